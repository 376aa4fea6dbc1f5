/*-------------------------------------------------------------------------
 *
 * retention.c
 *		  Deleting published outbox events after outbox.retention.
 *
 * Relay worker 0 of each database runs one retention batch inside its
 * lease transaction at most once a second, and again at once while the
 * previous batch was full, so a backlog of expired rows drains at
 * outbox.retention_batch rows per relay cycle without ever holding one
 * long transaction.  Only rows with status 'published' and a published_at
 * older than the cutoff are deleted: pending rows are never touched, and
 * dead letters stay until an operator purges them.
 *
 * Finding the expired rows without an extra index: published_at is never
 * earlier than the event's creation, and message ids are UUIDv7 whose
 * first 48 bits are the Unix milliseconds of the emit.  So every expired
 * row has an id below the UUID made of the cutoff's milliseconds and
 * zeros, and the primary key, walked from its low end, yields them oldest
 * first.  An index on published_at would make every acknowledgement write
 * one more index entry; this costs nothing on the hot path.  Rows on the
 * way that are not expired (old pending or dead ones) are stepped over; a
 * row whose id is not a UUIDv7 (inserted without emit()) sorts by its
 * random bits and may wait longer than the retention to be deleted.
 *
 * The rows are locked with FOR UPDATE SKIP LOCKED and deleted by ctid,
 * like the lease, so retention never waits for the relay or an operator.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/retention.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/lsyscache.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "worker/worker.h"

static uint64 retention_expire_published(TimestampTz cutoff, int batch_size);


PG_FUNCTION_INFO_V1(outbox_expire_published);
PG_FUNCTION_INFO_V1(outbox__rotate_log);
PG_FUNCTION_INFO_V1(outbox__trim_batches);

static const char *expire_sql =
"DELETE FROM outbox.events AS e"
" WHERE e.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
"        SELECT c.ctid FROM outbox.events AS c"
"         WHERE c.id OPERATOR(pg_catalog.<) $1"
"           AND c.status OPERATOR(pg_catalog.=) 'published'"
"           AND c.published_at OPERATOR(pg_catalog.<) $2"
"         ORDER BY c.id"
"         LIMIT $3"
"           FOR UPDATE SKIP LOCKED))";

static SPIPlanPtr expire_plan = NULL;

/*
 * Delete up to batch_size published rows published before cutoff.
 * The caller is connected to SPI.  Returns the rows deleted.
 */
static uint64
retention_expire_published(TimestampTz cutoff, int batch_size)
{
	Oid			types[3] = {UUIDOID, TIMESTAMPTZOID, INT4OID};
	Datum		args[3];
	pg_uuid_t  *bound = palloc0(sizeof(pg_uuid_t));
	int64		unix_ms;
	int			ret;

	unix_ms = (cutoff + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY) / 1000;
	if (unix_ms < 0)
		unix_ms = 0;
	for (int i = 0; i < 6; i++)
		bound->data[i] = (unsigned char) (unix_ms >> (40 - 8 * i));

	args[0] = UUIDPGetDatum(bound);
	args[1] = TimestampTzGetDatum(cutoff);
	args[2] = Int32GetDatum(batch_size);
	ret = SPI_execute_plan(WorkerKeepPlan(&expire_plan, expire_sql, 3, types),
						   args, NULL, false, 0);
	if (ret != SPI_OK_DELETE)
		elog(ERROR, "outbox retention failed: %s", SPI_result_code_string(ret));
	return SPI_processed;
}

/*
 * outbox._expire_published(retention interval, batch_size int4) returns int8
 * — the relay's retention statement, for tests and operators.
 */
Datum
outbox_expire_published(PG_FUNCTION_ARGS)
{
	TimestampTz cutoff;
	uint64		n;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("arguments must not be null")));
	if (PG_GETARG_INT32(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch size must not be negative")));
	cutoff = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
													 TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
													 PG_GETARG_DATUM(0)));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	n = retention_expire_published(cutoff, PG_GETARG_INT32(1));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}


/*
 * Retention of the insert-only store (issue #21, README.store section 3.1
 * and plan step 4): the log is three slots; emit() inserts into the
 * current one.  A rotation makes the next slot current after truncating
 * it, which is allowed when
 *
 *	(a) every row in it is acknowledged: each destination's
 *		acknowledged-through snapshot (from_snap of its oldest
 *		unacknowledged batch, else its position) shows the xid of each of
 *		its rows there.  Rows of no stream (unrouted, or of a deleted
 *		destination) are first copied to outbox.retries, so that none is
 *		lost (_route_pending() routes them from there: step 5);
 *	(b) no transaction that could still insert into it is running: the
 *		oldest running xid is past the xid of the latest switch, which was
 *		assigned after the switch that left this slot committed.  A writer
 *		that held the slot's lock then had its xid before that; one that
 *		locks it later sees the switch (emit() checks its cached slot again
 *		once it holds the lock) and goes to the current slot;
 *	(c) the ACCESS EXCLUSIVE lock comes at once: queued behind pg_dump's
 *		ACCESS SHARE, the TRUNCATE would make every claim (they read all
 *		slots) and emit() queue behind it.
 *
 * (a) and (b) are checked before the lock: nothing can enter the slot in
 * between.  The lock is held only for the TRUNCATE, to the end of the
 * caller's transaction.
 */
static const char *rotation_read_sql =
"SELECT r.slot, pg_catalog.now() OPERATOR(pg_catalog.-) r.switched_at"
"                OPERATOR(pg_catalog.>=) $1,"
"       pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())"
"                OPERATOR(pg_catalog.>) r.switch_xid"
"  FROM outbox.rotation AS r"
"   FOR UPDATE SKIP LOCKED";

/*
 * the first destination with a row in slot $1 its acknowledgement lacks,
 * and whether it is paused
 */
static const char *rotation_unacked_sql =
"SELECT a.destination, COALESCE((SELECT d.paused FROM outbox.destinations AS d"
"                                 WHERE d.name OPERATOR(pg_catalog.=) a.destination), false)"
"  FROM ("
"    SELECT s.destination, COALESCE("
"             (SELECT b.from_snap FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"                 AND NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS k"
"                                  WHERE k.destination OPERATOR(pg_catalog.=) b.destination"
"                                    AND k.seq OPERATOR(pg_catalog.=) b.seq)"
"               ORDER BY b.seq LIMIT 1),"
"             (SELECT b.to_snap FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"               ORDER BY b.seq DESC LIMIT 1)) AS snap"
"      FROM outbox.streams AS s) AS a"
" WHERE EXISTS (SELECT 1 FROM outbox.log AS l"
"                WHERE l.slot OPERATOR(pg_catalog.=) $1"
"                  AND l.destination OPERATOR(pg_catalog.=) a.destination"
"                  AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin(a.snap)"
"                  AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, a.snap))"
" ORDER BY a.destination LIMIT 1";

/* rows of slot $1 that no stream will ever claim: kept in outbox.retries */
static const char *rotation_orphans_sql =
"INSERT INTO outbox.retries AS t"
"       (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,"
"        destination, ordering_key, created_at, attempts, due_at)"
"SELECT l.id, l.type, l.aggregate_type, l.aggregate_id, l.payload, l.headers,"
"       l.traceparent, l.destination, l.ordering_key, l.created_at, 0,"
"       COALESCE(l.not_before, l.created_at)"
"  FROM outbox.log AS l"
" WHERE l.slot OPERATOR(pg_catalog.=) $1"
"   AND NOT EXISTS (SELECT 1 FROM outbox.streams AS s"
"                    WHERE s.destination OPERATOR(pg_catalog.=) l.destination)"
"   AND NOT EXISTS (SELECT 1 FROM outbox.settled_events AS z"
"                    WHERE z.id OPERATOR(pg_catalog.=) l.id)"
"    ON CONFLICT (id) DO NOTHING";

static const char *rotation_switch_sql =
"UPDATE outbox.rotation"
"   SET slot = $1, generation = generation OPERATOR(pg_catalog.+) 1,"
"       switched_at = pg_catalog.now(), switch_xid = pg_catalog.pg_current_xact_id()";

/* a paused destination's backlog: spilled in claims of this size, this often per try */
#define ROTATION_SPILL_BATCH	10000
#define ROTATION_MAX_SPILLS		10

static SPIPlanPtr rotation_read_plan = NULL;
static SPIPlanPtr rotation_unacked_plan = NULL;
static SPIPlanPtr rotation_orphans_plan = NULL;
static SPIPlanPtr rotation_switch_plan = NULL;

/*
 * Rotate the log if the current slot is older than every and (a) to (c)
 * hold.  Returns what happened, for the caller's log and the tests:
 * "rotated", "wait" (not due), "busy" (another rotation holds the row),
 * "writer" (b), "unacknowledged: <destination>" (a), "locked" (c).  The
 * caller is connected to SPI, in a READ COMMITTED transaction.
 */
char *
OutboxRotateLog(Interval *every)
{
	Oid			read_types[1] = {INTERVALOID};
	Oid			slot_types[1] = {INT2OID};
	Datum		args[1];
	bool		isnull;
	int			current;
	int			next;
	char		relname[NAMEDATALEN];
	Oid			nspid;
	Oid			relid;

	args[0] = IntervalPGetDatum(every);
	if (SPI_execute_plan(WorkerKeepPlan(&rotation_read_plan, rotation_read_sql, 1,
										read_types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox rotation statement failed");
	if (SPI_processed == 0)
		return pstrdup("busy");
	current = DatumGetInt16(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 2, &isnull)))
		return pstrdup("wait");
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 3, &isnull)))
		return pstrdup("writer");
	next = (current + 1) % OUTBOX_LOG_SLOTS;

	args[0] = Int16GetDatum((int16) next);

	/*
	 * A paused destination's backlog would keep the slot for as long as it
	 * is paused: it is spilled to outbox.retries (a few claims that send
	 * nothing), and looked at again.
	 */
	for (int spills = 0;; spills++)
	{
		char	   *destination;

		if (SPI_execute_plan(WorkerKeepPlan(&rotation_unacked_plan, rotation_unacked_sql, 1,
											slot_types),
							 args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "outbox rotation statement failed");
		if (SPI_processed == 0)
			break;
		destination = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
										2, &isnull)) ||
			spills >= ROTATION_MAX_SPILLS ||
			!OutboxStoreClaimSpill(ROTATION_SPILL_BATCH, destination))
			return psprintf("unacknowledged: %s", destination);
	}
	if (SPI_execute_plan(WorkerKeepPlan(&rotation_orphans_plan, rotation_orphans_sql, 1,
										slot_types),
						 args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "outbox rotation statement failed");

	nspid = get_namespace_oid(OUTBOX_SCHEMA, false);
	snprintf(relname, sizeof(relname), OUTBOX_LOG_SLOT_FORMAT, next);
	relid = get_relname_relid(relname, nspid);
	if (!OidIsValid(relid))
		elog(ERROR, "table \"%s.%s\" does not exist", OUTBOX_SCHEMA, relname);
	if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		return pstrdup("locked");
	if (SPI_execute(psprintf("TRUNCATE %s.%s", OUTBOX_SCHEMA, relname), false, 0)
		!= SPI_OK_UTILITY)
		elog(ERROR, "could not truncate %s.%s", OUTBOX_SCHEMA, relname);
	if (SPI_execute_plan(WorkerKeepPlan(&rotation_switch_plan, rotation_switch_sql, 1,
										slot_types),
						 args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox rotation statement failed");
	return pstrdup("rotated");
}

/*
 * outbox._rotate_log(every interval) returns text: OutboxRotateLog, for
 * tests and operators.  Internal: granted to no one.
 */
Datum
outbox__rotate_log(PG_FUNCTION_ARGS)
{
	char	   *result;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("arguments must not be null")));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	result = OutboxRotateLog(PG_GETARG_INTERVAL_P(0));
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text(result));
}

/*
 * The batches a destination no longer needs: those below its oldest
 * unacknowledged batch (else below its newest one, its position), with
 * their acknowledgements.  What is kept is what the claim (newest row),
 * the recovery and retention (unacknowledged rows) read, so their scans
 * stay short.  Bulk deletes, run with the rotation, not per event.
 */
static const char *trim_batches_sql =
"WITH low AS ("
"    SELECT s.destination, COALESCE("
"             (SELECT b.seq FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"                 AND NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS k"
"                                  WHERE k.destination OPERATOR(pg_catalog.=) b.destination"
"                                    AND k.seq OPERATOR(pg_catalog.=) b.seq)"
"               ORDER BY b.seq LIMIT 1),"
"             (SELECT b.seq FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"               ORDER BY b.seq DESC LIMIT 1)) AS seq"
"      FROM outbox.streams AS s),"
"     gone AS (DELETE FROM outbox.batches AS b USING low"
"               WHERE b.destination OPERATOR(pg_catalog.=) low.destination"
"                 AND b.seq OPERATOR(pg_catalog.<) low.seq"
"              RETURNING b.seq),"
"     acks AS (DELETE FROM outbox.batch_acks AS k USING low"
"               WHERE k.destination OPERATOR(pg_catalog.=) low.destination"
"                 AND k.seq OPERATOR(pg_catalog.<) low.seq)"
"SELECT pg_catalog.count(*) FROM gone";

static SPIPlanPtr trim_batches_plan = NULL;

/* Delete the batches no one reads any more; returns how many. */
int64
OutboxTrimBatches(void)
{
	bool		isnull;

	if (SPI_execute_plan(WorkerKeepPlan(&trim_batches_plan, trim_batches_sql, 0, NULL),
						 NULL, NULL, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox batch trim statement failed");
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/* outbox._trim_batches() returns bigint.  Internal: granted to no one. */
Datum
outbox__trim_batches(PG_FUNCTION_ARGS)
{
	int64		n;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	n = OutboxTrimBatches();
	SPI_finish();
	PG_RETURN_INT64(n);
}
