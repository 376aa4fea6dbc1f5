/*
 * emit(): writes an event into the outbox in the caller's transaction
 * (outbox.emit()), and defineEvents(): a catalogue that ties each event
 * type to the type of its payload.
 *
 * The payload always travels as JSON text cast to jsonb.  node-postgres
 * sends a JavaScript array parameter as a PostgreSQL array literal
 * ('{1,2}'), which jsonb refuses (22P02); serialising here makes every
 * JSON value, arrays included, arrive as itself.
 */

import { InvalidInputError } from './errors.js';
import { type Queryable, queryValue } from './executor.js';

/** The id of the entity an event is about; numbers are sent as text. */
export type AggregateId = string | number | bigint | null;

/** What outbox.emit() takes besides type, aggregate id and payload. */
export interface EmitOptions {
	/** e.g. 'payment' */
	aggregateType?: string | null | undefined;
	/** A destination name; default: the route of the event's type. */
	destination?: string | null | undefined;
	/** Extra request headers for this event, name => value. */
	headers?: Readonly<Record<string, string>> | null | undefined;
	/** W3C trace context; default: the outbox.traceparent setting. */
	traceparent?: string | null | undefined;
	/** Deliver no earlier than this time. */
	notBefore?: Date | string | null | undefined;
}

/** One event to emit. */
export interface OutboxEvent<T extends string = string, P = unknown> extends EmitOptions {
	/** e.g. 'payment.created' */
	type: T;
	aggregateId: AggregateId;
	/** Any value JSON.stringify() can serialise; sent as jsonb. */
	payload: P;
}

/*
 * JSON text of a payload or headers value.  undefined (and a function or a
 * symbol, which JSON.stringify() also drops) would become SQL NULL, which
 * emit() refuses anyway; a BigInt or a cycle make JSON.stringify() throw.
 */
function toJson(value: unknown, what: string): string {
	let json: string | undefined;

	try {
		json = JSON.stringify(value);
	}
	catch (err) {
		throw new InvalidInputError(`${what} cannot be serialised as JSON: ${err instanceof Error ? err.message : String(err)}`,
									{ code: '22023', cause: err });
	}
	if (json === undefined)
		throw new InvalidInputError(`${what} must be a JSON value, not ${typeof value}`,
									{ code: '22004' });
	return json;
}

function aggregateText(id: AggregateId | undefined): string | null {
	if (id === null || id === undefined)
		return null;
	return typeof id === 'string' ? id : id.toString();
}

/*
 * The statement and its parameters.  Only the options given are passed,
 * by name, so the server's defaults apply to the others.  Every type is
 * schema-qualified: the caller's search_path may shadow unqualified names.
 */
export function emitStatement(event: OutboxEvent): { text: string; values: unknown[] } {
	const values: unknown[] = [event.type, aggregateText(event.aggregateId), toJson(event.payload, 'event payload')];
	const args = ['$1::pg_catalog.text', '$2::pg_catalog.text', '$3::pg_catalog.jsonb'];
	const add = (name: string, value: unknown, type: string): void => {
		values.push(value);
		args.push(`${name} => $${values.length}::pg_catalog.${type}`);
	};

	if (event.aggregateType != null)
		add('aggregate_type', event.aggregateType, 'text');
	if (event.destination != null)
		add('destination', event.destination, 'text');
	if (event.headers != null)
		add('headers', toJson(event.headers, 'headers'), 'jsonb');
	if (event.traceparent != null)
		add('traceparent', event.traceparent, 'text');
	if (event.notBefore != null)
	{
		const t = event.notBefore;

		if (t instanceof Date && Number.isNaN(t.getTime()))
			throw new InvalidInputError('notBefore is an invalid Date', { code: '22023' });
		add('not_before', t instanceof Date ? t.toISOString() : t, 'timestamptz');
	}
	return { text: `SELECT outbox.emit(${args.join(', ')}) AS id`, values };
}

/**
 * Writes one event into the outbox in db's current transaction and returns
 * its message id (a UUID).  Call it on the connection that does the
 * business write, inside the same BEGIN ... COMMIT: the event then commits
 * or rolls back with it.
 */
export async function emit(db: Queryable, event: OutboxEvent): Promise<string> {
	const { text, values } = emitStatement(event);

	return String(await queryValue(db, text, values));
}

/** The events of a catalogue: for each type, an OutboxEvent with its payload type. */
export type EventOf<M> = { [K in keyof M & string]: OutboxEvent<K, M[K]> }[keyof M & string];

/** The payload type of event type K in catalogue M. */
export type PayloadOf<M, K extends keyof M> = M[K];

/** A catalogue of event types, made by defineEvents(). */
export interface EventCatalog<M> {
	/** emit() that accepts only the catalogue's types, each with its payload type. */
	emit(db: Queryable, event: EventOf<M>): Promise<string>;
	/** Builds an event of type `type` (for a later emit(), or for tests). */
	event<K extends keyof M & string>(type: K, aggregateId: AggregateId, payload: M[K],
									  options?: EmitOptions): OutboxEvent<K, M[K]>;
}

/**
 * A typed catalogue of the application's events, one payload type per
 * event type:
 *
 *     const events = defineEvents<{
 *         'payment.created': { amount: number; currency: string };
 *         'payment.refunded': { amount: number; reason: string | null };
 *     }>();
 *     await events.emit(client, { type: 'payment.created', aggregateId: id,
 *                                 payload: { amount: 1250, currency: 'EUR' } });
 *
 * It only adds types; at run time it is emit().
 */
export function defineEvents<M extends object>(): EventCatalog<M> {
	return {
		emit: (db, event) => emit(db, event),
		event: (type, aggregateId, payload, options) => ({ ...options, type, aggregateId, payload }),
	};
}
