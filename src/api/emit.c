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
 *		  src/emit.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "api/api.h"

PG_FUNCTION_INFO_V1(outbox_emit);

/* argument positions of outbox.emit() */
#define ARG_TYPE			0
#define ARG_AGGREGATE_ID	1
#define ARG_PAYLOAD			2
#define ARG_AGGREGATE_TYPE	3
#define ARG_DESTINATION		4
#define ARG_HEADERS			5
#define ARG_TRACEPARENT		6
#define ARG_NOT_BEFORE		7

static int64 uuid_last_ms = 0;
static int	uuid_last_sub = 0;

void
OutboxGenerateUuidV7(unsigned char *out)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		unix_us;
	int64		ms;
	int			sub;

	unix_us = now + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
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

	for (int i = 0; i < 6; i++)
		out[i] = (unsigned char) (ms >> (40 - 8 * i));
	out[6] = 0x70 | ((sub >> 8) & 0x0f);
	out[7] = sub & 0xff;
	out[8] = (out[8] & 0x3f) | 0x80;
}

static char *
emit_text_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
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
	 * see upgrade.c) are left out.
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

/*
 * outbox.emit(type, aggregate_id, payload, aggregate_type, destination,
 *			   headers, traceparent, not_before) returns uuid
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	const OutboxConfig *cfg;
	char	   *type;
	char	   *aggregate_id;
	char	   *aggregate_type;
	char	   *destination;
	char	   *traceparent;
	Datum		payload;
	Size		payload_size;
	TimestampTz now;
	TimestampTz next_attempt_at;
	pg_uuid_t  *id;
	bool		ordered;
	Datum		values[EV_NATTS];
	bool		nulls[EV_NATTS];

	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot emit an event in a read-only transaction")));

	/* type */
	if (PG_ARGISNULL(ARG_TYPE))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("event type must not be null")));
	type = emit_text_arg(fcinfo, ARG_TYPE);
	OutboxCheckIdentifier("event type", type, OUTBOX_MAX_TYPE_LEN);

	/* aggregate */
	aggregate_id = emit_text_arg(fcinfo, ARG_AGGREGATE_ID);
	if (aggregate_id)
		OutboxCheckIdentifier("aggregate id", aggregate_id, OUTBOX_MAX_ID_LEN);
	aggregate_type = emit_text_arg(fcinfo, ARG_AGGREGATE_TYPE);
	if (aggregate_type)
		OutboxCheckIdentifier("aggregate type", aggregate_type,
							  OUTBOX_MAX_TYPE_LEN);

	/* payload: size checked without detoasting */
	if (PG_ARGISNULL(ARG_PAYLOAD))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("event payload must not be null"),
				 errhint("Use '{}'::jsonb or 'null'::jsonb for an event without data.")));
	payload = PG_GETARG_DATUM(ARG_PAYLOAD);
	payload_size = toast_raw_datum_size(payload) - VARHDRSZ;
	if (payload_size > (Size) outbox_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event payload is too large"),
				 errdetail("The payload has %zu bytes; outbox.max_payload_size is %d bytes.",
						   payload_size, outbox_max_payload_size),
				 errhint("Store large documents elsewhere and emit a reference to them.")));

	/* destination: named explicitly, or routed by type */
	destination = emit_text_arg(fcinfo, ARG_DESTINATION);
	cfg = OutboxGetConfig();
	if (destination)
	{
		OutboxCheckIdentifier("destination name", destination,
							  OUTBOX_MAX_NAME_LEN);
		if (!OutboxDestinationExists(destination))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("destination \"%s\" does not exist", destination),
					 errhint("Create it in outbox.destinations first, or omit the destination to route by event type.")));
	}
	else
	{
		const char *routed = OutboxRouteEventType(type);

		destination = routed ? pstrdup(routed) : NULL;
	}

	/* headers */
	if (!PG_ARGISNULL(ARG_HEADERS))
		OutboxCheckHeaders(PG_GETARG_DATUM(ARG_HEADERS));

	/* trace context: argument, else the session/transaction setting */
	traceparent = emit_text_arg(fcinfo, ARG_TRACEPARENT);
	if (traceparent)
	{
		if (!OutboxTraceparentIsValid(traceparent))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid traceparent \"%s\"", traceparent),
					 errdetail("A traceparent has the form \"00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>\" in lower case, with non-zero ids.")));
	}
	else if (outbox_traceparent && outbox_traceparent[0] != '\0')
		traceparent = outbox_traceparent;

	/* delivery time */
	now = GetCurrentTransactionStartTimestamp();
	next_attempt_at = now;
	if (!PG_ARGISNULL(ARG_NOT_BEFORE))
	{
		TimestampTz not_before = PG_GETARG_TIMESTAMPTZ(ARG_NOT_BEFORE);

		if (TIMESTAMP_NOT_FINITE(not_before))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("not_before must be a finite timestamp")));
		if (not_before > now)
			next_attempt_at = not_before;
	}

	/*
	 * Ordered destination: wait for earlier uncommitted emits of the same
	 * aggregate, so that commit order is emit order (see ordering.c).  The
	 * id, which orders the aggregate, is generated after the wait.
	 */
	ordered = (destination && aggregate_id &&
			   OutboxDestinationIsOrdered(destination));
	if (ordered)
		OutboxLockAggregate(destination, aggregate_id);

	id = palloc(sizeof(pg_uuid_t));
	OutboxGenerateUuidV7(id->data);

	memset(nulls, true, sizeof(nulls));
#define SET_COL(col, datum) \
	do { values[(col) - 1] = (datum); nulls[(col) - 1] = false; } while (0)
	SET_COL(EV_ID, UUIDPGetDatum(id));
	SET_COL(EV_TYPE, PG_GETARG_DATUM(ARG_TYPE));
	if (aggregate_type)
		SET_COL(EV_AGGREGATE_TYPE, PG_GETARG_DATUM(ARG_AGGREGATE_TYPE));
	if (aggregate_id)
		SET_COL(EV_AGGREGATE_ID, PG_GETARG_DATUM(ARG_AGGREGATE_ID));
	SET_COL(EV_PAYLOAD, payload);
	if (!PG_ARGISNULL(ARG_HEADERS))
		SET_COL(EV_HEADERS, PG_GETARG_DATUM(ARG_HEADERS));
	if (traceparent)
		SET_COL(EV_TRACEPARENT, CStringGetTextDatum(traceparent));
	if (destination)
		SET_COL(EV_DESTINATION, CStringGetTextDatum(destination));
	SET_COL(EV_STATUS, CStringGetTextDatum("pending"));
	SET_COL(EV_ATTEMPTS, Int32GetDatum(0));
	SET_COL(EV_NEXT_ATTEMPT_AT, TimestampTzGetDatum(next_attempt_at));
	SET_COL(EV_CREATED_AT, TimestampTzGetDatum(now));
	if (ordered)
		SET_COL(EV_ORDERING_KEY, PG_GETARG_DATUM(ARG_AGGREGATE_ID));
#undef SET_COL

	emit_insert(cfg->events_relid, cfg->events_natts, values, nulls);
	OutboxWakeAtCommit();

	PG_RETURN_UUID_P(id);
}
