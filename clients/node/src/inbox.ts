/*
 * The consumer side: claim() (inbox.claim()) dedupes a message id in the
 * caller's transaction; withInbox() runs the claim and the business write
 * in one transaction of its own and skips the write for a duplicate.
 */

import { toOutboxError } from './errors.js';
import { type PoolClientLike, type PoolLike, type Queryable, queryValue } from './executor.js';

export interface ClaimOptions {
	/** Consumers of one database dedupe independently; default 'default'. */
	consumer?: string | undefined;
	/**
	 * How long the claim is kept: milliseconds, or an interval such as
	 * '30 days'; default the outbox.claim_retention setting.  It must
	 * outlive every redelivery of the message (at least
	 * outbox.redelivery_window, or the server refuses it).
	 */
	ttl?: number | string | undefined;
}

export type IsolationLevel = 'read committed' | 'repeatable read' | 'serializable';

export interface WithInboxOptions extends ClaimOptions {
	/** The transaction's isolation level; default the server's (read committed). */
	isolation?: IsolationLevel | undefined;
}

/** What withInbox() did: ran fn (and committed), or skipped a duplicate. */
export type InboxResult<T> = { ran: true; value: T } | { ran: false };

/**
 * Claims a message id for a consumer in db's current transaction: true
 * the first time, false for a duplicate.  Do the business write only when
 * true, in the same transaction; a rollback un-claims.
 */
export async function claim(db: Queryable, messageId: string, options: ClaimOptions = {}): Promise<boolean> {
	const values: unknown[] = [messageId];
	const args = ['$1::pg_catalog.text'];

	if (options.consumer !== undefined)
	{
		values.push(options.consumer);
		args.push(`consumer => $${values.length}::pg_catalog.text`);
	}
	if (options.ttl !== undefined)
	{
		values.push(typeof options.ttl === 'number' ? `${options.ttl} milliseconds` : options.ttl);
		args.push(`ttl => $${values.length}::pg_catalog.interval`);
	}
	return (await queryValue(db, `SELECT inbox.claim(${args.join(', ')}) AS claimed`, values)) === true;
}

const ISOLATION: Readonly<Record<IsolationLevel, string>> = {
	'read committed': 'READ COMMITTED',
	'repeatable read': 'REPEATABLE READ',
	'serializable': 'SERIALIZABLE',
};

/*
 * Runs a transaction-control statement.  Its failure is the connection's
 * problem, not fn's: the error is mapped like the calls' errors.
 */
async function control(client: Queryable, text: string): Promise<void> {
	try {
		await client.query(text);
	}
	catch (err) {
		throw toOutboxError(err);
	}
}

/**
 * Takes a connection from the pool and, in one transaction, claims
 * messageId and runs fn(client) when the claim is new; commits both, or
 * rolls both back if fn throws (the error is rethrown, and a redelivery
 * of the message runs fn again).  A duplicate commits nothing and skips
 * fn: { ran: false }.  fn must do its writes on the client it is given.
 */
export async function withInbox<T, C extends PoolClientLike = PoolClientLike>(
	pool: PoolLike<C>, messageId: string, fn: (client: C) => Promise<T> | T,
	options: WithInboxOptions = {}): Promise<InboxResult<T>> {
	const client = await pool.connect();
	let broken: Error | undefined;

	try {
		const iso = options.isolation;

		if (iso !== undefined && !(iso in ISOLATION))
			throw new TypeError(`unknown isolation level "${String(iso)}"`);
		try {
			await control(client, iso === undefined ? 'BEGIN' : `BEGIN ISOLATION LEVEL ${ISOLATION[iso]}`);
		}
		catch (err) {
			broken = err instanceof Error ? err : new Error(String(err));
			throw err;
		}
		try {
			const claimed = await claim(client, messageId, options);

			if (!claimed)
			{
				await control(client, 'ROLLBACK');
				return { ran: false };
			}
			const value = await fn(client);

			await control(client, 'COMMIT');
			return { ran: true, value };
		}
		catch (err) {
			try {
				await client.query('ROLLBACK');
			}
			catch (rollbackErr) {
				/* the connection is unusable: the pool must not lend it again */
				broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
			}
			throw err;
		}
	}
	finally {
		client.release(broken);
	}
}
