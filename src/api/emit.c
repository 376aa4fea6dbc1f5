/*-------------------------------------------------------------------------
 *
 * emit.c
 *		  outbox.emit(): write one event into the caller's transaction.
 *
 * The row is inserted straight through the executor's simple-insert path
 * (the one logical replication's apply worker uses): no parse, no plan, no
 * SPI.  That keeps emit() at the cost of the plain INSERT it replaces while
 * still checking constraints, maintaining every index and firing any
 * triggers a DBA may have put on the table.
 *
 * Privileges: the function does not consult search_path (tables are
 * found by OID under the extension's schema) and does not check table
 * privileges, so EXECUTE on outbox.emit() is the whole grant an
 * application role needs.  It is therefore not SECURITY DEFINER, which
 * would only add a user switch to every call.  EXECUTE is revoked from
 * PUBLIC by the install script.
 *
 * Message ids are UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, 12 bits
 * of sub-millisecond time kept strictly increasing within a backend, then
 * 62 random bits.  Time-ordered ids keep the primary key's insertions at
 * the right edge of the index instead of scattering them.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/emit.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
#include "utils/xid8.h"

#include "outbox_pg.h"
#include "guc.h"
#include "peertext.h"
#include "util.h"
#include "api/api.h"
#include "worker/worker.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox__events_insert);

/* argument positions of outbox.emit() */
#define ARG_TYPE			0
#define ARG_AGGREGATE_ID	1
#define ARG_PAYLOAD			2
#define ARG_AGGREGATE_TYPE	3
#define ARG_DESTINATION		4
#define ARG_HEADERS			5
#define ARG_TRACEPARENT		6
#define ARG_NOT_BEFORE		7

/* One event as outbox_emit() assembles it from its arguments. */
typedef struct EmitEvent
{
	char	   *type;
	char	   *aggregate_id;	/* NULL: none */
	char	   *aggregate_type; /* NULL: none */
	Datum		payload;
	char	   *destination;	/* NULL: matched no route */
	char	   *traceparent;	/* NULL: none */
	TimestampTz now;
	TimestampTz next_attempt_at;
	bool		ordered;		/* ordered per aggregate (ordering.c) */
} EmitEvent;

static char *emit_text_arg(FunctionCallInfo fcinfo, int argno);
static void emit_check_identity(FunctionCallInfo fcinfo, EmitEvent *ev);
static void emit_choose_destination(FunctionCallInfo fcinfo, EmitEvent *ev);
static void emit_trace_context(FunctionCallInfo fcinfo, EmitEvent *ev);
static void emit_check_traceparent(const char *traceparent);
static void emit_delivery_time(FunctionCallInfo fcinfo, EmitEvent *ev);
static void emit_generate_uuid_v7(unsigned char *out);
static void emit_build_row(FunctionCallInfo fcinfo, const EmitEvent *ev,
						   pg_uuid_t *id, Datum *values, bool *nulls);
static void emit_build_log_row(FunctionCallInfo fcinfo, const EmitEvent *ev,
							   pg_uuid_t *id, Datum *values, bool *nulls);
static Oid	emit_log_slot(const OutboxConfig **cfg);
static void emit_insert(Oid relid, int ncols, Datum *values, bool *nulls);

static int64 uuid_last_ms = 0;
static int	uuid_last_sub = 0;

/*
 * outbox.emit(type, aggregate_id, payload, aggregate_type, destination,
 *			   headers, traceparent, not_before) returns uuid
 *
 * The event goes into the current slot of the insert-only log (issue #21,
 * worker/README.store) with the transaction's xid.  Only between a library
 * upgrade and ALTER EXTENSION UPDATE, when the log does not exist yet, is
 * it written to the 0.3 table outbox.events, as that version did; the
 * update moves such rows into the store (see worker/version.c).
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	const OutboxConfig *cfg;
	EmitEvent	ev;
	pg_uuid_t  *id;
	Datum		values[Max((int) EV_NATTS, (int) LOG_NATTS)];
	bool		nulls[Max((int) EV_NATTS, (int) LOG_NATTS)];

	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot emit an event in a read-only transaction")));

	memset(&ev, 0, sizeof(ev));
	emit_check_identity(fcinfo, &ev);
	ev.payload = OutboxPayloadArg(fcinfo, ARG_PAYLOAD, true);
	cfg = OutboxGetConfig();
	emit_choose_destination(fcinfo, &ev);
	if (!PG_ARGISNULL(ARG_HEADERS))
		OutboxCheckHeaders(PG_GETARG_DATUM(ARG_HEADERS));
	emit_trace_context(fcinfo, &ev);
	emit_delivery_time(fcinfo, &ev);

	/*
	 * Ordered destination: wait for earlier uncommitted emits of the same
	 * aggregate, so that commit order is emit order (see ordering.c).  The
	 * id, which orders the aggregate, is generated after the wait.
	 */
	ev.ordered = (ev.destination && ev.aggregate_id &&
				  OutboxDestinationIsOrdered(ev.destination));
	if (ev.ordered)
		OutboxLockAggregate(ev.destination, ev.aggregate_id);

	id = palloc(sizeof(pg_uuid_t));
	emit_generate_uuid_v7(id->data);

	if (OidIsValid(cfg->log_relid))
	{
		Oid			relid = emit_log_slot(&cfg);

		emit_build_log_row(fcinfo, &ev, id, values, nulls);
		emit_insert(relid, LOG_NATTS, values, nulls);
		/* only this destination's relays look for new work (issue #19) */
		OutboxWakeDestinationAtCommit(ev.destination);
	}
	else
	{
		emit_build_row(fcinfo, &ev, id, values, nulls);
		emit_insert(cfg->events_relid, cfg->events_natts, values, nulls);
		OutboxWakeAtCommit();
	}

	PG_RETURN_UUID_P(id);
}

/*
 * The current log slot, locked.  Lock it before trusting the cached
 * choice: acquiring the lock reads the invalidations of every committed
 * rotation, so a switch that committed before it shows now, and
 * retention's condition (b) (see worker/retention.c) covers only writers
 * that locked the slot before the switch.
 */
static Oid
emit_log_slot(const OutboxConfig **cfg)
{
	Oid			relid;

	do
	{
		relid = (*cfg)->log_relid;
		if (!OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the outbox event log is not installed"),
					 errhint("Run ALTER EXTENSION outbox_pg UPDATE.")));
		LockRelationOid(relid, RowExclusiveLock);
		*cfg = OutboxGetConfig();
	} while ((*cfg)->log_relid != relid);
	return relid;
}

/*
 * An id the inserter gave must be new (outbox._events_insert).  Each slot
 * of the log has a primary key, but an id kept in another slot (the log
 * rotated in between), in outbox.retries or outbox.dead_events, or in
 * 0.3's events_0_3 was taken: the relay's statements find a log row by id
 * and destination and took one copy for the other (a retry carrying the
 * other's payload, a result recorded for the wrong one), and consumers,
 * who deduplicate by id, dropped the second event.
 */
static void
emit_check_new_id(Datum id)
{
	static SPIPlanPtr plan = NULL;
	Oid			argtypes[1] = {UUIDOID};
	Datum		args[1];
	bool		found;

	/*
	 * Two transactions giving the same id wait for each other here, so the
	 * second one's look (a fresh snapshot) sees the first one's row: in
	 * different slots no primary key makes them wait.
	 */
	OutboxLockEventId(DatumGetUUIDP(id));
	args[0] = id;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	WorkerKeepPlan(&plan,
				   "SELECT 1 FROM outbox.log AS l WHERE l.id OPERATOR(pg_catalog.=) $1"
				   " UNION ALL SELECT 1 FROM outbox.retries AS r"
				   "  WHERE r.id OPERATOR(pg_catalog.=) $1"
				   " UNION ALL SELECT 1 FROM outbox.dead_events AS d"
				   "  WHERE d.id OPERATOR(pg_catalog.=) $1"
				   " UNION ALL SELECT 1 FROM outbox.events_0_3 AS o"
				   "  WHERE o.id OPERATOR(pg_catalog.=) $1"
				   " LIMIT 1",
				   1, argtypes);
	if (SPI_execute_plan(plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look for the event's id");
	found = (SPI_processed > 0);
	SPI_finish();
	if (found)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("an event with id %s already exists",
						DatumGetCString(DirectFunctionCall1(uuid_out, id))),
				 errdetail("An event's id is its consumers' deduplication key: they would drop a second event with it."),
				 errhint("Leave id out to have one generated.")));
}

/*
 * outbox._events_insert(): INSTEAD OF INSERT trigger of the view
 * outbox.events (0.4.0).  A row inserted there without emit() goes into
 * the log like an emitted one, with the inserting transaction's xid, and
 * is delivered; emit()'s argument checks do not apply (the table had
 * none), but the destination is routed by type when NULL and an ordered
 * destination's aggregate lock is taken.  A missing id is generated;
 * only pending rows are accepted, and a given id must be new
 * (emit_check_new_id).  The row returned (RETURNING) carries the id.
 * Two checks do apply, for what the relay must be able to send:
 * per-event headers are checked as emit() checks them (a header line
 * with a line break, or a Content-Length of the row's own, split the
 * request on the wire, and the receiver's next answer acknowledged
 * another event), and created_at must be finite (the message's time).
 */
Datum
outbox__events_insert(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const OutboxConfig *cfg;
	TupleDesc	tupdesc;
	HeapTuple	newtup;
	Datum	   *ev_values;
	bool	   *ev_nulls;
	Datum		values[LOG_NATTS];
	bool		nulls[LOG_NATTS];
	char	   *destination = NULL;
	bool		ordered;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Oid			relid;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_INSTEAD(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox._events_insert() must be called as an INSTEAD OF INSERT row trigger")));

	tupdesc = RelationGetDescr(trigdata->tg_relation);
	if (tupdesc->natts < EV_NATTS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("view \"%s.%s\" does not have the expected columns",
						OUTBOX_SCHEMA, OUTBOX_EVENTS_TABLE)));
	ev_values = palloc(tupdesc->natts * sizeof(Datum));
	ev_nulls = palloc(tupdesc->natts * sizeof(bool));
	heap_deform_tuple(trigdata->tg_trigtuple, tupdesc, ev_values, ev_nulls);

	if (!ev_nulls[EV_STATUS - 1] &&
		strcmp(TextDatumGetCString(ev_values[EV_STATUS - 1]), "pending") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("only pending events can be inserted into outbox.events"),
				 errdetail("Since outbox_pg 0.4.0 outbox.events is a view over the event store; an inserted row is delivered like an emitted one.")));
	if (ev_nulls[EV_ID - 1])
	{
		pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

		emit_generate_uuid_v7(id->data);
		ev_values[EV_ID - 1] = UUIDPGetDatum(id);
		ev_nulls[EV_ID - 1] = false;
	}
	else
		emit_check_new_id(ev_values[EV_ID - 1]);
	if (!ev_nulls[EV_DESTINATION - 1])
		destination = TextDatumGetCString(ev_values[EV_DESTINATION - 1]);
	else if (!ev_nulls[EV_TYPE - 1])
	{
		const char *routed;

		routed = OutboxRouteEventType(TextDatumGetCString(ev_values[EV_TYPE - 1]));
		if (routed)
		{
			destination = pstrdup(routed);
			ev_values[EV_DESTINATION - 1] = CStringGetTextDatum(destination);
			ev_nulls[EV_DESTINATION - 1] = false;
		}
	}
	ordered = (destination && !ev_nulls[EV_AGGREGATE_ID - 1] &&
			   OutboxDestinationIsOrdered(destination));
	if (ordered)
	{
		OutboxLockAggregate(destination,
							TextDatumGetCString(ev_values[EV_AGGREGATE_ID - 1]));
		if (ev_nulls[EV_ORDERING_KEY - 1])
		{
			ev_values[EV_ORDERING_KEY - 1] = ev_values[EV_AGGREGATE_ID - 1];
			ev_nulls[EV_ORDERING_KEY - 1] = false;
		}
	}
	if (ev_nulls[EV_CREATED_AT - 1])
	{
		ev_values[EV_CREATED_AT - 1] = TimestampTzGetDatum(now);
		ev_nulls[EV_CREATED_AT - 1] = false;
	}
	else if (TIMESTAMP_NOT_FINITE(DatumGetTimestampTz(ev_values[EV_CREATED_AT - 1])))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("created_at of an event must be a finite time"),
				 errhint("Leave created_at out: it defaults to the transaction's start.")));
	if (!ev_nulls[EV_HEADERS - 1])
		OutboxCheckHeaders(ev_values[EV_HEADERS - 1]);
	if (!ev_nulls[EV_TRACEPARENT - 1])
		emit_check_traceparent(TextDatumGetCString(ev_values[EV_TRACEPARENT - 1]));
	if (!ev_nulls[EV_NEXT_ATTEMPT_AT - 1] &&
		TIMESTAMP_IS_NOEND(DatumGetTimestampTz(ev_values[EV_NEXT_ATTEMPT_AT - 1])))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("next_attempt_at of an event must be a finite time"),
				 errhint("Leave next_attempt_at out to deliver the event at once, or give the time of its first delivery.")));

	memset(nulls, true, sizeof(nulls));
#define COPY_COL(logcol, evcol) \
	do { values[(logcol) - 1] = ev_values[(evcol) - 1]; \
		 nulls[(logcol) - 1] = ev_nulls[(evcol) - 1]; } while (0)
	COPY_COL(LOG_ID, EV_ID);
	COPY_COL(LOG_TYPE, EV_TYPE);
	COPY_COL(LOG_AGGREGATE_TYPE, EV_AGGREGATE_TYPE);
	COPY_COL(LOG_AGGREGATE_ID, EV_AGGREGATE_ID);
	COPY_COL(LOG_PAYLOAD, EV_PAYLOAD);
	COPY_COL(LOG_HEADERS, EV_HEADERS);
	COPY_COL(LOG_TRACEPARENT, EV_TRACEPARENT);
	COPY_COL(LOG_DESTINATION, EV_DESTINATION);
	COPY_COL(LOG_ORDERING_KEY, EV_ORDERING_KEY);
	COPY_COL(LOG_CREATED_AT, EV_CREATED_AT);
#undef COPY_COL
	values[LOG_XID - 1] = FullTransactionIdGetDatum(GetTopFullTransactionId());
	nulls[LOG_XID - 1] = false;
	if (!ev_nulls[EV_NEXT_ATTEMPT_AT - 1] &&
		DatumGetTimestampTz(ev_values[EV_NEXT_ATTEMPT_AT - 1]) > now)
	{
		values[LOG_NOT_BEFORE - 1] = ev_values[EV_NEXT_ATTEMPT_AT - 1];
		nulls[LOG_NOT_BEFORE - 1] = false;
	}

	cfg = OutboxGetConfig();
	relid = emit_log_slot(&cfg);
	emit_insert(relid, LOG_NATTS, values, nulls);
	OutboxWakeDestinationAtCommit(destination);

	/* what RETURNING shows: the row as stored, pending */
	if (ev_nulls[EV_STATUS - 1])
	{
		ev_values[EV_STATUS - 1] = CStringGetTextDatum("pending");
		ev_nulls[EV_STATUS - 1] = false;
	}
	if (ev_nulls[EV_ATTEMPTS - 1])
	{
		ev_values[EV_ATTEMPTS - 1] = Int32GetDatum(0);
		ev_nulls[EV_ATTEMPTS - 1] = false;
	}
	if (ev_nulls[EV_NEXT_ATTEMPT_AT - 1])
	{
		ev_values[EV_NEXT_ATTEMPT_AT - 1] = ev_values[EV_CREATED_AT - 1];
		ev_nulls[EV_NEXT_ATTEMPT_AT - 1] = false;
	}
	newtup = heap_form_tuple(tupdesc, ev_values, ev_nulls);
	return PointerGetDatum(newtup);
}

static char *
emit_text_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

/* The event type (required) and the aggregate's id and type (optional). */
static void
emit_check_identity(FunctionCallInfo fcinfo, EmitEvent *ev)
{
	if (PG_ARGISNULL(ARG_TYPE))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("event type must not be null")));
	ev->type = emit_text_arg(fcinfo, ARG_TYPE);
	OutboxCheckIdentifier("event type", ev->type, OUTBOX_MAX_TYPE_LEN);

	ev->aggregate_id = emit_text_arg(fcinfo, ARG_AGGREGATE_ID);
	if (ev->aggregate_id)
		OutboxCheckIdentifier("aggregate id", ev->aggregate_id,
							  OUTBOX_MAX_ID_LEN);
	ev->aggregate_type = emit_text_arg(fcinfo, ARG_AGGREGATE_TYPE);
	if (ev->aggregate_type)
		OutboxCheckIdentifier("aggregate type", ev->aggregate_type,
							  OUTBOX_MAX_TYPE_LEN);
}

/*
 * The payload argument of outbox.emit() (event) or inbox.receive(): not
 * null, and its size, checked without detoasting, within
 * outbox.max_payload_size.
 */
Datum
OutboxPayloadArg(FunctionCallInfo fcinfo, int argno, bool event)
{
	Datum		payload;
	Size		payload_size;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 event ? errmsg("event payload must not be null") :
				 errmsg("message payload must not be null"),
				 event ? errhint("Use '{}'::jsonb or 'null'::jsonb for an event without data.") :
				 errhint("Use '{}'::jsonb or 'null'::jsonb for a message without data.")));
	payload = PG_GETARG_DATUM(argno);
	payload_size = toast_raw_datum_size(payload) - VARHDRSZ;
	if (payload_size > (Size) outbox_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 event ? errmsg("event payload is too large") :
				 errmsg("message payload is too large"),
				 errdetail("The payload has %zu bytes; outbox.max_payload_size is %d bytes.",
						   payload_size, outbox_max_payload_size),
				 event ? errhint("Store large documents elsewhere and emit a reference to them.") : 0));
	return payload;
}

/* The destination: named explicitly (it must exist), or routed by type. */
static void
emit_choose_destination(FunctionCallInfo fcinfo, EmitEvent *ev)
{
	const char *routed;

	ev->destination = emit_text_arg(fcinfo, ARG_DESTINATION);
	if (ev->destination)
	{
		OutboxCheckIdentifier("destination name", ev->destination,
							  OUTBOX_MAX_NAME_LEN);
		if (!OutboxDestinationExists(ev->destination))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("destination \"%s\" does not exist", ev->destination),
					 errhint("Create it in outbox.destinations first, or omit the destination to route by event type.")));
		return;
	}
	routed = OutboxRouteEventType(ev->type);
	ev->destination = routed ? pstrdup(routed) : NULL;
}

/*
 * A traceparent given to emit() or written into outbox.events.  The value
 * refused is quoted as a peer's text is (peertext.c), cut at
 * EMIT_TRACEPARENT_SHOWN bytes: it came from outside the application often
 * enough (an incoming request's header), and its line breaks and escape
 * sequences reached the client's error and the server log as they were.
 */
#define EMIT_TRACEPARENT_SHOWN	128

static void
emit_check_traceparent(const char *traceparent)
{
	if (OutboxTraceparentIsValid(traceparent))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid traceparent \"%s\"",
					OutboxServerTextForLog(traceparent, EMIT_TRACEPARENT_SHOWN)),
			 errdetail("A traceparent has the form \"00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>\" in lower case, with non-zero ids; a later version may append fields of visible ASCII characters (no spaces or control characters) after a dash, up to 512 characters in all.")));
}

/* The trace context: the argument, else the session/transaction setting. */
static void
emit_trace_context(FunctionCallInfo fcinfo, EmitEvent *ev)
{
	ev->traceparent = emit_text_arg(fcinfo, ARG_TRACEPARENT);
	if (ev->traceparent)
		emit_check_traceparent(ev->traceparent);
	else if (outbox_traceparent && outbox_traceparent[0] != '\0')
		ev->traceparent = outbox_traceparent;
}

/* The first delivery: now, or not_before if that is later. */
static void
emit_delivery_time(FunctionCallInfo fcinfo, EmitEvent *ev)
{
	ev->now = GetCurrentTransactionStartTimestamp();
	ev->next_attempt_at = ev->now;
	if (!PG_ARGISNULL(ARG_NOT_BEFORE))
	{
		TimestampTz not_before = PG_GETARG_TIMESTAMPTZ(ARG_NOT_BEFORE);

		if (TIMESTAMP_NOT_FINITE(not_before))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("not_before must be a finite timestamp")));
		if (not_before > ev->now)
			ev->next_attempt_at = not_before;
	}
}

static void
emit_generate_uuid_v7(unsigned char *out)
{
	int64		unix_us = OutboxUnixMicros(GetCurrentTimestamp());
	int64		ms;
	int			sub;

	ms = unix_us / 1000;
	sub = (int) ((unix_us % 1000) * 4096 / 1000);

	/* strictly increasing within this backend, even if the clock steps back */
	if (ms < uuid_last_ms || (ms == uuid_last_ms && sub <= uuid_last_sub))
	{
		ms = uuid_last_ms;
		sub = uuid_last_sub + 1;
		if (sub > 0xfff)
		{
			ms++;
			sub = 0;
		}
	}
	uuid_last_ms = ms;
	uuid_last_sub = sub;

	if (!pg_strong_random(out + 8, 8))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values")));

	OutboxUuidV7SetTime(out, ms);
	out[6] = 0x70 | ((sub >> 8) & 0x0f);
	out[7] = sub & 0xff;
	out[8] = (out[8] & 0x3f) | 0x80;
}

/* The row of outbox.events, by EV_* column; absent values are NULL. */
static void
emit_build_row(FunctionCallInfo fcinfo, const EmitEvent *ev, pg_uuid_t *id,
			   Datum *values, bool *nulls)
{
	memset(nulls, true, EV_NATTS * sizeof(bool));
#define SET_COL(col, datum) \
	do { values[(col) - 1] = (datum); nulls[(col) - 1] = false; } while (0)
	SET_COL(EV_ID, UUIDPGetDatum(id));
	SET_COL(EV_TYPE, PG_GETARG_DATUM(ARG_TYPE));
	if (ev->aggregate_type)
		SET_COL(EV_AGGREGATE_TYPE, PG_GETARG_DATUM(ARG_AGGREGATE_TYPE));
	if (ev->aggregate_id)
		SET_COL(EV_AGGREGATE_ID, PG_GETARG_DATUM(ARG_AGGREGATE_ID));
	SET_COL(EV_PAYLOAD, ev->payload);
	if (!PG_ARGISNULL(ARG_HEADERS))
		SET_COL(EV_HEADERS, PG_GETARG_DATUM(ARG_HEADERS));
	if (ev->traceparent)
		SET_COL(EV_TRACEPARENT, CStringGetTextDatum(ev->traceparent));
	if (ev->destination)
		SET_COL(EV_DESTINATION, CStringGetTextDatum(ev->destination));
	SET_COL(EV_STATUS, CStringGetTextDatum("pending"));
	SET_COL(EV_ATTEMPTS, Int32GetDatum(0));
	SET_COL(EV_NEXT_ATTEMPT_AT, TimestampTzGetDatum(ev->next_attempt_at));
	SET_COL(EV_CREATED_AT, TimestampTzGetDatum(ev->now));
	if (ev->ordered)
		SET_COL(EV_ORDERING_KEY, PG_GETARG_DATUM(ARG_AGGREGATE_ID));
#undef SET_COL
}

/*
 * The row of the log slot, by LOG_* column.  xid is the top-level
 * transaction's: a destination's position is a snapshot of top-level xids
 * (README.store, section 3.1); it is set here rather than by a column
 * default so that the row costs no expression evaluation.  not_before is
 * kept only when it is later than the transaction's start.
 */
static void
emit_build_log_row(FunctionCallInfo fcinfo, const EmitEvent *ev, pg_uuid_t *id,
				   Datum *values, bool *nulls)
{
	memset(nulls, true, LOG_NATTS * sizeof(bool));
#define SET_COL(col, datum) \
	do { values[(col) - 1] = (datum); nulls[(col) - 1] = false; } while (0)
	SET_COL(LOG_ID, UUIDPGetDatum(id));
	SET_COL(LOG_XID, FullTransactionIdGetDatum(GetTopFullTransactionId()));
	SET_COL(LOG_TYPE, PG_GETARG_DATUM(ARG_TYPE));
	if (ev->aggregate_type)
		SET_COL(LOG_AGGREGATE_TYPE, PG_GETARG_DATUM(ARG_AGGREGATE_TYPE));
	if (ev->aggregate_id)
		SET_COL(LOG_AGGREGATE_ID, PG_GETARG_DATUM(ARG_AGGREGATE_ID));
	SET_COL(LOG_PAYLOAD, ev->payload);
	if (!PG_ARGISNULL(ARG_HEADERS))
		SET_COL(LOG_HEADERS, PG_GETARG_DATUM(ARG_HEADERS));
	if (ev->traceparent)
		SET_COL(LOG_TRACEPARENT, CStringGetTextDatum(ev->traceparent));
	if (ev->destination)
		SET_COL(LOG_DESTINATION, CStringGetTextDatum(ev->destination));
	if (ev->ordered)
		SET_COL(LOG_ORDERING_KEY, PG_GETARG_DATUM(ARG_AGGREGATE_ID));
	if (ev->next_attempt_at > ev->now)
		SET_COL(LOG_NOT_BEFORE, TimestampTzGetDatum(ev->next_attempt_at));
	SET_COL(LOG_CREATED_AT, TimestampTzGetDatum(ev->now));
#undef SET_COL
}

/*
 * Insert one tuple through the executor's simple-insert path.
 */
static void
emit_insert(Oid relid, int ncols, Datum *values, bool *nulls)
{
	OutboxInsertState st;
	TupleTableSlot *slot;

	OutboxBeginInsert(&st, relid, false);
	slot = st.slot;
	/*
	 * Columns added by a later version than this library stay NULL; columns
	 * this library knows but the table does not have yet (upgrade pending,
	 * see worker/version.c) are left out.
	 */
	for (int i = 0; i < ncols && i < slot->tts_tupleDescriptor->natts; i++)
	{
		slot->tts_values[i] = values[i];
		slot->tts_isnull[i] = nulls[i];
	}
	ExecStoreVirtualTuple(slot);

	if (st.rri->ri_TrigDesc)
		AfterTriggerBeginQuery();
	ExecSimpleRelationInsert(st.rri, st.estate, slot);
	if (st.rri->ri_TrigDesc)
		AfterTriggerEndQuery(st.estate);

	OutboxEndInsert(&st);
}
