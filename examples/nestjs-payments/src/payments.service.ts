/*
 * The producer: a payment and its payment.created event commit together
 * (or neither does), in one TypeORM transaction.
 */

import { Injectable } from '@nestjs/common';
import { InjectDataSource } from '@nestjs/typeorm';
import { DataSource } from 'typeorm';

import { Payment } from './entities.js';
import { events } from './events.js';

@Injectable()
export class PaymentsService {
	constructor(@InjectDataSource() private readonly dataSource: DataSource) {}

	async create(amount: number, currency: string): Promise<{ payment: Payment; eventId: string }> {
		return this.dataSource.transaction(async (manager) => {
			const payment = await manager.save(manager.create(Payment, { amount, currency }));
			const eventId = await events.emit(manager, {
				type: 'payment.created',
				aggregateId: payment.id,
				aggregateType: 'payment',
				payload: { paymentId: payment.id, amount, currency },
			});

			return { payment, eventId };
		});
	}
}
