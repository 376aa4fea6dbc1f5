/*-------------------------------------------------------------------------
 *
 * pace.c
 *		  Jobs whose cost grows with what the database holds, kept to a
 *		  share of a worker's time.
 *
 * Some of a relay's periodic jobs cost per destination that exists (the
 * due-work sweep, the trim of claimed batches) or per pending event (the
 * backlog warning), not per event delivered.  Each runs no more often
 * than its base interval, and no more often than `factor` times its own
 * last duration: a job that took t ms waits factor * t ms, so it takes at
 * most 1/factor of the worker's time, however many destinations or events
 * there are.  `max_ms` bounds the wait, so that a slow job still runs now
 * and then.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/pace.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "worker/worker.h"

/* May the paced job run at now? */
bool
WorkerPaceDue(const WorkerPace *pace, TimestampTz now)
{
	/* before the reading it was set from: the clock went back (util.h) */
	return now >= pace->next || now < pace->set_at;
}

/*
 * The job began at started and has just ended: it runs again after
 * base_ms, or after factor times what it took if that is longer, but no
 * later than after max_ms (when that is above base_ms).  Returns the wait
 * in milliseconds.
 */
long
WorkerPaceDone(WorkerPace *pace, TimestampTz started, long base_ms)
{
	long		took_ms = (long) ((GetCurrentTimestamp() - started) / 1000);
	long		wait_ms = Max(base_ms, (long) pace->factor * Max(took_ms, 0));

	if (pace->max_ms > base_ms)
		wait_ms = Min(wait_ms, pace->max_ms);
	pace->next = TimestampTzPlusMilliseconds(started, wait_ms);
	pace->set_at = started;
	return wait_ms;
}
