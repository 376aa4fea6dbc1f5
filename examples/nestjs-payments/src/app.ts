/*
 * Creates the Nest application with the raw request body kept (the
 * webhook signature is computed over it).
 */

import 'reflect-metadata';
import { type INestApplication, type LoggerService, type LogLevel } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';

import { AppModule, type AppOptions } from './app.module.js';

export async function createApp(options: AppOptions & { logger?: LoggerService | LogLevel[] | false }):
	Promise<INestApplication> {
	return NestFactory.create(AppModule.forRoot(options), { rawBody: true, logger: options.logger ?? ['error', 'warn', 'log'] });
}
