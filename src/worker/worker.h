/*-------------------------------------------------------------------------
 *
 * worker.h
 *		  The launcher and relay processes and what they call.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/worker.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_H
#define OUTBOX_WORKER_H

#include "executor/spi.h"
#include "storage/lockdefs.h"

#include "outbox_pg.h"
#include "shmem.h"

/* launcher.c */
extern void OutboxRegisterLauncher(void);
extern PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* relay.c */
extern PGDLLEXPORT void OutboxRelayMain(Datum main_arg);

/* inbox_process.c */
extern bool InboxWorkerCycle(bool run_retention, long *wait_ms);

/* store.c */
typedef struct OutboxTableLock
{
	const char *name;			/* table in the schema given with the array */
	LOCKMODE	lockmode;
} OutboxTableLock;

extern SPIPlanPtr OutboxKeepPlan(SPIPlanPtr *plan, const char *sql,
								 int nargs, Oid *argtypes);
extern bool OutboxLockTablesNoWait(const char *schema,
								   const OutboxTableLock *tables, int ntables);
extern uint64 OutboxStoreLease(int batch_size, Interval *lease,
							   const char *destination);
extern uint64 OutboxStoreAck(Datum ids, Datum statuses);
extern uint64 OutboxStoreRetry(Datum ids, Datum next_at, Datum statuses,
							   Datum errors, Datum leases, Datum give_back);
extern uint64 OutboxStoreDead(Datum ids, Datum statuses, Datum errors,
							  Datum leases);

/* version.c */
extern char *OutboxInstalledVersion(void);
extern bool OutboxRelayVersionMatches(RelaySlot *slot, const char *dbname,
									  bool *missing);

/* retention.c */
extern uint64 OutboxExpirePublished(TimestampTz cutoff, int batch_size);
extern void OutboxRetentionStep(TimestampTz now);

#endif							/* OUTBOX_WORKER_H */
