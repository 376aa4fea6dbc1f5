/*
 * The application: TypeORM on the database of PGHOST/PGPORT/PGUSER/
 * PGDATABASE (node-postgres's variables), the payments API, the webhook
 * consumer.
 */

import { type DynamicModule, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';

import { LedgerEntry, Payment } from './entities.js';
import { LedgerService } from './ledger.service.js';
import { PaymentsController } from './payments.controller.js';
import { PaymentsService } from './payments.service.js';
import { WEBHOOK_SECRET, WebhooksController } from './webhooks.controller.js';

export interface AppOptions {
	/** The Standard Webhooks secret of the outbox destination (whsec_...). */
	webhookSecret: string;
	/** Create the tables (for the example and its test). */
	synchronize?: boolean;
}

@Module({})
export class AppModule {
	static forRoot(options: AppOptions): DynamicModule {
		return {
			module: AppModule,
			imports: [
				TypeOrmModule.forRoot({
					type: 'postgres',
					/* node-postgres reads PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE */
					entities: [Payment, LedgerEntry],
					synchronize: options.synchronize ?? false,
				}),
			],
			controllers: [PaymentsController, WebhooksController],
			providers: [PaymentsService, LedgerService, { provide: WEBHOOK_SECRET, useValue: options.webhookSecret }],
		};
	}
}
