/*-------------------------------------------------------------------------
 *
 * stats.c
 *		  outbox.workers(): what every relay worker is doing, from shared
 *		  memory.
 *
 * One row per assigned relay slot, whichever database it serves, so a
 * relay that is down (stopped, waiting for a restart, or finding no
 * extension) is visible too, not just the ones that run.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "shmem.h"
#include "worker/worker.h"

PG_FUNCTION_INFO_V1(outbox_workers);

#define WORKERS_COLS 11

Datum
outbox_workers(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);

	if (outbox_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox_pg is not loaded through shared_preload_libraries"),
				 errhint("Add outbox_pg to shared_preload_libraries and restart the server to run the relay.")));

	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];
		RelaySlot	copy;
		Datum		values[WORKERS_COLS];
		bool		nulls[WORKERS_COLS];
		char	   *dbname;

		LWLockAcquire(outbox_shared->lock, LW_SHARED);
		memcpy(&copy, slot, offsetof(RelaySlot, published));
		memcpy(copy.last_error, slot->last_error, sizeof(copy.last_error));
		copy.last_error_at = slot->last_error_at;
		LWLockRelease(outbox_shared->lock);

		if (!OidIsValid(copy.dboid))
			continue;

		memset(nulls, false, sizeof(nulls));
		dbname = get_database_name(copy.dboid);
		values[0] = Int32GetDatum(copy.pid);
		nulls[0] = (copy.pid == 0);
		values[1] = dbname ? CStringGetTextDatum(dbname) : (Datum) 0;
		nulls[1] = (dbname == NULL);
		values[2] = Int32GetDatum(copy.worker_number);
		values[3] = CStringGetTextDatum(OutboxRelayStateName(copy.state));
		values[4] = Int32GetDatum(copy.pid != 0 ? copy.in_flight : 0);
		values[5] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->published));
		values[6] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->failed));
		values[7] = TimestampTzGetDatum(copy.started_at);
		nulls[7] = (copy.started_at == 0);
		values[8] = TimestampTzGetDatum(copy.last_cycle_at);
		nulls[8] = (copy.last_cycle_at == 0);
		values[9] = CStringGetTextDatum(copy.last_error);
		nulls[9] = (copy.last_error[0] == '\0');
		values[10] = TimestampTzGetDatum(copy.last_error_at);
		nulls[10] = (copy.last_error_at == 0);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
