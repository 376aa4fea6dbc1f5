/*
 * What the client runs its statements on.  Anything with a
 * query(text, values) method that understands $1, $2, ... placeholders:
 * a node-postgres Client, PoolClient or Pool, a TypeORM QueryRunner or
 * EntityManager, or a small adapter around another query builder.
 */

import { toOutboxError } from './errors.js';

/** A connection (or a transaction's handle) that runs parameterised SQL. */
export interface Queryable {
	query(text: string, values?: any[]): Promise<unknown>;
}

/** A pooled connection: node-postgres's PoolClient. */
export interface PoolClientLike extends Queryable {
	release(err?: Error | boolean): void;
}

/** A pool that lends connections: node-postgres's Pool. */
export interface PoolLike<C extends PoolClientLike = PoolClientLike> {
	connect(): Promise<C>;
}

/*
 * Runs one statement and returns its rows: node-postgres answers with a
 * result object ({ rows }), TypeORM's query() with the rows themselves.
 * Errors with a SQLSTATE come back as OutboxError subclasses.
 */
export async function queryRows(db: Queryable, text: string, values: unknown[]): Promise<Record<string, unknown>[]> {
	let res: unknown;

	try {
		res = await db.query(text, values);
	}
	catch (err) {
		throw toOutboxError(err);
	}
	if (Array.isArray(res))
		return res as Record<string, unknown>[];
	if (res !== null && typeof res === 'object' && Array.isArray((res as { rows?: unknown }).rows))
		return (res as { rows: Record<string, unknown>[] }).rows;
	throw new TypeError('query() returned neither rows nor a result with rows');
}

/* The single value of a one-row, one-column result. */
export async function queryValue(db: Queryable, text: string, values: unknown[]): Promise<unknown> {
	const rows = await queryRows(db, text, values);
	const row = rows[0];

	if (rows.length !== 1 || row === undefined)
		throw new TypeError(`expected one row, got ${rows.length}`);
	return Object.values(row)[0];
}
