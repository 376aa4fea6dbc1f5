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
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "shmem.h"

/* launcher.c */
extern void OutboxRegisterLauncher(void);
extern PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* relay.c */
extern PGDLLEXPORT void OutboxRelayMain(Datum main_arg);

/* inbox_process.c */
extern bool InboxWorkerCycle(bool run_retention, long *wait_ms);

/* step.c */
typedef struct OutboxTableLock
{
	const char *name;			/* table in the schema given with the array */
	LOCKMODE	lockmode;
} OutboxTableLock;

/* What WorkerStepBegin() checks before it locks the tables. */
typedef enum WorkerStepCheck
{
	WORKER_CHECK_NONE,			/* nothing (the launcher: no database) */
	WORKER_CHECK_EXTENSION,		/* outbox_pg is installed */
	WORKER_CHECK_VERSION		/* ... at the library's version */
} WorkerStepCheck;

/* Why WorkerStepBegin() skipped a step. */
typedef enum WorkerStepSkip
{
	WORKER_STEP_RUN = 0,		/* not skipped */
	WORKER_STEP_NO_EXTENSION,	/* outbox_pg is not installed */
	WORKER_STEP_OUTDATED,		/* installed at another version */
	WORKER_STEP_LOCKED			/* a table is missing or locked */
} WorkerStepSkip;

/* One kind of worker step: its checks, its tables and its plans. */
typedef struct WorkerStepSpec
{
	WorkerStepCheck check;
	const char *schema;			/* of the tables */
	const OutboxTableLock *tables;	/* locked in this order, NOWAIT */
	int			ntables;
	void		(*prepare_plans) (void);	/* after the locks; may be NULL */
} WorkerStepSpec;

/* The last cycle error a worker logged, for WorkerReportCycleError(). */
typedef struct WorkerErrorThrottle
{
	char		last_message[OUTBOX_ERROR_LEN];
	TimestampTz last_logged_at;
} WorkerErrorThrottle;

extern bool WorkerStepBegin(const WorkerStepSpec *spec, RelaySlot *version_slot,
							WorkerStepSkip *skip);
extern void WorkerStepCommit(void);
extern bool WorkerRunInSubtransaction(void (*fn) (void *arg), void *arg,
									  ErrorData **error);
extern SPIPlanPtr WorkerKeepPlan(SPIPlanPtr *plan, const char *sql,
								 int nargs, Oid *argtypes);
extern void WorkerRefreshPlans(TimestampTz now);
extern void WorkerReportCycleError(WorkerErrorThrottle *throttle,
								   RelaySlot *slot, const char *hint,
								   const char *context_fmt,...) pg_attribute_printf(4, 5);
extern void WorkerReportJobError(WorkerErrorThrottle *throttle,
								 ErrorData *edata, const char *what,
								 const char *hint);

/* pace.c */
typedef struct WorkerPace
{
	int			factor;			/* waits factor times its last duration */
	long		max_ms;			/* ... but no longer than this */
	TimestampTz next;			/* not before */
	TimestampTz set_at;			/* the reading next was set from */
} WorkerPace;

extern bool WorkerPaceDue(const WorkerPace *pace, TimestampTz now);
extern long WorkerPaceDone(WorkerPace *pace, TimestampTz started, long base_ms);

/* housekeeping.c */
extern void WorkerHousekeeping(TimestampTz now, const char *database_name,
							   RelaySlot *slot);

/* retention.c (the insert-only store's rotation) */
extern char *OutboxRotateLog(Interval *every);
extern int64 OutboxTrimBatches(void);

/* store.c */
extern uint64 OutboxStoreClaim(int batch_size, Interval *lease,
							   const char *destination);
extern uint64 OutboxStoreClaimNext(int batch_size, Interval *lease,
								   const char *destination, bool serial,
								   bool *more, bool *locked_out);
extern uint64 OutboxStoreDueDestinations(bool with_log,
										 TimestampTz expired_since);
extern bool OutboxStorePreparedTransactions(void);
extern bool OutboxStoreClaimSpill(int batch_size, const char *destination);
extern bool OutboxStoreSpillExpired(const char *destination);
extern bool OutboxStoreBatchLease(const char *destination, int64 seq,
								  Interval *lease, TimestampTz *fence);
extern bool OutboxStoreClaimAck(const char *destination, int64 seq,
								Datum failed, Datum due_at, Datum attempts,
								Datum statuses, Datum errors, Datum dead,
								Datum dead_statuses, Datum dead_errors,
								TimestampTz fence);
extern uint64 OutboxStoreClaimRecover(Interval *lease, const char *destination,
									  int64 low_seq, bool relay);
extern uint64 OutboxStoreRetriesLease(int batch_size, Interval *lease,
									  const char *destination, bool ordered);
extern uint64 OutboxStoreRetriesAck(Datum ids);
extern uint64 OutboxStoreRetriesRetry(Datum ids, Datum next_at, Datum statuses,
									  Datum errors, Datum leases,
									  Datum give_back);
extern uint64 OutboxStoreRetriesDead(Datum ids, Datum statuses, Datum errors,
									 Datum leases);

/* version.c */
extern bool OutboxRelayVersionMatches(RelaySlot *slot, bool *missing);

#endif							/* OUTBOX_WORKER_H */
