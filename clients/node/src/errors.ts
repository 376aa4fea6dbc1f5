/*
 * Typed errors: every error the server raises while the client calls
 * outbox_pg is rethrown as an OutboxError subclass chosen by its SQLSTATE,
 * with the server's message, detail and hint, and the driver's error as
 * `cause`.  Errors without a SQLSTATE (a broken connection, a bug in the
 * caller's callback) pass through unchanged.
 */

export interface OutboxErrorOptions {
	/** The SQLSTATE, e.g. "22023". */
	code: string;
	detail?: string | undefined;
	hint?: string | undefined;
	cause?: unknown;
}

/** Base class: any SQLSTATE the more specific classes below do not cover. */
export class OutboxError extends Error {
	/** The five-character SQLSTATE the server (or this client) reported. */
	readonly code: string;
	readonly detail: string | undefined;
	readonly hint: string | undefined;

	constructor(message: string, options: OutboxErrorOptions) {
		super(message, options.cause === undefined ? undefined : { cause: options.cause });
		this.name = new.target.name;
		this.code = options.code;
		this.detail = options.detail;
		this.hint = options.hint;
	}

	/** True when running the same transaction again may succeed (class 40). */
	get retryable(): boolean {
		return this.code.startsWith('40');
	}
}

/**
 * Bad input to emit(), claim() or waitPublished(): SQLSTATE class 22
 * (22023 invalid_parameter_value, 22004 null_value_not_allowed, 22P02
 * invalid_text_representation, ...).  Retrying does not help.
 */
export class InvalidInputError extends OutboxError {}

/** The payload is larger than outbox.max_payload_size (54000). */
export class PayloadTooLargeError extends InvalidInputError {}

/** No such destination, or no such committed event (42704). */
export class NotFoundError extends OutboxError {}

/**
 * The database has no outbox_pg, or an older version without the function
 * called (3F000 invalid_schema_name, 42883 undefined_function).
 */
export class NotInstalledError extends OutboxError {}

/** The role lacks EXECUTE on the function (42501). */
export class PermissionDeniedError extends OutboxError {}

/** The server does not support the call in this form (0A000). */
export class FeatureNotSupportedError extends OutboxError {}

/** emit() or claim() in a read-only transaction or on a standby (25006). */
export class ReadOnlyTransactionError extends OutboxError {}

/**
 * The transaction is in the wrong state for the call (class 25 but 25006),
 * e.g. waitPublished() inside REPEATABLE READ or SERIALIZABLE (25000).
 */
export class TransactionStateError extends OutboxError {}

/**
 * The transaction lost a serialization conflict or a deadlock (class 40):
 * run it again.
 */
export class SerializationFailureError extends OutboxError {}

type ErrorClass = new (message: string, options: OutboxErrorOptions) => OutboxError;

const BY_CODE: Readonly<Record<string, ErrorClass>> = {
	'54000': PayloadTooLargeError,
	'42704': NotFoundError,
	'3F000': NotInstalledError,
	'42883': NotInstalledError,
	'42501': PermissionDeniedError,
	'0A000': FeatureNotSupportedError,
	'25006': ReadOnlyTransactionError,
};

const BY_CLASS: Readonly<Record<string, ErrorClass>> = {
	'22': InvalidInputError,
	'25': TransactionStateError,
	'40': SerializationFailureError,
};

const HINTS: Readonly<Record<string, string>> = {
	'22P02': 'If a JavaScript array was passed as the parameter of a jsonb argument, node-postgres sent it as a PostgreSQL array literal: pass JSON.stringify(value) and cast it to jsonb (emit() of @outbox-pg/client does).',
	'3F000': 'Is outbox_pg installed in this database? CREATE EXTENSION outbox_pg; (as a superuser).',
	'42883': 'Is outbox_pg installed in this database, at a version that has this function? See ALTER EXTENSION outbox_pg UPDATE.',
	'42501': 'Grant the role EXECUTE on the function (see "Roles" in outbox_pg: docs/security.md).',
};

/** The error class for a SQLSTATE. */
export function errorClassFor(code: string): ErrorClass {
	return BY_CODE[code] ?? BY_CLASS[code.slice(0, 2)] ?? OutboxError;
}

/* A SQLSTATE: five digits or upper-case letters. */
const SQLSTATE = /^[0-9A-Z]{5}$/;

interface DriverErrorFields {
	code?: unknown;
	message?: unknown;
	detail?: unknown;
	hint?: unknown;
	driverError?: unknown;
}

function text(v: unknown): string | undefined {
	return typeof v === 'string' && v !== '' ? v : undefined;
}

/*
 * The SQLSTATE-carrying object: node-postgres's DatabaseError itself, or
 * the driver error a wrapper keeps (TypeORM's QueryFailedError has it as
 * driverError).
 */
function findDriverError(err: unknown): DriverErrorFields | undefined {
	for (let e = err, depth = 0; e !== null && typeof e === 'object' && depth < 4; depth++) {
		const f = e as DriverErrorFields;
		if (typeof f.code === 'string' && SQLSTATE.test(f.code))
			return f;
		e = f.driverError ?? (e as { cause?: unknown }).cause;
	}
	return undefined;
}

/**
 * Maps a driver error to the OutboxError subclass of its SQLSTATE; returns
 * anything without a SQLSTATE (and an OutboxError) unchanged.  Useful for
 * errors of the application's own SQL around emit() and claim().
 */
export function toOutboxError(err: unknown): unknown {
	if (err instanceof OutboxError)
		return err;
	const f = findDriverError(err);
	if (f === undefined)
		return err;
	const code = f.code as string;
	const cls = errorClassFor(code);
	return new cls(text(f.message) ?? `SQLSTATE ${code}`, {
		code,
		detail: text(f.detail),
		hint: text(f.hint) ?? HINTS[code],
		cause: err,
	});
}
