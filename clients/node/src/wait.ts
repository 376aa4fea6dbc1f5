/*
 * waitPublished(): outbox.wait_published(), for read-your-publish flows
 * and tests.
 */

import { InvalidInputError } from './errors.js';
import { type Queryable, queryValue } from './executor.js';

/**
 * Waits until the event is published (true), or timeoutMs passes or the
 * event is dead-lettered (false).  The wait runs in the server and holds
 * db for its duration; call it outside REPEATABLE READ / SERIALIZABLE
 * transactions (TransactionStateError), after the emitting transaction
 * committed (NotFoundError before).  The role needs EXECUTE on
 * outbox.wait_published(uuid, interval).
 */
export async function waitPublished(db: Queryable, id: string, timeoutMs = 30000): Promise<boolean> {
	if (!Number.isFinite(timeoutMs) || timeoutMs < 0)
		throw new InvalidInputError(`timeout must be a finite number of milliseconds >= 0, not ${timeoutMs}`,
									{ code: '22023' });
	return (await queryValue(db,
							 'SELECT outbox.wait_published($1::pg_catalog.uuid, $2::pg_catalog.interval) AS published',
							 [id, `${timeoutMs} milliseconds`])) === true;
}
