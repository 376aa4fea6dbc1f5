/*
 * defineEvents(): a payload type per event type.  The @ts-expect-error
 * lines are the test of the types: tsc fails the build (and so this
 * suite) if any of them stops being an error.  At run time the catalogue
 * is emit(); the errors' mapping is checked here too.
 */

import assert from 'node:assert/strict';
import { after, test } from 'node:test';

import {
	FeatureNotSupportedError, InvalidInputError, NotFoundError, NotInstalledError, OutboxError,
	PayloadTooLargeError, PermissionDeniedError, ReadOnlyTransactionError, SerializationFailureError,
	TransactionStateError, type EventOf, type PayloadOf, defineEvents, errorClassFor, toOutboxError,
} from '@outbox-pg/client';

import { newPool, storedEvent } from './helpers.js';

interface PaymentCreated {
	amount: number;
	currency: 'EUR' | 'USD';
}

type Events = {
	'payment.created': PaymentCreated;
	'payment.refunded': { amount: number; reason: string | null };
	'order.lines': Array<{ sku: string; qty: number }>;
};

const events = defineEvents<Events>();
const pool = newPool();

after(async () => {
	await pool.end();
});

test('a catalogue emits each type with its payload type', async () => {
	const id = await events.emit(pool, {
		type: 'payment.created',
		aggregateId: 'p-9',
		payload: { amount: 1250, currency: 'EUR' },
		aggregateType: 'payment',
	});
	assert.deepEqual((await storedEvent(pool, id))?.payload, { amount: 1250, currency: 'EUR' });

	const lines = events.event('order.lines', 'o-1', [{ sku: 'A', qty: 2 }]);
	const id2 = await events.emit(pool, lines);
	assert.deepEqual((await storedEvent(pool, id2))?.payload, [{ sku: 'A', qty: 2 }]);

	const refund: PayloadOf<Events, 'payment.refunded'> = { amount: 1, reason: null };
	const e: EventOf<Events> = { type: 'payment.refunded', aggregateId: 'p-9', payload: refund };
	assert.ok(await events.emit(pool, e));
});

/* compile-time checks; never called */
export function typeChecks(): void {
	// @ts-expect-error an unknown event type
	void events.emit(pool, { type: 'payment.deleted', aggregateId: '1', payload: {} });
	// @ts-expect-error the payload of another type
	void events.emit(pool, { type: 'payment.created', aggregateId: '1', payload: { amount: 1, reason: null } });
	// @ts-expect-error a wrong field type
	void events.emit(pool, { type: 'payment.created', aggregateId: '1', payload: { amount: '1', currency: 'EUR' } });
	// @ts-expect-error a missing field
	void events.emit(pool, { type: 'payment.created', aggregateId: '1', payload: { amount: 1 } });
	// @ts-expect-error an array payload where an object is expected
	void events.event('payment.created', '1', [1, 2]);
	// @ts-expect-error an unknown option
	void events.emit(pool, { type: 'order.lines', aggregateId: '1', payload: [], destinaton: 'x' });
}

test('SQLSTATEs map to error classes', () => {
	const cases: Array<[string, new (...a: any[]) => OutboxError]> = [
		['22023', InvalidInputError],
		['22004', InvalidInputError],
		['22P02', InvalidInputError],
		['22007', InvalidInputError],
		['54000', PayloadTooLargeError],
		['42704', NotFoundError],
		['3F000', NotInstalledError],
		['42883', NotInstalledError],
		['42501', PermissionDeniedError],
		['0A000', FeatureNotSupportedError],
		['25006', ReadOnlyTransactionError],
		['25000', TransactionStateError],
		['25P02', TransactionStateError],
		['40001', SerializationFailureError],
		['40P01', SerializationFailureError],
		['55000', OutboxError],
		['XX000', OutboxError],
	];

	for (const [code, cls] of cases)
	{
		assert.equal(errorClassFor(code), cls, code);
		const driverError = Object.assign(new Error(`message ${code}`), { code, detail: 'd', hint: '' });
		const mapped = toOutboxError(driverError);
		assert.ok(mapped instanceof cls, code);
		assert.ok(mapped instanceof OutboxError);
		assert.equal(mapped.code, code);
		assert.equal(mapped.message, `message ${code}`);
		assert.equal(mapped.detail, 'd');
		assert.equal(mapped.cause, driverError);
		assert.equal(mapped.retryable, code.startsWith('40'));
	}
	assert.ok(new PayloadTooLargeError('x', { code: '54000' }) instanceof InvalidInputError);

	/* TypeORM's QueryFailedError keeps the driver's error as driverError */
	const pgError = Object.assign(new Error('destination "x" does not exist'), { code: '42704' });
	const queryFailed = Object.assign(new Error('query failed'), { driverError: pgError });
	const mapped = toOutboxError(queryFailed);
	assert.ok(mapped instanceof NotFoundError);
	assert.equal(mapped.message, 'destination "x" does not exist');

	/* no SQLSTATE: unchanged */
	const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
	assert.equal(toOutboxError(refused), refused);
	assert.equal(toOutboxError('text'), 'text');
	assert.equal(toOutboxError(null), null);
});
