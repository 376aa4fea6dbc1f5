/*
 * The application's tables: payments (written by the API, with the
 * payment.created event in the same transaction) and the ledger (written
 * by the consumer, once per message).
 */

import { Column, CreateDateColumn, Entity, PrimaryGeneratedColumn } from 'typeorm';

@Entity({ name: 'payments' })
export class Payment {
	@PrimaryGeneratedColumn('uuid')
	id!: string;

	@Column('int')
	amount!: number;

	@Column('text')
	currency!: string;

	@CreateDateColumn({ name: 'created_at', type: 'timestamptz' })
	createdAt!: Date;
}

/*
 * No unique key on message_id on purpose: applying a message once is the
 * inbox claim's job (withInbox), which the tests check.
 */
@Entity({ name: 'ledger' })
export class LedgerEntry {
	@PrimaryGeneratedColumn()
	id!: number;

	@Column('text', { name: 'message_id' })
	messageId!: string;

	@Column('text', { name: 'payment_id' })
	paymentId!: string;

	@Column('int')
	amount!: number;

	@Column('text')
	source!: string;
}
