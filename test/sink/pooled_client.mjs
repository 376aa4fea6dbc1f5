// The TypeScript client (@outbox-pg/client, built in clients/node/dist)
// through PgBouncer in transaction pooling mode, for test/t/029_pgbouncer.pl:
// concurrent application transactions that emit and commit or roll back,
// withInbox() of one message id from several pooled connections at once
// and after a failed attempt, waitPublished() of every committed event and
// of a rolled-back one, and node-postgres's named prepared statements
// next to its unnamed ones (what the client uses).  Connects with the
// libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE) and prints one
// JSON object with what happened; the TAP test asserts on it and on the
// database.
//
//   node pooled_client.mjs <clients/node directory> <first order number>
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [clientDir, firstArg] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(clientDir), 'package.json'));
const pg = require('pg');
const outbox = await import(pathToFileURL(path.join(path.resolve(clientDir), 'dist', 'index.js')).href);
const first = Number(firstArg);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = {};

// more pooled connections than PgBouncer has server connections
const pool = new pg.Pool({ max: 8 });
pool.on('error', () => {});

// 8 transactions at once: each writes an order and emits its event; the
// odd ones roll back
const pids = new Set();
const tasks = [];
for (let i = 0; i < 8; i++)
{
	const order = first + i;

	tasks.push((async () => {
		const c = await pool.connect();

		try {
			await c.query('BEGIN');
			await c.query('INSERT INTO orders (id, note) VALUES ($1, $2)', [order, 'node']);
			const id = await outbox.emit(c, {
				type: 'order.created', aggregateId: order,
				// an array, which node-postgres alone would send as '{...}'
				payload: { order, lines: [order, 'x', { n: i }] },
				headers: { 'X-Client': 'node' },
			});
			pids.add((await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid);
			await sleep(20);
			await c.query(i % 2 === 0 ? 'COMMIT' : 'ROLLBACK');
			return { order, id, committed: i % 2 === 0 };
		}
		finally {
			c.release();
		}
	})());
}
const emitted = await Promise.all(tasks);
out.committed = emitted.filter((e) => e.committed).map((e) => ({ order: e.order, id: e.id }));
out.rolled_back = emitted.filter((e) => !e.committed).map((e) => ({ order: e.order, id: e.id }));
out.emit_backends = pids.size;

// one message id, four deliveries at once: the business write runs once
const msg = `node-msg-${first}`;
const results = await Promise.all([0, 1, 2, 3].map((k) => outbox.withInbox(pool, msg, async (c) => {
	await c.query('INSERT INTO ledger (message_id, consumer, attempt) VALUES ($1, $2, $3)', [msg, 'node', k]);
	await sleep(50);
	return k;
}, { consumer: 'node' })));
out.inbox_ran = results.filter((r) => r.ran).length;

// a failed attempt rolls its claim back; the redelivery runs
const msg2 = `node-msg-${first}-retry`;
try {
	await outbox.withInbox(pool, msg2, async (c) => {
		await c.query('INSERT INTO ledger (message_id, consumer, attempt) VALUES ($1, $2, $3)', [msg2, 'node', 0]);
		throw new Error('handler failed');
	}, { consumer: 'node' });
	out.failed_attempt = 'did not throw';
}
catch (err) {
	out.failed_attempt = err.message;
}
const retry = await outbox.withInbox(pool, msg2, async (c) => {
	await c.query('INSERT INTO ledger (message_id, consumer, attempt) VALUES ($1, $2, $3)', [msg2, 'node', 1]);
	return 'second';
}, { consumer: 'node' });
out.retry = retry.ran ? retry.value : 'skipped';
out.duplicate_after_retry = (await outbox.withInbox(pool, msg2, () => 'third', { consumer: 'node' })).ran;

// every committed event: waitPublished() on the pool, all at once
const t0 = Date.now();
out.published = await Promise.all(out.committed.map((e) => outbox.waitPublished(pool, e.id, 60000)));
out.wait_ms = Date.now() - t0;
// a rolled-back event does not exist
try {
	await outbox.waitPublished(pool, out.rolled_back[0].id, 1000);
	out.wait_rolled_back = 'returned';
}
catch (err) {
	out.wait_rolled_back = `${err.constructor.name} ${err.code}`;
}
await pool.end();

// named prepared statements (node-postgres's { name }): three connections
// in turn prepare the same name and run it twice; what each run answered
out.named = [];
out.unnamed = [];
for (let k = 0; k < 3; k++)
{
	const c = new pg.Client();

	c.on('error', () => {});
	await c.connect();
	for (let n = 0; n < 2; n++)
	{
		try {
			const r = await c.query({ name: 'pgb_named', text: 'SELECT $1::int + 1 AS v', values: [k] });
			out.named.push(String(r.rows[0].v));
		}
		catch (err) {
			out.named.push(err.code ?? err.message);
		}
		const r = await c.query('SELECT $1::int + 1 AS v', [k]);
		out.unnamed.push(String(r.rows[0].v));
	}
	await c.end();
}

console.log(JSON.stringify(out));
