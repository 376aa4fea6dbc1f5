/*
 * The CommonJS build, as a CommonJS project (a NestJS application compiled
 * to CommonJS, say) loads it: require() and the declarations of the
 * "require" condition.  The ESM build is what the other tests use.
 */

import assert = require('node:assert/strict');
import test = require('node:test');
import pg = require('pg');

import client = require('@outbox-pg/client');

test('require() gives the CommonJS build with the same API', async () => {
	const esm = await import('@outbox-pg/client');

	assert.deepEqual(Object.keys(client).sort(), Object.keys(esm).sort());
	assert.match(require.resolve('@outbox-pg/client'), /dist\/cjs\/index\.js$/);

	const pool = new pg.Pool({ max: 1 });
	try {
		const id = await client.emit(pool, { type: 'cjs.event', aggregateId: '1', payload: [1, 'a'] });
		const r = await pool.query('SELECT payload FROM outbox.events WHERE id = $1', [id]);
		assert.deepEqual(r.rows[0].payload, [1, 'a']);
		await assert.rejects(client.emit(pool, { type: '', aggregateId: '1', payload: {} }),
							 (err: unknown) => err instanceof client.InvalidInputError && err.code === '22023');
	}
	finally {
		await pool.end();
	}
});
