/*-------------------------------------------------------------------------
 *
 * relay.c
 *		  The relay worker: lease due events, deliver them, record results.
 *
 * This file is the process (start-up, main loop, transactions, errors);
 * delivery.c leases, builds, sends and records the events.
 *
 * Protocol (at-least-once):
 *
 *	1. Lease, in a short transaction: outbox._lease() picks due pending
 *	   rows of one destination with FOR UPDATE SKIP LOCKED (only the head
 *	   of each aggregate on an ordered destination, see ordering.c), counts
 *	   the attempt and sets leased_until to the end of the lease, then the
 *	   transaction commits.  Other workers skip the rows while the
 *	   transaction runs and ignore them afterwards because they are no
 *	   longer due.  No transaction stays open while HTTP runs.
 *	2. Send, with no transaction open: every leased event becomes a request
 *	   on the curl multi handle (http.c); requests run concurrently and the
 *	   loop keeps leasing for destinations with free capacity, so a slow
 *	   destination never holds up a healthy one.
 *	3. Record, in a short transaction per group of completions:
 *	   acknowledged rows become published; failed rows get their next
 *	   attempt time or go to the dead letters, but only while the row is
 *	   still under the lease that sent it (store.c): a worker that stalled
 *	   past its lease cannot fail a row another worker has taken over.
 *
 * A worker that dies anywhere after step 1 leaves its rows leased; when
 * the lease runs out they are due again and another worker (or this one,
 * restarted) sends them again, with the same message id.  Rows are never
 * marked published before the destination acknowledged them.
 *
 * Each lease counts as an attempt, so a message that kills the worker
 * every time still runs out of attempts instead of crash-looping it.
 *
 * Per destination the worker holds slots of the destination's concurrency
 * (max_concurrency counts the events in flight to it across every relay
 * of the database) and asks the destination's circuit breaker before it
 * leases: both are shared by all relays of the database and live in
 * shared memory (deststats.c has the protocol).  After
 * options.circuit_threshold (default 5; 0 disables it) failed rounds in a
 * row no relay leases events of the destination for a pause (1 s,
 * doubling up to outbox.circuit_max_pause); then one relay sends a single
 * probe; any success closes the circuit and wakes the other relays.  A
 * failure recorded while the circuit is open is the destination's, not
 * the event's: the event gets its attempt back and is due at once, so it
 * neither backs off nor runs out of attempts during an outage (max_age
 * still applies).
 *
 * The loop: OutboxRelayMain() starts the process, then runs the steps
 * below in turn, each a function of its own: see what is due, start what
 * waits for the slots the last answers freed and what earlier leases left
 * unstarted (about RELAY_START_PER_TURN requests a step), record the results
 * that completed, lease and start more events (with worker 0's
 * housekeeping, housekeeping.c, in the same transaction), run an inbox
 * batch (inbox_process.c), then wait on curl's sockets and the latch.
 * Each transaction is a worker step (step.c).
 *
 * Memory: the loop runs in relay_cycle_context, reset at the end of every
 * iteration, so a step allocates freely.  Each event lives in its own
 * small memory context, deleted after its result is recorded; the lists
 * of events that outlive an iteration live in relay_events_context
 * (delivery.c).  Errors inside a cycle are caught, logged the way
 * autovacuum logs them (WorkerReportCycleError), shown in the worker's
 * slot, and followed by a pause; they never restart the worker.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/relay.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "deststats.h"
#include "worker/worker.h"
#include "worker/relay.h"
#include "destination/http.h"
#include "util.h"

#define ERROR_PAUSE_MS			1000
#define RECORD_BATCH			128
#define RECORD_DELAY_MS			10
#define RELAY_START_PER_TURN	32	/* HTTP requests per relay_start_leased() */

/* What the loop carries from one iteration to the next. */
typedef struct RelayLoop
{
	TimestampTz now;			/* when this iteration began */
	bool		need_lease;		/* lease before waiting */
	bool		need_inbox;		/* inbox work may be due (inbox_process.c) */
	long		inbox_wait_ms;	/* set by every InboxWorkerCycle() */
	uint64		inbox_wake_generation;	/* the slot's wake generation the
										 * inbox last looked for */
	TimestampTz last_poll;		/* last lease that drained every destination */
	TimestampTz first_done_at;	/* when the oldest of pending_done completed */
	TimestampTz record_again_at;	/* tables locked: record then; 0: at once */
	int			record_backoff_ms;	/* ... after this long (doubling) */
	List	   *pending_done;	/* completed, not recorded yet */
	List	   *answered;		/* for slots answers freed, not started yet */
	List	   *leased;			/* leased, not started yet */
} RelayLoop;

static RelayLoop loop;

static WorkerErrorThrottle relay_errors;
static const char *relay_activity = "starting";	/* for an error's context */
static bool relay_announced = false;	/* "started" is logged */
/* SIGTERM with events in a native client's hands: flush them first */
static volatile sig_atomic_t relay_stop_requested = false;
static volatile TimestampTz relay_stop_requested_at = 0;

/*
 * The postmaster sends every SIGTERM twice, to the process and to its
 * process group, back to back: a second one within this long of the first
 * is that copy, not a request to exit at once.
 */
#define SIGTERM_COPY_MS			1000

/* start-up and exit */
static void relay_start(int slot_index);
static void relay_sigterm(SIGNAL_ARGS);
static void relay_on_exit(int code, Datum arg);

/* the loop's steps, in the order they run */
static void relay_flush_step(void);
static void relay_due_step(void);
static void relay_start_step(void);
static void relay_start_leased(void);
static void relay_record_step(void);
static void relay_lease_step(void);
static void relay_housekeeping_step(void);
static void relay_cycle_failed(void);
static void relay_inbox_step(void);
static void relay_wait_step(void);

/* what the steps share */
static bool relay_slot_is_ours(Oid dboid);
static long relay_wait_time(void);
static void relay_set_state(RelayState state, const char *activity);
static void relay_announce(void);
static void relay_exit_no_extension(void);
static void relay_free_events(List **events);
static bool relay_collect(HttpRequest *done);

void
OutboxRelayMain(Datum main_arg)
{
	relay_start(DatumGetInt32(main_arg));

	/*
	 * "started" is logged once the relay has seen the extension (the first
	 * lease): in a database without it the relay only starts, looks and
	 * exits, every discovery interval, and logs that once.
	 */
	for (;;)
	{
		relay_due_step();
		PG_TRY();
		{
			relay_start_step();
			relay_record_step();
			relay_lease_step();
		}
		PG_CATCH();
		{
			relay_cycle_failed();
		}
		PG_END_TRY();
		relay_inbox_step();
		relay_wait_step();
		MemoryContextReset(relay_cycle_context);
	}
}

/*
 * Connect to the slot's database, claim the slot and set the relay up.
 * Returns in relay_cycle_context, where the loop runs.
 */
static void
relay_start(int slot_index)
{
	Oid			dboid;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, relay_sigterm);
	BackgroundWorkerUnblockSignals();

	if (slot_index < 0 || slot_index >= OUTBOX_MAX_RELAYS)
		elog(ERROR, "invalid relay slot %d", slot_index);
	relay_slot = &outbox_shared->slots[slot_index];

	/*
	 * The database the launcher started this relay for.  The slot is the
	 * launcher's until the relay claims it below: it may have been freed
	 * (outbox.databases changed) or given to another database since; then
	 * the relay leaves without touching it.  (Connecting to the slot's
	 * database of the moment once met a freed slot: no database at all,
	 * and a crash.)
	 */
	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	if (!relay_slot_is_ours(dboid))
		proc_exit(0);

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);

	/*
	 * Claim the slot, unless the launcher has given it to another database
	 * or relay meanwhile, or a statement that needs the database without
	 * sessions holds it (api/database_ddl.c): started just before the
	 * hold, leave at once.
	 */
	if (relay_slot->dboid != dboid || relay_slot->pid != 0)
	{
		/* not ours any more: leave it as it is */
		LWLockRelease(outbox_shared->lock);
		proc_exit(0);
	}
	if (relay_slot->held_until > GetCurrentTimestamp())
	{
		/* stopped for the statement, as those it signalled */
		relay_slot->stopped_for_ddl = true;
		relay_slot->state = RELAY_STOPPED;
		LWLockRelease(outbox_shared->lock);
		proc_exit(0);
	}
	relay_slot->pid = MyProcPid;
	relay_slot->procno = MyProcNumber;
	relay_slot->started_at = GetCurrentTimestamp();
	relay_slot->state = RELAY_STARTING;
	relay_slot->in_flight = 0;
	relay_slot->last_error[0] = '\0';
	pg_atomic_write_u64(&relay_slot->sweep_due_at, 0);
	LWLockRelease(outbox_shared->lock);
	before_shmem_exit(relay_on_exit, (Datum) 0);

	pgstat_report_appname("outbox_pg relay");
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("application_name", "outbox_pg relay", PGC_USERSET, PGC_S_OVERRIDE);

	/*
	 * The relay's own commits need not wait for the WAL flush: a lease lost
	 * in a crash leaves its rows due (sent again), and a lost result means
	 * the event is sent again after its lease.  Either way at-least-once
	 * holds, and each cycle saves a disk flush.  Inbox handlers' writes
	 * are not the relay's: their transactions wait for the local flush
	 * unless the server has off (inbox_process.c).  Set as a session's SET
	 * is, so that its reset value stays the server's (the file's, after a
	 * reload; the database's or role's).
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION);

	/*
	 * The lease relies on READ COMMITTED (FOR UPDATE SKIP LOCKED with a
	 * recheck of the row): never take a database's or role's default.
	 */
	SetConfigOption("default_transaction_isolation", "read committed",
					PGC_SUSET, PGC_S_OVERRIDE);
	/* generic plans, made again every minute (WorkerKeepPlan) */
	SetConfigOption("plan_cache_mode", "force_generic_plan", PGC_USERSET,
					PGC_S_OVERRIDE);

	/*
	 * No JIT: every statement of the relay is short, and the log's slots
	 * are not analyzed (autovacuum is off on them), so their estimates
	 * follow their size on disk.  With a slot of some 100,000
	 * rows those estimates passed jit_above_cost and every claim, sweep and
	 * trim spent seconds compiling: delivery fell from 2,000 to under 100
	 * events/s (test/bench/snapshot).
	 */
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	StartTransactionCommand();
	relay_database_name = MemoryContextStrdup(TopMemoryContext,
											  get_database_name(MyDatabaseId));
	CommitTransactionCommand();

	relay_http = HttpClientCreate();

	DeliveryInit();
	relay_cycle_context = AllocSetContextCreate(TopMemoryContext,
												"outbox_pg relay cycle",
												ALLOCSET_DEFAULT_SIZES);
	loop.need_lease = true;
	loop.need_inbox = true;
	MemoryContextSwitchTo(relay_cycle_context);
}

/* Is the slot still the launcher's for this relay (not taken, same database)? */
static bool
relay_slot_is_ours(Oid dboid)
{
	bool		ours;

	LWLockAcquire(outbox_shared->lock, LW_SHARED);
	ours = OidIsValid(dboid) && relay_slot->dboid == dboid &&
		relay_slot->pid == 0;
	LWLockRelease(outbox_shared->lock);
	return ours;
}

/*
 * SIGTERM: die() at once, as every worker does, unless events are in a
 * native broker client's hands; then the loop flushes them first
 * (relay_flush_step).  The postmaster's copy of that SIGTERM is ignored:
 * taken for a second request, its die() made the next
 * CHECK_FOR_INTERRUPTS() of the step under way exit before the flush
 * began.  A SIGTERM that comes later is one (pg_terminate_backend() again)
 * and dies, though once the flush holds interrupts it waits for its end.
 * GetCurrentTimestamp() reads the clock, as timeout.c's handler does.
 */
static void
relay_sigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	if (relay_stop_requested &&
		!OutboxTimePassed(relay_stop_requested_at, GetCurrentTimestamp(),
						  SIGTERM_COPY_MS))
		SetLatch(MyLatch);
	else if (DeliveryNativeOutstanding() > 0 && !relay_stop_requested)
	{
		relay_stop_requested_at = GetCurrentTimestamp();
		relay_stop_requested = true;
		SetLatch(MyLatch);
	}
	else
		die(postgres_signal_arg);
	errno = save_errno;
}

static void
relay_on_exit(int code, Datum arg)
{
	if (relay_slot == NULL)
		return;
	OutboxDestStatsRelayExit(RELAY_SLOT_INDEX);	/* ops */
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	relay_slot->pid = 0;
	relay_slot->procno = -1;
	relay_slot->in_flight = 0;
	if (relay_slot->state != RELAY_NO_EXTENSION)
		relay_slot->state = RELAY_STOPPED;
	LWLockRelease(outbox_shared->lock);
}

/*
 * SIGTERM with events handed to a native broker client (destination.h,
 * relay_sigterm): before the relay exits, nothing more is started, and it
 * waits for their completions and records them, until every one
 * completed or the earliest of their leases ends (after which another
 * relay may send them again anyway).  Interrupts are held meanwhile, so
 * the wait is bounded by the lease, never by the broker; what is
 * unconfirmed then is sent again after its lease, and so is what a
 * statement on the database (api/database_ddl.c) cuts the wait short
 * for.  HTTP requests are not waited for (they are sent again too), but those that
 * complete meanwhile are recorded.  Then the relay dies the way die() has it.
 */
static void
relay_flush_step(void)
{
	TimestampTz deadline;
	TimestampTz started;

	if (!relay_stop_requested)
		return;
	started = GetCurrentTimestamp();
	HOLD_INTERRUPTS();
	deadline = DeliveryStop();
	relay_set_state(RELAY_WORKING, "flushing a broker client before exiting");
	if (DeliveryNativeOutstanding() > 0)
		ereport(LOG,
				(errmsg("outbox_pg relay waits for %d events a broker has not confirmed yet before exiting",
						DeliveryNativeOutstanding()),
				 errdetail("It waits until their leases end at the latest.")));
	while (DeliveryNativeOutstanding() > 0)
	{
		TimestampTz now = GetCurrentTimestamp();
		long		wait_ms;
		bool		woken;

		/*
		 * A statement that needs the database without sessions ends it
		 * (api/database_ddl.c marks the slot before its SIGTERM).  Not a
		 * second SIGTERM: the postmaster sends every SIGTERM twice, to the
		 * process and to its process group.
		 */
		/* before it started: the clock went back, the deadline means nothing */
		if (now >= deadline || now < started || relay_slot->stopped_for_ddl)
			break;
		wait_ms = Min(100, (long) ((deadline - now + 999) / 1000));
		DeliveryWatchNative();
		(void) relay_collect(HttpClientWait(relay_http, wait_ms, &woken));
	}
	if (DeliveryNativeOutstanding() > 0)
		ereport(LOG,
				(errmsg("outbox_pg relay exits with %d events unconfirmed by their broker",
						DeliveryNativeOutstanding()),
				 errdetail("They are sent again when their lease runs out.")));
	if (loop.pending_done != NIL)
	{
		relay_set_state(RELAY_WORKING, "recording results");
		(void) DeliveryRecord(loop.pending_done);	/* locked: sent again */
		relay_free_events(&loop.pending_done);
	}
	RESUME_INTERRUPTS();
	/* the CHECK_FOR_INTERRUPTS() that follows exits */
	die(SIGTERM);
}

/*
 * Interrupts and reloads; then what is due: a lease and an inbox batch at
 * every poll, a lease when a circuit's pause ends.
 */
static void
relay_due_step(void)
{
	relay_flush_step();
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		DeliveryForgetConfig();	/* loaded under the old settings */
	}

	loop.now = GetCurrentTimestamp();
	WorkerRefreshPlans(loop.now);
	if (OutboxTimePassed(loop.last_poll, loop.now, outbox_poll_interval))
		loop.need_lease = loop.need_inbox = true;
	if (relay_lease_again_at != 0 && loop.now >= relay_lease_again_at)
		loop.need_lease = true;
}

/*
 * Start requests before this iteration records results and claims: what
 * waits for the slots the last wait's answers freed (DeliveryStartAnswered,
 * in loop.answered), then what earlier lease steps left in loop.leased.
 */
static void
relay_start_step(void)
{
	bool		missing;

	if (DeliveryStartable())
	{
		relay_set_state(RELAY_WORKING, "sending");
		if (relay_begin(&missing))
		{
			DeliveryStartAnswered(&loop.answered);
			relay_commit();
		}
		else
		{
			DeliveryStartAnswered(NULL);	/* the lease step pumps them */
			if (missing)
				relay_exit_no_extension();
		}
	}
	relay_start_leased();
}

/*
 * Start the events of a list in order, until limit HTTP requests are
 * started and the next event would be another; returns how many were.
 * The events a started request carries (which follow it), and those that
 * make no request, leave the list with it: once its answer is recorded
 * they are freed.  Each event leaves the list as it is started, so an
 * error here never frees a request curl still uses.  An event that waited
 * too long for its lease (DeliveryStartOverdue) starts beyond the limit:
 * the list is in the order its events were pumped, so those are first.
 */
static int
relay_start_from(List **events, int limit)
{
	int			http = 0;
	TimestampTz now = GetCurrentTimestamp();

	while (*events != NIL)
	{
		RelayEvent *ev = linitial(*events);
		bool		sends = DeliveryWouldSend(ev);

		if (http >= limit && sends && !DeliveryStartOverdue(ev, now))
			break;
		*events = list_delete_first(*events);
		DeliveryStart(ev);
		if (sends)
			http++;
	}
	return http;
}

/*
 * Start leased events: about RELAY_START_PER_TURN HTTP requests a call
 * (the start step calls it, and the lease step again when it leased),
 * those for the slots answers freed first, and at least a quarter of that
 * of what lease steps left, so that those are never held back for long;
 * a native client takes what it is given at once.  curl sends them now
 * rather than at the next wait.  What is left starts at the next
 * iterations, each after a wait that takes the answers that came
 * meanwhile, and no lease step claims more before loop.leased is empty:
 * 100 requests started at once, and their 100 answers taken 200 ms later,
 * kept the loop busy for milliseconds, and a neighbour's answer that came
 * meanwhile waited for all of them (issue #20).  (The record step starts
 * what the results it records unblock, an ordered aggregate's next
 * events, itself.)
 */
static void
relay_start_leased(void)
{
	int			http;

	http = relay_start_from(&loop.answered, RELAY_START_PER_TURN);
	http += relay_start_from(&loop.leased,
							 Max(RELAY_START_PER_TURN - http,
								 RELAY_START_PER_TURN / 4));
	if (http > 0)
		HttpClientKick(relay_http);
}

/*
 * Record what completed: at once when nothing else is running, else in
 * groups (RECORD_BATCH results, or RECORD_DELAY_MS after the first), so
 * that one transaction records many results.
 */
static void
relay_record_step(void)
{
	if (loop.pending_done == NIL)
		return;
	if ((HttpClientRunning(relay_http) != 0 || DeliveryNativeOutstanding() > 0) &&
		list_length(loop.pending_done) < RECORD_BATCH &&
		!OutboxTimePassed(loop.first_done_at, GetCurrentTimestamp(),
						  RECORD_DELAY_MS))
		return;

	if (loop.record_again_at != 0 &&
		!OutboxDeadlineReached(loop.record_again_at, loop.record_backoff_ms,
							   GetCurrentTimestamp()))
		return;

	relay_set_state(RELAY_WORKING, "recording results");
	if (DeliveryRecord(loop.pending_done))
	{
		relay_free_events(&loop.pending_done);
		loop.record_again_at = 0;
		loop.record_backoff_ms = 0;
		/* slots and ordered batches freed: lease (collecting results did not) */
		loop.need_lease = true;
		return;
	}

	/*
	 * The tables are locked (VACUUM FULL, LOCK TABLE): the results wait,
	 * tried again after RECORD_DELAY_MS, doubling up to a poll interval.
	 */
	loop.record_backoff_ms = Min(Max(loop.record_backoff_ms * 2, RECORD_DELAY_MS),
								 outbox_poll_interval);
	loop.record_again_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   loop.record_backoff_ms);
}

/*
 * Lease due events of the destinations with free capacity, in one
 * transaction, then start their requests once it has committed (the
 * first of them: relay_start_leased).
 */
static void
relay_lease_step(void)
{
	bool		begun;
	bool		missing;
	bool		drained = true;
	bool		claimed = false;

	/* not while what the last one leased waits to start (relay_start_leased) */
	if (!loop.need_lease || DeliveryInFlight() >= outbox_batch_size ||
		loop.leased != NIL)
		return;
	/* stopping: nothing more that could keep the flush waiting */
	if (relay_stop_requested)
		return;

	relay_set_state(RELAY_WORKING, "leasing events");
	relay_lease_again_at = 0;	/* DeliveryLease() sets it again */
	DeliveryCheckConfig();		/* before the transaction's snapshot */
	begun = relay_begin(&missing);
	if (!missing && !relay_announced)
		relay_announce();
	if (begun)
	{
		List	   *dests = DeliveryLoadDestinations();

		relay_housekeeping_step();

		/*
		 * In the cycle's memory: what outlives the iteration (the events,
		 * the list of those to start) is put in relay_events_context by
		 * delivery.c itself.  (Run in relay_events_context, the pass left
		 * a few bytes there for every claim, for good: some 9 bytes per
		 * event at one event a commit.)
		 */
		DeliveryLease(dests, &drained, &claimed);

		/*
		 * A claim holds its destination's stream to the commit: another
		 * relay claims it while this one reads and builds the events.
		 */
		if (claimed)
		{
			relay_commit();
			DeliveryLeaseCommitted();
			begun = relay_begin(&missing);
			if (!begun && !missing)
			{
				/* tables locked or the extension outdated: they wait */
				MemoryContext cxt = CurrentMemoryContext;

				StartTransactionCommand();
				DeliveryLeaseRead();
				CommitTransactionCommand();
				MemoryContextSwitchTo(cxt);
			}
		}
		if (begun)
		{
			DeliveryLeaseStart(dests, &loop.leased);
			relay_commit();
			DeliveryLeaseCommitted();
		}
	}
	else
		DeliveryForgetConfig(); /* what is installed may be changing */

	/*
	 * Without the extension nothing in flight can be recorded (its rows are
	 * gone), so there is nothing to wait for.
	 */
	if (missing)
		relay_exit_no_extension();

	relay_start_leased();
	loop.need_lease = !drained;
	if (drained)
		loop.last_poll = loop.now;
}

/* Worker 0's jobs for the database, in the lease transaction. */
static void
relay_housekeeping_step(void)
{
	if (relay_slot->worker_number == 0)
		WorkerHousekeeping(loop.now, relay_database_name, relay_slot);
}

/*
 * The start, record or lease step failed: report it, drop what cannot be
 * recorded or started any more, and pause.
 */
static void
relay_cycle_failed(void)
{
	TimestampTz until;

	MemoryContextSwitchTo(relay_cycle_context);
	WorkerReportCycleError(&relay_errors, relay_slot,
						   "Leased events are sent again when their lease runs out. "
						   "Retrying in " CppAsString2(ERROR_PAUSE_MS) " ms.",
						   "while %s in database \"%s\"",
						   relay_activity, relay_database_name);
	/* results not recorded are sent again after their lease */
	relay_free_events(&loop.pending_done);
	loop.record_again_at = 0;
	loop.record_backoff_ms = 0;
	/*
	 * leased but never started: their lease was rolled back, or, once
	 * their claim committed (relay_lease_step), they are sent again when
	 * it runs out
	 */
	relay_free_events(&loop.leased);
	relay_free_events(&loop.answered);
	/* claimed and waiting to start: their batches go to the recovery */
	DeliveryDropWaiting();

	/*
	 * The whole pause: a commit's wake-up does not cut it short (a busy
	 * database retried a failing cycle at its commit rate); SIGTERM does
	 * (the loop's next step exits).
	 */
	until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ERROR_PAUSE_MS);
	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		long		left = (long) ((until - now) / 1000);

		if (OutboxDeadlineReached(until, ERROR_PAUSE_MS, now) ||
			relay_stop_requested || ProcDiePending)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(left, ERROR_PAUSE_MS), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	loop.need_lease = true;
}

/* One bounded batch of received inbox messages, and inbox retention. */
static void
relay_inbox_step(void)
{
	/* stopping: no handlers to wait for before the flush */
	if (loop.need_inbox && !relay_stop_requested)
		loop.need_inbox = InboxWorkerCycle(relay_slot->worker_number == 0,
										   &loop.inbox_wait_ms);
}

/*
 * Show the state, then wait for curl's sockets, the latch or the next
 * thing due, and collect the requests that completed.
 */
static void
relay_wait_step(void)
{
	HttpRequest *done;
	bool		woken = false;

	if (relay_outdated)
		relay_set_state(RELAY_OUTDATED,
						"waiting for ALTER EXTENSION outbox_pg UPDATE");
	else if (loop.record_again_at != 0)
		relay_set_state(RELAY_WORKING,
						"waiting for a lock on the outbox tables to record results");
	else if (relay_locked_out)
		relay_set_state(RELAY_WORKING,
						"waiting for a lock on the outbox tables to lease events");
	else if (DeliveryInFlight() == 0)
		relay_set_state(RELAY_IDLE, "waiting for events");
	else
		relay_set_state(RELAY_WORKING, "sending");

	DeliveryWatchNative();
	done = HttpClientWait(relay_http, relay_wait_time(), &woken);
	if (woken)
	{
		uint64		wake = pg_atomic_read_u64(&relay_slot->wake_generation);

		loop.need_lease = true;

		/*
		 * The inbox looks when a commit woke the relays without naming
		 * destinations (inbox.receive(), a redrive), and at every poll:
		 * emit()'s wakes name theirs and are the outbox's.  Looking at
		 * every wake cost up to 50 empty inbox leases a second per worker
		 * under an outbox load (5 % of a core at 1,000 events/s).
		 */
		if (wake != loop.inbox_wake_generation)
		{
			loop.inbox_wake_generation = wake;
			loop.need_inbox = true;
		}
	}

	/* results (not those kept while the tables are locked): lease more */
	if (relay_collect(done))
		loop.need_lease = true;
}

/*
 * The events that completed: the answered requests, and what the native
 * clients completed; they wait in pending_done beyond this iteration.
 * Whether there were any.
 */
static bool
relay_collect(HttpRequest *done)
{
	int			had = list_length(loop.pending_done);

	MemoryContextSwitchTo(relay_events_context);
	while (done != NULL)
	{
		HttpRequest *next = done->next_done;

		loop.pending_done = DeliveryCompleted(loop.pending_done, done);
		done = next;
	}
	loop.pending_done = DeliveryPollNative(loop.pending_done);
	MemoryContextSwitchTo(relay_cycle_context);
	if (had == 0 && loop.pending_done != NIL)
		loop.first_done_at = GetCurrentTimestamp();
	return list_length(loop.pending_done) > had;
}

/* How long relay_wait_step() may wait. */
static long
relay_wait_time(void)
{
	TimestampTz now = GetCurrentTimestamp();
	long		wait_ms;

	if (loop.leased != NIL || loop.answered != NIL ||
		(loop.need_lease && DeliveryInFlight() < outbox_batch_size))
		wait_ms = 0;
	else if (loop.pending_done != NIL && loop.record_again_at != 0)
	{
		wait_ms = Max((long) ((loop.record_again_at - now + 999) / 1000), 0);
		wait_ms = Min(wait_ms, loop.record_backoff_ms);
		if (DeliveryInFlight() > 0)
			wait_ms = Min(wait_ms, 100);
	}
	else if (loop.pending_done != NIL)
		wait_ms = RECORD_DELAY_MS;
	else
	{
		wait_ms = outbox_poll_interval - (long) ((now - loop.last_poll) / 1000);
		/* more than a poll interval: the clock went back (util.h) */
		wait_ms = Min(Max(wait_ms, 0), outbox_poll_interval);
		if (DeliveryInFlight() > 0)
			wait_ms = Min(wait_ms, 100);
	}
	/* a circuit's pause ends, a gathered claim is due: on time */
	if (relay_lease_again_at != 0)
		wait_ms = Min(wait_ms,
					  Max((long) ((relay_lease_again_at - now + 999) / 1000), 0));
	if (loop.need_inbox)
		wait_ms = Min(wait_ms, loop.inbox_wait_ms);
	return wait_ms;
}

static void
relay_set_state(RelayState state, const char *activity)
{
	if (relay_slot->state != state)
		OutboxSlotSetState(relay_slot, state);
	relay_slot->in_flight = DeliveryInFlight();
	relay_slot->last_cycle_at = GetCurrentTimestamp();
	relay_activity = activity;
	pgstat_report_activity(state == RELAY_IDLE ? STATE_IDLE : STATE_RUNNING,
						   activity);
}

/*
 * The relay has found the extension: say that it started, and let the
 * slot report the extension missing again should it be dropped.
 */
static void
relay_announce(void)
{
	ereport(LOG,
			(errmsg("outbox_pg relay %d started for database \"%s\"",
					relay_slot->worker_number, relay_database_name)));
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	relay_slot->absence_logged = false;
	LWLockRelease(outbox_shared->lock);
	relay_announced = true;
}

/*
 * No extension in this database: exit; the launcher starts a relay again
 * after outbox.discovery_interval, or at once when a commit asks for one.
 * Worker 0 says so for its database, once: the next relays that find no
 * extension exit quietly until one finds it (relay_announce()).
 */
static void
relay_exit_no_extension(void)
{
	bool		log_it;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	relay_slot->state = RELAY_NO_EXTENSION;
	log_it = relay_slot->worker_number == 0 && !relay_slot->absence_logged;
	relay_slot->absence_logged = true;
	LWLockRelease(outbox_shared->lock);
	if (log_it)
		ereport(LOG,
				(errmsg("outbox_pg relay for database \"%s\" is exiting: the extension is not installed",
						relay_database_name),
				 errdetail("The database is looked at again every outbox.discovery_interval; this is not logged again until the extension is found."),
				 errhint("Run CREATE EXTENSION outbox_pg in that database; a relay starts by itself after the first emit().")));
	proc_exit(0);
}

/* Free a list of events (and their requests) and empty it. */
static void
relay_free_events(List **events)
{
	DeliveryFreeEvents(*events);
	*events = NIL;
}
