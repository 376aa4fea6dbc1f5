/*-------------------------------------------------------------------------
 *
 * step.c
 *		  Worker plumbing: the transaction of a worker step, kept plans,
 *		  subtransactions and the reporting of a failed cycle.
 *
 * Every unit of work of the launcher and the relays (a lease, a group of
 * results, an inbox batch, a look at pg_database) runs as one step: a
 * short transaction with a snapshot and SPI, begun and committed here, so
 * that the sequence and its checks are written once.
 *
 * Design notes:
 *
 *	- A step runs in the memory context of its caller: WorkerStepBegin()
 *	  switches back to it after SPI_connect(), and WorkerStepCommit()
 *	  returns to it after the commit (which would leave TopMemoryContext
 *	  current).  A worker loop that runs in a per-iteration context
 *	  therefore needs no MemoryContextSwitchTo around its steps.  SPI
 *	  calls still leave SPI's own context current after they return; what
 *	  must outlive the transaction is allocated in a named context.
 *	- The extension may be dropped, updated or not yet created while a
 *	  worker runs (DESIGN.md section 5).  WorkerStepBegin() checks that it
 *	  is there (and, for the relay, that its version is the library's),
 *	  then takes every table lock of the step without waiting: when DROP
 *	  or ALTER EXTENSION holds one, the step is skipped instead of
 *	  queueing behind that lock and deadlocking against it.  A skipped
 *	  step commits by itself (nothing was written; the commit releases the
 *	  locks taken so far) and says why; WorkerStepCommit() after it does
 *	  nothing, so callers may always pair the two.
 *	- A failed cycle is reported the way autovacuum reports a failed
 *	  table: the original error, with its SQLSTATE, detail and hint, is
 *	  logged again at LOG with a context line naming what the worker was
 *	  doing; the worker goes on.  The same message within a minute is
 *	  logged at DEBUG1 only, so a database in a persistent bad state does
 *	  not fill the log.  An error may quote what a destination said, so
 *	  its message and detail pass through peertext.c first.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/step.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "pgstat.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "shmem.h"
#include "peertext.h"
#include "worker/worker.h"
#include "util.h"

static bool step_lock_tables_nowait(const char *schema,
								   const OutboxTableLock *tables, int ntables);

/* the same cycle error again within this time is logged at DEBUG1 */
#define CYCLE_ERROR_QUIET_MS	60000
#define PLAN_REFRESH_MS			60000

/* WorkerKeepPlan()'s plans (addresses of their static pointers) */
static List *kept_plans = NIL;
static TimestampTz plans_made_at = 0;

/* a step is open: WorkerStepCommit() has something to commit */
static bool step_open = false;

/* the memory context the open step returns to */
static MemoryContext step_context = NULL;

static char *step_safe_text(const char *text);

/*
 * Begin a step: start a transaction with a snapshot, connect to SPI, check
 * the extension (spec->check) and lock spec's tables without waiting, then
 * prepare the step's plans.  The caller's memory context stays current.
 *
 * Returns true when the step may run; the caller ends it with
 * WorkerStepCommit().  Returns false when it must be skipped, with the
 * transaction already committed, and the reason in *skip (if not NULL).
 * version_slot is the slot that shows a version mismatch (WORKER_CHECK_VERSION
 * only).
 */
bool
WorkerStepBegin(const WorkerStepSpec *spec, RelaySlot *version_slot,
				WorkerStepSkip *skip)
{
	MemoryContext caller = CurrentMemoryContext;
	WorkerStepSkip why = WORKER_STEP_RUN;

	Assert(!step_open);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	MemoryContextSwitchTo(caller);
	step_open = true;
	step_context = caller;

	switch (spec->check)
	{
		case WORKER_CHECK_NONE:
			break;
		case WORKER_CHECK_EXTENSION:
			if (!OidIsValid(get_extension_oid("outbox_pg", true)))
				why = WORKER_STEP_NO_EXTENSION;
			break;
		case WORKER_CHECK_VERSION:
			{
				bool		missing;

				if (!OutboxRelayVersionMatches(version_slot, &missing))
					why = missing ? WORKER_STEP_NO_EXTENSION : WORKER_STEP_OUTDATED;
			}
			break;
	}
	if (why == WORKER_STEP_RUN && spec->ntables > 0 &&
		!step_lock_tables_nowait(spec->schema, spec->tables, spec->ntables))
		why = WORKER_STEP_LOCKED;

	if (skip != NULL)
		*skip = why;
	if (why != WORKER_STEP_RUN)
	{
		WorkerStepCommit();
		return false;
	}
	if (spec->prepare_plans != NULL)
	{
		/* preparing a plan leaves SPI's memory current */
		spec->prepare_plans();
		MemoryContextSwitchTo(caller);
	}
	return true;
}

/*
 * End a step begun by WorkerStepBegin(): commit, and return to the memory
 * context the step began in.  Does nothing after a skipped begin.
 */
void
WorkerStepCommit(void)
{
	if (!step_open)
		return;
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(step_context);
	step_open = false;
	pgstat_report_stat(false);
}

/*
 * Run fn(arg) in an internal subtransaction of the open step, in the
 * caller's memory context.  Returns true when it succeeded (the
 * subtransaction is released).  On an ERROR the subtransaction is rolled
 * back, the error is copied into the caller's memory context for the
 * caller to report (*error), and false is returned.
 */
bool
WorkerRunInSubtransaction(void (*fn) (void *arg), void *arg,
						  ErrorData **error)
{
	MemoryContext caller = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool ok = true;

	*error = NULL;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(caller);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(caller);
		*error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(caller);
	CurrentResourceOwner = owner;
	return ok;
}

/*
 * Prepare sql into *plan and keep it (until WorkerRefreshPlans()).  The
 * caller is connected to SPI.  The relay runs with plan_cache_mode =
 * force_generic_plan: each statement is planned once per refresh, for
 * the tables' sizes at that time.  Until 0.4.0 the relay forced custom
 * plans for every statement, including the functions it calls and the
 * foreign-key checks they fire: planning took 56 % of its CPU at 1,000
 * events/s (perf).  With auto, the claim's statements (a snapshot's xip
 * array as a parameter) kept being planned afresh: 32 % of relay CPU in
 * the planner at 1,000 single-event commits/s, against 5 % now.
 */
SPIPlanPtr
WorkerKeepPlan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes)
{
	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

		if (p == NULL)
			elog(ERROR, "could not prepare outbox statement: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "could not keep outbox statement");
		*plan = p;
		if (!list_member_ptr(kept_plans, plan))
		{
			MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

			kept_plans = lappend(kept_plans, plan);
			MemoryContextSwitchTo(old);
		}
	}
	return *plan;
}

/*
 * Drop every kept plan once they are PLAN_REFRESH_MS old; each statement
 * is prepared again at its next use.  A plan is made for the tables as
 * they are when it is made (the log's slots are never analyzed: their
 * estimates follow their size on disk), and only an invalidation of a
 * table it reads would make it again: this bounds how long a plan made
 * for an empty table is used on a large one.  Called between cycles,
 * when no kept plan is running.
 */
void
WorkerRefreshPlans(TimestampTz now)
{
	ListCell   *lc;

	if (plans_made_at == 0)
		plans_made_at = now;
	if (!OutboxTimePassed(plans_made_at, now, PLAN_REFRESH_MS))
		return;
	plans_made_at = now;
	foreach(lc, kept_plans)
	{
		SPIPlanPtr *plan = lfirst(lc);

		if (*plan != NULL)
		{
			SPI_freeplan(*plan);
			*plan = NULL;
		}
	}
}

/*
 * Lock the tables a worker step touches, in the given order, without
 * waiting: false when one is missing or locked by someone else (DROP or
 * ALTER EXTENSION in progress), and the step should be skipped instead of
 * queueing behind that lock and deadlocking against it.  The caller is in
 * a transaction; locks taken before a false return stay until it ends.
 */
static bool
step_lock_tables_nowait(const char *schema, const OutboxTableLock *tables,
					   int ntables)
{
	for (int i = 0; i < ntables; i++)
	{
		RangeVar   *rv = makeRangeVar((char *) schema, (char *) tables[i].name, -1);

		if (!OidIsValid(RangeVarGetRelidExtended(rv, tables[i].lockmode,
												 RVR_MISSING_OK | RVR_SKIP_LOCKED,
												 NULL, NULL)))
			return false;
	}
	return true;
}

/*
 * Was message logged by throttle's worker less than CYCLE_ERROR_QUIET_MS
 * ago?  Remembers it as the last one, and its time unless repeated.
 */
static bool
step_error_repeated(WorkerErrorThrottle *throttle, const char *message)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		repeated;

	repeated = (strcmp(throttle->last_message, message) == 0 &&
				!OutboxTimePassed(throttle->last_logged_at, now,
								  CYCLE_ERROR_QUIET_MS));
	strlcpy(throttle->last_message, message, sizeof(throttle->last_message));
	if (!repeated)
		throttle->last_logged_at = now;
	return repeated;
}

/*
 * Report the error that ended a worker's cycle, from its PG_CATCH block,
 * called in a memory context other than ErrorContext (the worker's loop
 * context, say), which is current again on return.
 *
 * The transaction is aborted (with the open step, if any).  slot, if not
 * NULL, shows the error and the error state.  The error is then logged at
 * LOG with its own SQLSTATE, detail and hint, plus a context line made
 * from context_fmt, and hint when the error has none of its own; the same
 * message within a minute of its last report goes to DEBUG1.
 */
void
WorkerReportCycleError(WorkerErrorThrottle *throttle, RelaySlot *slot,
					   const char *hint, const char *context_fmt,...)
{
	MemoryContext caller = CurrentMemoryContext;
	ErrorData  *edata;
	StringInfoData context;
	bool		repeated;

	Assert(caller != ErrorContext);
	edata = CopyErrorData();
	FlushErrorState();
	AbortCurrentTransaction();
	MemoryContextSwitchTo(caller);
	step_open = false;

	if (slot != NULL)
	{
		OutboxSlotSetError(slot, edata->message);
		OutboxSlotSetState(slot, RELAY_ERROR);
	}

	repeated = step_error_repeated(throttle, edata->message);

	/* what the worker was doing goes below the error's own context */
	initStringInfo(&context);
	if (edata->context != NULL)
		appendStringInfo(&context, "%s\n", edata->context);
	for (;;)
	{
		va_list		args;
		int			needed;

		va_start(args, context_fmt);
		needed = appendStringInfoVA(&context, context_fmt, args);
		va_end(args);
		if (needed == 0)
			break;
		enlargeStringInfo(&context, needed);
	}
	edata->context = context.data;
	edata->message = step_safe_text(edata->message);
	if (edata->detail != NULL)
		edata->detail = step_safe_text(edata->detail);
	if (edata->hint == NULL && hint != NULL)
		edata->hint = pstrdup(hint);

	/* ThrowErrorData() emits a report below ERROR and returns */
	edata->elevel = repeated ? DEBUG1 : LOG;
	ThrowErrorData(edata);
	MemoryContextSwitchTo(caller);
}

/* An error's text, made safe to log: controls escaped, length bounded. */
static char *
step_safe_text(const char *text)
{
	return OutboxPeerText(text, strlen(text), false, NULL,
						  8 * OUTBOX_ERROR_LEN);
}

/*
 * Report the error of a worker's job that WorkerRunInSubtransaction()
 * caught, and free it: "<what> failed: <its message>" at LOG, with its
 * SQLSTATE, detail and context, the texts made safe to log as
 * WorkerReportCycleError() does, and hint after its own.
 * The same message within a minute of its last report goes to DEBUG1.
 */
void
WorkerReportJobError(WorkerErrorThrottle *throttle, ErrorData *edata,
					 const char *what, const char *hint)
{
	bool		repeated;

	if (edata->message == NULL)
		edata->message = pstrdup("");
	repeated = step_error_repeated(throttle, edata->message);

	edata->message = psprintf("%s failed: %s", what,
							  step_safe_text(edata->message));
	if (edata->detail != NULL)
		edata->detail = step_safe_text(edata->detail);
	if (edata->hint == NULL)
		edata->hint = pstrdup(hint);
	else
		edata->hint = psprintf("%s %s", step_safe_text(edata->hint), hint);
	edata->elevel = repeated ? DEBUG1 : LOG;
	ThrowErrorData(edata);
	FreeErrorData(edata);
}
