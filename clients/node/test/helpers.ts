/*
 * Shared by the tests: connections to the throwaway cluster test/run.sh
 * started (PGHOST, PGPORT, PGUSER, PGDATABASE), and reading what emit()
 * stored.
 */

import pg from 'pg';

export const { Pool, Client } = pg;

/* A pool for one test file; end it in after(). */
export function newPool(options: pg.PoolConfig = {}): pg.Pool {
	return new Pool({ max: 4, ...options });
}

/* A plain connected client. */
export async function newClient(options: pg.ClientConfig = {}): Promise<pg.Client> {
	const c = new Client(options);

	await c.connect();
	return c;
}

/* The stored event, or undefined when there is none. */
export async function storedEvent(db: pg.Pool | pg.ClientBase, id: string): Promise<Record<string, any> | undefined> {
	const r = await db.query('SELECT * FROM outbox.events WHERE id = $1', [id]);

	return r.rows[0];
}

/* A name no other test uses. */
let counter = 0;
export function unique(prefix: string): string {
	counter += 1;
	return `${prefix}-${process.pid}-${Date.now()}-${counter}`;
}
