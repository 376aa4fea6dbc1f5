/*-------------------------------------------------------------------------
 *
 * ops.c
 *		  Operability: outbox.wait_published() and the C helpers of the
 *		  monitoring and admin SQL functions (the relay's backlog warning is
 *		  in worker/housekeeping.c).
 *
 * Design notes:
 *
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

#define WAIT_MIN_SLEEP_MS		5
#define WAIT_MAX_SLEEP_MS		100
/* wait_published: a longer timeout waits this long (100 years) */
#define WAIT_MAX_TIMEOUT_US		(INT64CONST(36525) * USECS_PER_DAY)

PG_FUNCTION_INFO_V1(outbox_wake);
PG_FUNCTION_INFO_V1(outbox_relay_presence);
PG_FUNCTION_INFO_V1(outbox_log_rotation);
PG_FUNCTION_INFO_V1(outbox_wait_published);

static SPIPlanPtr status_plan = NULL;
static SPIPlanPtr own_event_plan = NULL;

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
 * outbox._log_rotation(): the last result of the log's rotation, as relay
 * worker 0 of the current database left it in its slot (retention.c), for
 * outbox.health(): all null while no worker 0 runs.
 */
Datum
outbox_log_rotation(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false};
	RelaySlot  *slot;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (outbox_shared == NULL)
		PG_RETURN_NULL();

	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	slot = OutboxFirstRelaySlot(MyDatabaseId);
	if (slot != NULL)
	{
		nulls[0] = (slot->rotation[0] == '\0');
		if (!nulls[0])
			values[0] = CStringGetTextDatum(slot->rotation);
		nulls[1] = (slot->rotation_checked_at == 0);
		values[1] = TimestampTzGetDatum(slot->rotation_checked_at);
		nulls[2] = (slot->rotated_at == 0);
		values[2] = TimestampTzGetDatum(slot->rotated_at);
		nulls[3] = (slot->rotation_blocked_since == 0);
		values[3] = TimestampTzGetDatum(slot->rotation_blocked_since);
	}
	LWLockRelease(outbox_shared->lock);

	if (slot == NULL)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * An event the calling transaction emitted is published only after it
 * commits: waiting for it in the same transaction waited for the whole
 * timeout (holding what the transaction locked) and answered false.
 * Asked once, when the event is first seen pending in a transaction that
 * has written something.
 */
static void
wait_refuse_own_event(Datum *args)
{
	Oid			argtypes[1] = {UUIDOID};

	WorkerKeepPlan(&own_event_plan,
				   "SELECT 1 FROM outbox.log AS l"
				   " WHERE l.id OPERATOR(pg_catalog.=) $1"
				   "   AND l.xid OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id()",
				   1, argtypes);
	if (SPI_execute_plan(own_event_plan, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the event's transaction");
	if (SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("outbox.wait_published() cannot wait for an event emitted by the current transaction"),
				 errdetail("The event is delivered only after the transaction that emitted it commits."),
				 errhint("Commit first, then call outbox.wait_published() in a new transaction.")));
	SPI_freetuptable(SPI_tuptable);
}

/*
 * outbox.wait_published(id, timeout): true once the event is published;
 * false when the timeout passes first or the event is a dead letter.
 *
 * The status comes from the view outbox.events (0.4.0), whose conditions
 * on id reach every branch's primary key: an event of the log is
 * published once its xid is visible in its destination's position, no
 * unacknowledged batch's range holds it, and neither outbox.retries nor
 * outbox.dead_events has a copy of it (worker/README.store, 3.1).
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
	{
		/*
		 * In floating point: '300000 years' or an infinite interval (17+)
		 * overflowed int64, and wrapped ('-300000 years' waited for ever,
		 * '98000000 days' not at all).  Beyond WAIT_MAX_TIMEOUT_US is as
		 * good as for ever.
		 */
		double		us = (double) timeout->time +
			(double) timeout->day * USECS_PER_DAY +
			(double) timeout->month * DAYS_PER_MONTH * USECS_PER_DAY;

		if (us < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("timeout must not be negative")));
		timeout_us = (us >= (double) WAIT_MAX_TIMEOUT_US) ?
			WAIT_MAX_TIMEOUT_US : (int64) us;
	}
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
	WorkerKeepPlan(&status_plan,
				   "SELECT e.status FROM outbox.events AS e"
				   " WHERE e.id OPERATOR(pg_catalog.=) $1",
				   1, argtypes);
	for (;;)
	{
		char	   *status;
		TimestampTz now;
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
		result = (strcmp(status, "published") == 0);
		if (result || strcmp(status, "dead") == 0)
			break;
		pfree(status);			/* one a poll, for as long as it waits */
		if (sleep_ms == WAIT_MIN_SLEEP_MS &&
			TransactionIdIsValid(GetTopTransactionIdIfAny()))
			wait_refuse_own_event(args);

		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;
		left_ms = TimestampDifferenceMilliseconds(now, deadline);	/* rounded up */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(sleep_ms, left_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		sleep_ms = Min(sleep_ms * 2, WAIT_MAX_SLEEP_MS);
	}
	SPI_finish();
	PG_RETURN_BOOL(result);
}
