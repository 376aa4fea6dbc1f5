/*
 * The consumer side: claim() (inbox.claim()) dedupes a message id in the
 * caller's transaction; withInbox() runs the claim and the business write
 * in one transaction of its own (on a node-postgres pool, or through a
 * TypeORM DataSource's transaction()) and skips the write for a duplicate.
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
 * What runs a callback in a transaction of its own and hands it the
 * transaction's executor: a TypeORM DataSource (or EntityManager), whose
 * transaction() commits when the callback returns and rolls back when it
 * throws.
 */
export interface TransactionRunner<M extends Queryable = Queryable> {
	transaction<R>(fn: (manager: M) => Promise<R>): Promise<R>;
}

function isRunner(x: PoolLike<PoolClientLike> | TransactionRunner<Queryable>): x is TransactionRunner<Queryable> {
	return typeof (x as { transaction?: unknown }).transaction === 'function';
}

/**
 * In one transaction, claims messageId and runs fn when the claim is new;
 * commits both, or rolls both back if fn throws (the error is rethrown,
 * and a redelivery of the message runs fn again).  A duplicate commits
 * nothing and skips fn: { ran: false }.  fn must do its writes on what it
 * is given:
 *
 * - a node-postgres Pool: a PoolClient taken from it, in BEGIN ... COMMIT;
 * - a TypeORM DataSource: its transaction()'s EntityManager.
 *
 * Annotate fn's parameter (client: PoolClient, manager: EntityManager) for
 * the driver's own type.
 */
export async function withInbox<T, C extends PoolClientLike = PoolClientLike>(
	pool: PoolLike<C>, messageId: string, fn: (client: C) => Promise<T> | T,
	options?: WithInboxOptions): Promise<InboxResult<T>>;
export async function withInbox<T, M extends Queryable = Queryable>(
	runner: TransactionRunner<M>, messageId: string, fn: (manager: M) => Promise<T> | T,
	options?: WithInboxOptions): Promise<InboxResult<T>>;
export async function withInbox<T>(
	db: PoolLike<PoolClientLike> | TransactionRunner<Queryable>, messageId: string,
	fn: (client: any) => Promise<T> | T, options: WithInboxOptions = {}): Promise<InboxResult<T>> {
	const iso = options.isolation;

	if (iso !== undefined && !Object.hasOwn(ISOLATION, iso))
		throw new TypeError(`unknown isolation level "${String(iso)}"`);
	if (isRunner(db))
		return withInboxRunner(db, messageId, fn, options);
	return withInboxPool(db, messageId, fn, options);
}

async function withInboxRunner<T>(runner: TransactionRunner<Queryable>, messageId: string,
								  fn: (manager: Queryable) => Promise<T> | T,
								  options: WithInboxOptions): Promise<InboxResult<T>> {
	const body = async (manager: Queryable): Promise<InboxResult<T>> => {
		if (!(await claim(manager, messageId, options)))
			return { ran: false };
		return { ran: true, value: await fn(manager) };
	};

	if (options.isolation === undefined)
		return runner.transaction(body);
	/* TypeORM: transaction(isolationLevel, fn), the level in SQL's words */
	return (runner as unknown as {
		transaction(level: string, f: typeof body): Promise<InboxResult<T>>;
	}).transaction(ISOLATION[options.isolation], body);
}

async function withInboxPool<T>(pool: PoolLike<PoolClientLike>, messageId: string,
								fn: (client: PoolClientLike) => Promise<T> | T,
								options: WithInboxOptions): Promise<InboxResult<T>> {
	const client = await pool.connect();
	let broken: Error | undefined;

	try {
		const iso = options.isolation;

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
