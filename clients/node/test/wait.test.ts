/*
 * waitPublished(): a timeout with nothing to deliver to, the relay
 * delivering to a local webhook sink (the payload arrives as the JSON that
 * was emitted), and its typed errors.
 */

import assert from 'node:assert/strict';
import { type IncomingHttpHeaders, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';

import {
	InvalidInputError, NotFoundError, PermissionDeniedError, TransactionStateError, emit, waitPublished,
} from '@outbox-pg/client';

import { newClient, newPool, unique } from './helpers.js';

const pool = newPool();

interface Delivery {
	headers: IncomingHttpHeaders;
	body: string;
}

/* a webhook sink on 127.0.0.1: answers 204, keeps what it received */
const received: Delivery[] = [];
const sink = createServer((req, res) => {
	const chunks: Buffer[] = [];

	req.on('data', (c: Buffer) => chunks.push(c));
	req.on('end', () => {
		received.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
		res.writeHead(204).end();
	});
});

before(async () => {
	await new Promise<void>((resolve) => sink.listen(0, '127.0.0.1', resolve));
	const { port } = sink.address() as AddressInfo;

	await pool.query('INSERT INTO outbox.destinations (name, url) VALUES ($1, $2)',
					 ['node-sink', `http://127.0.0.1:${port}/hook`]);
	await pool.query("INSERT INTO outbox.routes (pattern, destination) VALUES ('relayed.*', 'node-sink')");
});

after(async () => {
	await pool.end();
	await new Promise<void>((resolve) => sink.close(() => resolve()));
});

test('waitPublished() times out cleanly when nothing delivers the event', async () => {
	const id = await emit(pool, { type: 'unrouted.event', aggregateId: '1', payload: {} });
	const t0 = Date.now();

	assert.equal(await waitPublished(pool, id, 500), false);
	const elapsed = Date.now() - t0;
	assert.ok(elapsed >= 450, `waited ${elapsed} ms`);
	assert.ok(elapsed < 5000, `waited ${elapsed} ms`);
});

test('waitPublished() is true once the relay delivered the event', async () => {
	const payload = { amount: 1250, items: [1, 'two', { three: 3 }], note: 'Grüße' };
	const client = await pool.connect();
	let id: string;

	try {
		await client.query('BEGIN');
		id = await emit(client, { type: 'relayed.payment', aggregateId: 'p-1', payload });
		await client.query('COMMIT');
	}
	finally {
		client.release();
	}
	assert.equal(await waitPublished(pool, id, 20_000), true);
	const got = received.find((d) => d.headers['ce-id'] === id || d.headers['webhook-id'] === id);
	assert.ok(got, `the sink received ${id}`);
	assert.deepEqual(JSON.parse(got.body), payload);
	assert.equal(got.headers['ce-type'], 'relayed.payment');
});

test('waitPublished() errors: unknown id, bad id, snapshot isolation, no grant', async () => {
	await assert.rejects(waitPublished(pool, '00000000-0000-7000-8000-000000000000', 0), NotFoundError);
	await assert.rejects(waitPublished(pool, 'not-a-uuid', 0), (err: unknown) =>
		err instanceof InvalidInputError && err.code === '22P02');
	await assert.rejects(waitPublished(pool, '00000000-0000-7000-8000-000000000000', -1), InvalidInputError);

	const id = await emit(pool, { type: 'unrouted.event', aggregateId: '2', payload: {} });
	const c = await pool.connect();
	try {
		await c.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
		await assert.rejects(waitPublished(c, id, 0), (err: unknown) =>
			err instanceof TransactionStateError && err.code === '25000');
		await c.query('ROLLBACK');
	}
	finally {
		c.release();
	}

	/* an application role granted emit() only, as "Roles" in docs/security.md */
	const role = unique('app').replace(/-/g, '_');
	await pool.query(`CREATE ROLE ${role} LOGIN`);
	await pool.query(`GRANT USAGE ON SCHEMA outbox, inbox TO ${role}`);
	await pool.query(`GRANT EXECUTE ON FUNCTION outbox.emit(text, text, jsonb, text, text, jsonb, text, timestamptz) TO ${role}`);
	const app = await newClient({ user: role });
	try {
		const own = await emit(app, { type: 'unrouted.event', aggregateId: '3', payload: [] });
		await assert.rejects(waitPublished(app, own, 0), (err: unknown) =>
			err instanceof PermissionDeniedError && err.code === '42501' && /wait_published/.test(err.message));
	}
	finally {
		await app.end();
	}
});
