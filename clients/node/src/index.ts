/*
 * @outbox-pg/client: a typed client for the outbox_pg PostgreSQL
 * extension.  It runs outbox_pg's SQL functions on a connection the
 * application already has (node-postgres, TypeORM, or any executor with
 * query(text, values)); it opens none of its own.
 */

export { type AggregateId, type EmitOptions, type EventCatalog, type EventOf, type OutboxEvent, type PayloadOf,
	defineEvents, emit, emitStatement } from './emit.js';
export { type PoolClientLike, type PoolLike, type Queryable } from './executor.js';
export { type ClaimOptions, type InboxResult, type IsolationLevel, type TransactionRunner, type WithInboxOptions,
	claim, withInbox } from './inbox.js';
export { waitPublished } from './wait.js';
export { type OutboxErrorOptions, FeatureNotSupportedError, InvalidInputError, NotFoundError, NotInstalledError,
	OutboxError, PayloadTooLargeError, PermissionDeniedError, ReadOnlyTransactionError, SerializationFailureError,
	TransactionStateError, errorClassFor, toOutboxError } from './errors.js';
