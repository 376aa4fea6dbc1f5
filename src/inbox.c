/*-------------------------------------------------------------------------
 *
 * inbox.c
 *		  inbox.claim(): idempotent consumption in the consumer's transaction.
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
 * Privileges: like outbox.emit(), the function finds its table by OID in
 * the extension's schema, never consults search_path and does not check
 * table privileges; EXECUTE on inbox.claim() is the whole grant.
 *
 * Retention: a claim must outlive every possible redelivery of its
 * message, or a late duplicate is processed twice.  Retentions shorter
 * than outbox.redelivery_window are refused.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/inbox.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"

PG_FUNCTION_INFO_V1(inbox_claim);

/* columns of inbox.claims */
#define CLAIM_NATTS		4

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
 * Insert the claim unless its key exists; true if inserted.
 */
static bool
claim_insert(Datum *values)
{
	OutboxInsertState st;
	TupleTableSlot *slot;
	bool		claimed;

	OutboxBeginInsert(&st, OutboxGetConfig()->claims_relid, true);
	if (RelationGetDescr(st.rel)->natts != CLAIM_NATTS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" does not have the expected columns",
						INBOX_SCHEMA, INBOX_CLAIMS_TABLE),
				 errhint("The outbox_pg library and its SQL objects do not match; run ALTER EXTENSION outbox_pg UPDATE.")));
	st.estate->es_snapshot = GetActiveSnapshot();
	slot = st.slot;
	for (int i = 0; i < CLAIM_NATTS; i++)
	{
		slot->tts_values[i] = values[i];
		slot->tts_isnull[i] = false;
	}
	ExecStoreVirtualTuple(slot);

	for (;;)
	{
		ItemPointerData conflict;
		bool		race = false;
		uint32		token;
		List	   *recheck;

		/* waits for an in-progress inserter of the same key */
		if (!ExecCheckIndexConstraints(st.rri, slot, st.estate, &conflict, NIL))
		{
			claim_check_visible(st.estate, st.rel, &conflict);
			claimed = false;
			break;
		}

		token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(st.rel, slot, st.estate->es_output_cid, 0,
									   NULL, token);
		recheck = ExecInsertIndexTuples(st.rri, slot, st.estate, false, true,
										&race, NIL);
		table_tuple_complete_speculative(st.rel, slot, token, !race);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		list_free(recheck);
		if (!race)
		{
			claimed = true;
			break;
		}
		/* a concurrent claim got in between the check and the insert */
	}

	OutboxEndInsert(&st);
	return claimed;
}

/* Seconds spanned by an interval, months counted as 30 days. */
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
	char	   *message_id;
	char	   *consumer;
	TimestampTz now;
	TimestampTz expires_at;
	double		ttl_secs;
	Datum		values[CLAIM_NATTS];
	bool		claimed;

	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot claim a message in a read-only transaction")));
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message id must not be null")));
	message_id = text_to_cstring(PG_GETARG_TEXT_PP(0));
	OutboxCheckIdentifier("message id", message_id, OUTBOX_MAX_ID_LEN);

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer must not be null"),
				 errhint("Omit the argument to use the consumer \"default\".")));
	consumer = text_to_cstring(PG_GETARG_TEXT_PP(1));
	OutboxCheckIdentifier("consumer", consumer, OUTBOX_MAX_NAME_LEN);

	now = GetCurrentTransactionStartTimestamp();
	if (PG_ARGISNULL(2))
	{
		ttl_secs = outbox_claim_retention;
		expires_at = now + (int64) outbox_claim_retention * USECS_PER_SEC;
	}
	else
	{
		Interval   *ttl = PG_GETARG_INTERVAL_P(2);

		ttl_secs = interval_seconds(ttl);
		if (ttl_secs < OUTBOX_MIN_CLAIM_TTL || ttl_secs > OUTBOX_MAX_CLAIM_TTL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("claim ttl must be between 1 second and 10 years")));
		expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															 TimestampTzGetDatum(now),
															 PointerGetDatum(ttl)));
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
	claimed = claim_insert(values);

	PG_RETURN_BOOL(claimed);
}
