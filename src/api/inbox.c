/*-------------------------------------------------------------------------
 *
 * inbox.c
 *		  inbox.claim() and inbox.receive(): idempotent consumption in the
 *		  consumer's transaction.
 *
 * claim() remembers a message id; receive() stores the whole message in
 * inbox.messages for the worker to run through its handler (see
 * worker/inbox_process.c).  Both insert one row keyed by the message id
 * the same way, described here for claims.
 *
 * A claim is one row in inbox.claims keyed by (consumer, message_id),
 * inserted with ON CONFLICT DO NOTHING in the caller's transaction:
 *
 *	- the first claim of an id inserts the row and returns true;
 *	- a later claim finds the committed row and returns false;
 *	- a concurrent claim waits on the first transaction's speculative
 *	  insertion and then returns false if it committed, or inserts and
 *	  returns true if it rolled back.  Nobody sees a unique violation;
 *	- a rollback of the claiming transaction removes the claim together
 *	  with the business write it protected.
 *
 * The insert runs the executor's speculative-insertion protocol directly
 * (what INSERT ... ON CONFLICT DO NOTHING does inside ModifyTable), without
 * parsing, planning or SPI: check the unique index, waiting for any
 * in-progress inserter of the same key; insert the heap tuple with a
 * speculative token; insert the index entries; confirm the tuple, or kill
 * it and start over if a concurrent inserter won the race in between.
 * Under REPEATABLE READ or SERIALIZABLE a conflicting row that the
 * transaction's snapshot cannot see is a serialization failure, as with
 * ON CONFLICT DO NOTHING.
 *
 * Privileges: like outbox.emit(), the functions find their tables by OID
 * in the extension's schema, never consult search_path and do not check
 * table or sequence privileges; EXECUTE on inbox.claim() or
 * inbox.receive() is the whole grant.  receive() wakes the relay workers
 * of the database at commit, as emit() does.
 *
 * Retention: a claim (or a processed message) must outlive every possible
 * redelivery of its message, or a late duplicate is processed twice.
 * Claim retentions shorter than outbox.redelivery_window are refused; the
 * worker keeps processed messages at least that long whatever
 * outbox.inbox_retention says (worker/inbox_process.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/inbox.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/detoast.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "guc.h"
#include "api/api.h"

PG_FUNCTION_INFO_V1(inbox_claim);
PG_FUNCTION_INFO_V1(inbox_receive);
PG_FUNCTION_INFO_V1(inbox_pattern_matches);

/* columns of inbox.claims */
#define CLAIM_NATTS		4

/* the most years any one part of a claim's ttl may span on its own */
#define CLAIM_TTL_MAX_PART_YEARS	11

static void claim_check_visible(EState *estate, Relation rel, ItemPointer tid);
static bool inbox_insert_unless_exists(Oid relid, const char *table, int natts,
									   Datum *values, bool *nulls);
static char *inbox_text_arg(FunctionCallInfo fcinfo, int argno,
							const char *what, int maxlen);
static void inbox_check_message_id(FunctionCallInfo fcinfo);
static double interval_seconds(const Interval *span);
static char *seconds_to_text(int64 secs);
static Oid	inbox_relid(Oid relid, const char *name);

/*
 * Under a transaction snapshot, a conflicting claim this transaction cannot
 * see means a concurrent transaction claimed the id after our snapshot was
 * taken: report a serialization failure rather than silently answer
 * "duplicate" for a row we cannot see.
 */
static void
claim_check_visible(EState *estate, Relation rel, ItemPointer tid)
{
	TupleTableSlot *other;
	bool		isnull;

	if (!IsolationUsesXactSnapshot())
		return;
	other = table_slot_create(rel, NULL);
	if (!table_tuple_fetch_row_version(rel, tid, SnapshotAny, other))
		elog(ERROR, "could not fetch the conflicting claim");
	if (!table_tuple_satisfies_snapshot(rel, other, estate->es_snapshot) &&
		!TransactionIdIsCurrentTransactionId(
											 DatumGetTransactionId(slot_getsysattr(other, MinTransactionIdAttributeNumber, &isnull))))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
	ExecDropSingleTupleTableSlot(other);
}

/*
 * Insert a row into relid (a table of the inbox schema with natts columns)
 * unless its key exists; true if inserted.  Shared by claim() and
 * receive().
 */
static bool
inbox_insert_unless_exists(Oid relid, const char *table, int natts,
						   Datum *values, bool *nulls)
{
	OutboxInsertState st;
	TupleTableSlot *slot;
	bool		inserted;

	OutboxBeginInsert(&st, relid, true);
	if (RelationGetDescr(st.rel)->natts != natts)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" does not have the expected columns",
						INBOX_SCHEMA, table),
				 errhint("The outbox_pg library and its SQL objects do not match; run ALTER EXTENSION outbox_pg UPDATE.")));
	st.estate->es_snapshot = GetActiveSnapshot();
	slot = st.slot;
	for (int i = 0; i < natts; i++)
	{
		slot->tts_values[i] = values[i];
		slot->tts_isnull[i] = nulls[i];
	}
	ExecStoreVirtualTuple(slot);

	for (;;)
	{
		ItemPointerData conflict;
		bool		race = false;
		uint32		token;
		List	   *recheck;

		/* waits for an in-progress inserter of the same key */
		if (!ExecCheckIndexConstraints(st.rri, slot, st.estate, &conflict, NULL, NIL))
		{
			claim_check_visible(st.estate, st.rel, &conflict);
			inserted = false;
			break;
		}

		token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(st.rel, slot, st.estate->es_output_cid, 0,
									   NULL, token);
		recheck = ExecInsertIndexTuples(st.rri, slot, st.estate, false, true,
										&race, NIL, false);
		table_tuple_complete_speculative(st.rel, slot, token, !race);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		list_free(recheck);
		if (!race)
		{
			inserted = true;
			break;
		}
		/* a concurrent inserter got in between the check and the insert */
	}

	OutboxEndInsert(&st);
	return inserted;
}

/* An optional text argument, validated; NULL when absent. */
static char *
inbox_text_arg(FunctionCallInfo fcinfo, int argno, const char *what,
				 int maxlen)
{
	char	   *value;

	if (PG_ARGISNULL(argno))
		return NULL;
	value = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	OutboxCheckIdentifier(what, value, maxlen);
	return value;
}

/* The message id, argument 0 of claim() and receive(): required. */
static void
inbox_check_message_id(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message id must not be null")));
	(void) inbox_text_arg(fcinfo, 0, "message id", OUTBOX_MAX_ID_LEN);
}

/*
 * Seconds spanned by an interval as interval comparisons count them:
 * months of 30 days, days of 24 hours.
 */
static double
interval_seconds(const Interval *span)
{
	return (double) span->time / USECS_PER_SEC +
		(double) span->day * SECS_PER_DAY +
		(double) span->month * DAYS_PER_MONTH * SECS_PER_DAY;
}

static char *
seconds_to_text(int64 secs)
{
	if (secs % SECS_PER_DAY == 0)
		return psprintf(INT64_FORMAT " days", secs / SECS_PER_DAY);
	if (secs % SECS_PER_HOUR == 0)
		return psprintf(INT64_FORMAT " hours", secs / SECS_PER_HOUR);
	return psprintf(INT64_FORMAT " seconds", secs);
}

/*
 * inbox.claim(message_id text, consumer text, ttl interval) returns boolean
 */
Datum
inbox_claim(PG_FUNCTION_ARGS)
{
	TimestampTz now;
	TimestampTz expires_at;
	double		ttl_secs;
	Datum		values[CLAIM_NATTS];
	bool		nulls[CLAIM_NATTS];
	bool		claimed;

	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot claim a message in a read-only transaction")));
	inbox_check_message_id(fcinfo);

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer must not be null"),
				 errhint("Omit the argument to use the consumer \"default\".")));
	(void) inbox_text_arg(fcinfo, 1, "consumer", OUTBOX_MAX_NAME_LEN);

	now = GetCurrentTransactionStartTimestamp();
	if (PG_ARGISNULL(2))
	{
		ttl_secs = outbox_claim_retention;
		expires_at = now + (int64) outbox_claim_retention * USECS_PER_SEC;
	}
	else
	{
		Interval   *ttl = PG_GETARG_INTERVAL_P(2);
		TimestampTz floor_at;

		/*
		 * The ttl is checked as interval comparisons measure it (months of
		 * 30 days, days of 24 hours), so that a call accepted once is
		 * accepted on every date; each part on its own must be within the
		 * range too, so that adding it to now cannot overflow (22008).
		 */
		ttl_secs = interval_seconds(ttl);
		if (ttl_secs < OUTBOX_MIN_CLAIM_TTL || ttl_secs > OUTBOX_MAX_CLAIM_TTL ||
			fabs((double) ttl->month) > CLAIM_TTL_MAX_PART_YEARS * MONTHS_PER_YEAR ||
			fabs((double) ttl->day) > CLAIM_TTL_MAX_PART_YEARS * DAYS_PER_YEAR ||
			fabs((double) ttl->time) > CLAIM_TTL_MAX_PART_YEARS * DAYS_PER_YEAR * USECS_PER_DAY)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("claim ttl must be between 1 second and 10 years")));

		/*
		 * Kept until the ttl as the calendar adds it to now (a month of 28
		 * to 31 days, a day of 23 to 25 hours across a change of daylight
		 * saving time), but never less than the redelivery window checked
		 * below, nor than a second: with 30-day months alone, '1 mon -28
		 * days' passed the checks and expired at once in February.
		 */
		expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															 TimestampTzGetDatum(now),
															 PointerGetDatum(ttl)));
		floor_at = now + (int64) Max(outbox_redelivery_window,
									 OUTBOX_MIN_CLAIM_TTL) * USECS_PER_SEC;
		if (expires_at < floor_at)
			expires_at = floor_at;
	}

	if (ttl_secs < outbox_redelivery_window)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("claim retention is shorter than outbox.redelivery_window"),
				 errdetail("The claim would be kept for %s, but a message may be redelivered up to %s after its first delivery.",
						   seconds_to_text((int64) ttl_secs),
						   seconds_to_text(outbox_redelivery_window)),
				 errhint("Use a longer ttl, or lower outbox.redelivery_window if no broker or relay can redeliver that late.")));

	values[0] = PG_GETARG_DATUM(1);
	values[1] = PG_GETARG_DATUM(0);
	values[2] = TimestampTzGetDatum(now);
	values[3] = TimestampTzGetDatum(expires_at);
	memset(nulls, false, sizeof(nulls));
	claimed = inbox_insert_unless_exists(OutboxGetConfig()->claims_relid,
										 INBOX_CLAIMS_TABLE, CLAIM_NATTS,
										 values, nulls);

	PG_RETURN_BOOL(claimed);
}

/*
 * The OID of inbox.messages or its sequence, cached with the other tables
 * (routing.c), or an error saying the extension needs its update.
 */
static Oid
inbox_relid(Oid relid, const char *name)
{
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation \"%s.%s\" does not exist", INBOX_SCHEMA, name),
				 errhint("Run ALTER EXTENSION outbox_pg UPDATE to install the full inbox.")));
	return relid;
}

/*
 * inbox.receive(message_id text, type text, payload jsonb,
 *				 aggregate_id text, headers jsonb, source text) returns boolean
 *
 * Stores the message for the worker unless its id was received before.
 * The message id is the primary key, so a duplicate delivery — however
 * late, as long as the processed message is still retained — is answered
 * false and never processed twice.
 */
Datum
inbox_receive(PG_FUNCTION_ARGS)
{
	const OutboxConfig *cfg;
	Datum		values[IM_NATTS];
	bool		nulls[IM_NATTS];
	Datum		payload;
	TimestampTz now;
	bool		received;

	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot receive a message in a read-only transaction")));
	inbox_check_message_id(fcinfo);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message type must not be null")));
	(void) inbox_text_arg(fcinfo, 1, "message type", OUTBOX_MAX_TYPE_LEN);
	payload = OutboxPayloadArg(fcinfo, 2, false);
	(void) inbox_text_arg(fcinfo, 3, "aggregate id", OUTBOX_MAX_ID_LEN);

	/*
	 * Headers are what the broker carried, kept for the handler: any JSON
	 * object (the outbox's rules for headers it sends do not apply).
	 */
	if (!PG_ARGISNULL(4))
	{
		Size		headers_size = toast_raw_datum_size(PG_GETARG_DATUM(4)) - VARHDRSZ;

		/* within the payload's bound: they are stored with it, from a peer */
		if (headers_size > (Size) outbox_max_payload_size)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("message headers are too large"),
					 errdetail("The headers have %zu bytes; outbox.max_payload_size is %d bytes.",
							   headers_size, outbox_max_payload_size)));
		if (!JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(4)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message headers must be a JSON object")));
	}
	(void) inbox_text_arg(fcinfo, 5, "message source", OUTBOX_MAX_TYPE_LEN);

	now = GetCurrentTransactionStartTimestamp();
	memset(nulls, true, sizeof(nulls));
#define SET_COL(col, datum) \
	do { values[(col) - 1] = (datum); nulls[(col) - 1] = false; } while (0)
	SET_COL(IM_ID, PG_GETARG_DATUM(0));
	SET_COL(IM_TYPE, PG_GETARG_DATUM(1));
	if (!PG_ARGISNULL(3))
		SET_COL(IM_AGGREGATE_ID, PG_GETARG_DATUM(3));
	SET_COL(IM_PAYLOAD, payload);
	if (!PG_ARGISNULL(4))
		SET_COL(IM_HEADERS, PG_GETARG_DATUM(4));
	if (!PG_ARGISNULL(5))
		SET_COL(IM_SOURCE, PG_GETARG_DATUM(5));
	SET_COL(IM_STATUS, CStringGetTextDatum("pending"));
	SET_COL(IM_ATTEMPTS, Int32GetDatum(0));
	SET_COL(IM_FINISHED_ATTEMPTS, Int32GetDatum(0));
	SET_COL(IM_NEXT_ATTEMPT_AT, TimestampTzGetDatum(now));
	SET_COL(IM_RECEIVED_AT, TimestampTzGetDatum(now));

	/*
	 * The sequence number orders messages of an aggregate.  It is drawn
	 * before the duplicate check, so a duplicate leaves a gap in it: gaps are
	 * harmless, only the order matters.
	 */
	cfg = OutboxGetConfig();
	SET_COL(IM_SEQ, Int64GetDatum(nextval_internal(inbox_relid(cfg->messages_seq_relid,
															   INBOX_MESSAGES_SEQ),
												   false)));
#undef SET_COL

	/*
	 * Before ALTER EXTENSION UPDATE to 0.5.1 the table ends with seq
	 * (cfg->messages_natts, known by the column's name and place): the
	 * columns 0.5.1 appended are left out, and the update gives them their
	 * defaults.
	 */
	received = inbox_insert_unless_exists(inbox_relid(cfg->messages_relid,
													  INBOX_MESSAGES_TABLE),
										  INBOX_MESSAGES_TABLE, cfg->messages_natts,
										  values, nulls);
	if (received)
		OutboxWakeAtCommit();
	PG_RETURN_BOOL(received);
}

/*
 * inbox._pattern_matches(pattern text, value text) returns boolean — the
 * routes' glob ('*' matches any text), for handler lookup in SQL.
 */
Datum
inbox_pattern_matches(PG_FUNCTION_ARGS)
{
	char	   *pattern = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *value = text_to_cstring(PG_GETARG_TEXT_PP(1));

	PG_RETURN_BOOL(OutboxPatternMatches(pattern, value));
}
