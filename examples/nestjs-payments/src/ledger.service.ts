/*
 * The consumer's business write: a ledger entry per payment, applied once
 * per message id whatever the number of deliveries (withInbox: the inbox
 * claim and the insert in one transaction).
 */

import { Injectable } from '@nestjs/common';
import { InjectDataSource } from '@nestjs/typeorm';
import { DataSource, type EntityManager } from 'typeorm';
import { withInbox } from '@outbox-pg/client';

import { LedgerEntry } from './entities.js';
import type { PaymentCreated } from './events.js';

@Injectable()
export class LedgerService {
	constructor(@InjectDataSource() private readonly dataSource: DataSource) {}

	/* true when applied now, false for a message applied before */
	async apply(messageId: string, payment: PaymentCreated, source: string): Promise<boolean> {
		const r = await withInbox(this.dataSource, messageId, async (manager: EntityManager) => {
			await manager.insert(LedgerEntry, {
				messageId, paymentId: payment.paymentId, amount: payment.amount, source,
			});
		}, { consumer: 'ledger' });

		return r.ran;
	}
}
