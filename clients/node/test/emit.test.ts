/*
 * emit(): committed and rolled-back events, JSON payloads of every kind
 * (arrays never become PostgreSQL array literals), options, executors
 * (node-postgres Client, PoolClient, Pool, a TypeORM-style query() that
 * returns rows), and typed errors for what the server refuses.
 */

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
	InvalidInputError, NotFoundError, NotInstalledError, OutboxError, PayloadTooLargeError,
	PermissionDeniedError, ReadOnlyTransactionError, type Queryable, emit, toOutboxError, waitPublished,
} from '@outbox-pg/client';

import { newClient, newPool, storedEvent, unique } from './helpers.js';

const pool = newPool();

after(async () => {
	await pool.end();
});

test('emit in a committed transaction writes one pending event', async () => {
	const client = await pool.connect();
	let id: string;

	try {
		await client.query('BEGIN');
		id = await emit(client, { type: 'payment.created', aggregateId: '42', payload: { amount: 1250 } });
		await client.query('COMMIT');
	}
	finally {
		client.release();
	}
	assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/);
	const row = await storedEvent(pool, id);
	assert.ok(row);
	assert.equal(row.type, 'payment.created');
	assert.equal(row.aggregate_id, '42');
	assert.deepEqual(row.payload, { amount: 1250 });
	assert.equal(row.status, 'pending');
	/* the server knows it as a committed event: no route, so not published */
	assert.equal(await waitPublished(pool, id, 0), false);
});

test('emit in a rolled-back transaction leaves nothing', async () => {
	const client = await pool.connect();
	let id: string;

	try {
		await client.query('BEGIN');
		id = await emit(client, { type: 'payment.created', aggregateId: '43', payload: { amount: 1 } });
		assert.ok(await storedEvent(client, id), 'visible inside its transaction');
		await client.query('ROLLBACK');
	}
	finally {
		client.release();
	}
	assert.equal(await storedEvent(pool, id), undefined);
	await assert.rejects(waitPublished(pool, id, 0), (err: unknown) => {
		assert.ok(err instanceof NotFoundError);
		assert.equal(err.code, '42704');
		return true;
	});
});

test('payloads of every JSON kind round-trip as themselves', async () => {
	const payloads: unknown[] = [
		[1, 2, 3],
		[],
		['a', { b: [true, null] }],
		{ nested: { list: [1.5, -2, 'x'], empty: {} } },
		'a string',
		'{1,2}',
		'',
		42,
		-0.125,
		true,
		false,
		null,
		{ unicode: 'Grüße, 東京 🚀', quote: '"\'\\' },
	];

	for (const payload of payloads)
	{
		const id = await emit(pool, { type: 'json.kind', aggregateId: null, payload });
		const r = await pool.query('SELECT payload, jsonb_typeof(payload) AS kind FROM outbox.events WHERE id = $1', [id]);

		assert.deepEqual(r.rows[0].payload, payload, `payload ${JSON.stringify(payload)}`);
		assert.equal(r.rows[0].kind, payload === null ? 'null' : Array.isArray(payload) ? 'array' : typeof payload);
	}
	/* toJSON applies: a Date becomes its ISO string */
	const when = new Date('2026-01-02T03:04:05.678Z');
	const id = await emit(pool, { type: 'json.kind', aggregateId: null, payload: { when } });
	assert.deepEqual((await storedEvent(pool, id))?.payload, { when: '2026-01-02T03:04:05.678Z' });
});

test('a JavaScript array payload does not become a PostgreSQL array literal', async () => {
	/* the trap: node-postgres sends an array parameter as '{1,2,3}' */
	const raw = pool.query('SELECT outbox.emit($1, $2, $3)', ['json.array', '1', [1, 2, 3]]);
	await assert.rejects(raw, (err: unknown) => {
		const mapped = toOutboxError(err);
		assert.ok(mapped instanceof InvalidInputError);
		assert.equal(mapped.code, '22P02');
		assert.ok(mapped.hint, 'a hint names the usual cause');
		assert.match(mapped.hint, /array/);
		assert.equal(mapped.cause, err);
		return true;
	});
	/* emit() serialises it */
	const id = await emit(pool, { type: 'json.array', aggregateId: '1', payload: [1, 2, 3] });
	const r = await pool.query('SELECT jsonb_typeof(payload) AS kind, payload FROM outbox.events WHERE id = $1', [id]);
	assert.equal(r.rows[0].kind, 'array');
	assert.deepEqual(r.rows[0].payload, [1, 2, 3]);
});

test('options reach the stored event; only the given ones are sent', async () => {
	const notBefore = new Date(Date.now() + 3600_000);
	const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
	const id = await emit(pool, {
		type: 'payment.created',
		aggregateId: 7n,
		payload: { amount: 5 },
		aggregateType: 'payment',
		headers: { 'X-Tenant': 'acme' },
		traceparent,
		notBefore,
	});
	const row = await storedEvent(pool, id);
	assert.ok(row);
	assert.equal(row.aggregate_id, '7');
	assert.equal(row.aggregate_type, 'payment');
	assert.deepEqual(row.headers, { 'X-Tenant': 'acme' });
	assert.equal(row.traceparent, traceparent);
	assert.equal((row.next_attempt_at as Date).getTime(), notBefore.getTime());

	/* numbers become text; an absent option stays the server's default */
	const id2 = await emit(pool, { type: 'payment.created', aggregateId: 8, payload: {}, aggregateType: undefined });
	const row2 = await storedEvent(pool, id2);
	assert.equal(row2?.aggregate_id, '8');
	assert.equal(row2?.aggregate_type, null);
	assert.equal(row2?.headers, null);
});

test('emit works on a Client, a PoolClient, a Pool and a TypeORM-style executor', async () => {
	const client = await newClient();
	try {
		await client.query('BEGIN');
		const id = await emit(client, { type: 'exec.client', aggregateId: '1', payload: 1 });
		await client.query('COMMIT');
		assert.ok(await storedEvent(pool, id));
	}
	finally {
		await client.end();
	}

	/* TypeORM's QueryRunner/EntityManager query() resolves to the rows */
	const runner = await pool.connect();
	try {
		const typeorm: Queryable = {
			query: async (text: string, values?: unknown[]) => (await runner.query(text, values)).rows,
		};
		await typeorm.query('BEGIN');
		const id = await emit(typeorm, { type: 'exec.typeorm', aggregateId: '2', payload: ['x'] });
		await typeorm.query('COMMIT');
		assert.deepEqual((await storedEvent(pool, id))?.payload, ['x']);
	}
	finally {
		runner.release();
	}
});

function rejectsWith(cls: new (...args: any[]) => OutboxError, code: string, message?: RegExp) {
	return (err: unknown): boolean => {
		assert.ok(err instanceof cls, `expected ${cls.name}, got ${String(err)}`);
		assert.ok(err instanceof OutboxError);
		assert.equal(err.code, code);
		if (message)
			assert.match(err.message, message);
		assert.equal(err.name, cls.name);
		return true;
	};
}

test('what the server refuses comes back as typed errors', async () => {
	const ok = { type: 'payment.created', aggregateId: '1', payload: {} };

	await assert.rejects(emit(pool, { ...ok, type: '' }), rejectsWith(InvalidInputError, '22023', /event type must not be empty/));
	await assert.rejects(emit(pool, { ...ok, type: 't'.repeat(256) }), rejectsWith(InvalidInputError, '22023', /too long/));
	await assert.rejects(emit(pool, { ...ok, type: null as unknown as string }), rejectsWith(InvalidInputError, '22004'));
	await assert.rejects(emit(pool, { ...ok, aggregateId: '' }), rejectsWith(InvalidInputError, '22023', /aggregate id/));
	await assert.rejects(emit(pool, { ...ok, destination: 'nowhere' }),
						 rejectsWith(NotFoundError, '42704', /destination "nowhere" does not exist/));
	await assert.rejects(emit(pool, { ...ok, headers: { 'bad name': 'v' } }), rejectsWith(InvalidInputError, '22023', /header name/));
	await assert.rejects(emit(pool, { ...ok, headers: { 'ce-id': 'forged' } }), rejectsWith(InvalidInputError, '22023', /cannot be set/));
	await assert.rejects(emit(pool, { ...ok, traceparent: 'garbage' }), rejectsWith(InvalidInputError, '22023', /traceparent/));
	await assert.rejects(emit(pool, { ...ok, notBefore: 'infinity' }), rejectsWith(InvalidInputError, '22023'));
	await assert.rejects(emit(pool, { ...ok, notBefore: 'not a time' }), rejectsWith(InvalidInputError, '22007'));

	/* the size cap (a superuser setting) */
	const client = await pool.connect();
	try {
		await client.query("SET outbox.max_payload_size = '2kB'");
		await assert.rejects(emit(client, { ...ok, payload: { blob: 'x'.repeat(3000) } }),
							 rejectsWith(PayloadTooLargeError, '54000', /too large/));
		await assert.rejects(emit(client, { ...ok, payload: { blob: 'x'.repeat(3000) } }), InvalidInputError);
	}
	finally {
		await client.query('RESET outbox.max_payload_size');
		client.release();
	}
});

test('payloads JSON cannot carry are refused before any query', async () => {
	let queries = 0;
	const counting: Queryable = {
		query: async (text: string, values?: unknown[]) => {
			queries += 1;
			return pool.query(text, values);
		},
	};
	const cyclic: Record<string, unknown> = {};
	cyclic.self = cyclic;

	await assert.rejects(emit(counting, { type: 't', aggregateId: '1', payload: undefined }),
						 rejectsWith(InvalidInputError, '22004', /must be a JSON value/));
	await assert.rejects(emit(counting, { type: 't', aggregateId: '1', payload: () => 1 }),
						 rejectsWith(InvalidInputError, '22004'));
	await assert.rejects(emit(counting, { type: 't', aggregateId: '1', payload: { n: 1n } }),
						 rejectsWith(InvalidInputError, '22023', /BigInt/));
	await assert.rejects(emit(counting, { type: 't', aggregateId: '1', payload: cyclic }),
						 rejectsWith(InvalidInputError, '22023', /circular/i));
	await assert.rejects(emit(counting, { type: 't', aggregateId: '1', payload: {}, notBefore: new Date(NaN) }),
						 rejectsWith(InvalidInputError, '22023', /invalid Date/));
	assert.equal(queries, 0);
});

test('read-only transactions, missing grants and a database without the extension', async () => {
	const ok = { type: 'payment.created', aggregateId: '1', payload: {} };
	const client = await pool.connect();
	try {
		await client.query('BEGIN READ ONLY');
		await assert.rejects(emit(client, ok), rejectsWith(ReadOnlyTransactionError, '25006'));
		await client.query('ROLLBACK');
	}
	finally {
		client.release();
	}

	const role = unique('app').replace(/-/g, '_');
	await pool.query(`CREATE ROLE ${role} LOGIN`);
	const app = await newClient({ user: role });
	try {
		await assert.rejects(emit(app, ok), rejectsWith(PermissionDeniedError, '42501'));
	}
	finally {
		await app.end();
	}

	const db = unique('noext').replace(/-/g, '_');
	await pool.query(`CREATE DATABASE ${db}`);
	const other = await newClient({ database: db });
	try {
		await assert.rejects(emit(other, ok), (err: unknown) => {
			assert.ok(err instanceof NotInstalledError);
			assert.equal(err.code, '3F000');
			assert.match(err.hint ?? '', /CREATE EXTENSION outbox_pg/);
			return true;
		});
	}
	finally {
		await other.end();
		await pool.query(`DROP DATABASE ${db} WITH (FORCE)`);
	}
});
