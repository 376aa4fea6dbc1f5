/*-------------------------------------------------------------------------
 *
 * housekeeping.c
 *		  Relay worker 0's jobs for its database: routing pending events,
 *		  the log's rotation (retention) and the backlog warning.
 *
 * They run inside the lease transaction of relay 0 (connected to SPI, the
 * relay's tables locked by WorkerStepBegin()), each no more often than
 * its own interval, so they cost no transaction of their own.  Only one
 * relay per database does them, so that several relays do not repeat
 * the same work or the same warning.
 *
 * Design notes:
 *
 *	- Routing: outbox._route_pending() gives events emitted without a
 *	  destination theirs from outbox.routes, every ROUTE_INTERVAL_MS.
 *	- Retention: the log's rotation (retention.c, OutboxRotateLog), tried
 *	  every ROTATE_CHECK_MS with outbox.retention / 2 as its interval, so an
 *	  event is kept between one and one and a half retentions; -1 never
 *	  rotates.  Each result goes to the relay's slot (RelaySlot.rotation):
 *	  why the rotation is blocked is what an operator needs when the log
 *	  grows.  Then the batches no claim or recovery reads any more are
 *	  deleted (OutboxTrimBatches), every TRIM_INTERVAL_MS; the trim costs
 *	  per destination, so with many it waits TRIM_COST_FACTOR times its
 *	  last duration if that is longer (pace.c).  Both in a
 *	  subtransaction: an error is logged and delivery goes on.
 *	- The worst outbox failure is silent: events pile up while everything
 *	  else looks healthy.  Relay 0 of each database therefore looks at the
 *	  age of the oldest pending event every few seconds, inside a cycle's
 *	  transaction it has open anyway, and logs a WARNING when it is above
 *	  outbox.pending_age_warning — at most once a minute while that holds,
 *	  and a LOG line when it recovers.  The query aggregates the pending
 *	  rows, so it costs what the backlog costs (0.3 s for 200,000 pending
 *	  among 1.2 million rows on the development VM); a check that took
 *	  t ms is not repeated before 1,000 t ms (5 s to 10 min; pace.c), so
 *	  it takes at most 0.1% of the relay's time until it takes 0.6 s, and
 *	  runs every 10 minutes when slower (with a one-minute cap, a check of
 *	  10,000 destinations with events in the log cost two idle relays
 *	  about 0.5 % of a core).  If no relay runs at all, nobody logs:
 *	  outbox.health() reports that case, and it is what to alert on.
 *	- "Pending age" counts from the event's creation, but an event that
 *	  was never attempted and is scheduled for later (emit(..., not_before))
 *	  does not count before it is due; the SQL views use the same rule.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/housekeeping.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "guc.h"
#include "worker/worker.h"
#include "util.h"

#define ROUTE_INTERVAL_MS		5000
#define ROTATE_CHECK_MS			1000
#define TRIM_INTERVAL_MS		10000
#define TRIM_COST_FACTOR		1000
#define TRIM_MAX_MS				600000
#define BACKLOG_CHECK_MS		5000
#define BACKLOG_CHECK_MAX_MS	600000
#define BACKLOG_COST_FACTOR		1000
#define BACKLOG_WARN_EVERY_MS	60000

static SPIPlanPtr route_plan = NULL;
static TimestampTz last_route = 0;
static WorkerErrorThrottle route_errors;
static WorkerErrorThrottle rotate_errors;
static WorkerErrorThrottle trim_errors;
static WorkerErrorThrottle backlog_errors;

static TimestampTz last_rotate = 0;
static WorkerPace trim_pace = {TRIM_COST_FACTOR, TRIM_MAX_MS, 0, 0};

static WorkerPace backlog_pace = {BACKLOG_COST_FACTOR, BACKLOG_CHECK_MAX_MS, 0, 0};
static TimestampTz backlog_warned_at = 0;
static bool backlog_warning = false;

static void housekeeping_route(TimestampTz now);
static void housekeeping_rotate(TimestampTz now, RelaySlot *slot);
static void housekeeping_check_backlog(const char *database_name);

/*
 * Relay 0's housekeeping, once per lease: each job runs when its interval
 * has passed.  Called in the lease step's transaction.
 */
void
WorkerHousekeeping(TimestampTz now, const char *database_name, RelaySlot *slot)
{
	housekeeping_route(now);
	housekeeping_rotate(now, slot);
	housekeeping_check_backlog(database_name);
}

/* Route the events emitted without a destination. */
static void
housekeeping_route_pending(void *arg)
{
	WorkerKeepPlan(&route_plan, "SELECT outbox._route_pending()", 0, NULL);
	if (SPI_execute_plan(route_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not route pending events");
}

/*
 * Route the events emitted without a destination, in a subtransaction, so
 * that failing (a lock_timeout on the log, a trigger) it does not fail the
 * lease step it runs in: it is logged and tried again after its interval,
 * and relay 0 delivers meanwhile.
 */
static void
housekeeping_route(TimestampTz now)
{
	ErrorData  *edata;

	if (!OutboxTimePassed(last_route, now, ROUTE_INTERVAL_MS))
		return;
	last_route = now;
	if (!WorkerRunInSubtransaction(housekeeping_route_pending, NULL, &edata))
		WorkerReportJobError(&route_errors, edata,
							 "outbox_pg routing of events emitted without a destination",
							 "Delivery continues; the routing is tried again in "
							 CppAsString2(ROUTE_INTERVAL_MS) " ms.");
}

/* What housekeeping_rotate() runs in its subtransaction. */
static void
housekeeping_rotate_log(void *arg)
{
	char	  **result = arg;
	Interval   *every = palloc0(sizeof(Interval));

	every->time = (int64) outbox_retention * USECS_PER_SEC / 2;
	*result = OutboxRotateLog(every);
}

static void
housekeeping_trim(void *arg)
{
	(void) OutboxTrimBatches();
}

/* Rotate the log when due, and trim the batches now and then. */
static void
housekeeping_rotate(TimestampTz now, RelaySlot *slot)
{
	char	   *result = NULL;
	ErrorData  *edata;
	bool		blocked;
	bool		trimmed;
	TimestampTz started;
	long		wait_ms;

	if (!OutboxTimePassed(last_rotate, now, ROTATE_CHECK_MS))
		return;
	last_rotate = now;

	if (outbox_retention < 0)
		OutboxSlotSetRotation(slot, "never", false, now);
	else if (WorkerRunInSubtransaction(housekeeping_rotate_log, &result, &edata))
	{
		blocked = (strcmp(result, "rotated") != 0 &&
				   strcmp(result, "wait") != 0 &&
				   strcmp(result, "busy") != 0);
		OutboxSlotSetRotation(slot, result, blocked, now);
	}
	else
	{
		OutboxSlotSetRotation(slot, psprintf("failed: %s", edata->message),
							  true, now);
		WorkerReportJobError(&rotate_errors, edata,
							 "outbox_pg rotation of the event log",
							 "Delivery continues; the rotation is tried again in "
							 CppAsString2(ROTATE_CHECK_MS) " ms.");
	}

	if (!WorkerPaceDue(&trim_pace, now))
		return;
	started = GetCurrentTimestamp();
	trimmed = WorkerRunInSubtransaction(housekeeping_trim, NULL, &edata);
	wait_ms = WorkerPaceDone(&trim_pace, started, TRIM_INTERVAL_MS);
	if (!trimmed)
		WorkerReportJobError(&trim_errors, edata,
							 "outbox_pg trim of claimed batches",
							 psprintf("Delivery continues; the trim is tried again in %ld ms.",
									  wait_ms));
}

/* The destination with the oldest pending event: what the warning says. */
typedef struct BacklogMeasure
{
	char	   *destination;	/* NULL: nothing is pending */
	double		age;			/* of its oldest pending event, in s */
	int64		pending;
} BacklogMeasure;

/* What housekeeping_check_backlog() runs in its subtransaction. */
static void
housekeeping_measure_backlog(void *arg)
{
	BacklogMeasure *m = arg;
	bool		isnull;

	/* planned afresh: the backlog's size decides its plan */
	if (SPI_execute("SELECT coalesce(b.destination, '(unrouted)'),"
					"       pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-)"
					"                                     b.oldest_pending_at),"
					"       b.pending"
					"  FROM outbox._destination_backlog AS b"
					" WHERE b.oldest_pending_at IS NOT NULL"
					" ORDER BY 2 DESC LIMIT 1",
					true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not measure the outbox backlog");
	if (SPI_processed > 0)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		m->destination = SPI_getvalue(tup, desc, 1);
		m->age = DatumGetFloat8(SPI_getbinval(tup, desc, 2, &isnull));
		m->pending = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
	}
}

/*
 * The backlog warning: does nothing more often than every
 * BACKLOG_CHECK_MS (more rarely when the last measurement was slow).  The
 * measurement runs in a subtransaction, as the routing does, so that
 * failing it does not fail the lease step: it is logged and tried again
 * after BACKLOG_CHECK_MS.
 */
static void
housekeeping_check_backlog(const char *database_name)
{
	TimestampTz now = GetCurrentTimestamp();
	int			threshold = outbox_pending_age_warning;
	BacklogMeasure m = {NULL, 0, 0};
	ErrorData  *edata;

	if (!WorkerPaceDue(&backlog_pace, now))
		return;

	if (threshold > 0 &&
		!WorkerRunInSubtransaction(housekeeping_measure_backlog, &m, &edata))
	{
		/* not paced by its duration: a lock_timeout's was not the measure's */
		backlog_pace.set_at = GetCurrentTimestamp();
		backlog_pace.next = TimestampTzPlusMilliseconds(backlog_pace.set_at,
														BACKLOG_CHECK_MS);
		WorkerReportJobError(&backlog_errors, edata,
							 "outbox_pg measurement of the pending events",
							 "Delivery continues; the measurement is tried again in "
							 CppAsString2(BACKLOG_CHECK_MS) " ms.");
		return;
	}
	/* a large backlog (or many destinations) is measured less often */
	(void) WorkerPaceDone(&backlog_pace, now, BACKLOG_CHECK_MS);

	if (threshold > 0 && m.destination != NULL && m.age >= threshold)
	{
		if (!backlog_warning ||
			OutboxTimePassed(backlog_warned_at, now, BACKLOG_WARN_EVERY_MS))
		{
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("outbox_pg: the oldest pending event in database \"%s\" is %.0f s old",
							database_name, m.age),
					 errdetail("Destination \"%s\" has %lld pending events; outbox.pending_age_warning is %d s.",
							   m.destination, (long long) m.pending, threshold),
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
