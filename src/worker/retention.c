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

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "worker/worker.h"

static uint64 retention_expire_published(TimestampTz cutoff, int batch_size);

/* how often worker 0 looks for expired rows when the last batch was short */
#define RETENTION_INTERVAL_MS	1000

PG_FUNCTION_INFO_V1(outbox_expire_published);

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
static TimestampTz retention_last_run = 0;
static bool retention_more = false;

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

/* One batch of OutboxRetentionStep(), in its subtransaction. */
static void
retention_batch(void *arg)
{
	TimestampTz now = *(TimestampTz *) arg;
	uint64		n;

	n = retention_expire_published(now - (int64) outbox_retention * USECS_PER_SEC,
							  outbox_retention_batch);
	retention_more = (n >= (uint64) outbox_retention_batch);
}

/*
 * One retention batch, if it is time.  Called by relay worker 0 inside its
 * lease transaction (connected to SPI, the events table locked).  The
 * batch runs in a subtransaction: if it fails (a user trigger on the
 * table, a lock timeout) the error is logged and delivery goes on.
 */
void
OutboxRetentionStep(TimestampTz now)
{
	ErrorData  *edata;

	if (outbox_retention < 0)
		return;
	if (!retention_more &&
		!TimestampDifferenceExceeds(retention_last_run, now, RETENTION_INTERVAL_MS))
		return;
	retention_last_run = now;
	retention_more = false;

	if (WorkerRunInSubtransaction(retention_batch, &now, &edata))
		return;
	ereport(LOG,
			(errcode(edata->sqlerrcode),
			 errmsg("outbox_pg retention of published events failed: %s",
					edata->message),
			 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
			 errhint("Delivery continues; retention is tried again in %d ms.",
					 RETENTION_INTERVAL_MS)));
	FreeErrorData(edata);
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
