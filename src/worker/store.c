/*-------------------------------------------------------------------------
 *
 * store.c
 *		  The relay's statements on outbox.events: lease, ack, retry, dead.
 *
 * Each statement is prepared once per process and kept (SPI_keepplan).
 * The relay calls them directly; outbox._lease(), _ack(), _retry(),
 * _requeue() and _dead() expose the very same statements to SQL, so the regression and
 * isolation tests exercise exactly what the relay runs.
 *
 * Design notes:
 *
 *	- Lease picks the due rows of one destination through the partial
 *	  index (destination, next_attempt_at, id) WHERE status = 'pending',
 *	  locks them with FOR UPDATE SKIP LOCKED, and updates them by ctid
 *	  (= ANY of the locked rows' ctids, a TID scan) — there is no join for
 *	  the planner to get wrong.  Each lease counts as an attempt and sets
 *	  leased_until to the end of the lease.  leased_until is in no index
 *	  and outbox.events keeps half of each page free (fillfactor 50), so
 *	  the lease is a HOT update: no index entry is written.  Rows in flight
 *	  stay in the pending index with a past next_attempt_at; the lease
 *	  steps over them (at most the in-flight count) by their leased_until.
 *	- On an ordered destination the lease takes only the head of each
 *	  aggregate (see lease_sql and ordering.c for why that is safe with
 *	  several workers and with transactions that commit out of order).
 *	- Ack and dead change the status (never HOT: status is in the index
 *	  predicates) and clear the lease; retry moves next_attempt_at and
 *	  clears the lease, so the row is due at the retry time.  A retry may
 *	  also give back the attempt the lease counted (per row): the relay
 *	  does that for a failure that was the destination's (its circuit is
 *	  open, see deststats.c), not the event's; outbox._requeue() is that
 *	  retry for every row it is given.
 *	- The results are recorded by joining the arrays of ids to the primary
 *	  key, and only rows still pending change: a late result never undoes
 *	  what another worker recorded.
 *	- Retry and dead are fenced by the lease: the lease returns the
 *	  leased_until it set, the relay carries it with the event, and a
 *	  retry or dead changes a row only while its leased_until is still
 *	  that value.  A worker that was stopped (SIGSTOP, a paused VM,
 *	  swapping) past its lease may find the row re-leased by
 *	  another worker that is delivering it right now; without the fence
 *	  its late failure would dead-letter that row, or clear the new lease
 *	  so that a third worker sends it again.  leased_until identifies a
 *	  lease because a row is leased again only once now() has passed its
 *	  leased_until, and every relay lease lasts more than a second
 *	  (timeout_ms >= 100, outbox.lease_margin >= 1 s), so each lease sets a
 *	  later value; a retry, a dead letter and a redrive set it to null,
 *	  which matches no lease.  Ack is not fenced: the destination
 *	  acknowledged the message, which is true whoever leased the row.
 *	  The fence costs no index (leased_until is in none; the row is found
 *	  by its primary key).
 *	- Every name is schema-qualified, operators included.
 *	- The relay runs with plan_cache_mode = force_custom_plan, so the
 *	  planner always sees the real LIMIT and array sizes.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/store.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "nodes/makefuncs.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "outbox_pg.h"
#include "worker/worker.h"

PG_FUNCTION_INFO_V1(outbox_lease);
PG_FUNCTION_INFO_V1(outbox_ack);
PG_FUNCTION_INFO_V1(outbox_retry);
PG_FUNCTION_INFO_V1(outbox_dead);
PG_FUNCTION_INFO_V1(outbox_requeue);

/*
 * The lease.  Plain destinations: due rows in (next_attempt_at, id) order.
 * Ordered destinations (options.ordering = 'aggregate', see ordering.c):
 * among the rows emit() gave an ordering_key (the aggregate id), only the
 * head of each aggregate — the pending row with no earlier pending row of
 * the same (destination, ordering_key) — and, under the
 * 'block' policy, only when no unreleased dead row of the aggregate comes
 * before it.  A head in flight or waiting for a retry is not due, so its
 * aggregate contributes nothing.  The two flags are InitPlans, evaluated
 * once per lease; for a plain destination the OR short-circuits and the
 * probes never run.
 */
static const char *lease_sql =
"UPDATE outbox.events AS e"
"   SET attempts = e.attempts OPERATOR(pg_catalog.+) 1,"
"       leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $2"
" WHERE e.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
"        SELECT c.ctid FROM outbox.events AS c"
"         WHERE c.status OPERATOR(pg_catalog.=) 'pending'"
"           AND c.destination OPERATOR(pg_catalog.=) $3"
"           AND c.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
"           AND (c.leased_until IS NULL"
"                OR c.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())"
"           AND (NOT (SELECT COALESCE(d.options OPERATOR(pg_catalog.->>) 'ordering'"
"                                                OPERATOR(pg_catalog.=) 'aggregate', false)"
"                       FROM outbox.destinations AS d WHERE d.name OPERATOR(pg_catalog.=) $3)"
"                OR c.ordering_key IS NULL"
"                OR (NOT EXISTS ("
"                       SELECT 1 FROM outbox.events AS p"
"                        WHERE p.destination OPERATOR(pg_catalog.=) $3"
"                          AND p.ordering_key OPERATOR(pg_catalog.=) c.ordering_key"
"                          AND p.status OPERATOR(pg_catalog.=) 'pending'"
"                          AND p.id OPERATOR(pg_catalog.<) c.id)"
"                    AND (NOT (SELECT COALESCE(d.options OPERATOR(pg_catalog.->>) 'on_dead',"
"                                                         'block') OPERATOR(pg_catalog.=) 'block'"
"                                FROM outbox.destinations AS d WHERE d.name OPERATOR(pg_catalog.=) $3)"
"                         OR NOT EXISTS ("
"                            SELECT 1 FROM outbox.events AS x"
"                             WHERE x.destination OPERATOR(pg_catalog.=) $3"
"                               AND x.ordering_key OPERATOR(pg_catalog.=) c.ordering_key"
"                               AND x.status OPERATOR(pg_catalog.=) 'dead'"
"                               AND x.id OPERATOR(pg_catalog.<) c.id"
"                               AND x.id OPERATOR(pg_catalog.>) COALESCE("
"                                     (SELECT r.released_through FROM outbox.aggregate_releases AS r"
"                                       WHERE r.destination OPERATOR(pg_catalog.=) $3"
"                                         AND r.aggregate_id OPERATOR(pg_catalog.=) c.ordering_key),"
"                                     '00000000-0000-0000-0000-000000000000'::pg_catalog.uuid)))))"
"         ORDER BY c.next_attempt_at, c.id"
"         LIMIT $1"
"           FOR UPDATE OF c SKIP LOCKED))"
" RETURNING e.id, e.type, e.aggregate_id, e.payload::pg_catalog.text, e.headers,"
"           e.traceparent,"
"           pg_catalog.to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
"           e.attempts,"
"           pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) e.created_at),"
"           e.leased_until";

/* status changes are never HOT anyway: clearing the lease costs nothing */
static const char *ack_sql =
"UPDATE outbox.events AS e"
"   SET status = 'published', published_at = pg_catalog.clock_timestamp(),"
"       last_status = r.status, last_error = NULL, leased_until = NULL"
"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS r(id, status)"
" WHERE e.id OPERATOR(pg_catalog.=) r.id"
"   AND e.status OPERATOR(pg_catalog.=) 'pending'";

/*
 * Retry and dead are fenced by the lease the result belongs to (r.lease):
 * a row leased again since then is left alone.  A null leases array (only
 * from the SQL wrappers, never from the relay) skips the fence.  Retry
 * gives the lease's attempt back where r.give_back is true (a null array:
 * nowhere).  GREATEST is SQL syntax, not a function: nothing to
 * schema-qualify.
 */
static const char *retry_sql =
"UPDATE outbox.events AS e"
"   SET attempts = CASE WHEN r.give_back"
"                       THEN GREATEST(e.attempts OPERATOR(pg_catalog.-) 1, 0)"
"                       ELSE e.attempts END,"
"       next_attempt_at = r.next_at, leased_until = NULL,"
"       last_status = r.status, last_error = r.error"
"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
"                  pg_catalog.unnest($3), pg_catalog.unnest($4),"
"                  pg_catalog.unnest($5), pg_catalog.unnest($6))"
"       AS r(id, next_at, status, error, lease, give_back)"
" WHERE e.id OPERATOR(pg_catalog.=) r.id"
"   AND e.status OPERATOR(pg_catalog.=) 'pending'"
"   AND ($5 IS NULL OR e.leased_until OPERATOR(pg_catalog.=) r.lease)";

static const char *dead_sql =
"UPDATE outbox.events AS e"
"   SET status = 'dead', leased_until = NULL,"
"       last_status = r.status, last_error = r.error"
"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
"                  pg_catalog.unnest($3), pg_catalog.unnest($4)) AS r(id, status, error, lease)"
" WHERE e.id OPERATOR(pg_catalog.=) r.id"
"   AND e.status OPERATOR(pg_catalog.=) 'pending'"
"   AND ($4 IS NULL OR e.leased_until OPERATOR(pg_catalog.=) r.lease)";

static SPIPlanPtr lease_plan = NULL;
static SPIPlanPtr ack_plan = NULL;
static SPIPlanPtr retry_plan = NULL;
static SPIPlanPtr dead_plan = NULL;

static uint64
store_execute(SPIPlanPtr plan, Datum *args, const char *nulls, int expected)
{
	int			ret = SPI_execute_plan(plan, args, nulls, false, 0);

	if (ret != expected)
		elog(ERROR, "outbox statement failed: %s", SPI_result_code_string(ret));
	return SPI_processed;
}

/*
 * Lease up to batch_size due events of a destination.  The rows are left
 * in SPI_tuptable: id, type, aggregate_id, payload (text), headers,
 * traceparent, time (RFC 3339 text), attempts, age in seconds, and
 * leased_until (the lease's fence for OutboxStoreRetry/Dead).
 * The caller is connected to SPI.
 */
uint64
OutboxStoreLease(int batch_size, Interval *lease, const char *destination)
{
	Oid			types[3] = {INT4OID, INTERVALOID, TEXTOID};
	Datum		args[3];

	args[0] = Int32GetDatum(batch_size);
	args[1] = IntervalPGetDatum(lease);
	args[2] = CStringGetTextDatum(destination);
	return store_execute(WorkerKeepPlan(&lease_plan, lease_sql, 3, types),
						 args, NULL, SPI_OK_UPDATE_RETURNING);
}

uint64
OutboxStoreAck(Datum ids, Datum statuses)
{
	Oid			types[2] = {UUIDARRAYOID, INT4ARRAYOID};
	Datum		args[2] = {ids, statuses};

	return store_execute(WorkerKeepPlan(&ack_plan, ack_sql, 2, types),
						 args, NULL, SPI_OK_UPDATE);
}

/*
 * leases: the leased_until of each event's lease, as the lease returned it
 * (timestamptz[]); rows leased again since are not changed.  give_back
 * (bool[]): give the lease's attempt back.  (Datum) 0 for either skips it
 * (no fence: SQL wrappers only; no give-back).
 */
uint64
OutboxStoreRetry(Datum ids, Datum next_at, Datum statuses, Datum errors,
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
	return store_execute(WorkerKeepPlan(&retry_plan, retry_sql, 6, types),
						 args, nulls, SPI_OK_UPDATE);
}

/* leases: as for OutboxStoreRetry */
uint64
OutboxStoreDead(Datum ids, Datum statuses, Datum errors, Datum leases)
{
	Oid			types[4] = {UUIDARRAYOID, INT4ARRAYOID, TEXTARRAYOID,
							TIMESTAMPTZARRAYOID};
	Datum		args[4] = {ids, statuses, errors, leases};

	return store_execute(WorkerKeepPlan(&dead_plan, dead_sql, 4, types),
						 args, leases == (Datum) 0 ? "   n" : NULL,
						 SPI_OK_UPDATE);
}

/*
 * SQL wrappers, for tests and for operators who want to see what the relay
 * would do.  Internal: not granted to anyone.
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

/* A bool[] of true, one per element of the array ids. */
static Datum
store_all_true(Datum ids)
{
	int			n = ArrayGetNItems(ARR_NDIM(DatumGetArrayTypeP(ids)),
								   ARR_DIMS(DatumGetArrayTypeP(ids)));
	Datum	   *values = palloc(Max(n, 1) * sizeof(Datum));

	for (int i = 0; i < n; i++)
		values[i] = BoolGetDatum(true);
	return PointerGetDatum(construct_array(values, n, BOOLOID, 1, true,
										   TYPALIGN_CHAR));
}

Datum
outbox_lease(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		n;

	InitMaterializedSRF(fcinfo, 0);
	store_require_args(fcinfo, 3);
	if (PG_GETARG_INT32(0) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch size must not be negative")));
	n = OutboxStoreLease(PG_GETARG_INT32(0), PG_GETARG_INTERVAL_P(1),
						 text_to_cstring(PG_GETARG_TEXT_PP(2)));

	/*
	 * Between installing a newer library and ALTER EXTENSION UPDATE the
	 * SQL declaration may list fewer columns than the statement returns.
	 */
	if (rsinfo->setDesc->natts != SPI_tuptable->tupdesc->natts)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox._lease() does not match the outbox_pg library"),
				 errhint("Run ALTER EXTENSION outbox_pg UPDATE.")));
	for (uint64 i = 0; i < n; i++)
		tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
	SPI_finish();
	return (Datum) 0;
}

Datum
outbox_ack(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 2);
	n = OutboxStoreAck(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

Datum
outbox_retry(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 4);
	n = OutboxStoreRetry(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
						 PG_GETARG_DATUM(2), PG_GETARG_DATUM(3),
						 store_leases_arg(fcinfo, 4), (Datum) 0);
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

Datum
outbox_dead(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 3);
	n = OutboxStoreDead(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2),
						store_leases_arg(fcinfo, 3));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

Datum
outbox_requeue(PG_FUNCTION_ARGS)
{
	uint64		n;

	store_require_args(fcinfo, 4);
	n = OutboxStoreRetry(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
						 PG_GETARG_DATUM(2), PG_GETARG_DATUM(3),
						 store_leases_arg(fcinfo, 4),
						 store_all_true(PG_GETARG_DATUM(0)));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}
