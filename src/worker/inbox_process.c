/*-------------------------------------------------------------------------
 *
 * inbox_process.c
 *		  Run received inbox messages through their handlers; expire what
 *		  the inbox no longer needs.
 *
 * The relay workers call InboxWorkerCycle() from their main loop when
 * woken (inbox.receive() wakes them at commit) and at every poll.  Every
 * worker of a database processes messages (they share the work with
 * FOR UPDATE SKIP LOCKED); worker 0 also runs retention.  One cycle
 * handles at most INBOX_BATCH messages, so the inbox never starves outbox
 * delivery in the same worker, and the outbox never starves the inbox:
 * the relay loop calls both in turn.
 *
 * The wake-up is shared with the outbox (emit() and receive() set the same
 * latch), but emit()'s commits name their destinations and receive()'s do
 * not (wake.c): the relay calls the inbox for the latter, at every poll
 * and after every batch that leased anything (relay.c).  After a lease
 * that found nothing, the next look waits until INBOX_IDLE_RECHECK_MS have
 * passed: at most 50 empty leases a second under a stream of receive()
 * commits, for at most that much added latency after an idle spell.
 *
 * Protocol for one batch (at-least-once into the handler, exactly-once in
 * effect because the handler's writes and the processed mark commit
 * together):
 *
 *	1. Lease, in a short transaction: inbox._lease() picks due pending
 *	   messages in received order with FOR UPDATE SKIP LOCKED, counts the
 *	   attempt and pushes next_attempt_at out by outbox.lease_margin, then
 *	   commits and flushes that commit to disk.  Counting the attempt
 *	   before the handler runs means a message whose handler kills the
 *	   worker process, or crashes the server, still runs out of attempts
 *	   instead of crash-looping the server: leased beyond its handler's
 *	   max_attempts, it is dead-lettered without running the handler again
 *	   (inbox_run_batch).  Such an attempt leaves attempts above
 *	   finished_attempts (the processed mark and a recorded failure set
 *	   one to the other), and the lease takes a message in that state
 *	   alone (0.5.1): the messages leased with one that kills the worker
 *	   are charged that one attempt, not one per death, and only the
 *	   culprit runs out of attempts.  Before, the batch was leased together
 *	   again and again, and after max_attempts deaths every message of it
 *	   was dead-lettered.
 *	2. Process, in one transaction: lock the leased rows again (FOR
 *	   UPDATE, and only if their attempt count is still the leased one, so
 *	   a lease that ran out and was taken by another worker is left to that
 *	   worker).  Not SKIP LOCKED: another worker's lease that looked at a
 *	   row as this worker's lease committed (the row no longer due, in its
 *	   recheck) holds the row's lock until its own commit, a moment later.
 *	   Skipped, the message waited for its lease to run out: with two
 *	   workers, 2,045 of 20,000 messages of a backlog waited 10 s that
 *	   way, the backlog took 11 s instead of about 1.  That lease never
 *	   waits (SKIP LOCKED), so this wait is short and cannot deadlock with
 *	   it; another session's lock is waited for at most
 *	   INBOX_FETCH_LOCK_TIMEOUT (inbox_fetch).  The messages run through
 *	   their handlers in one internal subtransaction, split where a
 *	   handler fails (inbox_run_range): a failing handler rolls back only
 *	   its own writes; the message then gets its error and its next
 *	   attempt time (OutboxBackoffDelayMs, the outbox's schedule), or is
 *	   dead-lettered once it has used the handler's max_attempts.
 *	   Messages whose handler succeeded are marked processed, and
 *	   everything commits at once.  The row locks, held to the end, keep
 *	   other workers off even if a slow handler outlives the lease.
 *
 * Handler contract: a function (not a procedure, not set-returning) with
 * exactly one argument of type inbox.messages; its result is ignored, an
 * ERROR is a failure.  It is called through fmgr, as its owner
 * (SetUserIdAndSecContext with SECURITY_LOCAL_USERID_CHANGE and
 * SECURITY_RESTRICTED_OPERATION, like maintenance commands run index
 * functions), so registering a function — a privileged act, since
 * inbox.handlers is granted to nobody — never lends the worker's superuser
 * rights to the function's author.  Settings the handler changes are
 * undone after it (a GUC nest level), and the worker's search_path is
 * pg_catalog: handlers qualify their names or carry SET search_path.  The
 * signature is checked again before every call, so a row written directly
 * into inbox.handlers cannot make the worker pass a wrong argument type.
 * Constraints are checked at the end of each of the handler's statements
 * (SET CONSTRAINTS ALL IMMEDIATE): PostgreSQL refuses to queue a deferred
 * trigger in a security-restricted operation.
 * Each call runs under the statement timeout (outbox.inbox_handler_timeout,
 * the backend's own STATEMENT_TIMEOUT machinery): a handler that hangs is
 * cancelled and counts as a failed attempt instead of holding the worker —
 * and with it this worker's outbox delivery — forever.
 *
 * Ordering: for a message whose handler is ordered, inbox._lease() skips it
 * while an earlier message (lower seq) of the same aggregate is pending,
 * which includes one waiting for its retry; dead letters do not block.
 * The lease sets such a message aside (its next_attempt_at becomes the
 * time the aggregate's first message is retried or its lease runs out;
 * see inbox._lease), so leases do not walk it again and again.  A message
 * that leaves pending (processed or dead) makes the next message of its
 * aggregate due again if it was set aside (release_plan; a never-attempted
 * one at its received_at, its place in the queue): an aggregate goes one
 * message after the other without waiting for those times, also when an
 * operator moved a retry forward.  Only a first pending message behind the
 * settled one (a higher seq) is released: one before it was not waiting for
 * it, and a failed ordered message waiting for its retry lost its backoff
 * each time a later message of its aggregate of an unordered type was
 * processed.  A row locked by someone else is left
 * alone (SKIP LOCKED: another worker's lease may be walking it); at worst
 * it waits for the time it was set aside to.
 *
 * Retention (worker 0, at most once a second unless behind): processed
 * messages older than outbox.inbox_retention and expired claims are
 * deleted, INBOX_RETENTION_BATCH rows per table per run.  Pending and dead
 * messages are never deleted here.  A processed message is the duplicate
 * detector for its id, so the effective retention is never shorter than
 * outbox.redelivery_window; a shorter setting is overridden, and said so
 * in the server log at LOG level (which, unlike WARNING, passes the
 * default log_min_messages and TAP's log_min_messages = log alike).  Each
 * of the two deletions runs in a subtransaction: one that fails (an
 * application's trigger or foreign key on inbox.messages) is logged and
 * tried again at the next run, and neither the other one nor the
 * processing of messages waits for it.
 *
 * Each step takes its table locks with RVR_SKIP_LOCKED first and skips the
 * cycle when they are not free (DROP or ALTER EXTENSION in progress), and
 * it skips the cycle while the extension's SQL objects are at another
 * version than the library, as the relay does (its statements name
 * columns of this version: inbox.messages.finished_attempts is 0.5.1's;
 * until then the inbox ran in that window and every cycle failed).  Errors are
 * caught here, logged (the same one at most once a minute) and end the
 * cycle (step.c reports them); they never reach the relay's own error
 * handling.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/inbox_process.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "guc.h"
#include "peertext.h"
#include "retry.h"
#include "worker/relay.h"
#include "worker/worker.h"
#include "util.h"

#define INBOX_BATCH					100
#define INBOX_RETENTION_BATCH		1000
#define INBOX_RETENTION_INTERVAL_MS	1000
#define INBOX_ERROR_LEN				1000
#define INBOX_IDLE_RECHECK_MS		20
#define INBOX_FETCH_LOCK_TIMEOUT	"1s"

/*
 * A message no handler matches waits for one: looked at again after its
 * age (at least INBOX_UNHANDLED_MIN_MS, at most INBOX_UNHANDLED_MAX_MS
 * apart), its attempts untouched, and dead-lettered once it has been
 * pending INBOX_UNHANDLED_WAIT_MS.
 */
#define INBOX_UNHANDLED_MIN_MS		1000
#define INBOX_UNHANDLED_MAX_MS		600000
#define INBOX_UNHANDLED_WAIT_MS		(60 * 60 * 1000)

/* One message of the batch being processed, in cycle memory. */
typedef struct InboxMessage
{
	char	   *id;
	Datum		row;			/* the inbox.messages row, for the handler */
	Oid			handler;		/* InvalidOid: no handler matches */
	int			attempts;
	int			max_attempts;
	int			backoff_base_ms;
	int			backoff_max_ms;
	char	   *type;
	TimestampTz received_at;
	char	   *last_error;		/* the previous attempt's; NULL: none */
	int			finished_attempts;	/* before this attempt */
	bool		unrun;			/* this attempt did not run: not charged */
	bool		has_aggregate;	/* aggregate_id is set: release_plan applies */
	char	   *error;			/* why the handler failed; NULL: it did not */
} InboxMessage;

/* The tables a cycle touches, in the order it locks them. */
static const OutboxTableLock inbox_tables[] =
{
	{INBOX_MESSAGES_TABLE, RowExclusiveLock},
	{INBOX_HANDLERS_TABLE, AccessShareLock},
	{INBOX_CLAIMS_TABLE, RowExclusiveLock},
};

static MemoryContext inbox_context = NULL;
static pg_prng_state inbox_prng;
static TimestampTz last_retention_at = 0;
static TimestampTz last_empty_at = 0;	/* last lease that found nothing */
static bool retention_behind = false;
static int	warned_retention = -1;
static WorkerErrorThrottle inbox_errors;
static const char *inbox_doing = "";	/* for the context of an error */

static SPIPlanPtr due_plan = NULL;
static SPIPlanPtr lease_plan = NULL;
static SPIPlanPtr fetch_plan = NULL;
static SPIPlanPtr processed_plan = NULL;
static SPIPlanPtr failed_plan = NULL;
static SPIPlanPtr release_plan = NULL;
static SPIPlanPtr expire_messages_plan = NULL;
static SPIPlanPtr expire_claims_plan = NULL;

static void inbox_prepare_plans(void);

/* A transaction of the inbox: the extension and its inbox tables. */
static const WorkerStepSpec inbox_step =
{
	WORKER_CHECK_VERSION, INBOX_SCHEMA, inbox_tables, lengthof(inbox_tables),
	inbox_prepare_plans
};

static void
inbox_prepare_plans(void)
{
	Oid			lease_types[2] = {INT4OID, INTERVALOID};
	Oid			fetch_types[2] = {TEXTARRAYOID, INT4ARRAYOID};
	Oid			processed_types[1] = {TEXTARRAYOID};
	Oid			failed_types[5] = {TEXTOID, BOOLOID, TIMESTAMPTZOID, TEXTOID, INT4OID};
	Oid			release_types[1] = {TEXTARRAYOID};
	Oid			expire_messages_types[2] = {INTERVALOID, INT4OID};
	Oid			expire_claims_types[1] = {INT4OID};

	/*
	 * The statements on leased messages find them by id, through the
	 * primary key, whatever the statistics say.  The relay plans once per
	 * refresh (force_generic_plan, step.c), and a plan made while nothing
	 * was pending (or before the table's first ANALYZE) took
	 * messages_pending_idx, whose predicate "status = 'pending'" implies,
	 * for the whole scan: as long as the burst that followed lasted, each
	 * fetch of 100 ids read every pending message (15-20 ms per batch with
	 * 900 to 20,000 pending, auto_explain; the inbox bench processed 1,000
	 * messages/s instead of 13,000).  So the id is the only indexable
	 * condition: the status is tested with texteq(), the same test, which
	 * does not imply the index's predicate; the fetch names its ids with
	 * = ANY as well as in the join.
	 */
	WorkerKeepPlan(&due_plan,
				   "SELECT 1 FROM inbox.messages AS m"
				   " WHERE m.status OPERATOR(pg_catalog.=) 'pending'"
				   "   AND m.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
				   " LIMIT 1",
				   0, NULL);
	WorkerKeepPlan(&lease_plan,
				   "SELECT l.id, l.attempts FROM inbox._lease($1, $2) AS l",
				   2, lease_types);
	WorkerKeepPlan(&fetch_plan,
				   "SELECT m, m.id, m.type, m.attempts, h.function::pg_catalog.oid,"
				   " h.max_attempts, h.backoff_base_ms, h.backoff_max_ms,"
				   " m.aggregate_id IS NOT NULL, m.received_at, m.last_error,"
				   " m.finished_attempts"
				   "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS l(id, attempts)"
				   "  JOIN inbox.messages AS m"
				   "    ON m.id OPERATOR(pg_catalog.=) l.id"
				   "   AND m.attempts OPERATOR(pg_catalog.=) l.attempts"
				   "   AND m.finished_attempts OPERATOR(pg_catalog.<) m.attempts"
				   "  LEFT JOIN LATERAL inbox.handler_for(m.type) AS h ON true"
				   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($1)"
				   "   AND pg_catalog.texteq(m.status, 'pending')"
				   " ORDER BY m.seq"
				   "   FOR UPDATE OF m",
				   2, fetch_types);
	WorkerKeepPlan(&processed_plan,
				   "UPDATE inbox.messages AS m"
				   "   SET status = 'processed', processed_at = pg_catalog.now(),"
				   "       last_error = NULL, finished_attempts = m.attempts"
				   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($1)"
				   "   AND pg_catalog.texteq(m.status, 'pending')",
				   1, processed_types);
	WorkerKeepPlan(&failed_plan,
				   "UPDATE inbox.messages AS m"
				   "   SET status = CASE WHEN $2 THEN 'dead' ELSE 'pending' END,"
				   "       next_attempt_at = $3, last_error = $4,"
				   "       attempts = m.attempts OPERATOR(pg_catalog.-) $5,"
				   "       finished_attempts = m.attempts OPERATOR(pg_catalog.-) $5"
				   " WHERE m.id OPERATOR(pg_catalog.=) $1"
				   "   AND pg_catalog.texteq(m.status, 'pending')",
				   5, failed_types);
	/* see "Ordering" at the top of the file */
	WorkerKeepPlan(&release_plan,
				   "UPDATE inbox.messages AS f"
				   "   SET next_attempt_at = CASE WHEN f.attempts OPERATOR(pg_catalog.=) 0"
				   "                              THEN f.received_at ELSE pg_catalog.now() END"
				   " WHERE f.id OPERATOR(pg_catalog.=) ANY (ARRAY("
				   "        SELECT h.id FROM inbox.messages AS h"
				   "         WHERE h.id OPERATOR(pg_catalog.=) ANY (ARRAY("
				   "                SELECT (SELECT CASE WHEN a.seq OPERATOR(pg_catalog.>) e.seq"
				   "                                    THEN a.id END"
				   "                          FROM inbox.messages AS a"
				   "                         WHERE a.aggregate_id OPERATOR(pg_catalog.=) e.aggregate_id"
				   "                           AND a.status OPERATOR(pg_catalog.=) 'pending'"
				   "                         ORDER BY a.seq LIMIT 1)"
				   "                  FROM inbox.messages AS e"
				   "                 WHERE e.id OPERATOR(pg_catalog.=) ANY ($1)"
				   "                   AND e.aggregate_id IS NOT NULL))"
				   "           AND h.next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.now()"
				   "           AND coalesce((inbox.handler_for(h.type)).ordered, false)"
				   "           FOR UPDATE OF h SKIP LOCKED))",
				   1, release_types);
	WorkerKeepPlan(&expire_messages_plan,
				   "DELETE FROM inbox.messages AS m"
				   " WHERE m.id OPERATOR(pg_catalog.=) ANY (ARRAY("
				   "        SELECT o.id FROM inbox.messages AS o"
				   "         WHERE o.status OPERATOR(pg_catalog.=) 'processed'"
				   "           AND o.processed_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)"
				   "         ORDER BY o.processed_at"
				   "         LIMIT $2"
				   "           FOR UPDATE SKIP LOCKED))"
				   "   AND m.status OPERATOR(pg_catalog.=) 'processed'",
				   2, expire_messages_types);
	WorkerKeepPlan(&expire_claims_plan,
				   "DELETE FROM inbox.claims AS c"
				   " WHERE c.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
				   "        SELECT x.ctid FROM inbox.claims AS x"
				   "         WHERE x.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()"
				   "         ORDER BY x.expires_at"
				   "         LIMIT $1"
				   "           FOR UPDATE SKIP LOCKED))"
				   "   AND c.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()",
				   1, expire_claims_types);
}

/*
 * Call the handler of one message as the function's owner.  Raises an
 * ERROR on any failure, the handler's own included.  messages_type is the
 * row type of inbox.messages, the one argument type a handler takes.
 */
static void
inbox_call_handler(InboxMessage *msg, Oid messages_type)
{
	HeapTuple	proctup;
	Form_pg_proc proc;
	Oid			owner;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	FmgrInfo	flinfo;

	LOCAL_FCINFO(fcinfo, 1);

	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(msg->handler));
	if (!HeapTupleIsValid(proctup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler function with OID %u does not exist", msg->handler),
				 errhint("Register an existing function with inbox.register_handler().")));
	proc = (Form_pg_proc) GETSTRUCT(proctup);
	if (proc->prokind != PROKIND_FUNCTION || proc->proretset ||
		proc->pronargs != 1 || proc->proargtypes.values[0] != messages_type)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("function %s cannot be an inbox handler",
						format_procedure(msg->handler)),
				 errdetail("A handler is a function with exactly one argument of type inbox.messages.")));
	owner = proc->proowner;
	ReleaseSysCache(proctup);

	fmgr_info(msg->handler, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = msg->row;
	fcinfo->args[0].isnull = false;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	if (outbox_inbox_handler_timeout > 0)
		enable_timeout_after(STATEMENT_TIMEOUT, outbox_inbox_handler_timeout);

	(void) FunctionCallInvoke(fcinfo);

	/* on error, the subtransaction's abort restores both; see below */
	if (outbox_inbox_handler_timeout > 0)
		disable_timeout(STATEMENT_TIMEOUT, true);

	/*
	 * A timeout that fired just as the handler returned left a cancel
	 * pending: take it here, while this message is the one being run, where
	 * it fails this message and not the next one (with the timeout's
	 * message: the indicator was kept).
	 */
	CHECK_FOR_INTERRUPTS();
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/*
 * A run of consecutive messages of the batch through their handlers, in
 * one subtransaction (inbox_run_range).
 */
typedef struct InboxRun
{
	InboxMessage *msgs;
	int			from;
	int			to;				/* exclusive */
	int			at;				/* the message being run: the failing one */
	Oid			messages_type;
	MemoryContext msgcxt;		/* the handlers' memory, reset after each */
} InboxRun;

static void
inbox_run_step(void *arg)
{
	InboxRun   *run = (InboxRun *) arg;
	MemoryContext oldcxt = CurrentMemoryContext;
	ConstraintsSetStmt immediate = {.type = T_ConstraintsSetStmt};

	for (run->at = run->from; run->at < run->to; run->at++)
	{
		InboxMessage *msg = &run->msgs[run->at];

		if (msg->error != NULL)
			continue;			/* no handler matches */
		CHECK_FOR_INTERRUPTS();

		/*
		 * Constraints are checked at the end of each statement of a
		 * handler, not deferred to the commit: a handler runs as a
		 * security-restricted operation, where PostgreSQL refuses to queue a
		 * deferred trigger, and every write to a table with a DEFERRABLE
		 * INITIALLY DEFERRED foreign key failed (42501).  Set outside the
		 * handler's restricted context, before each handler: the mode is
		 * transaction state, not a setting its GUC level restores, so a
		 * handler's SET CONSTRAINTS ALL DEFERRED outlived it and failed the
		 * next handlers of the range.  Nothing is pending deferred here (a
		 * handler cannot queue it), so this fires nothing.  This
		 * subtransaction's rollback undoes it.
		 */
		AfterTriggerSetState(&immediate);
		MemoryContextSwitchTo(run->msgcxt);
		inbox_call_handler(msg, run->messages_type);
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(run->msgcxt);
		/* the next handler and the processed mark see this one's writes */
		CommandCounterIncrement();
	}
}

/*
 * Run messages [from, to) through their handlers, each failure in
 * msgs[i].error (allocated in the caller's memory context) with its own
 * writes rolled back, the successes' writes kept.
 *
 * All of them run in one subtransaction.  When a handler fails, that
 * subtransaction rolls back: the ones before it run again, in a
 * subtransaction of their own, and the ones after it in another.  Until
 * 0.4.0 every message had a subtransaction of its own: with a handler that
 * writes, an XID each, 100 per batch, beyond the 64 a backend's snapshot
 * entry can list, so every snapshot in the server had to look deeper
 * (pg_subtrans) while the batch was open; and the CPU of beginning and
 * ending one per message (not measurable here: 46-58 µs of worker CPU
 * per message either way with a one-INSERT plpgsql handler).  A handler
 * may be called twice for a message in one attempt, the first call's
 * writes rolled back (handlers are at-least-once, their effects once: the
 * writes commit with the processed mark).  One that succeeds and then
 * fails when run again (it does not answer the same to the same message)
 * fails its message in this attempt; each split runs fewer messages, so
 * the splitting ends.
 */
static void
inbox_run_range(InboxRun *base, int from, int to)
{
	MemoryContext oldcxt = CurrentMemoryContext;

	while (from < to)
	{
		InboxRun	run = *base;
		ErrorData  *edata;
		InboxMessage *msg;

		run.from = from;
		run.to = to;
		if (WorkerRunInSubtransaction(inbox_run_step, &run, &edata))
			return;

		/*
		 * The rollback restored the user and the settings, not the timer.
		 * A timeout that fired while the handler was failing of something
		 * else left its cancel pending (the indicator says so once the
		 * timer is off): it belongs to this message, and taken later it
		 * failed the next one.
		 */
		if (outbox_inbox_handler_timeout > 0)
		{
			disable_timeout(STATEMENT_TIMEOUT, true);
			if (get_timeout_indicator(STATEMENT_TIMEOUT, true))
				QueryCancelPending = false;
		}
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(base->msgcxt);
		if (run.at >= to)
		{
			/*
			 * Every handler of the range returned, and the subtransaction's
			 * end failed (postgres_fdw's RELEASE SAVEPOINT on a connection
			 * that went away, say): the error is no one message's, and
			 * msgs[run.at] was past the range (past the array after the
			 * batch's last message).  Each message runs again alone, where
			 * such an error is its own.
			 */
			if (to - from == 1 && base->msgs[from].error == NULL)
				run.at = from;
			else
			{
				FreeErrorData(edata);
				if (to - from > 1)
					for (int i = from; i < to; i++)
						inbox_run_range(base, i, i + 1);
				/* else one without a handler: it ran nothing to fail */
				return;
			}
		}
		msg = &base->msgs[run.at];
		if (edata->message == NULL)
			edata->message = pstrdup("");
		/* cut between characters: the text is stored and dumped */
		msg->error = psprintf("%s: %.*s", unpack_sql_state(edata->sqlerrcode),
							  pg_mbcliplen(edata->message, strlen(edata->message),
										   INBOX_ERROR_LEN),
							  edata->message);
		FreeErrorData(edata);
		inbox_run_range(base, from, run.at);
		from = run.at + 1;
	}
}

/*
 * Text of the database's made safe to log as a peer's, long enough for the
 * longest message id (see OutboxServerTextForLog: the conversion to UTF-8
 * it did before 0.5.1 could fail, and with it the dead letter's log line
 * and the whole batch, again at every lease).
 */
static char *
inbox_log_text(const char *text)
{
	return OutboxServerTextForLog(text, INBOX_ERROR_LEN + 64);
}

/*
 * Record a failed message: its next attempt, or the dead letters.  Returns
 * whether it is dead.
 *
 * A message no handler matches is not charged the attempt: its handler,
 * registered late, gets all of its max_attempts.  Until 0.5.1 such a look
 * counted, with the defaults of inbox.handlers (10 attempts), and a
 * handler registered after more looks than its max_attempts dead-lettered
 * the message without running ("attempt N of M ended without a result").
 * Uncounted, the wait is paced by the message's age instead: looked at
 * again after as long as it has been pending (1 s, 2 s, 4 s, ... at most
 * 10 min apart, with equal jitter as the backoff has), dead once pending
 * an hour and missed by two looks in a row.  The refund leaves attempts
 * equal to finished_attempts, so a worker whose lease of the message ran
 * out before its fetch cannot take it as its own (the fetch wants an
 * attempt in progress).
 */
static bool
inbox_record_failure(InboxMessage *msg, const char *error)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		unhandled = !OidIsValid(msg->handler);
	bool		dead;
	int64		delay = 0;
	Datum		args[5];

	if (unhandled)
	{
		int64		age = (now - msg->received_at) / 1000;

		/*
		 * Dead only if the look before found no handler either: a message
		 * older than the wait (the inbox stopped for a while, a handler
		 * registered again in a transaction of its own) is not
		 * dead-lettered by the first look that misses its handler.
		 */
		dead = age >= INBOX_UNHANDLED_WAIT_MS && msg->last_error != NULL &&
			strcmp(msg->last_error, error) == 0;
		delay = OutboxEqualJitterMs(Min(Max(age, INBOX_UNHANDLED_MIN_MS),
										INBOX_UNHANDLED_MAX_MS),
									pg_prng_double(&inbox_prng));
	}
	else
	{
		dead = msg->attempts >= msg->max_attempts;
		if (!dead)
			delay = OutboxBackoffDelayMs(msg->attempts, msg->backoff_base_ms,
										 msg->backoff_max_ms,
										 pg_prng_double(&inbox_prng));
	}
	if (dead)
		delay = 0;
	args[0] = CStringGetTextDatum(msg->id);
	args[1] = BoolGetDatum(dead);
	args[2] = TimestampTzGetDatum(TimestampTzPlusMilliseconds(now, delay));
	args[3] = CStringGetTextDatum(error);
	args[4] = Int32GetDatum(msg->unrun ? 1 : 0);
	if (SPI_execute_plan(failed_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not record an inbox handler failure");
	/*
	 * The id is the sender's and the error often quotes the payload (a
	 * handler's cast of one of its values): both are made safe to log as
	 * a peer's text is (peertext.c), so a carriage return or an escape
	 * sequence in them cannot rewrite the log line on a terminal.
	 */
	if (dead && unhandled)
		ereport(LOG,
				(errmsg("outbox_pg inbox message \"%s\" is dead: no handler matched its type for an hour",
						inbox_log_text(msg->id)),
				 errdetail_internal("%s", inbox_log_text(error)),
				 errhint("Register a handler with inbox.register_handler(), then call inbox.redrive(); or call inbox.purge().")));
	else if (dead)
		ereport(LOG,
				(errmsg("outbox_pg inbox message \"%s\" is dead after %d attempts",
						inbox_log_text(msg->id), msg->attempts - (msg->unrun ? 1 : 0)),
				 errdetail_internal("%s", inbox_log_text(error)),
				 errhint("Fix the handler, then call inbox.redrive() or inbox.purge().")));
	return dead;
}

/*
 * The inbox's own statements are planned without sequential scans, in a
 * GUC nest level the caller opens and closes around them (never around a
 * handler: those plan as the relay does).  The relay keeps each plan for a
 * minute (step.c); one made while the table was nearly empty, after a
 * TRUNCATE or on a new install, was a sequential scan, and a burst that
 * filled the table within that minute made every fetch and processed mark
 * read the whole table (the inbox bench's receive-while-processing run:
 * 660-890 messages/s, against the 3,000-5,000 its clients received).
 */
static void
inbox_plan_with_indexes(void)
{
	(void) set_config_option("enable_seqscan", "off",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
}

/*
 * Step 1: lease up to INBOX_BATCH due messages, in a transaction of its
 * own.  Their ids and attempt counts are returned in inbox_context.
 */
static int
inbox_lease(Datum **ids, Datum **attempts)
{
	Datum		args[2];
	Interval   *lease;
	int			nleased;
	int			save_nestlevel;

	inbox_doing = "leasing inbox messages";
	if (!WorkerStepBegin(&inbox_step, relay_slot, NULL))
		return 0;

	/*
	 * A probe of the pending index first: inbox._lease() is an SQL
	 * function, parsed and planned at every call, and most looks (one per
	 * poll and worker) find nothing.
	 */
	save_nestlevel = NewGUCNestLevel();
	inbox_plan_with_indexes();
	if (SPI_execute_plan(due_plan, NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look for due inbox messages");
	AtEOXact_GUC(true, save_nestlevel);
	if (SPI_processed == 0)
	{
		WorkerStepCommit();
		return 0;
	}
	lease = palloc0(sizeof(Interval));
	lease->time = (int64) outbox_lease_margin * 1000;
	args[0] = Int32GetDatum(INBOX_BATCH);
	args[1] = IntervalPGetDatum(lease);
	if (SPI_execute_plan(lease_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not lease inbox messages");
	nleased = (int) SPI_processed;
	MemoryContextSwitchTo(inbox_context);
	*ids = palloc(Max(nleased, 1) * sizeof(Datum));
	*attempts = palloc(Max(nleased, 1) * sizeof(Datum));
	for (int i = 0; i < nleased; i++)
	{
		bool		isnull;
		HeapTuple	tup = SPI_tuptable->vals[i];

		(*ids)[i] = datumCopy(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull),
							  false, -1);
		(*attempts)[i] = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
	}
	WorkerStepCommit();

	/*
	 * The counted attempts reach the disk before any handler runs.  The
	 * relay commits asynchronously, and the WAL writer writes such a commit
	 * out within wal_writer_delay: a handler that crashed the server sooner
	 * took its lease with it, the message looked new after the restart, and
	 * the server crash-looped for ever (test/t/004).  One flush per batch.
	 */
	if (nleased > 0)
		XLogFlush(XactLastCommitEnd);
	return nleased;
}

/*
 * Step 2, first part: lock the leased messages that are still ours and
 * read them, with their handler, into inbox_context.
 */
static InboxMessage *
inbox_fetch(Datum *ids, Datum *attempts, int nleased, int *nmsgs)
{
	Datum		args[2];
	InboxMessage *msgs;
	int			save_nestlevel;

	args[0] = PointerGetDatum(construct_array(ids, nleased, TEXTOID, -1, false,
											  TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_array(attempts, nleased, INT4OID, 4, true,
											  TYPALIGN_INT));

	/*
	 * The wait for a row lock (see the top of the file) is bounded: a
	 * session that locked one of these rows after the lease committed (an
	 * operator's UPDATE of pending messages left open) would otherwise hold
	 * this worker, and its outbox delivery with it, until that session
	 * ends.  After INBOX_FETCH_LOCK_TIMEOUT the cycle fails (logged) and
	 * the messages are processed when their lease runs out.  For this
	 * statement only: the handlers run with the server's lock_timeout.
	 */
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("lock_timeout", INBOX_FETCH_LOCK_TIMEOUT,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	inbox_plan_with_indexes();
	if (SPI_execute_plan(fetch_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read leased inbox messages");
	AtEOXact_GUC(true, save_nestlevel);
	*nmsgs = (int) SPI_processed;
	MemoryContextSwitchTo(inbox_context);
	msgs = palloc0(Max(*nmsgs, 1) * sizeof(InboxMessage));
	for (int i = 0; i < *nmsgs; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;

		msgs[i].row = datumCopy(SPI_getbinval(tup, desc, 1, &isnull), false, -1);
		msgs[i].id = TextDatumGetCString(SPI_getbinval(tup, desc, 2, &isnull));
		msgs[i].type = TextDatumGetCString(SPI_getbinval(tup, desc, 3, &isnull));
		msgs[i].attempts = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
		msgs[i].has_aggregate = DatumGetBool(SPI_getbinval(tup, desc, 9, &isnull));
		msgs[i].received_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 10, &isnull));
		d = SPI_getbinval(tup, desc, 11, &isnull);
		msgs[i].last_error = isnull ? NULL : TextDatumGetCString(d);
		msgs[i].finished_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 12, &isnull));
		d = SPI_getbinval(tup, desc, 5, &isnull);
		msgs[i].handler = isnull ? InvalidOid : DatumGetObjectId(d);
		if (!isnull)
		{
			msgs[i].max_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
			msgs[i].backoff_base_ms = DatumGetInt32(SPI_getbinval(tup, desc, 7, &isnull));
			msgs[i].backoff_max_ms = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
		}
	}
	SPI_freetuptable(SPI_tuptable);
	return msgs;
}

/*
 * Step 2, second part: run the messages through their handlers; record the
 * failures and mark the successes processed.
 */
static void
inbox_run_batch(InboxMessage *msgs, int nmsgs)
{
	InboxRun	run = {0};
	Datum	   *done;
	Datum	   *gone;
	int			ndone = 0;
	int			ngone = 0;
	int			save_nestlevel;
	Datum		args[1];

	run.msgs = msgs;
	run.messages_type = get_rel_type_id(get_relname_relid(INBOX_MESSAGES_TABLE,
														  get_namespace_oid(INBOX_SCHEMA, false)));
	run.msgcxt = AllocSetContextCreate(inbox_context, "outbox_pg inbox message",
									   ALLOCSET_DEFAULT_SIZES);
	for (int i = 0; i < nmsgs; i++)
	{
		if (!OidIsValid(msgs[i].handler))
		{
			msgs[i].error = psprintf("no inbox handler matches message type \"%s\"",
									 msgs[i].type);
			msgs[i].unrun = true;	/* see inbox_record_failure */
		}

		/*
		 * Leased more often than its handler allows: an attempt ended
		 * without a result (the worker died in the handler, or the batch's
		 * transaction failed).  The lease counts the attempt so that such a
		 * message runs out of attempts, and this is where it does: it is
		 * dead-lettered without running its handler again.  Only an
		 * ordinary error used to dead-letter, and a handler that killed the
		 * worker ran again after every lease, for ever.
		 */
		else if (msgs[i].attempts > msgs[i].max_attempts &&
				 msgs[i].finished_attempts < msgs[i].attempts - 1)
			msgs[i].error = psprintf("attempt %d of %d ended without a result: the worker stopped, or its transaction failed, while the message was being processed",
									 msgs[i].attempts - 1, msgs[i].max_attempts);

		/*
		 * Its attempts so far ended with results, and its handler allows
		 * fewer now (registered again with a lower max_attempts).
		 */
		else if (msgs[i].attempts > msgs[i].max_attempts)
		{
			msgs[i].error = psprintf("no attempt left: the message has had %d, and its handler allows %d",
									 msgs[i].attempts - 1, msgs[i].max_attempts);
			msgs[i].unrun = true;
		}
	}
	inbox_run_range(&run, 0, nmsgs);

	done = palloc(Max(nmsgs, 1) * sizeof(Datum));
	gone = palloc(Max(nmsgs, 1) * sizeof(Datum));
	save_nestlevel = NewGUCNestLevel();
	inbox_plan_with_indexes();
	for (int i = 0; i < nmsgs; i++)
	{
		bool		settled;

		if (msgs[i].error == NULL)
		{
			done[ndone++] = CStringGetTextDatum(msgs[i].id);
			settled = true;
		}
		else
			settled = inbox_record_failure(&msgs[i], msgs[i].error);
		/* only a message of an aggregate can have one waiting behind it */
		if (settled && msgs[i].has_aggregate)
			gone[ngone++] = CStringGetTextDatum(msgs[i].id);
	}
	if (ndone > 0)
	{
		args[0] = PointerGetDatum(construct_array(done, ndone, TEXTOID, -1, false,
												  TYPALIGN_INT));
		if (SPI_execute_plan(processed_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not mark inbox messages processed");
	}
	if (ngone > 0)
	{
		args[0] = PointerGetDatum(construct_array(gone, ngone, TEXTOID, -1, false,
												  TYPALIGN_INT));
		if (SPI_execute_plan(release_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not release inbox messages set aside");
	}
	AtEOXact_GUC(true, save_nestlevel);
}

/*
 * Lease and process one batch.  Returns true when it leased anything: more
 * may be due, either because the batch was full or because a message it
 * processed was what the next message of an ordered aggregate waited for.
 * Before, a partial batch waited for the next wake-up or poll, and an
 * ordered aggregate went one message per poll (201 messages of one
 * aggregate took 46 s).  The look that finds nothing costs one probe of
 * the pending index (inbox_lease), and then rests INBOX_IDLE_RECHECK_MS.
 */
static bool
inbox_process(int *nleased_out)
{
	Datum	   *ids;
	Datum	   *attempts;
	int			nleased;
	int			nmsgs;
	InboxMessage *msgs;

	nleased = inbox_lease(&ids, &attempts);
	*nleased_out = nleased;
	if (nleased == 0)
		return false;

	inbox_doing = "processing inbox messages";
	pgstat_report_activity(STATE_RUNNING, inbox_doing);
	if (!WorkerStepBegin(&inbox_step, relay_slot, NULL))
		return false;			/* being dropped: the leases run out by themselves */

	/*
	 * The handlers' writes wait for the local WAL flush, unless the server
	 * has synchronous_commit off (its reset value, relay.c), not as the
	 * relay's own bookkeeping commits (off): committed without the flush, a
	 * handler's writes and its outbox.emit() were visible, and that event
	 * delivered, before a crash could take them back, and the message
	 * processed again emitted it again under a new id.  Not a standby's
	 * confirmation (local, not on): the wait would hold the relay's
	 * deliveries of every destination while a synchronous standby is away,
	 * and a SIGTERM that waits for a broker client does not end it; a
	 * failover that loses the batch has it processed again, as a crash
	 * before the commit does.  Until the end of this transaction.
	 */
	(void) set_config_option("synchronous_commit",
							 strcmp(GetConfigOptionResetString("synchronous_commit"),
									"off") == 0 ? "off" : "local",
							 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
							 true, 0, false);
	msgs = inbox_fetch(ids, attempts, nleased, &nmsgs);
	inbox_run_batch(msgs, nmsgs);
	WorkerStepCommit();
	return true;
}

/* What inbox_retention() deletes, each in a subtransaction of its own. */
typedef struct InboxExpire
{
	Interval   *keep;
	uint64		messages;		/* deleted */
	uint64		claims;
} InboxExpire;

static void
inbox_expire_messages(void *arg)
{
	InboxExpire *expire = arg;
	Datum		args[2];

	args[0] = IntervalPGetDatum(expire->keep);
	args[1] = Int32GetDatum(INBOX_RETENTION_BATCH);
	if (SPI_execute_plan(expire_messages_plan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not delete processed inbox messages");
	expire->messages = SPI_processed;
}

static void
inbox_expire_claims(void *arg)
{
	InboxExpire *expire = arg;
	Datum		args[1];

	args[0] = Int32GetDatum(INBOX_RETENTION_BATCH);
	if (SPI_execute_plan(expire_claims_plan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not delete expired inbox claims");
	expire->claims = SPI_processed;
}

static WorkerErrorThrottle expire_messages_errors;
static WorkerErrorThrottle expire_claims_errors;

/*
 * Delete old processed messages and expired claims, one bounded batch per
 * table.  Returns true when a batch was full (more to delete).
 */
static bool
inbox_retention(void)
{
	int			keep_secs = outbox_inbox_retention;
	Interval   *keep;
	InboxExpire expire = {NULL, 0, 0};
	ErrorData  *edata;

	if (keep_secs < outbox_redelivery_window)
	{
		/* LOG outranks WARNING in the server log (log_min_messages) */
		if (warned_retention != outbox_inbox_retention)
			ereport(LOG,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox.inbox_retention (%d s) is shorter than outbox.redelivery_window (%d s); processed inbox messages are kept for %d s",
							outbox_inbox_retention, outbox_redelivery_window,
							outbox_redelivery_window),
					 errdetail("A processed message is what recognises a redelivery of its id as a duplicate; deleting it earlier would let a late redelivery be processed twice."),
					 errhint("Raise outbox.inbox_retention, or lower outbox.redelivery_window if no broker can redeliver that late.")));
		warned_retention = outbox_inbox_retention;
		keep_secs = outbox_redelivery_window;
	}
	else
		warned_retention = -1;

	inbox_doing = "expiring inbox messages and claims";
	if (!WorkerStepBegin(&inbox_step, relay_slot, NULL))
		return false;
	pgstat_report_activity(STATE_RUNNING, inbox_doing);
	keep = palloc0(sizeof(Interval));
	keep->time = (int64) keep_secs * USECS_PER_SEC;
	expire.keep = keep;
	if (!WorkerRunInSubtransaction(inbox_expire_messages, &expire, &edata))
		WorkerReportJobError(&expire_messages_errors, edata,
							 "outbox_pg deletion of processed inbox messages",
							 "Inbox processing continues; the deletion is tried again in "
							 CppAsString2(INBOX_RETENTION_INTERVAL_MS) " ms.");
	if (!WorkerRunInSubtransaction(inbox_expire_claims, &expire, &edata))
		WorkerReportJobError(&expire_claims_errors, edata,
							 "outbox_pg deletion of expired inbox claims",
							 "Inbox processing continues; the deletion is tried again in "
							 CppAsString2(INBOX_RETENTION_INTERVAL_MS) " ms.");
	WorkerStepCommit();
	if (expire.messages > 0 || expire.claims > 0)
		elog(DEBUG1, "outbox_pg inbox retention deleted " UINT64_FORMAT " messages and " UINT64_FORMAT " claims",
			 expire.messages, expire.claims);
	return expire.messages >= INBOX_RETENTION_BATCH || expire.claims >= INBOX_RETENTION_BATCH;
}

/*
 * One inbox cycle of a relay worker: a batch of messages, then (worker 0)
 * retention when it is due.  Called with no transaction open.  Returns
 * true when the caller should call again within *wait_ms (0: more work is
 * waiting), false when there is nothing to do until the next wake-up or
 * poll.
 */
bool
InboxWorkerCycle(bool run_retention, long *wait_ms)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	volatile bool more = false;
	TimestampTz now = GetCurrentTimestamp();

	*wait_ms = 0;
	if (last_empty_at != 0 &&
		!OutboxTimePassed(last_empty_at, now, INBOX_IDLE_RECHECK_MS))
	{
		*wait_ms = Max(1, INBOX_IDLE_RECHECK_MS -
					   (long) ((now - last_empty_at) / 1000));
		return true;
	}

	if (inbox_context == NULL)
	{
		inbox_context = AllocSetContextCreate(TopMemoryContext,
											  "outbox_pg inbox cycle",
											  ALLOCSET_DEFAULT_SIZES);
		pg_prng_seed(&inbox_prng, (uint64) MyProcPid ^ (uint64) GetCurrentTimestamp());
	}

	PG_TRY();
	{
		int			nleased = 0;

		MemoryContextSwitchTo(inbox_context);
		more = inbox_process(&nleased);
		now = GetCurrentTimestamp();
		last_empty_at = (nleased == 0) ? now : 0;
		if (run_retention &&
			(retention_behind ||
			 OutboxTimePassed(last_retention_at, now,
							  INBOX_RETENTION_INTERVAL_MS)))
		{
			last_retention_at = now;
			retention_behind = inbox_retention();
			more = more || retention_behind;
		}
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		WorkerReportCycleError(&inbox_errors, NULL,
							   "Leased inbox messages are processed again when their lease runs out.",
							   "while %s", inbox_doing);
		more = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(inbox_context);
	return more;
}
