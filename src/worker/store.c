/*-------------------------------------------------------------------------
 *
 * store.c
 *		  The relay's statements on the insert-only store (issue #21,
 *		  README.store): claim, claim acknowledgement, recovery, the
 *		  due-work sweep, and the lease, retry and dead of outbox.retries.
 *
 * Each statement is prepared once per process and kept (SPI_keepplan).
 * The relay calls them directly; outbox._claim(), _claim_ack(),
 * _claim_recover() and _retries_*() expose the very same statements to
 * SQL, so the regression and isolation tests exercise exactly what the
 * relay runs.  The design notes of each part are with its statements
 * below; in short:
 *
 *	- Events are appended to the log and never updated: a claim records a
 *	  range of a destination's log as a batch, the acknowledgement is one
 *	  row per batch, and only failures are written per event (copied to
 *	  outbox.retries or outbox.dead_events).
 *	- outbox.retries rows are leased and updated like 0.2's event rows,
 *	  fenced by leased_until: a retry or dead letter changes a row only
 *	  while its leased_until is still the value the lease returned, so a
 *	  relay that stalled past its lease cannot undo what another relay
 *	  leased since.  The ack of a copy (delete) is not fenced: the
 *	  destination acknowledged the message, whoever leased it.
 *	- Every name is schema-qualified, operators included.
 *	- The plan cache decides between custom plans (the real LIMIT and
 *	  array sizes) and a generic one, statement by statement
 *	  (WorkerKeepPlan).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/store.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "nodes/makefuncs.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "outbox_pg.h"
#include "worker/worker.h"
#include "util.h"

PG_FUNCTION_INFO_V1(outbox_lease);
PG_FUNCTION_INFO_V1(outbox_ack);
PG_FUNCTION_INFO_V1(outbox_retry);
PG_FUNCTION_INFO_V1(outbox_dead);
PG_FUNCTION_INFO_V1(outbox_requeue);
PG_FUNCTION_INFO_V1(outbox__snapshot_cut);
PG_FUNCTION_INFO_V1(outbox__claim);
PG_FUNCTION_INFO_V1(outbox__claim_ack);
PG_FUNCTION_INFO_V1(outbox__claim_recover);
PG_FUNCTION_INFO_V1(outbox__retries_lease);
PG_FUNCTION_INFO_V1(outbox__retries_ack);
PG_FUNCTION_INFO_V1(outbox__retries_retry);
PG_FUNCTION_INFO_V1(outbox__retries_dead);

static uint64
store_execute(SPIPlanPtr plan, Datum *args, const char *nulls, int expected)
{
	int			ret = SPI_execute_plan(plan, args, nulls, false, 0);

	if (ret != expected)
		elog(ERROR, "outbox statement failed: %s", SPI_result_code_string(ret));
	return SPI_processed;
}

/*
 * For the SQL wrappers (tests, and operators who want to see what the
 * relay would do; internal, granted to no one): null arguments refused,
 * SPI connected.
 */
static void
store_require_args(FunctionCallInfo fcinfo, int nrequired)
{
	for (int i = 0; i < Min(nrequired, PG_NARGS()); i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("arguments must not be null")));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/*
 * The optional leases argument of _retry and _dead: (Datum) 0 (no fence)
 * when null, or when an older SQL declaration does not pass it.
 */
static Datum
store_leases_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return (Datum) 0;
	return PG_GETARG_DATUM(argno);
}

/*
 * 0.2's statements on outbox.events (lease, ack, retry, dead, requeue) are
 * gone with that table (0.4.0: outbox.events is a view over the store).
 * Their C entry points stay because the 0.1.0 and 0.2.x install scripts
 * declare SQL functions on them (CREATE FUNCTION checks that the symbol
 * exists); 0.3.0--0.4.0 drops those declarations.
 */
static void
store_removed(const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("%s was removed in outbox_pg 0.4.0", name),
			 errhint("Run ALTER EXTENSION outbox_pg UPDATE.")));
}

Datum
outbox_lease(PG_FUNCTION_ARGS)
{
	store_removed("outbox._lease()");
	PG_RETURN_NULL();
}

Datum
outbox_ack(PG_FUNCTION_ARGS)
{
	store_removed("outbox._ack()");
	PG_RETURN_NULL();
}

Datum
outbox_retry(PG_FUNCTION_ARGS)
{
	store_removed("outbox._retry()");
	PG_RETURN_NULL();
}

Datum
outbox_dead(PG_FUNCTION_ARGS)
{
	store_removed("outbox._dead()");
	PG_RETURN_NULL();
}

Datum
outbox_requeue(PG_FUNCTION_ARGS)
{
	store_removed("outbox._requeue()");
	PG_RETURN_NULL();
}


/*
 * The insert-only store (issue #21, design A of README.store)
 * ===========================================================
 *
 * Events are appended to outbox.log_0..2 and never updated.  A
 * destination's position is a pg_snapshot: the to_snap of its newest
 * outbox.batches row.  A claim takes the events whose transactions the
 * current snapshot shows and the position does not, cut to about
 * batch_size events at a transaction boundary, and records the range as a
 * new batches row.  The acknowledgement is one outbox.batch_acks row per
 * batch; only failed events are written per event (copied to
 * outbox.retries).  See README.store, section 3.1, for why this is
 * gap-safe and why no dead index entry lies in what the claim scans.
 *
 * The claim is three statements in the caller's transaction:
 *
 *	- lock the destination's outbox.streams row (FOR NO KEY UPDATE SKIP
 *	  LOCKED; NO KEY so that foreign-key checks are not blocked): nothing
 *	  when another worker is claiming it.  It must be a statement of its
 *	  own: the next one reads the position with a snapshot taken after the
 *	  lock was granted, so it sees the batch a claimer that just released
 *	  the lock committed.  (Read in the same statement, the position could
 *	  be older than the lock, and two claims would cover the same range.)
 *	- read the position, the current snapshot and the xids of the first
 *	  batch_size + 1 candidate events in xid order.  The current snapshot
 *	  is taken in the statement that reads, so every row it shows is read.
 *	- compute the cut in C, then read the range's events and INSERT the
 *	  batch row in one statement (its snapshot is newer than the one the
 *	  cut was computed from: it sees every row the cut snapshot shows).
 *
 * The range read probes prev's xip one xid at a time (a LATERAL subquery
 * kept unflattened by OFFSET 0) and scans (destination, xid) from
 * xmax(prev) to xmax(upto).  Do not write the probes as xid = ANY(ARRAY(
 * subquery)): with stale statistics (routine after a TRUNCATE) the planner
 * turned that into a bitmap scan of the destination's whole backlog.
 */

/* The events of $1 shown by snapshot $4 and not by $3 (text parameters). */
#define STORE_RANGE_SQL \
"SELECT l.* FROM pg_catalog.pg_snapshot_xip($3::pg_catalog.pg_snapshot) AS q(xid)" \
"  CROSS JOIN LATERAL (SELECT * FROM outbox.log AS l0" \
"                       WHERE l0.destination OPERATOR(pg_catalog.=) $1" \
"                         AND l0.xid OPERATOR(pg_catalog.=) q.xid OFFSET 0) AS l" \
" WHERE pg_catalog.pg_visible_in_snapshot(l.xid, $4::pg_catalog.pg_snapshot)" \
" UNION ALL " \
"SELECT l.* FROM outbox.log AS l" \
" WHERE l.destination OPERATOR(pg_catalog.=) $1" \
"   AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmax($3::pg_catalog.pg_snapshot)" \
"   AND l.xid OPERATOR(pg_catalog.<) pg_catalog.pg_snapshot_xmax($4::pg_catalog.pg_snapshot)" \
"   AND pg_catalog.pg_visible_in_snapshot(l.xid, $4::pg_catalog.pg_snapshot)"

/*
 * What a claim returns per event: the columns of the lease (attempts is 1:
 * a batch is an event's first attempt), then the batch's seq.  ev is the
 * range, b the batch row; only the events to send now (f.send) are
 * returned.  The SQL functions (outbox._claim, _claim_recover) return the
 * payload and the time as text, the declared types of their results; the
 * relay takes the payload as jsonb and created_at as it is, and formats
 * them after its claim committed (delivery.c), outside the stream's lock.
 */
#define STORE_EVENT_COLUMNS_OF(payload, time) \
"SELECT ev.id, ev.type, ev.aggregate_id, " payload ", ev.headers," \
"       ev.traceparent, " time "," \
"       1," \
"       pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) ev.created_at)," \
"       b.leased_until, b.seq" \
"  FROM f AS ev CROSS JOIN b" \
" WHERE ev.send" \
" ORDER BY ev.xid, ev.id"
#define STORE_EVENT_COLUMNS \
	STORE_EVENT_COLUMNS_OF("ev.payload::pg_catalog.text", \
						   "pg_catalog.to_char(ev.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
#define STORE_RELAY_EVENT_COLUMNS \
	STORE_EVENT_COLUMNS_OF("ev.payload", "ev.created_at")

/*
 * The range's events with what to do with them now: deferred (not_before
 * still ahead) or held (ordered destination: an earlier event of the
 * aggregate is in outbox.retries, is deferred in this range, or, under
 * on_dead = 'block', is dead and not released) events are not sent; the
 * claim copies them to outbox.retries, whose lease takes each aggregate's
 * head in order (see retries_lease_sql).  For a plain destination the
 * ordered flag (an InitPlan, once per claim) short-circuits every probe.
 *
 * The deferred events of the range are grouped per aggregate (dk: its
 * first deferred id; ids order as their text does) and joined, not probed
 * per event: a correlated EXISTS over the range scanned the whole range
 * for each of its events, and a transaction of 20,000 events to an
 * ordered destination was claimed for minutes.
 */
#define STORE_ORDERED_OF_SQL(dest) \
"(SELECT COALESCE(d.options OPERATOR(pg_catalog.->>) 'ordering'" \
"                 OPERATOR(pg_catalog.=) 'aggregate', false)" \
"   FROM outbox.destinations AS d WHERE d.name OPERATOR(pg_catalog.=) " dest ")"
#define STORE_ORDERED_SQL STORE_ORDERED_OF_SQL("$1")
/*
 * The probes of an ordered destination dest for an aggregate key: a copy
 * of it in outbox.retries (earlier than an id, or any), an unreleased dead
 * copy earlier than an id in outbox.dead_events.  Each reads the first
 * entry of the aggregate in the (destination, ordering_key, id) index and
 * is written so that no other plan is cheap, whatever the statistics say.
 * The planner estimates a probe whose key is a parameter from the table's
 * statistics: where one aggregate held thousands of copies and the analyze
 * saw no other key, it took every copy for a match, and an EXISTS scanned
 * the table for each probe (its first row "finds" one at once): two scans
 * of the 10,000 copies of one held aggregate per event of a claim, 2 ms,
 * and 500-1,000 events/s to the whole destination.  So the first row in
 * (ordering_key, id) order, LIMIT 1: only that index gives the order.  The
 * key is a range of one value, not an equality: equated to a parameter it
 * drops out of the order, which is then the id's alone, and the primary
 * key gives that too (a plan walked it from the smallest id, through every
 * copy of the held aggregate, for each head of another one).
 */
#define STORE_RETRIES_COPY_SQL(dest, key, before) \
"((SELECT p.id FROM outbox.retries AS p" \
"   WHERE p.destination OPERATOR(pg_catalog.=) " dest \
"     AND p.ordering_key OPERATOR(pg_catalog.>=) " key \
"     AND p.ordering_key OPERATOR(pg_catalog.<=) " key before \
"   ORDER BY p.ordering_key, p.id LIMIT 1) IS NOT NULL)"
#define STORE_DEAD_BEFORE_SQL(dest, key, id) \
"((SELECT x.id FROM outbox.dead_events AS x" \
"   WHERE x.destination OPERATOR(pg_catalog.=) " dest \
"     AND x.ordering_key OPERATOR(pg_catalog.>=) " key \
"     AND x.ordering_key OPERATOR(pg_catalog.<=) " key \
"     AND x.id OPERATOR(pg_catalog.<) " id \
"     AND x.id OPERATOR(pg_catalog.>) COALESCE(" \
"           (SELECT ar.released_through FROM outbox.aggregate_releases AS ar" \
"             WHERE ar.destination OPERATOR(pg_catalog.=) " dest \
"               AND ar.aggregate_id OPERATOR(pg_catalog.=) " key ")," \
"           '00000000-0000-0000-0000-000000000000'::pg_catalog.uuid)" \
"   ORDER BY x.ordering_key, x.id LIMIT 1) IS NOT NULL)"
#define STORE_ON_DEAD_BLOCK_SQL(dest) \
"(SELECT COALESCE(d.options OPERATOR(pg_catalog.->>) 'on_dead', 'block')" \
"                 OPERATOR(pg_catalog.=) 'block'" \
"   FROM outbox.destinations AS d WHERE d.name OPERATOR(pg_catalog.=) " dest ")"

/*
 * The flags are computed once per event, below the OFFSET 0: pulled up,
 * held was evaluated twice (for itself and for send).
 */
#define STORE_FLAGS_SQL \
"SELECT e.*, NOT (e.deferred OR e.held OR $6) AS send FROM (" \
"  SELECT r.*," \
"         COALESCE(r.not_before OPERATOR(pg_catalog.>) pg_catalog.now(), false) AS deferred," \
"         (r.ordering_key IS NOT NULL" \
"          AND " STORE_ORDERED_SQL \
"          AND (" STORE_RETRIES_COPY_SQL("$1", "r.ordering_key", "") \
"               OR COALESCE(dk.first_deferred OPERATOR(pg_catalog.<) r.id, false)" \
"               OR (" STORE_ON_DEAD_BLOCK_SQL("$1") \
"                   AND " STORE_DEAD_BEFORE_SQL("$1", "r.ordering_key", "r.id") ")))" \
"           AS held" \
"    FROM ev AS r" \
"    LEFT JOIN (SELECT q.ordering_key," \
"                      pg_catalog.min(q.id::pg_catalog.text COLLATE \"C\")::pg_catalog.uuid" \
"                      AS first_deferred" \
"                 FROM ev AS q" \
"                WHERE q.not_before OPERATOR(pg_catalog.>) pg_catalog.now()" \
"                  AND q.ordering_key IS NOT NULL" \
"                  AND " STORE_ORDERED_SQL \
"                GROUP BY q.ordering_key) AS dk" \
"           ON dk.ordering_key OPERATOR(pg_catalog.=) r.ordering_key" \
"   OFFSET 0) AS e"

static const char *claim_lock_sql =
"SELECT 1 FROM outbox.streams AS s"
" WHERE s.destination OPERATOR(pg_catalog.=) $1"
"   FOR NO KEY UPDATE SKIP LOCKED";

/*
 * Position, current snapshot and the xids of the first $2 candidates (one
 * row per candidate event; none: nothing new).  Not as text: only the
 * first row's snapshots and two xids are read, and the output functions
 * of the others were 4 % of a claim.
 */
static const char *claim_scan_sql =
"SELECT p.seq, p.to_snap, c.cur, x.xid"
"  FROM (SELECT b.seq, b.to_snap FROM outbox.batches AS b"
"         WHERE b.destination OPERATOR(pg_catalog.=) $1"
"         ORDER BY b.seq DESC LIMIT 1) AS p"
" CROSS JOIN (SELECT pg_catalog.pg_current_snapshot() AS cur OFFSET 0) AS c"
" CROSS JOIN LATERAL ("
"       SELECT r.xid FROM ("
"           SELECT l.xid FROM pg_catalog.pg_snapshot_xip(p.to_snap) AS q(xid)"
"             CROSS JOIN LATERAL (SELECT l0.xid FROM outbox.log AS l0"
"                                  WHERE l0.destination OPERATOR(pg_catalog.=) $1"
"                                    AND l0.xid OPERATOR(pg_catalog.=) q.xid OFFSET 0) AS l"
"            WHERE pg_catalog.pg_visible_in_snapshot(l.xid, c.cur)"
"           UNION ALL"
"           (SELECT l.xid FROM outbox.log AS l"
"             WHERE l.destination OPERATOR(pg_catalog.=) $1"
"               AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmax(p.to_snap)"
"               AND l.xid OPERATOR(pg_catalog.<) pg_catalog.pg_snapshot_xmax(c.cur)"
"               AND pg_catalog.pg_visible_in_snapshot(l.xid, c.cur)"
"             ORDER BY l.xid LIMIT $2)) AS r"
"        ORDER BY r.xid LIMIT $2) AS x"
" ORDER BY x.xid";

/*
 * $1 destination, $2 seq, $3 from, $4 to (text), $5 lease, $6 spill (every
 * event is copied to outbox.retries: see OutboxStoreClaimSpill).  The batch
 * counts every event of the range; the deferred and held ones are copied
 * to outbox.retries (attempts 0, due at not_before or now) in the same
 * statement, so the batch is acknowledged once the returned ones are done;
 * a batch with none to send is acknowledged here (nobody else would, and
 * an unacknowledged batch is recovered again and again and pins the
 * rotation).
 */
#define CLAIM_INSERT_SQL \
"WITH ev AS MATERIALIZED (" STORE_RANGE_SQL ")," \
"     f AS MATERIALIZED (" STORE_FLAGS_SQL ")," \
"     b AS (INSERT INTO outbox.batches AS nb" \
"                  (destination, seq, from_snap, to_snap, leased_until, events," \
"                   oldest_created_at)" \
"           SELECT $1, $2, $3::pg_catalog.pg_snapshot, $4::pg_catalog.pg_snapshot," \
"                  pg_catalog.now() OPERATOR(pg_catalog.+) $5," \
"                  pg_catalog.count(*), pg_catalog.min(ev.created_at) FROM ev" \
"           RETURNING nb.seq, nb.leased_until)," \
"     k AS (INSERT INTO outbox.retries AS t" \
"                  (id, type, aggregate_type, aggregate_id, payload, headers, traceparent," \
"                   destination, ordering_key, created_at, attempts, due_at)" \
"           SELECT h.id, h.type, h.aggregate_type, h.aggregate_id, h.payload, h.headers," \
"                  h.traceparent, h.destination, h.ordering_key, h.created_at, 0," \
"                  CASE WHEN h.deferred THEN h.not_before ELSE pg_catalog.now() END" \
"             FROM f AS h WHERE NOT h.send" \
"           ON CONFLICT (id) DO NOTHING)," \
"     z AS (INSERT INTO outbox.batch_acks (destination, seq)" \
"           SELECT $1, b.seq FROM b WHERE NOT EXISTS (SELECT 1 FROM f WHERE f.send)) "

static const char *claim_insert_sql = CLAIM_INSERT_SQL STORE_EVENT_COLUMNS;
static const char *claim_insert_relay_sql = CLAIM_INSERT_SQL STORE_RELAY_EVENT_COLUMNS;

/*
 * The acknowledgement of batch $2 of $1, and the copies of its failed
 * events ($3 ids, $4 due_at, $5 attempts, $6 status, $7 error: to
 * outbox.retries) and dead ones ($8 ids, $9 status, $10 error: to
 * outbox.dead_events) when it is the first: a late acknowledgement of a
 * batch that another worker claimed again and acknowledged changes
 * nothing.  A batch that does not exist is not acknowledged.  $11, the
 * lease's fence: unless null, the batch is acknowledged only while its
 * leased_until is still the one its acknowledger holds, so a relay that
 * was stopped past its lease (another worker recovered the batch and is
 * sending it again) cannot turn its late failures into dead letters.
 */
static const char *claim_ack_sql =
"WITH a AS (INSERT INTO outbox.batch_acks AS k (destination, seq)"
"           SELECT $1, $2 WHERE EXISTS ("
"               SELECT 1 FROM outbox.batches AS b"
"                WHERE b.destination OPERATOR(pg_catalog.=) $1"
"                  AND b.seq OPERATOR(pg_catalog.=) $2"
"                  AND ($11::pg_catalog.timestamptz IS NULL"
"                       OR b.leased_until OPERATOR(pg_catalog.=) $11))"
"           ON CONFLICT DO NOTHING RETURNING k.seq),"
"     f AS (INSERT INTO outbox.retries AS t"
"                  (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,"
"                   destination, ordering_key, created_at, attempts, due_at,"
"                   last_status, last_error)"
"           SELECT l.id, l.type, l.aggregate_type, l.aggregate_id, l.payload, l.headers,"
"                  l.traceparent, l.destination, l.ordering_key, l.created_at,"
"                  r.attempts, r.due_at, r.status, r.error"
"             FROM ROWS FROM (pg_catalog.unnest($3), pg_catalog.unnest($4),"
"                             pg_catalog.unnest($5), pg_catalog.unnest($6),"
"                             pg_catalog.unnest($7))"
"                  AS r(id, due_at, attempts, status, error)"
"             JOIN outbox.log AS l ON l.id OPERATOR(pg_catalog.=) r.id"
"                                 AND l.destination OPERATOR(pg_catalog.=) $1"
"            WHERE EXISTS (SELECT 1 FROM a)"
"           ON CONFLICT (id) DO NOTHING),"
"     x AS (INSERT INTO outbox.dead_events AS t"
"                  (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,"
"                   destination, ordering_key, created_at, attempts, due_at,"
"                   last_status, last_error)"
"           SELECT l.id, l.type, l.aggregate_type, l.aggregate_id, l.payload, l.headers,"
"                  l.traceparent, l.destination, l.ordering_key, l.created_at,"
"                  1, pg_catalog.now(), r.status, r.error"
"             FROM ROWS FROM (pg_catalog.unnest($8), pg_catalog.unnest($9),"
"                             pg_catalog.unnest($10))"
"                  AS r(id, status, error)"
"             JOIN outbox.log AS l ON l.id OPERATOR(pg_catalog.=) r.id"
"                                 AND l.destination OPERATOR(pg_catalog.=) $1"
"            WHERE EXISTS (SELECT 1 FROM a)"
"           ON CONFLICT (id) DO NOTHING)"
"SELECT EXISTS (SELECT 1 FROM a)";

/*
 * The oldest unacknowledged batch of $1 at or above seq $3 whose lease ran
 * out, leased again for $2.  Run once per lease margin, not per claim.
 */
static const char *claim_recover_sql =
"UPDATE outbox.batches AS b"
"   SET leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $2"
" WHERE b.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
"        SELECT c.ctid FROM outbox.batches AS c"
"         WHERE c.destination OPERATOR(pg_catalog.=) $1"
"           AND c.seq OPERATOR(pg_catalog.>=) $3"
"           AND c.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now()"
"           AND NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS k"
"                            WHERE k.destination OPERATOR(pg_catalog.=) c.destination"
"                              AND k.seq OPERATOR(pg_catalog.=) c.seq)"
"         ORDER BY c.seq LIMIT 1"
"           FOR UPDATE OF c SKIP LOCKED))"
" RETURNING b.seq, b.from_snap::pg_catalog.text, b.to_snap::pg_catalog.text";

/*
 * The events of a recovered batch: $1 destination, $2 seq, $3 from, $4 to;
 * those its claim copied to outbox.retries (deferred, held) are not sent
 * again.
 */
#define CLAIM_REREAD_SQL \
"WITH ev AS MATERIALIZED (" STORE_RANGE_SQL ")," \
"     f AS (SELECT r.*, NOT EXISTS (SELECT 1 FROM outbox.retries AS t" \
"                                    WHERE t.id OPERATOR(pg_catalog.=) r.id) AS send" \
"             FROM ev AS r)," \
"     b AS (SELECT nb.seq, nb.leased_until FROM outbox.batches AS nb" \
"            WHERE nb.destination OPERATOR(pg_catalog.=) $1" \
"              AND nb.seq OPERATOR(pg_catalog.=) $2) "

static const char *claim_reread_sql = CLAIM_REREAD_SQL STORE_EVENT_COLUMNS;
static const char *claim_reread_relay_sql = CLAIM_REREAD_SQL STORE_RELAY_EVENT_COLUMNS;

/*
 * An ordered destination has one batch in flight at a time (README.store,
 * 3.1, "ordering"): after its stream is locked, its newest batch must be
 * acknowledged before another is claimed.  Only the newest can be
 * unacknowledged, since each claim checked this; an expired one is the
 * recovery's.  One probe of batch_acks' primary key.
 */
static const char *claim_serial_sql =
"SELECT 1 FROM (SELECT b.seq FROM outbox.batches AS b"
"                WHERE b.destination OPERATOR(pg_catalog.=) $1"
"                ORDER BY b.seq DESC LIMIT 1) AS p"
" WHERE NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS k"
"                    WHERE k.destination OPERATOR(pg_catalog.=) $1"
"                      AND k.seq OPERATOR(pg_catalog.=) p.seq)";

static SPIPlanPtr claim_lock_plan = NULL;

/*
 * The stream of a destination that has none (its row was written with the
 * triggers off: outbox._stream_changed() did not run): its position shows
 * no transaction, so its first claim takes every event of it in the log.
 */
static const char *stream_create_sql =
"WITH s AS (INSERT INTO outbox.streams (destination)"
"           SELECT d.name FROM outbox.destinations AS d"
"            WHERE d.name OPERATOR(pg_catalog.=) $1"
"           ON CONFLICT DO NOTHING RETURNING destination),"
"     b AS (INSERT INTO outbox.batches (destination, seq, from_snap, to_snap,"
"                                       leased_until, events)"
"           SELECT s.destination, 0, '3:3:', '3:3:', pg_catalog.now(), 0 FROM s"
"           ON CONFLICT DO NOTHING),"
"     a AS (INSERT INTO outbox.batch_acks (destination, seq)"
"           SELECT s.destination, 0 FROM s ON CONFLICT DO NOTHING)"
"SELECT s.destination FROM s";

static SPIPlanPtr stream_create_plan = NULL;

/*
 * The destinations whose stream this process locked lately: a lock missed
 * on one of them is another worker's claim, and the stream is not made
 * again (two workers on one busy destination missed about half of their
 * locks, and each miss ran stream_create_sql).  Looked at again after
 * STREAM_KNOWN_MS, so a stream deleted behind the triggers' back is made
 * again within that time.
 */
#define STREAM_KNOWN_MS		10000

typedef struct KnownStream
{
	char		name[NAMEDATALEN];	/* destination names have at most 63 */
	TimestampTz locked_at;
} KnownStream;

static HTAB *known_streams = NULL;

static KnownStream *
store_known_stream(const char *destination)
{
	bool		found;
	KnownStream *k;

	if (known_streams == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(KnownStream);
		known_streams = hash_create("outbox_pg streams", 16, &ctl,
									HASH_ELEM | HASH_STRINGS);
	}
	k = hash_search(known_streams, destination, HASH_ENTER, &found);
	if (!found)
		k->locked_at = 0;
	return k;
}

/* whether the last store_claim() made a batch */
static bool store_last_claimed = false;

/*
 * Whether the last store_claim() cut its range before events it had seen:
 * the destination has more to claim, however few events the claim
 * returned (a cut at a transaction boundary can leave it well below
 * batch_size, and held or deferred events are not returned at all).
 */
static bool store_last_cut = false;

/*
 * Whether the last store_claim() found the destination's stream locked:
 * another relay is claiming it now, so what it has is not known.
 */
static bool store_last_locked_out = false;

static uint64 store_claim(int batch_size, Interval *lease,
						  const char *destination, bool serial, bool spill,
						  bool relay);
static SPIPlanPtr claim_serial_plan = NULL;
static SPIPlanPtr claim_scan_plan = NULL;
static SPIPlanPtr claim_insert_plan = NULL;
static SPIPlanPtr claim_insert_relay_plan = NULL;
static SPIPlanPtr claim_ack_plan = NULL;
static SPIPlanPtr claim_recover_plan = NULL;
static SPIPlanPtr claim_reread_plan = NULL;
static SPIPlanPtr claim_reread_relay_plan = NULL;

/*
 * A pg_snapshot taken apart: xids below xmin and those from xmin up to
 * xmax that are not in xip are shown; the rest is not.  Kept as the text
 * form pg_snapshot_in/out use ("xmin:xmax:xip,..."), which is stable
 * across releases, rather than the type's internal layout, which is not
 * exported.
 */
typedef struct StoreSnapshot
{
	uint64		xmin;
	uint64		xmax;
	int			nxip;
	uint64	   *xip;			/* ascending */
} StoreSnapshot;

static uint64
store_parse_xid(const char *str, char **end)
{
	uint64		v;

	errno = 0;
	v = strtou64(str, end, 10);
	if (errno != 0 || *end == str)
		elog(ERROR, "invalid snapshot or xid from outbox statement: \"%s\"", str);
	return v;
}

static void
store_snapshot_parse(const char *str, StoreSnapshot *s)
{
	const char *p = str;
	char	   *end;
	int			max = 8;

	s->xmin = store_parse_xid(p, &end);
	if (*end != ':')
		elog(ERROR, "invalid snapshot from outbox statement: \"%s\"", str);
	s->xmax = store_parse_xid(end + 1, &end);
	if (*end != ':')
		elog(ERROR, "invalid snapshot from outbox statement: \"%s\"", str);
	p = end + 1;
	s->nxip = 0;
	s->xip = palloc(max * sizeof(uint64));
	while (*p != '\0')
	{
		if (s->nxip == max)
		{
			max *= 2;
			s->xip = repalloc(s->xip, max * sizeof(uint64));
		}
		s->xip[s->nxip++] = store_parse_xid(p, &end);
		if (*end == ',')
			end++;
		else if (*end != '\0')
			elog(ERROR, "invalid snapshot from outbox statement: \"%s\"", str);
		p = end;
	}
}

static char *
store_snapshot_format(const StoreSnapshot *s)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfo(&buf, UINT64_FORMAT ":" UINT64_FORMAT ":", s->xmin, s->xmax);
	for (int i = 0; i < s->nxip; i++)
		appendStringInfo(&buf, "%s" UINT64_FORMAT, i > 0 ? "," : "", s->xip[i]);
	return buf.data;
}

/*
 * Cut s at xid: afterwards it shows what it showed below xid and nothing
 * from xid on.
 */
static void
store_snapshot_cut(StoreSnapshot *s, uint64 xid)
{
	if (xid >= s->xmax)
		return;
	s->xmax = xid;
	if (s->xmin > xid)
		s->xmin = xid;
	while (s->nxip > 0 && s->xip[s->nxip - 1] >= xid)
		s->nxip--;
}

/* Column col (1-based) of row row of SPI_tuptable, not null. */
static Datum
store_binary_column(uint64 row, int col)
{
	bool		isnull;
	Datum		value = SPI_getbinval(SPI_tuptable->vals[row],
									  SPI_tuptable->tupdesc, col, &isnull);

	if (isnull)
		elog(ERROR, "outbox statement returned a null where none can be");
	return value;
}

/* Column col (1-based) of row row of SPI_tuptable, not null, as C text. */
static char *
store_text_column(uint64 row, int col)
{
	char	   *value = SPI_getvalue(SPI_tuptable->vals[row],
									 SPI_tuptable->tupdesc, col);

	if (value == NULL)
		elog(ERROR, "outbox statement returned a null where none can be");
	return value;
}

/*
 * Claim up to about batch_size events of a destination (whole
 * transactions: more when the first transaction alone has more, fewer
 * when the cut falls inside one).  The events are left in SPI_tuptable in
 * the lease's columns, then seq (see claim_insert_sql): only those to send
 * now; deferred and held ones are in outbox.retries.  Returns their number,
 * 0 when another worker holds the destination, nothing is new, or nothing
 * of what is new is to be sent now (a batch row exists then).  The caller is connected to SPI and commits the batch
 * row with its transaction.
 */
uint64
OutboxStoreClaim(int batch_size, Interval *lease, const char *destination)
{
	return store_claim(batch_size, lease, destination, false, false, false);
}

/*
 * OutboxStoreClaim for the relay: *more is set when the destination has
 * more events than this claim took (claim it again at once), *locked_out
 * when another relay held its stream (claim it again soon: it may have
 * events this relay has not seen).
 */
uint64
OutboxStoreClaimNext(int batch_size, Interval *lease, const char *destination,
					 bool serial, bool *more, bool *locked_out)
{
	uint64		n = store_claim(batch_size, lease, destination, serial, false,
								true);

	*more = store_last_cut;
	*locked_out = store_last_locked_out;
	return n;
}

/*
 * Spill up to about batch_size events of a destination to outbox.retries:
 * a claim that sends nothing and copies every event of its range (so it
 * acknowledges itself).  The rotation does this for a paused destination
 * whose backlog would otherwise keep a slot from being truncated
 * (README.store, 3.1, "retention"); the copies pin nothing and are leased
 * in order once the destination is resumed.  True if a batch was made.
 *
 * Nothing is spilled while the destination's newest batch is
 * unacknowledged (serial): the events after it would be leased from
 * outbox.retries while it is still in flight, and an ordered destination
 * sent an aggregate's later events before its earlier one.  Spilling past
 * it seldom frees the slot: its events usually lie in the slot to
 * truncate themselves.  Not when a transaction that was open over the
 * batch's claim left an event in an older slot; that slot then waits for
 * the batch's acknowledgement (or its recovery once the destination is
 * resumed), and the rotation says "unacknowledged" meanwhile.
 */
bool
OutboxStoreClaimSpill(int batch_size, const char *destination)
{
	Interval   *lease = palloc0(sizeof(Interval));

	(void) store_claim(batch_size, lease, destination, true, true, false);
	return store_last_claimed;
}

/*
 * Lease again the oldest batch of a destination, at or above low_seq,
 * whose lease ran out unacknowledged (claim_recover_sql).  False: none.
 * Else args[0..3] are the destination, the batch's seq and its from and
 * to snapshots as text: the parameters of the statements on its range
 * (STORE_RANGE_SQL).
 */
static bool
store_recover_batch(Interval *lease, const char *destination, int64 low_seq,
					Datum *args)
{
	Oid			recover_types[3] = {TEXTOID, INTERVALOID, INT8OID};

	args[0] = CStringGetTextDatum(destination);
	args[1] = IntervalPGetDatum(lease);
	args[2] = Int64GetDatum(low_seq);
	if (store_execute(WorkerKeepPlan(&claim_recover_plan, claim_recover_sql, 3,
									 recover_types),
					  args, NULL, SPI_OK_UPDATE_RETURNING) == 0)
		return false;
	args[1] = Int64GetDatum((int64) strtoi64(store_text_column(0, 1), NULL, 10));
	args[2] = CStringGetTextDatum(store_text_column(0, 2));
	args[3] = CStringGetTextDatum(store_text_column(0, 3));
	return true;
}

/*
 * Batch $2 of destination $1 (from $3 to $4, as text) acknowledged, and
 * its events copied to outbox.retries if this acknowledged it: a relay
 * whose late acknowledgement came first (its fence still held) did the
 * batch's bookkeeping itself, and its delivered and dead events must not
 * be copied.  Those the claim copied (deferred, held) keep their copy, and
 * a copy that was since delivered, purged or dead-lettered is not made
 * again (settled_events, dead_events).  attempts 1: the batch was their
 * first attempt, which may have reached the destination.
 */
static const char *spill_batch_sql =
"WITH a AS (INSERT INTO outbox.batch_acks AS k (destination, seq) VALUES ($1, $2)"
"           ON CONFLICT DO NOTHING RETURNING k.seq),"
"     ev AS MATERIALIZED (" STORE_RANGE_SQL ")"
"INSERT INTO outbox.retries AS t"
"       (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,"
"        destination, ordering_key, created_at, attempts, due_at)"
"SELECT ev.id, ev.type, ev.aggregate_type, ev.aggregate_id, ev.payload,"
"       ev.headers, ev.traceparent, ev.destination, ev.ordering_key,"
"       ev.created_at, 1, pg_catalog.now()"
"  FROM ev"
" WHERE EXISTS (SELECT 1 FROM a)"
"   AND NOT EXISTS (SELECT 1 FROM outbox.settled_events AS z"
"                    WHERE z.id OPERATOR(pg_catalog.=) ev.id)"
"   AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x"
"                    WHERE x.id OPERATOR(pg_catalog.=) ev.id)"
"    ON CONFLICT (id) DO NOTHING";

static SPIPlanPtr spill_batch_plan = NULL;

/*
 * Spill the oldest batch of a destination whose lease ran out
 * unacknowledged to outbox.retries, and acknowledge it.  The rotation does
 * this for a deleted or paused destination, which no relay recovers: its
 * batch would keep a slot from being truncated until the destination is
 * created again or resumed.  A relay that still sends the batch finds its
 * lease moved (the recovery's UPDATE) and its acknowledgement fenced; the
 * copies are sent once the destination is back, a second time for those
 * that had reached it.  True if a batch was spilled.
 */
bool
OutboxStoreSpillExpired(const char *destination)
{
	Oid			spill_types[4] = {TEXTOID, INT8OID, TEXTOID, TEXTOID};
	Datum		args[4];

	if (!store_recover_batch(palloc0(sizeof(Interval)), destination, 0, args))
		return false;
	(void) store_execute(WorkerKeepPlan(&spill_batch_plan, spill_batch_sql, 4,
										spill_types),
						 args, NULL, SPI_OK_INSERT);
	return true;
}

/*
 * OutboxStoreClaim; with serial, nothing while the destination's newest
 * batch is unacknowledged (the relay's claim of an ordered destination);
 * with spill, every event to outbox.retries; with relay, in the relay's
 * columns (STORE_RELAY_EVENT_COLUMNS).
 */
static uint64
store_claim(int batch_size, Interval *lease, const char *destination,
			bool serial, bool spill, bool relay)
{
	Oid			lock_types[1] = {TEXTOID};
	Oid			scan_types[2] = {TEXTOID, INT4OID};
	Oid			insert_types[6] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, INTERVALOID,
								   BOOLOID};
	Datum		args[6];
	uint64		n;
	int64		seq;
	char	   *prev_text;
	StoreSnapshot prev;
	StoreSnapshot cur;
	KnownStream *known;

	Assert(batch_size > 0);
	store_last_claimed = false;
	store_last_cut = false;
	store_last_locked_out = false;

	/*
	 * The position must be read with a snapshot taken after the stream's
	 * lock was granted (see above): each statement needs its own snapshot.
	 */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("an outbox claim must run at isolation level READ COMMITTED")));
	args[0] = CStringGetTextDatum(destination);
	known = store_known_stream(destination);
	if (store_execute(WorkerKeepPlan(&claim_lock_plan, claim_lock_sql, 1, lock_types),
					  args, NULL, SPI_OK_SELECT) == 0)
	{
		/*
		 * No stream to lock: another worker holds it, or the destination
		 * was written with its triggers off (session_replication_role =
		 * replica, as logical replication applies rows), so it never got
		 * one.  Make it then, positioned before every event, and lock it.
		 */
		store_last_locked_out = true;
		if (known->locked_at != 0 &&
			!OutboxTimePassed(known->locked_at, GetCurrentTimestamp(),
							  STREAM_KNOWN_MS))
			return 0;
		if (store_execute(WorkerKeepPlan(&stream_create_plan, stream_create_sql, 1,
										 lock_types),
						  args, NULL, SPI_OK_SELECT) == 0 ||
			store_execute(WorkerKeepPlan(&claim_lock_plan, claim_lock_sql, 1,
										 lock_types),
						  args, NULL, SPI_OK_SELECT) == 0)
			return 0;
		store_last_locked_out = false;
	}
	known->locked_at = GetCurrentTimestamp();
	if (serial &&
		store_execute(WorkerKeepPlan(&claim_serial_plan, claim_serial_sql, 1, lock_types),
					  args, NULL, SPI_OK_SELECT) > 0)
		return 0;

	args[1] = Int32GetDatum(batch_size + 1);
	n = store_execute(WorkerKeepPlan(&claim_scan_plan, claim_scan_sql, 2, scan_types),
					  args, NULL, SPI_OK_SELECT);
	if (n == 0)
		return 0;

	seq = DatumGetInt64(store_binary_column(0, 1));
	prev_text = store_text_column(0, 2);
	store_snapshot_parse(prev_text, &prev);
	store_snapshot_parse(store_text_column(0, 3), &cur);

	/*
	 * More candidates than batch_size: cut before the transaction of the
	 * (batch_size + 1)th, but never inside the first transaction (it goes
	 * whole) and never below prev's xmax (the new position must show all
	 * prev shows, or the next claim would take those events again).
	 */
	if (n > (uint64) batch_size)
	{
		uint64		first;
		uint64		lim;

		first = U64FromFullTransactionId(DatumGetFullTransactionId(store_binary_column(0, 4)));
		lim = U64FromFullTransactionId(DatumGetFullTransactionId(store_binary_column(batch_size, 4)));
		if (lim == first)
			lim = first + 1;
		if (lim < prev.xmax)
			lim = prev.xmax;
		store_snapshot_cut(&cur, lim);
		store_last_cut = true;
	}

	args[1] = Int64GetDatum(seq + 1);
	args[2] = CStringGetTextDatum(prev_text);
	args[3] = CStringGetTextDatum(store_snapshot_format(&cur));
	args[4] = IntervalPGetDatum(lease);
	args[5] = BoolGetDatum(spill);
	store_last_claimed = true;
	if (relay)
		return store_execute(WorkerKeepPlan(&claim_insert_relay_plan,
											claim_insert_relay_sql, 6,
											insert_types),
							 args, NULL, SPI_OK_SELECT);
	return store_execute(WorkerKeepPlan(&claim_insert_plan, claim_insert_sql, 6,
										insert_types),
						 args, NULL, SPI_OK_SELECT);
}

/*
 * Acknowledge batch seq of a destination; failed (uuid[]) with due_at
 * (timestamptz[]), attempts and statuses (int4[]) and errors (text[]): the
 * events to copy to outbox.retries; dead (uuid[]) with dead_statuses
 * (int4[]) and dead_errors (text[]): those to copy to outbox.dead_events.
 * fence: the batch's leased_until as the caller holds it (0: no fence).
 * True if this call acknowledged the batch (false: already acknowledged,
 * no such batch, or its lease moved on; nothing copied).
 */
bool
OutboxStoreClaimAck(const char *destination, int64 seq, Datum failed,
					Datum due_at, Datum attempts, Datum statuses, Datum errors,
					Datum dead, Datum dead_statuses, Datum dead_errors,
					TimestampTz fence)
{
	Oid			types[11] = {TEXTOID, INT8OID, UUIDARRAYOID, TIMESTAMPTZARRAYOID,
							 INT4ARRAYOID, INT4ARRAYOID, TEXTARRAYOID,
							 UUIDARRAYOID, INT4ARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID};
	Datum		args[11] = {CStringGetTextDatum(destination), Int64GetDatum(seq),
							failed, due_at, attempts, statuses, errors,
							dead, dead_statuses, dead_errors,
							TimestampTzGetDatum(fence)};
	char		nulls[11] = "          ";
	bool		isnull;
	Datum		acked;

	nulls[10] = (fence == 0) ? 'n' : ' ';
	if (store_execute(WorkerKeepPlan(&claim_ack_plan, claim_ack_sql, 11, types),
					  args, nulls, SPI_OK_SELECT) != 1)
		elog(ERROR, "outbox acknowledgement returned no row");
	acked = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return !isnull && DatumGetBool(acked);
}

/*
 * Lease again the oldest batch of a destination, at or above low_seq,
 * whose lease ran out unacknowledged, and read its events again (left in
 * SPI_tuptable as OutboxStoreClaim leaves them; with relay, in the
 * relay's columns).  0: none.
 */
uint64
OutboxStoreClaimRecover(Interval *lease, const char *destination, int64 low_seq,
						bool relay)
{
	Oid			reread_types[4] = {TEXTOID, INT8OID, TEXTOID, TEXTOID};
	Datum		args[4];

	if (!store_recover_batch(lease, destination, low_seq, args))
		return 0;
	if (relay)
		return store_execute(WorkerKeepPlan(&claim_reread_relay_plan,
											claim_reread_relay_sql, 4,
											reread_types),
							 args, NULL, SPI_OK_SELECT);
	return store_execute(WorkerKeepPlan(&claim_reread_plan, claim_reread_sql, 4,
										reread_types),
						 args, NULL, SPI_OK_SELECT);
}

/*
 * The destinations with due work (issue #19): events past their position
 * (a probe per xid of the position's xip, and one of the (destination,
 * xid) index from its xmax: a few index probes per destination), a due
 * outbox.retries row that is not leased, or a batch whose lease ran out
 * unacknowledged.  The relay's sweep (delivery.c), the safety net under
 * the emitted generations (wake.c): it finds what no commit of emit()
 * announced (retries coming due, COPY, COMMIT PREPARED, a relay that
 * died).  An event of a transaction still running counts: a claim that
 * finds nothing, at most once per sweep.  Paused destinations are not
 * looked at (a relay does not claim them; once resumed, the next sweep
 * finds their work).
 *
 * outbox.retries is looked at per destination that has copies there (a
 * skip scan of its destinations), each asked for its first due copy that
 * is not leased in retries_due_idx: reading every due copy, as this did,
 * cost 136 ms per sweep with 100,000 copies of a paused destination's
 * backlog (the rotation spills it there; psql, no JIT), and the sweep is
 * paced by its cost for every destination (1 ms now).
 */
#define DUE_WITHOUT_LOG_SQL \
"WITH RECURSIVE rd (destination) AS (" \
"    (SELECT r.destination FROM outbox.retries AS r" \
"      ORDER BY r.destination LIMIT 1)" \
"    UNION ALL" \
"    SELECT (SELECT r.destination FROM outbox.retries AS r" \
"             WHERE r.destination OPERATOR(pg_catalog.>) rd.destination" \
"             ORDER BY r.destination LIMIT 1)" \
"      FROM rd WHERE rd.destination IS NOT NULL) " \
"SELECT DISTINCT x.destination" \
"  FROM (SELECT rd.destination FROM rd" \
"         WHERE rd.destination IS NOT NULL" \
"           AND (SELECT r.due_at FROM outbox.retries AS r" \
"                 WHERE r.destination OPERATOR(pg_catalog.=) rd.destination" \
"                   AND r.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()" \
"                   AND (r.leased_until IS NULL" \
"                        OR r.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())" \
"                 ORDER BY r.due_at LIMIT 1) IS NOT NULL" \
"        UNION ALL " \
"        SELECT b.destination FROM outbox.batches AS b" \
"         WHERE b.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now()" \
"           AND b.leased_until OPERATOR(pg_catalog.>) $1" \
"           AND (SELECT true FROM outbox.batch_acks AS k" \
"                 WHERE k.destination OPERATOR(pg_catalog.=) b.destination" \
"                   AND k.seq OPERATOR(pg_catalog.=) b.seq) IS NULL) AS x" \
" WHERE NOT (SELECT d.paused FROM outbox.destinations AS d" \
"             WHERE d.name OPERATOR(pg_catalog.=) x.destination)"

static const char *due_destinations_sql =
DUE_WITHOUT_LOG_SQL
" UNION "
"SELECT d.name FROM outbox.destinations AS d"
" WHERE NOT EXISTS (SELECT 1 FROM outbox.streams AS s"
"                    WHERE s.destination OPERATOR(pg_catalog.=) d.name)"
" UNION "
"SELECT s.destination FROM outbox.streams AS s"
" JOIN outbox.destinations AS d ON d.name OPERATOR(pg_catalog.=) s.destination"
" CROSS JOIN LATERAL (SELECT b.to_snap FROM outbox.batches AS b"
"                      WHERE b.destination OPERATOR(pg_catalog.=) s.destination"
"                      ORDER BY b.seq DESC LIMIT 1) AS p"
" WHERE NOT d.paused"
"   AND (EXISTS (SELECT 1 FROM pg_catalog.pg_snapshot_xip(p.to_snap) AS q(xid)"
"                 WHERE EXISTS (SELECT 1 FROM outbox.log AS l"
"                                WHERE l.destination OPERATOR(pg_catalog.=) s.destination"
"                                  AND l.xid OPERATOR(pg_catalog.=) q.xid))"
"        OR EXISTS (SELECT 1 FROM outbox.log AS l"
"                    WHERE l.destination OPERATOR(pg_catalog.=) s.destination"
"                      AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmax(p.to_snap)))";

static SPIPlanPtr due_destinations_plan = NULL;

/*
 * The light sweep, without the log: the first half of the statement above
 * (DUE_WITHOUT_LOG_SQL).  Retries due and batches whose lease ran out are
 * looked for in those two tables as a whole (the retries are few; the
 * batches about one per destination once trimmed), not through each
 * destination's newest batch as the log is, which also left out the
 * retries of a destination that never had a batch.  A batch's
 * acknowledgement is looked up by its key (a subplan), for the reason
 * retention.c gives for the trim; only for the batches whose lease ran
 * out after $1, so that the periodic sweep probes the batches that expired
 * since its last look, not one per destination that exists (delivery.c).
 * Whether the destination is paused is looked up for what was found (a
 * join let the planner scan every destination first).
 * The destinations without a stream row (rows written with the triggers
 * off) are the full statement's: a load of the destinations that finds
 * one new runs it.
 */
static const char *due_light_sql = DUE_WITHOUT_LOG_SQL;

static SPIPlanPtr due_light_plan = NULL;

/*
 * Move the lease of batch $2 of $1 to now() + $3, unless it is
 * acknowledged.  The relay lengthens the lease of a batch it sends in
 * several rounds (a transaction larger than the destination's
 * concurrency, or an ordered aggregate's events one after the other), so
 * that the recovery does not take it while it is still being sent.  $4 is
 * the fence: the lease it holds; a batch another worker recovered is not
 * moved.
 */
static const char *batch_lease_sql =
"UPDATE outbox.batches AS b"
"   SET leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $3"
" WHERE b.destination OPERATOR(pg_catalog.=) $1"
"   AND b.seq OPERATOR(pg_catalog.=) $2"
"   AND b.leased_until OPERATOR(pg_catalog.=) $4"
"   AND NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS k"
"                    WHERE k.destination OPERATOR(pg_catalog.=) b.destination"
"                      AND k.seq OPERATOR(pg_catalog.=) b.seq)"
" RETURNING b.leased_until";

static SPIPlanPtr batch_lease_plan = NULL;

/*
 * Lease batch seq of destination again, for lease from now, if its lease is
 * still *fence; true if moved, with *fence set to the new leased_until.
 */
bool
OutboxStoreBatchLease(const char *destination, int64 seq, Interval *lease,
					  TimestampTz *fence)
{
	Oid			types[4] = {TEXTOID, INT8OID, INTERVALOID, TIMESTAMPTZOID};
	Datum		args[4] = {CStringGetTextDatum(destination), Int64GetDatum(seq),
							IntervalPGetDatum(lease), TimestampTzGetDatum(*fence)};
	bool		isnull;

	if (store_execute(WorkerKeepPlan(&batch_lease_plan, batch_lease_sql, 4, types),
					  args, NULL, SPI_OK_UPDATE_RETURNING) == 0)
		return false;
	*fence = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1, &isnull));
	return true;
}

/*
 * The names of the destinations with due work, left in SPI_tuptable
 * (one text column); returns their number.  Without with_log, events of
 * the log past a destination's position are not looked for (the costly
 * half: every commit of emit() announces its own, see delivery.c), nor
 * destinations without a stream row; retries due are, and batches whose
 * lease ran out after expired_since (DT_NOBEGIN: all of them).
 */
uint64
OutboxStoreDueDestinations(bool with_log, TimestampTz expired_since)
{
	Oid			types[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(expired_since)};

	if (!with_log)
		return store_execute(WorkerKeepPlan(&due_light_plan, due_light_sql,
											1, types),
							 args, NULL, SPI_OK_SELECT);
	return store_execute(WorkerKeepPlan(&due_destinations_plan,
										due_destinations_sql, 1, types),
						 args, NULL, SPI_OK_SELECT);
}

static const char *prepared_sql =
"SELECT 1 FROM pg_catalog.pg_prepared_xacts AS p"
" WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database()"
" LIMIT 1";

static SPIPlanPtr prepared_plan = NULL;

/* Does this database have prepared transactions? */
bool
OutboxStorePreparedTransactions(void)
{
	return store_execute(WorkerKeepPlan(&prepared_plan, prepared_sql, 0, NULL),
						 NULL, NULL, SPI_OK_SELECT) > 0;
}

/*
 * SQL wrappers of the insert-only store, for tests.  Internal: not
 * granted to anyone.
 */
Datum
outbox__snapshot_cut(PG_FUNCTION_ARGS)
{
	StoreSnapshot s;
	char	   *text;

	text = DatumGetCString(DirectFunctionCall1(pg_snapshot_out, PG_GETARG_DATUM(0)));
	store_snapshot_parse(text, &s);
	store_snapshot_cut(&s, U64FromFullTransactionId(PG_GETARG_FULLTRANSACTIONID(1)));
	PG_RETURN_DATUM(DirectFunctionCall1(pg_snapshot_in,
										CStringGetDatum(store_snapshot_format(&s))));
}

/* Copy SPI_tuptable's n rows into the caller's materialized result. */
static void
store_return_rows(FunctionCallInfo fcinfo, uint64 n, const char *name)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (n > 0 && rsinfo->setDesc->natts != SPI_tuptable->tupdesc->natts)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s does not match the outbox_pg library", name),
				 errhint("Run ALTER EXTENSION outbox_pg UPDATE.")));
	for (uint64 i = 0; i < n; i++)
		tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
}

Datum
outbox__claim(PG_FUNCTION_ARGS)
{
	uint64		n;

	InitMaterializedSRF(fcinfo, 0);
	store_require_args(fcinfo, 3);
	if (PG_GETARG_INT32(0) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch size must be positive")));
	n = OutboxStoreClaim(PG_GETARG_INT32(0), PG_GETARG_INTERVAL_P(1),
						 text_to_cstring(PG_GETARG_TEXT_PP(2)));
	store_return_rows(fcinfo, n, "outbox._claim()");
	SPI_finish();
	return (Datum) 0;
}

Datum
outbox__claim_ack(PG_FUNCTION_ARGS)
{
	bool		acked;

	store_require_args(fcinfo, 10);
	acked = OutboxStoreClaimAck(text_to_cstring(PG_GETARG_TEXT_PP(0)),
								PG_GETARG_INT64(1), PG_GETARG_DATUM(2),
								PG_GETARG_DATUM(3), PG_GETARG_DATUM(4),
								PG_GETARG_DATUM(5), PG_GETARG_DATUM(6),
								PG_GETARG_DATUM(7), PG_GETARG_DATUM(8),
								PG_GETARG_DATUM(9), 0);
	SPI_finish();
	PG_RETURN_BOOL(acked);
}

Datum
outbox__claim_recover(PG_FUNCTION_ARGS)
{
	uint64		n;

	InitMaterializedSRF(fcinfo, 0);
	store_require_args(fcinfo, 3);
	n = OutboxStoreClaimRecover(PG_GETARG_INTERVAL_P(0),
								text_to_cstring(PG_GETARG_TEXT_PP(1)),
								PG_GETARG_INT64(2), false);
	store_return_rows(fcinfo, n, "outbox._claim_recover()");
	SPI_finish();
	return (Datum) 0;
}


/*
 * outbox.retries: the events that failed or were deferred, leased and
 * updated in place like 0.2's rows (they are few; see README.store,
 * section 6, point 8, for the risk that remains).  The statements are
 * those 0.2 ran on outbox.events, on the copies: the lease takes due rows
 * by (due_at, id) and, on an ordered destination, only the head of each
 * aggregate (no earlier copy of the same (destination, ordering_key) in
 * retries, and under on_dead = 'block' no unreleased earlier dead copy);
 * retry and dead are fenced by leased_until; a published copy is deleted;
 * a dead one moves to outbox.dead_events.
 */
/*
 * Whether copy c of destination $3 is due and not leased, and whether it
 * may be leased now: also, on an ordered destination, the head of its
 * aggregate (see above).
 */
#define RETRIES_DUE_SQL \
"           c.destination OPERATOR(pg_catalog.=) $3" \
"           AND c.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()" \
"           AND (c.leased_until IS NULL" \
"                OR c.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())"
#define RETRIES_ELIGIBLE_SQL \
RETRIES_DUE_SQL \
"           AND (NOT " STORE_ORDERED_OF_SQL("$3") \
"                OR c.ordering_key IS NULL" \
"                OR (NOT " STORE_RETRIES_COPY_SQL("$3", "c.ordering_key", \
												  " AND p.id OPERATOR(pg_catalog.<) c.id") \
"                    AND (NOT " STORE_ON_DEAD_BLOCK_SQL("$3") \
"                         OR NOT " STORE_DEAD_BEFORE_SQL("$3", "c.ordering_key", "c.id") ")))"

#define RETRIES_LEASE_SET_SQL \
"UPDATE outbox.retries AS e" \
"   SET attempts = e.attempts OPERATOR(pg_catalog.+) 1," \
"       leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $2"

#define RETRIES_LEASE_RETURNING_SQL \
" RETURNING e.id, e.type, e.aggregate_id, e.payload::pg_catalog.text, e.headers," \
"           e.traceparent," \
"           pg_catalog.to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')," \
"           e.attempts," \
"           pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) e.created_at)," \
"           e.leased_until"

static const char *retries_lease_sql =
RETRIES_LEASE_SET_SQL
" WHERE e.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
"        SELECT c.ctid FROM outbox.retries AS c"
"         WHERE " RETRIES_ELIGIBLE_SQL
"         ORDER BY c.due_at, c.id"
"         LIMIT $1"
"           FOR UPDATE OF c SKIP LOCKED))"
RETRIES_LEASE_RETURNING_SQL;

/*
 * The lease of an ordered destination.  Walking its due copies in order
 * and testing each for being its aggregate's head, as the plain lease
 * does, costs a probe per copy that waits behind its head: a paused
 * backlog spilled to retries (100,000 copies of 100 aggregates) was leased
 * at 877 ms a call and drained at 5 events/s, and one held aggregate with
 * 10,000 copies behind its head slowed the whole destination from about
 * 15,000 to 125-595 events/s.  So the candidates are (a) the first due
 * copies by due_at (in index order: a spill gives thousands of copies the
 * same due_at, and sorting them by id read them all), a few times the
 * batch, and, only when those hold fewer heads than asked for while more
 * are due, (b) the head of every aggregate, found by a skip scan of
 * retries_ordering_idx (two index descents per aggregate), and (c) due
 * copies without an aggregate.  The candidates are then leased as the
 * plain lease would: same conditions rechecked under the row lock, in
 * (due_at, id) order.  Among copies due at the same time, those the first
 * look reached go first.
 */
static const char *retries_lease_ordered_sql =
"WITH RECURSIVE"
"     a AS MATERIALIZED ("
"         SELECT c.ctid AS tid, (" RETRIES_ELIGIBLE_SQL ") AS ok"
"           FROM outbox.retries AS c"
"          WHERE " RETRIES_DUE_SQL
"          ORDER BY c.due_at"
"          LIMIT ($1 OPERATOR(pg_catalog.*) 4 OPERATOR(pg_catalog.+) 64)),"
"     more AS MATERIALIZED ("
"         SELECT (SELECT pg_catalog.count(*) FROM a WHERE a.ok) OPERATOR(pg_catalog.<) $1"
"                AND (SELECT pg_catalog.count(*) FROM a)"
"                    OPERATOR(pg_catalog.=) ($1 OPERATOR(pg_catalog.*) 4 OPERATOR(pg_catalog.+) 64)"
"                AS needed),"
"     k (key) AS ("
"         (SELECT c.ordering_key FROM outbox.retries AS c"
"           WHERE c.destination OPERATOR(pg_catalog.=) $3"
"             AND c.ordering_key IS NOT NULL"
"             AND (SELECT m.needed FROM more AS m)"
"           ORDER BY c.ordering_key LIMIT 1)"
"         UNION ALL"
"         SELECT (SELECT c.ordering_key FROM outbox.retries AS c"
"                  WHERE c.destination OPERATOR(pg_catalog.=) $3"
"                    AND c.ordering_key OPERATOR(pg_catalog.>) k.key"
"                  ORDER BY c.ordering_key LIMIT 1)"
"           FROM k WHERE k.key IS NOT NULL),"
"     b AS ("
"         SELECT h.tid FROM k CROSS JOIN LATERAL"
"                (SELECT c.ctid AS tid FROM outbox.retries AS c"
"                  WHERE c.destination OPERATOR(pg_catalog.=) $3"
"                    AND c.ordering_key OPERATOR(pg_catalog.>=) k.key"
"                    AND c.ordering_key OPERATOR(pg_catalog.<=) k.key"
"                  ORDER BY c.ordering_key, c.id LIMIT 1) AS h"
"          WHERE k.key IS NOT NULL),"
"     n AS ("
"         SELECT c.ctid AS tid FROM outbox.retries AS c"
"          WHERE " RETRIES_DUE_SQL
"            AND c.ordering_key IS NULL"
"            AND (SELECT m.needed FROM more AS m)"
"          ORDER BY c.due_at, c.id LIMIT $1)"
RETRIES_LEASE_SET_SQL
" WHERE e.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
"        SELECT c.ctid FROM outbox.retries AS c"
"         WHERE c.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
"                   SELECT a.tid FROM a WHERE a.ok"
"                   UNION ALL SELECT b.tid FROM b"
"                   UNION ALL SELECT n.tid FROM n))"
"           AND " RETRIES_ELIGIBLE_SQL
"         ORDER BY c.due_at, c.id"
"         LIMIT $1"
"           FOR UPDATE OF c SKIP LOCKED))"
RETRIES_LEASE_RETURNING_SQL;

/*
 * published: the copy goes (not fenced, as the ack of outbox.events), and
 * its id is settled as delivered with the copy's attempts (what the view
 * outbox.events shows for it from then on)
 */
static const char *retries_ack_sql =
"WITH d AS (DELETE FROM outbox.retries AS e"
"            WHERE e.id OPERATOR(pg_catalog.=) ANY ($1)"
"            RETURNING e.id, e.attempts)"
"INSERT INTO outbox.settled_events AS s (id, settled, attempts)"
"SELECT d.id, 'delivered', d.attempts FROM d"
"    ON CONFLICT (id) DO UPDATE"
"   SET settled = 'delivered', attempts = excluded.attempts,"
"       settled_at = pg_catalog.now()";

static const char *retries_retry_sql =
"UPDATE outbox.retries AS e"
"   SET attempts = CASE WHEN r.give_back"
"                       THEN GREATEST(e.attempts OPERATOR(pg_catalog.-) 1, 0)"
"                       ELSE e.attempts END,"
"       due_at = r.next_at, leased_until = NULL,"
"       last_status = r.status, last_error = r.error"
"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
"                  pg_catalog.unnest($3), pg_catalog.unnest($4),"
"                  pg_catalog.unnest($5), pg_catalog.unnest($6))"
"       AS r(id, next_at, status, error, lease, give_back)"
" WHERE e.id OPERATOR(pg_catalog.=) r.id"
"   AND ($5 IS NULL OR e.leased_until OPERATOR(pg_catalog.=) r.lease)";

static const char *retries_dead_sql =
"WITH d AS (DELETE FROM outbox.retries AS e"
"            USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
"                             pg_catalog.unnest($3), pg_catalog.unnest($4))"
"                  AS r(id, status, error, lease)"
"            WHERE e.id OPERATOR(pg_catalog.=) r.id"
"              AND ($4 IS NULL OR e.leased_until OPERATOR(pg_catalog.=) r.lease)"
"            RETURNING e.*, r.status AS dead_status, r.error AS dead_error)"
"INSERT INTO outbox.dead_events AS x"
"       (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,"
"        destination, ordering_key, created_at, attempts, due_at, leased_until,"
"        last_status, last_error)"
"SELECT d.id, d.type, d.aggregate_type, d.aggregate_id, d.payload, d.headers,"
"       d.traceparent, d.destination, d.ordering_key, d.created_at, d.attempts,"
"       d.due_at, NULL, d.dead_status, d.dead_error"
"  FROM d"
"    ON CONFLICT (id) DO NOTHING";

static SPIPlanPtr retries_lease_plan = NULL;
static SPIPlanPtr retries_lease_ordered_plan = NULL;
static SPIPlanPtr retries_ack_plan = NULL;
static SPIPlanPtr retries_retry_plan = NULL;
static SPIPlanPtr retries_dead_plan = NULL;

/*
 * Lease up to batch_size due copies of a destination, left in SPI_tuptable:
 * id, type, aggregate_id, payload (text), headers, traceparent, time (RFC
 * 3339 text), attempts, age in seconds, and leased_until (the fence).
 */
uint64
OutboxStoreRetriesLease(int batch_size, Interval *lease, const char *destination,
						bool ordered)
{
	Oid			types[3] = {INT4OID, INTERVALOID, TEXTOID};
	Datum		args[3];
	SPIPlanPtr	plan;

	args[0] = Int32GetDatum(batch_size);
	args[1] = IntervalPGetDatum(lease);
	args[2] = CStringGetTextDatum(destination);
	if (ordered)
		plan = WorkerKeepPlan(&retries_lease_ordered_plan, retries_lease_ordered_sql,
							  3, types);
	else
		plan = WorkerKeepPlan(&retries_lease_plan, retries_lease_sql, 3, types);
	return store_execute(plan, args, NULL, SPI_OK_UPDATE_RETURNING);
}

uint64
OutboxStoreRetriesAck(Datum ids)
{
	Oid			types[1] = {UUIDARRAYOID};
	Datum		args[1] = {ids};

	return store_execute(WorkerKeepPlan(&retries_ack_plan, retries_ack_sql, 1, types),
						 args, NULL, SPI_OK_INSERT);
}

/*
 * Due again at next_at, under the lease each belongs to (leases, (Datum) 0:
 * no fence); give_back (bool[], or (Datum) 0) returns the lease's attempt.
 */
uint64
OutboxStoreRetriesRetry(Datum ids, Datum next_at, Datum statuses, Datum errors,
						Datum leases, Datum give_back)
{
	Oid			types[6] = {UUIDARRAYOID, TIMESTAMPTZARRAYOID, INT4ARRAYOID,
							TEXTARRAYOID, TIMESTAMPTZARRAYOID, BOOLARRAYOID};
	Datum		args[6] = {ids, next_at, statuses, errors, leases, give_back};
	char		nulls[7] = "      ";

	if (leases == (Datum) 0)
		nulls[4] = 'n';
	if (give_back == (Datum) 0)
		nulls[5] = 'n';
	return store_execute(WorkerKeepPlan(&retries_retry_plan, retries_retry_sql, 6, types),
						 args, nulls, SPI_OK_UPDATE);
}

/* Dead, under their lease: the copies move to outbox.dead_events. */
uint64
OutboxStoreRetriesDead(Datum ids, Datum statuses, Datum errors, Datum leases)
{
	Oid			types[4] = {UUIDARRAYOID, INT4ARRAYOID, TEXTARRAYOID,
							TIMESTAMPTZARRAYOID};
	Datum		args[4] = {ids, statuses, errors, leases};

	return store_execute(WorkerKeepPlan(&retries_dead_plan, retries_dead_sql, 4, types),
						 args, leases == (Datum) 0 ? "   n" : NULL,
						 SPI_OK_INSERT);
}

/*
 * Whether a destination is ordered, as the relay reads it (delivery.c), so
 * that outbox._retries_lease() runs the statement the relay would.
 */
static bool
store_destination_ordered(Datum destination)
{
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {destination};
	bool		isnull;

	if (SPI_execute_with_args("SELECT COALESCE(" STORE_ORDERED_SQL ", false)",
							  1, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox statement failed");
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
									  1, &isnull));
}

Datum
outbox__retries_lease(PG_FUNCTION_ARGS)
{
	uint64		n;

	InitMaterializedSRF(fcinfo, 0);
	store_require_args(fcinfo, 3);
	if (PG_GETARG_INT32(0) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch size must not be negative")));
	n = OutboxStoreRetriesLease(PG_GETARG_INT32(0), PG_GETARG_INTERVAL_P(1),
								text_to_cstring(PG_GETARG_TEXT_PP(2)),
								store_destination_ordered(PG_GETARG_DATUM(2)));
	store_return_rows(fcinfo, n, "outbox._retries_lease()");
	SPI_finish();
	return (Datum) 0;
}

Datum
outbox__retries_ack(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 1);
	n = OutboxStoreRetriesAck(PG_GETARG_DATUM(0));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

Datum
outbox__retries_retry(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 4);
	n = OutboxStoreRetriesRetry(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
								PG_GETARG_DATUM(2), PG_GETARG_DATUM(3),
								store_leases_arg(fcinfo, 4),
								store_leases_arg(fcinfo, 5));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

Datum
outbox__retries_dead(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 3);
	n = OutboxStoreRetriesDead(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
							   PG_GETARG_DATUM(2), store_leases_arg(fcinfo, 3));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}
