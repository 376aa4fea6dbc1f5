/*-------------------------------------------------------------------------
 *
 * retention.c
 *		  Retention of the insert-only store: the log's rotation and the
 *		  trim of claimed batches (README.store, section 3.1).
 *
 * Relay worker 0 of each database runs both from its housekeeping
 * (housekeeping.c); outbox._rotate_log() and outbox._trim_batches() run
 * them by hand.  0.2's DELETE of published outbox.events rows is gone
 * with that table; its C entry point stays for the older install scripts.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/retention.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
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

PG_FUNCTION_INFO_V1(outbox_expire_published);
PG_FUNCTION_INFO_V1(outbox__rotate_log);
PG_FUNCTION_INFO_V1(outbox__trim_batches);

/*
 * 0.2's retention statement is gone with outbox.events; the 0.1.0 and
 * 0.2.x install scripts still declare a function on this symbol.
 */
Datum
outbox_expire_published(PG_FUNCTION_ARGS)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("outbox._expire_published() was removed in outbox_pg 0.4.0"),
			 errhint("Retention rotates the event log: see outbox.retention.")));
	PG_RETURN_NULL();
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
 *		its rows there.  Rows of no stream (unrouted, or naming a
 *		destination that never existed) are first copied to
 *		outbox.retries, so that none is lost (_route_pending() routes them
 *		from there: step 5).  A deleted destination keeps its stream
 *		(0.5.0): its backlog is spilled as a paused one's, and what it
 *		acknowledged is not copied;
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
 * the first destination with a row in the slot (%s: its table) that its
 * acknowledgement lacks, and whether it is paused or deleted (its stream
 * outlives it: no relay claims it).  Each destination's
 * acknowledged-through snapshot is read once (the MATERIALIZED list), and
 * the slot is probed per destination through its (destination, xid) index:
 * ORDER BY xid LIMIT 1 leaves that index the only cheap plan, whatever the
 * slot's (absent) statistics say.  Written as one EXISTS over the log, the
 * planner hashed the whole slot and evaluated both snapshot subqueries for
 * each of its rows: over a slot of 1.2 million rows and ~4,600 batches,
 * relay worker 0 had not finished it after three minutes.
 */
static const char *rotation_unacked_fmt =
"WITH a AS MATERIALIZED ("
"    SELECT s.destination, COALESCE("
"             (SELECT b.from_snap FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"                 AND (SELECT true FROM outbox.batch_acks AS k"
"                       WHERE k.destination OPERATOR(pg_catalog.=) b.destination"
"                         AND k.seq OPERATOR(pg_catalog.=) b.seq) IS NULL"
"               ORDER BY b.seq LIMIT 1),"
"             (SELECT b.to_snap FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"               ORDER BY b.seq DESC LIMIT 1)) AS snap"
"      FROM outbox.streams AS s)"
"SELECT a.destination, COALESCE((SELECT d.paused FROM outbox.destinations AS d"
"                                 WHERE d.name OPERATOR(pg_catalog.=) a.destination), true)"
"  FROM a CROSS JOIN LATERAL"
"       (SELECT l.xid FROM %s AS l"
"         WHERE l.destination OPERATOR(pg_catalog.=) a.destination"
"           AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin(a.snap)"
"           AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, a.snap)"
"         ORDER BY l.xid LIMIT 1) AS x"
" ORDER BY a.destination LIMIT 1";

/*
 * rows of slot $1 that no stream will ever claim: kept in outbox.retries;
 * returns the ids copied (null: none)
 */
static const char *rotation_orphans_sql =
"WITH c AS ("
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
"    ON CONFLICT (id) DO NOTHING"
"    RETURNING t.id) "
"SELECT pg_catalog.array_agg(c.id) FROM c";

/* the copies of a try that could not truncate: the rows stay in the slot */
static const char *rotation_orphans_undo_sql =
"DELETE FROM outbox.retries AS t WHERE t.id OPERATOR(pg_catalog.=) ANY ($1)";

static const char *rotation_switch_sql =
"UPDATE outbox.rotation"
"   SET slot = $1, generation = generation OPERATOR(pg_catalog.+) 1,"
"       switched_at = pg_catalog.now(), switch_xid = pg_catalog.pg_current_xact_id()";

/* a paused destination's backlog: spilled in claims of this size, this often per try */
#define ROTATION_SPILL_BATCH	10000
#define ROTATION_MAX_SPILLS		10

/*
 * Rotate the log if the current slot is older than every and (a) to (c)
 * hold.  Returns what happened, for the caller's log and the tests:
 * "rotated", "wait" (not due), "busy" (another rotation holds the row),
 * "writer" (b), "unacknowledged: <destination>" (a), "locked" (c, or a
 * transaction that makes a stream is still open).  The
 * caller is connected to SPI, in a READ COMMITTED transaction.  Its
 * statements, like the trim's, are planned each time they run (once a
 * second at most), not kept: their plans follow the tables' sizes.
 */
static char *rotation_truncate(int next);

char *
OutboxRotateLog(Interval *every)
{
	Oid			read_types[1] = {INTERVALOID};
	Datum		args[1];
	bool		isnull;
	int			current;
	Oid			streams_relid;
	char	   *result;

	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("the outbox log rotation must run at isolation level READ COMMITTED")));
	args[0] = IntervalPGetDatum(every);
	if (SPI_execute_with_args(rotation_read_sql, 1, read_types, args, NULL,
							  false, 1) != SPI_OK_SELECT)
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

	/*
	 * No stream is made while the slot is checked, copied and truncated (a
	 * destination created, a relay's stream_create_sql): the check of what
	 * the slot's streams acknowledged and the copy of the rows of no stream
	 * read the streams each with a snapshot of its own, and rows of a name
	 * whose stream came in between would be neither waited for nor copied,
	 * and truncated.  SHARE conflicts with the insert (and with a VACUUM of
	 * the table), not with the claims' row locks.  Released when this try
	 * ends, not with the transaction (relay 0's lease goes on in it).  A
	 * creating transaction still open: "locked", try again.
	 */
	streams_relid = get_relname_relid("streams",
									  get_namespace_oid(OUTBOX_SCHEMA, false));
	if (!OidIsValid(streams_relid))
		elog(ERROR, "table \"%s.streams\" does not exist", OUTBOX_SCHEMA);
	if (!ConditionalLockRelationOid(streams_relid, ShareLock))
		return pstrdup("locked");
	result = rotation_truncate((current + 1) % OUTBOX_LOG_SLOTS);
	UnlockRelationOid(streams_relid, ShareLock);
	return result;
}

/* OutboxRotateLog once the streams are locked: slot next, (a) and (c). */
static char *
rotation_truncate(int next)
{
	Oid			slot_types[1] = {INT2OID};
	Oid			undo_types[1] = {UUIDARRAYOID};
	Datum		args[1];
	bool		isnull;
	char		relname[NAMEDATALEN];
	const char *slot_table;
	char	   *unacked_sql;
	Oid			relid;
	Datum		copied;
	bool		none_copied;

	args[0] = Int16GetDatum((int16) next);
	snprintf(relname, sizeof(relname), OUTBOX_LOG_SLOT_FORMAT, next);
	slot_table = quote_qualified_identifier(OUTBOX_SCHEMA, relname);
	unacked_sql = psprintf(rotation_unacked_fmt, slot_table);

	/*
	 * A paused or deleted destination's backlog would keep the slot for as
	 * long as it is paused or until the name is created again: it is
	 * spilled to outbox.retries (a few claims that send nothing), and
	 * looked at again.  A batch of it whose lease ran out is spilled first:
	 * no relay recovers such a destination's batches, and the spill of its
	 * backlog waits for its newest batch (OutboxStoreClaimSpill).
	 */
	for (int spills = 0;; spills++)
	{
		char	   *destination;

		if (SPI_execute(unacked_sql, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "outbox rotation statement failed");
		if (SPI_processed == 0)
			break;
		destination = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
										2, &isnull)) ||
			spills >= ROTATION_MAX_SPILLS ||
			!(OutboxStoreSpillExpired(destination) ||
			  OutboxStoreClaimSpill(ROTATION_SPILL_BATCH, destination)))
			return psprintf("unacknowledged: %s", destination);
	}
	if (SPI_execute_with_args(rotation_orphans_sql, 1, slot_types, args, NULL,
							  false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox rotation statement failed");
	copied = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
						   &none_copied);

	relid = get_relname_relid(relname, get_namespace_oid(OUTBOX_SCHEMA, false));
	if (!OidIsValid(relid))
		elog(ERROR, "table \"%s.%s\" does not exist", OUTBOX_SCHEMA, relname);
	if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
	{
		/*
		 * The rows stay, so their copies go: a copy left while the row stays
		 * would be sent besides it once the row's name has a stream.
		 */
		args[0] = copied;
		if (!none_copied &&
			SPI_execute_with_args(rotation_orphans_undo_sql, 1, undo_types, args,
								  NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "outbox rotation statement failed");
		return pstrdup("locked");
	}
	if (SPI_execute(psprintf("TRUNCATE %s", slot_table), false, 0)
		!= SPI_OK_UTILITY)
		elog(ERROR, "could not truncate %s.%s", OUTBOX_SCHEMA, relname);
	if (SPI_execute_with_args(rotation_switch_sql, 1, slot_types, args, NULL,
							  false, 0) != SPI_OK_UPDATE)
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
	MemoryContext caller = CurrentMemoryContext;
	char	   *result;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("arguments must not be null")));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* the result is made in SPI's memory, which SPI_finish() frees */
	result = MemoryContextStrdup(caller,
								 OutboxRotateLog(PG_GETARG_INTERVAL_P(0)));
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text(result));
}

/*
 * The batches a destination no longer needs: those below its oldest
 * unacknowledged batch (else below its newest one, its position), with
 * their acknowledgements.  What is kept is what the claim (newest row),
 * the recovery and retention (unacknowledged rows) read, so their scans
 * stay short.  Bulk deletes, run with the rotation, not per event.  The
 * acknowledgement of each batch is looked up by its key (a subplan), not
 * anti-joined: with the batches' estimates from their first minute the
 * planner joined every batch with every acknowledgement, and one trim of
 * 7,600 batches took 5.2 s of a relay's time (auto_explain).
 */
static const char *trim_batches_sql =
"WITH low AS ("
"    SELECT s.destination, COALESCE("
"             (SELECT b.seq FROM outbox.batches AS b"
"               WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"                 AND (SELECT true FROM outbox.batch_acks AS k"
"                       WHERE k.destination OPERATOR(pg_catalog.=) b.destination"
"                         AND k.seq OPERATOR(pg_catalog.=) b.seq) IS NULL"
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

/*
 * The streams no one needs any more (0.5.0: a stream outlives its
 * destination): a name that has no destination, no event left in the log
 * and no batch unacknowledged.  Its copies in outbox.retries and
 * outbox.dead_events are found by name, not through the stream.  Created
 * again, the name starts a new stream before every event, which finds
 * none of it that was delivered.
 *
 * Two statements: the first locks the candidates (a stream a claim holds
 * is skipped, and no claim takes one of them until this transaction
 * ends), the second checks them again with a snapshot taken after the
 * locks and deletes them.  Checked and locked in one statement, a name
 * created, emitted to and claimed after that statement's snapshot lost
 * its stream and its new batch, and the event was claimed again.
 */
#define TRIM_STREAMS_GONE_SQL(s) \
"NOT EXISTS (SELECT 1 FROM outbox.destinations AS d" \
"             WHERE d.name OPERATOR(pg_catalog.=) " s ".destination)" \
" AND NOT EXISTS (SELECT 1 FROM outbox.log AS l" \
"                  WHERE l.destination OPERATOR(pg_catalog.=) " s ".destination)" \
" AND NOT EXISTS (SELECT 1 FROM outbox.batches AS b" \
"                  WHERE b.destination OPERATOR(pg_catalog.=) " s ".destination" \
"                    AND NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS k" \
"                                     WHERE k.destination OPERATOR(pg_catalog.=) b.destination" \
"                                       AND k.seq OPERATOR(pg_catalog.=) b.seq))"

static const char *trim_streams_lock_sql =
"SELECT pg_catalog.array_agg(g.destination) FROM ("
"    SELECT s.destination FROM outbox.streams AS s"
"     WHERE " TRIM_STREAMS_GONE_SQL("s")
"       FOR UPDATE OF s SKIP LOCKED) AS g";

static const char *trim_streams_sql =
"DELETE FROM outbox.streams AS s"
" WHERE s.destination OPERATOR(pg_catalog.=) ANY ($1)"
"   AND " TRIM_STREAMS_GONE_SQL("s");

/*
 * The releases (outbox.release_aggregate()) of names that have no
 * destination, of aggregates that have no dead letter under the name any
 * more, nor a redriven one waiting in outbox.retries (it may die again,
 * and the release covers it): they belong to the name as its dead letters
 * do (0.5.1), and go with the last of them once the destination is gone.
 * Two statements, as the stream trim: the candidates are locked with SKIP
 * LOCKED (a release_aggregate() of a name created again holds its row:
 * waiting for it would stall relay 0's lease transaction), then checked
 * again with a snapshot taken after the locks and deleted.
 */
#define TRIM_RELEASES_GONE_SQL(r) \
"NOT EXISTS (SELECT 1 FROM outbox.destinations AS d" \
"             WHERE d.name OPERATOR(pg_catalog.=) " r ".destination)" \
" AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS e" \
"                  WHERE e.destination OPERATOR(pg_catalog.=) " r ".destination" \
"                    AND e.ordering_key OPERATOR(pg_catalog.=) " r ".aggregate_id)" \
" AND NOT EXISTS (SELECT 1 FROM outbox.retries AS x" \
"                  WHERE x.destination OPERATOR(pg_catalog.=) " r ".destination" \
"                    AND x.ordering_key OPERATOR(pg_catalog.=) " r ".aggregate_id)"

static const char *trim_releases_lock_sql =
"SELECT pg_catalog.array_agg(g.destination), pg_catalog.array_agg(g.aggregate_id) FROM ("
"    SELECT r.destination, r.aggregate_id FROM outbox.aggregate_releases AS r"
"     WHERE " TRIM_RELEASES_GONE_SQL("r")
"       FOR UPDATE OF r SKIP LOCKED) AS g";

static const char *trim_releases_sql =
"DELETE FROM outbox.aggregate_releases AS r"
" USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS c(destination, aggregate_id)"
" WHERE r.destination OPERATOR(pg_catalog.=) c.destination"
"   AND r.aggregate_id OPERATOR(pg_catalog.=) c.aggregate_id"
"   AND " TRIM_RELEASES_GONE_SQL("r");

/*
 * Delete the batches no one reads any more, the streams of names gone for
 * good and their releases; returns how many batches.
 */
int64
OutboxTrimBatches(void)
{
	Oid			types[1] = {TEXTARRAYOID};
	Oid			release_types[2] = {TEXTARRAYOID, TEXTARRAYOID};
	Datum		args[1];
	Datum		release_args[2];
	bool		isnull;
	int64		n;

	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("the outbox batch trim must run at isolation level READ COMMITTED")));
	if (SPI_execute(trim_batches_sql, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox batch trim statement failed");
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 1, &isnull));
	if (SPI_execute(trim_streams_lock_sql, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox stream trim lock statement failed");
	args[0] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
							&isnull);
	if (!isnull &&
		SPI_execute_with_args(trim_streams_sql, 1, types, args, NULL, false, 0)
		!= SPI_OK_DELETE)
		elog(ERROR, "outbox stream trim statement failed");
	if (SPI_execute(trim_releases_lock_sql, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox release trim lock statement failed");
	release_args[0] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
									&isnull);
	release_args[1] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
									&isnull);
	if (!isnull &&
		SPI_execute_with_args(trim_releases_sql, 2, release_types, release_args,
							  NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "outbox release trim statement failed");
	return n;
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
