/*-------------------------------------------------------------------------
 *
 * ops.c
 *		  Operability: the relay's backlog warning, outbox.wait_published()
 *		  and the C helpers of the monitoring and admin SQL functions.
 *
 * Design notes:
 *
 *	- The worst outbox failure is silent: events pile up while everything
 *	  else looks healthy.  Relay 0 of each database therefore looks at the
 *	  age of the oldest pending event every few seconds, inside a cycle's
 *	  transaction it has open anyway, and logs a WARNING when it is above
 *	  outbox.pending_age_warning — at most once a minute while that holds,
 *	  and a LOG line when it recovers.  The query aggregates the pending
 *	  rows, so it costs what the backlog costs (0.3 s for 200,000 pending
 *	  among 1.2 million rows on the development VM); a check that took t ms is not repeated before
 *	  50 t ms (5 to 60 s), so it never takes more than 2% of the relay's
 *	  time.  If no relay runs at all, nobody logs: outbox.health() reports
 *	  that case, and it is what to alert on.
 *	- "Pending age" counts from the event's creation, but an event that
 *	  was never attempted and is scheduled for later (emit(..., not_before))
 *	  does not count before it is due; the SQL views use the same rule.
 *	- outbox.wait_published() polls the event's status with a fresh
 *	  snapshot each time (READ COMMITTED), sleeping on the latch between
 *	  polls (5 ms doubling up to 100 ms), so it is interruptible and costs
 *	  nothing while it waits.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/ops.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "api/api.h"
#include "worker/worker.h"
#include "destination/destination.h"

#define BACKLOG_CHECK_MS		5000
#define BACKLOG_CHECK_MAX_MS	60000
#define BACKLOG_COST_FACTOR		50
#define BACKLOG_WARN_EVERY_MS	60000
#define WAIT_MIN_SLEEP_MS		5
#define WAIT_MAX_SLEEP_MS		100

PG_FUNCTION_INFO_V1(outbox_wake);
PG_FUNCTION_INFO_V1(outbox_relay_presence);
PG_FUNCTION_INFO_V1(outbox_wait_published);

static SPIPlanPtr backlog_plan = NULL;
static SPIPlanPtr status_plan = NULL;
static TimestampTz backlog_checked_at = 0;
static long backlog_interval_ms = BACKLOG_CHECK_MS;
static TimestampTz backlog_warned_at = 0;
static bool backlog_warning = false;

/*
 * Relay 0's backlog check; called in a relay cycle's transaction, with
 * SPI connected and the events table locked.  Does nothing more often
 * than every BACKLOG_CHECK_MS.
 */
void
OutboxOpsCheckBacklog(const char *database_name)
{
	TimestampTz now = GetCurrentTimestamp();
	int			threshold = outbox_pending_age_warning;
	double		age = 0;
	char	   *destination = NULL;
	int64		pending = 0;

	if (!TimestampDifferenceExceeds(backlog_checked_at, now, backlog_interval_ms))
		return;
	backlog_checked_at = now;

	if (threshold > 0)
	{
		bool		isnull;

		OutboxKeepPlan(&backlog_plan,
					   "SELECT coalesce(e.destination, '(unrouted)'),"
					   "       pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-)"
					   "                                     pg_catalog.min(e.created_at)),"
					   "       pg_catalog.count(*)"
					   "  FROM outbox.events AS e"
					   " WHERE e.status OPERATOR(pg_catalog.=) 'pending'"
					   "   AND (e.attempts OPERATOR(pg_catalog.>) 0"
					   "        OR e.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now())"
					   " GROUP BY e.destination ORDER BY 2 DESC LIMIT 1",
					   0, NULL);
		if (SPI_execute_plan(backlog_plan, NULL, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not measure the outbox backlog");
		if (SPI_processed > 0)
		{
			HeapTuple	tup = SPI_tuptable->vals[0];
			TupleDesc	desc = SPI_tuptable->tupdesc;

			destination = SPI_getvalue(tup, desc, 1);
			age = DatumGetFloat8(SPI_getbinval(tup, desc, 2, &isnull));
			pending = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
		}

		/* a large backlog is measured less often: at most 2% of the time */
		backlog_interval_ms =
			Min(BACKLOG_CHECK_MAX_MS,
				Max(BACKLOG_CHECK_MS,
					BACKLOG_COST_FACTOR *
					(long) ((GetCurrentTimestamp() - now) / 1000)));
	}

	if (threshold > 0 && destination != NULL && age >= threshold)
	{
		if (!backlog_warning ||
			TimestampDifferenceExceeds(backlog_warned_at, now, BACKLOG_WARN_EVERY_MS))
		{
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("outbox_pg: the oldest pending event in database \"%s\" is %.0f s old",
							database_name, age),
					 errdetail("Destination \"%s\" has %lld pending events; outbox.pending_age_warning is %d s.",
							   destination, (long long) pending, threshold),
					 errhint("See outbox.health() and outbox.destination_stats: the destination may be down, paused or unrouted, or the relay may not keep up.")));
			backlog_warned_at = now;
		}
		backlog_warning = true;
	}
	else if (backlog_warning)
	{
		ereport(LOG,
				(errmsg("outbox_pg: pending events in database \"%s\" are younger than outbox.pending_age_warning again",
						database_name)));
		backlog_warning = false;
	}
}

/*
 * outbox._wake(): wake this database's relays when the transaction
 * commits (redrive, resume).
 */
Datum
outbox_wake(PG_FUNCTION_ARGS)
{
	OutboxWakeAtCommit();
	PG_RETURN_VOID();
}

/*
 * outbox._relay_presence(): what outbox.health() needs from shared memory
 * about the relays of the current database.
 */
Datum
outbox_relay_presence(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[5];
	bool		nulls[5] = {false};
	bool		launcher = false;
	int			running = 0;
	int			erroring = 0;
	char		last_error[OUTBOX_ERROR_LEN] = "";

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (outbox_shared != NULL)
	{
		LWLockAcquire(outbox_shared->lock, LW_SHARED);
		launcher = (outbox_shared->launcher_pid != 0);
		for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
		{
			RelaySlot  *slot = &outbox_shared->slots[i];

			if (slot->dboid != MyDatabaseId || slot->pid == 0)
				continue;
			running++;
			if (slot->state == RELAY_ERROR)
			{
				erroring++;
				strlcpy(last_error, slot->last_error, sizeof(last_error));
			}
		}
		LWLockRelease(outbox_shared->lock);
	}

	values[0] = BoolGetDatum(outbox_shared != NULL);
	values[1] = BoolGetDatum(launcher);
	values[2] = Int32GetDatum(running);
	values[3] = Int32GetDatum(erroring);
	values[4] = CStringGetTextDatum(last_error);
	nulls[4] = (last_error[0] == '\0');
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * outbox.wait_published(id, timeout): true once the event is published;
 * false when the timeout passes first or the event is a dead letter.
 */
Datum
outbox_wait_published(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *id;
	Interval   *timeout;
	int64		timeout_us;
	TimestampTz deadline;
	long		sleep_ms = WAIT_MIN_SLEEP_MS;
	Oid			argtypes[1] = {UUIDOID};
	Datum		args[1];
	bool		result = false;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("event id must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("timeout must not be null")));
	id = PG_GETARG_UUID_P(0);
	timeout = PG_GETARG_INTERVAL_P(1);
	timeout_us = timeout->time +
		(int64) timeout->day * USECS_PER_DAY +
		(int64) timeout->month * DAYS_PER_MONTH * USECS_PER_DAY;
	if (timeout_us < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must not be negative")));
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("outbox.wait_published() cannot be used in a REPEATABLE READ or SERIALIZABLE transaction"),
				 errdetail("Such a transaction never sees the relay's later commits."),
				 errhint("Call it in a READ COMMITTED transaction, after the transaction that emitted the event has committed.")));

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_us / 1000);
	args[0] = UUIDPGetDatum(id);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	OutboxKeepPlan(&status_plan,
				   "SELECT e.status FROM outbox.events AS e"
				   " WHERE e.id OPERATOR(pg_catalog.=) $1",
				   1, argtypes);
	for (;;)
	{
		char	   *status;
		TimestampTz now;
		long		secs;
		int			usecs;
		long		left_ms;

		/* not read-only: every execution takes a new snapshot */
		if (SPI_execute_plan(status_plan, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read the event's status");
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("event %s does not exist",
							DatumGetCString(DirectFunctionCall1(uuid_out, args[0]))),
					 errhint("Wait only for events emitted by committed transactions.")));
		status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		SPI_freetuptable(SPI_tuptable);
		if (strcmp(status, "published") == 0)
		{
			result = true;
			break;
		}
		if (strcmp(status, "dead") == 0)
			break;

		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;
		TimestampDifference(now, deadline, &secs, &usecs);
		left_ms = secs * 1000 + (usecs + 999) / 1000;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(sleep_ms, left_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		sleep_ms = Min(sleep_ms * 2, WAIT_MAX_SLEEP_MS);
	}
	SPI_finish();
	PG_RETURN_BOOL(result);
}
