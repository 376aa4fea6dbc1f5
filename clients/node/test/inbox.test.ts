/*
 * claim() and withInbox(): a message id is applied once per consumer, a
 * failing handler rolls its claim back with its writes, concurrent
 * deliveries of one id run the handler once, connections go back to the
 * pool.
 */

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { InvalidInputError, OutboxError, claim, withInbox } from '@outbox-pg/client';
import type { PoolClient } from 'pg';

import { newPool, unique } from './helpers.js';

const pool = newPool();

before(async () => {
	await pool.query('CREATE TABLE IF NOT EXISTS ledger (message_id text, amount int)');
});

after(async () => {
	await pool.end();
});

async function ledger(messageId: string): Promise<number[]> {
	const r = await pool.query('SELECT amount FROM ledger WHERE message_id = $1 ORDER BY amount', [messageId]);

	return r.rows.map((row) => row.amount as number);
}

test('claim() is true the first time only, and a rollback un-claims', async () => {
	const id = unique('claim');
	const c = await pool.connect();
	try {
		await c.query('BEGIN');
		assert.equal(await claim(c, id), true);
		await c.query('ROLLBACK');
		await c.query('BEGIN');
		assert.equal(await claim(c, id), true, 'the rolled-back claim is gone');
		await c.query('COMMIT');
		await c.query('BEGIN');
		assert.equal(await claim(c, id), false);
		/* another consumer dedupes on its own */
		assert.equal(await claim(c, id, { consumer: 'ledger', ttl: '30 days' }), true);
		assert.equal(await claim(c, id, { consumer: 'ledger' }), false);
		await c.query('COMMIT');
	}
	finally {
		c.release();
	}
});

test('withInbox() runs the handler once per message id', async () => {
	const id = unique('msg');
	let calls = 0;
	const apply = async (client: { query: (t: string, v: unknown[]) => Promise<unknown> }) => {
		calls += 1;
		await client.query('INSERT INTO ledger VALUES ($1, $2)', [id, 1250]);
		return 'applied';
	};

	assert.deepEqual(await withInbox(pool, id, apply), { ran: true, value: 'applied' });
	assert.deepEqual(await withInbox(pool, id, apply), { ran: false });
	assert.equal(calls, 1);
	assert.deepEqual(await ledger(id), [1250]);

	/* a second consumer applies it once too */
	assert.equal((await withInbox(pool, id, apply, { consumer: 'audit', ttl: 86_400_000 * 2 })).ran, true);
	assert.equal((await withInbox(pool, id, apply, { consumer: 'audit' })).ran, false);
	assert.equal(calls, 2);
	assert.equal(pool.totalCount, pool.idleCount, 'every connection went back to the pool');
});

test('a throwing handler rolls back its claim and its writes', async () => {
	const id = unique('fail');
	const boom = new Error('handler failed');

	await assert.rejects(withInbox(pool, id, async (client) => {
		await client.query('INSERT INTO ledger VALUES ($1, $2)', [id, 1]);
		throw boom;
	}), (err: unknown) => err === boom);
	assert.deepEqual(await ledger(id), [], 'the write was rolled back');

	/* an SQL error in the handler: the same, and the error is the driver's */
	await assert.rejects(withInbox(pool, id, async (client) => {
		await client.query('INSERT INTO ledger VALUES ($1, $2)', [id, 'not a number']);
	}), (err: unknown) => !(err instanceof OutboxError) && (err as { code?: string }).code === '22P02');

	/* the redelivery runs it */
	const r = await withInbox(pool, id, async (client) => {
		await client.query('INSERT INTO ledger VALUES ($1, $2)', [id, 2]);
		return 2;
	});
	assert.deepEqual(r, { ran: true, value: 2 });
	assert.deepEqual(await ledger(id), [2]);
	assert.equal(pool.totalCount, pool.idleCount, 'every connection went back to the pool');
});

test('concurrent deliveries of one message id run the handler once', async () => {
	const id = unique('race');
	let running = 0;
	let calls = 0;
	const handler = async (client: { query: (t: string, v: unknown[]) => Promise<unknown> }) => {
		calls += 1;
		running += 1;
		await client.query('INSERT INTO ledger VALUES ($1, $2)', [id, 7]);
		/* hold the claim open while the others arrive and wait on it */
		await client.query('SELECT pg_sleep(0.2)', []);
		running -= 1;
	};
	const results = await Promise.all([1, 2, 3].map(() => withInbox(pool, id, handler)));

	assert.equal(results.filter((r) => r.ran).length, 1);
	assert.equal(calls, 1);
	assert.equal(running, 0);
	assert.deepEqual(await ledger(id), [7]);
});

test('claim() refuses bad input with typed errors', async () => {
	const c = await pool.connect();
	try {
		await c.query('BEGIN');
		await assert.rejects(claim(c, ''), (err: unknown) =>
			err instanceof InvalidInputError && err.code === '22023');
		await c.query('ROLLBACK');
		await c.query('BEGIN');
		/* shorter than outbox.redelivery_window (1 day by default) */
		await assert.rejects(claim(c, 'x', { ttl: 60_000 }), (err: unknown) =>
			err instanceof InvalidInputError && err.code === '22023');
		await c.query('ROLLBACK');
	}
	finally {
		c.release();
	}
	/* withInbox: the claim's error, mapped; nothing left open */
	await assert.rejects(withInbox(pool, '', () => 1), InvalidInputError);
	await assert.rejects(withInbox(pool, 'y', () => 1, { consumer: '' }), InvalidInputError);
	assert.equal(pool.totalCount, pool.idleCount);
});

test('withInbox() honours an isolation level', async () => {
	const id = unique('iso');
	/* annotating the client gives fn node-postgres's own PoolClient type */
	const r = await withInbox(pool, id, async (client: PoolClient) => {
		const res = await client.query<{ transaction_isolation: string }>('SHOW transaction_isolation');
		return res.rows[0]?.transaction_isolation;
	}, { isolation: 'serializable' });
	assert.deepEqual(r, { ran: true, value: 'serializable' });
});

/*
 * The shape of a TypeORM DataSource: transaction(fn) / transaction(level,
 * fn), commit when fn returns, rollback when it throws, an executor whose
 * query() resolves to the rows.
 */
function typeormLike(levels: string[]) {
	async function transaction<R>(a: string | ((m: { query(t: string, v?: unknown[]): Promise<unknown[]> }) => Promise<R>),
								  b?: (m: { query(t: string, v?: unknown[]): Promise<unknown[]> }) => Promise<R>): Promise<R> {
		const fn = typeof a === 'function' ? a : b!;
		const c = await pool.connect();
		try {
			await c.query(typeof a === 'string' ? `START TRANSACTION ISOLATION LEVEL ${a}` : 'START TRANSACTION');
			levels.push((await c.query('SHOW transaction_isolation')).rows[0].transaction_isolation);
			const r = await fn({ query: async (t: string, v?: unknown[]) => (await c.query(t, v)).rows });
			await c.query('COMMIT');
			return r;
		}
		catch (err) {
			await c.query('ROLLBACK');
			throw err;
		}
		finally {
			c.release();
		}
	}
	return { transaction };
}

test('withInbox() through a TypeORM-style transaction()', async () => {
	const id = unique('typeorm');
	const levels: string[] = [];
	const dataSource = typeormLike(levels);
	let calls = 0;
	const apply = async (manager: { query(t: string, v?: unknown[]): Promise<unknown[]> }) => {
		calls += 1;
		await manager.query('INSERT INTO ledger VALUES ($1, $2)', [id, 30]);
		return calls;
	};

	await assert.rejects(withInbox(dataSource, id, async (manager) => {
		await manager.query('INSERT INTO ledger VALUES ($1, $2)', [id, 1]);
		throw new Error('first delivery fails');
	}), /first delivery fails/);
	assert.deepEqual(await ledger(id), []);
	assert.deepEqual(await withInbox(dataSource, id, apply, { isolation: 'repeatable read' }), { ran: true, value: 1 });
	assert.deepEqual(await withInbox(dataSource, id, apply), { ran: false });
	assert.equal(calls, 1);
	assert.deepEqual(await ledger(id), [30]);
	assert.deepEqual(levels, ['read committed', 'repeatable read', 'read committed']);
});

test('withInbox() refuses an unknown isolation level before taking a connection', async () => {
	for (const level of ['chaos', 'constructor'])
		await assert.rejects(withInbox(pool, unique('bad-iso'), () => 1, { isolation: level as 'serializable' }),
							 /unknown isolation level/);
	assert.equal(pool.totalCount, pool.idleCount);
});
