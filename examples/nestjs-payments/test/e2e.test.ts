/*
 * End to end, on the throwaway cluster of clients/node/test/run.sh (its
 * relay runs for the database "nestjs_payments" this test creates): the
 * API saves a payment and emits payment.created in one transaction; the
 * relay delivers it, signed, to the application's own webhook endpoint;
 * the consumer verifies the signature and applies it once, also when the
 * delivery is repeated; a forged delivery is refused; the SQS variant of
 * the consumer dedupes by the message_id attribute.
 */

import assert from 'node:assert/strict';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';

import type { INestApplication } from '@nestjs/common';
import { waitPublished } from '@outbox-pg/client';
import pg from 'pg';
import { Webhook } from 'standardwebhooks';

import { createApp } from '../src/app.js';
import { LedgerService } from '../src/ledger.service.js';
import { applySqsMessage } from '../src/sqs-consumer.js';

const DB = 'nestjs_payments';
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

let app: INestApplication;
let base: string;
let pool: pg.Pool;

interface Reply {
	status: number;
	body: any;
}

function post(path: string, body: string, headers: Record<string, string> = {}): Promise<Reply> {
	return new Promise((resolve, reject) => {
		const req = request(`${base}${path}`, {
			method: 'POST',
			headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers },
		}, (res) => {
			const chunks: Buffer[] = [];

			res.on('data', (c: Buffer) => chunks.push(c));
			res.on('end', () => {
				const text = Buffer.concat(chunks).toString('utf8');
				resolve({ status: res.statusCode ?? 0, body: text === '' ? null : JSON.parse(text) });
			});
		});
		req.on('error', reject);
		req.end(body);
	});
}

async function ledger(messageId: string): Promise<Array<Record<string, unknown>>> {
	return (await pool.query('SELECT payment_id, amount, source FROM ledger WHERE message_id = $1', [messageId])).rows;
}

before(async () => {
	const admin = new pg.Client();
	await admin.connect();
	try {
		await admin.query(`CREATE DATABASE ${DB}`);
	}
	finally {
		await admin.end();
	}
	process.env.PGDATABASE = DB;
	pool = new pg.Pool({ max: 2 });
	await pool.query('CREATE EXTENSION outbox_pg');

	app = await createApp({ webhookSecret: SECRET, synchronize: true, logger: false });
	await app.listen(0, '127.0.0.1');
	const { port } = app.getHttpServer().address() as AddressInfo;
	base = `http://127.0.0.1:${port}`;

	/* the relay delivers payment events to this application, signed */
	await pool.query('INSERT INTO outbox.destinations (name, url, signing_secrets) VALUES ($1, $2, $3::text[])',
					 ['payments-webhook', `${base}/webhooks/payments`, [SECRET]]);
	await pool.query("INSERT INTO outbox.routes (pattern, destination) VALUES ('payment.*', 'payments-webhook')");
});

after(async () => {
	await app?.close();
	await pool?.end();
});

test('a payment and its event commit together; the webhook applies it once', async () => {
	const created = await post('/payments', JSON.stringify({ amount: 1250, currency: 'EUR' }));
	assert.equal(created.status, 201, JSON.stringify(created.body));
	const { id, eventId } = created.body as { id: string; eventId: string };

	const event = (await pool.query('SELECT type, aggregate_id, payload FROM outbox.events WHERE id = $1', [eventId])).rows[0];
	assert.deepEqual(event, {
		type: 'payment.created', aggregate_id: id, payload: { paymentId: id, amount: 1250, currency: 'EUR' },
	});

	/* published = the consumer answered 2xx, after its commit */
	assert.equal(await waitPublished(pool, eventId, 20_000), true);
	assert.deepEqual(await ledger(eventId), [{ payment_id: id, amount: 1250, source: 'webhook' }]);

	/* the same delivery again (a retry after a lost answer): not applied twice */
	const body = JSON.stringify({ paymentId: id, amount: 1250, currency: 'EUR' });
	const wh = new Webhook(SECRET);
	const now = new Date();
	const headers = {
		'webhook-id': eventId,
		'webhook-timestamp': String(Math.floor(now.getTime() / 1000)),
		'webhook-signature': wh.sign(eventId, now, body),
	};
	const again = await post('/webhooks/payments', body, headers);
	assert.equal(again.status, 200);
	assert.deepEqual(again.body, { applied: false });
	assert.equal((await ledger(eventId)).length, 1);
});

test('a delivery with a wrong signature is refused and applies nothing', async () => {
	const body = JSON.stringify({ paymentId: 'forged', amount: 1_000_000, currency: 'EUR' });
	const now = new Date();
	const other = new Webhook('whsec_' + Buffer.alloc(32, 7).toString('base64'));
	const r = await post('/webhooks/payments', body, {
		'webhook-id': 'forged-1',
		'webhook-timestamp': String(Math.floor(now.getTime() / 1000)),
		'webhook-signature': other.sign('forged-1', now, body),
	});
	assert.equal(r.status, 401);
	assert.deepEqual(await ledger('forged-1'), []);

	const unsigned = await post('/webhooks/payments', body, { 'webhook-id': 'forged-2' });
	assert.equal(unsigned.status, 401);
	assert.deepEqual(await ledger('forged-2'), []);
});

test('the API refuses a bad payment and emits nothing', async () => {
	const before = (await pool.query('SELECT count(*)::int AS n FROM outbox.events')).rows[0].n as number;
	const r = await post('/payments', JSON.stringify({ amount: -5, currency: 'EUR' }));
	assert.equal(r.status, 400);
	assert.equal((await pool.query('SELECT count(*)::int AS n FROM outbox.events')).rows[0].n, before);
});

test('the SQS variant applies a message once by its message_id attribute', async () => {
	const ledgerService = app.get(LedgerService);
	const message = {
		MessageId: 'sqs-own-id-1',
		Body: JSON.stringify({ paymentId: 'p-sqs', amount: 99, currency: 'USD' }),
		MessageAttributes: { message_id: { DataType: 'String', StringValue: 'sqs-event-1' } },
	};

	assert.equal(await applySqsMessage(ledgerService, message), true);
	/* SQS redelivers with a new MessageId: the attribute still dedupes */
	assert.equal(await applySqsMessage(ledgerService, { ...message, MessageId: 'sqs-own-id-2' }), false);
	assert.deepEqual(await ledger('sqs-event-1'), [{ payment_id: 'p-sqs', amount: 99, source: 'sqs' }]);
	await assert.rejects(applySqsMessage(ledgerService, { Body: '{}' }), /message_id attribute/);
});
