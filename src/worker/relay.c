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
 * Per destination the worker keeps an in-flight count (capped by
 * max_concurrency) and asks the destination's circuit breaker before it
 * leases: the circuit is shared by all relays of the database and lives
 * in shared memory (deststats.c has the protocol).  After
 * options.circuit_threshold (default 5; 0 disables it) failed rounds in a
 * row no relay leases events of the destination for a pause (1 s,
 * doubling up to outbox.circuit_max_pause); then one relay sends a single
 * probe; any success closes the circuit and wakes the other relays.  A
 * failure recorded while the circuit is open is the destination's, not
 * the event's: the event gets its attempt back and is due at once, so it
 * neither backs off nor runs out of attempts during an outage (max_age
 * still applies).
 *
 * Memory: each event lives in its own small memory context, deleted
 * after its result is recorded; everything else per cycle is reset every
 * loop.  Errors inside a cycle are caught, logged, shown in the worker's
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
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "retry.h"
#include "deststats.h"
#include "peertext.h"
#include "api/api.h"
#include "worker/worker.h"
#include "worker/relay.h"
#include "destination/http.h"
#include "destination/destination.h"

#define ROUTE_INTERVAL_MS		5000
#define ERROR_PAUSE_MS			1000
#define RECORD_BATCH			128
#define RECORD_DELAY_MS			10

/* The process's state, shared with delivery.c through worker/relay.h. */
RelaySlot  *relay_slot = NULL;
HttpClient *relay_http = NULL;
MemoryContext relay_cycle_context = NULL;
char	   *relay_database_name = NULL;

/* lease again then: a circuit's pause ends or another relay's probe expires */
TimestampTz relay_circuit_recheck_at = 0;

static char last_logged_error[OUTBOX_ERROR_LEN];
static TimestampTz last_logged_at = 0;

static bool relay_outdated = false;	/* extension needs an UPDATE */
static bool relay_announced = false;	/* "started" is logged */

static SPIPlanPtr route_plan = NULL;

/* The tables a relay cycle touches, in the order it locks them. */
static const OutboxTableLock relay_tables[] =
{
	{OUTBOX_EVENTS_TABLE, RowExclusiveLock},
	{OUTBOX_DESTINATIONS_TABLE, AccessShareLock},
	{OUTBOX_ROUTES_TABLE, AccessShareLock},
	{OUTBOX_CREDENTIALS_TABLE, AccessShareLock},
};

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

static void
relay_prepare_plans(void)
{
	DeliveryPreparePlans();
	OutboxKeepPlan(&route_plan, "SELECT outbox._route_pending()", 0, NULL);
}

/*
 * Start a transaction and check that the extension is installed and its
 * events table is not locked away (DROP EXTENSION in progress).  Returns
 * false, with the transaction still open, when the cycle should be
 * skipped; sets *missing when the extension is not there at all.
 */
bool
relay_begin(bool *missing)
{
	*missing = false;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/* ha: deliver only with the SQL objects of this library's version */
	relay_outdated = false;
	if (!OutboxRelayVersionMatches(relay_slot, relay_database_name, missing))
	{
		relay_outdated = !*missing;
		return false;
	}

	/*
	 * Take every table lock of the cycle now, without waiting: if DROP
	 * EXTENSION (or an ALTER) holds one, skip this cycle instead of queueing
	 * behind it and deadlocking against it.
	 */
	if (!OutboxLockTablesNoWait(OUTBOX_SCHEMA, relay_tables, lengthof(relay_tables)))
		return false;
	relay_prepare_plans();
	return true;
}

void
relay_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
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

static void
relay_set_state(RelayState state, const char *activity)
{
	if (relay_slot->state != state)
		OutboxSlotSetState(relay_slot, state);
	relay_slot->in_flight = DeliveryInFlight();
	relay_slot->last_cycle_at = GetCurrentTimestamp();
	pgstat_report_activity(state == RELAY_IDLE ? STATE_IDLE : STATE_RUNNING,
						   activity);
}

void
OutboxRelayMain(Datum main_arg)
{
	int			slot_index = DatumGetInt32(main_arg);
	volatile bool need_lease = true;
	volatile bool need_inbox = true;	/* inbox work (inbox_worker.c) */
	long		inbox_wait_ms = 0;	/* set by every InboxWorkerCycle() */
	volatile TimestampTz last_poll = 0;
	volatile TimestampTz last_route = 0;
	TimestampTz first_done_at = 0;
	List	   *volatile pending_done = NIL;
	List	   *volatile leased = NIL;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (slot_index < 0 || slot_index >= OUTBOX_MAX_RELAYS)
		elog(ERROR, "invalid relay slot %d", slot_index);
	relay_slot = &outbox_shared->slots[slot_index];

	BackgroundWorkerInitializeConnectionByOid(relay_slot->dboid, InvalidOid, 0);

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	relay_slot->pid = MyProcPid;
	relay_slot->procno = MyProcNumber;
	relay_slot->started_at = GetCurrentTimestamp();
	relay_slot->state = RELAY_STARTING;
	relay_slot->in_flight = 0;
	relay_slot->last_error[0] = '\0';
	LWLockRelease(outbox_shared->lock);
	before_shmem_exit(relay_on_exit, (Datum) 0);

	pgstat_report_appname("outbox_pg relay");
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("application_name", "outbox_pg relay", PGC_USERSET, PGC_S_OVERRIDE);

	/*
	 * The relay's own commits need not wait for the WAL flush: a lease lost
	 * in a crash leaves its rows due (sent again), and a lost result means
	 * the event is sent again after its lease.  Either way at-least-once
	 * holds, and each cycle saves a disk flush.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * The lease relies on READ COMMITTED (FOR UPDATE SKIP LOCKED with a
	 * recheck of the row): never take a database's or role's default.
	 */
	SetConfigOption("default_transaction_isolation", "read committed",
					PGC_SUSET, PGC_S_OVERRIDE);
	/* plan every lease with its real LIMIT and array sizes (see store.c) */
	SetConfigOption("plan_cache_mode", "force_custom_plan", PGC_USERSET, PGC_S_OVERRIDE);

	StartTransactionCommand();
	relay_database_name = MemoryContextStrdup(TopMemoryContext,
										get_database_name(MyDatabaseId));
	CommitTransactionCommand();

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR),
				 errmsg("could not initialize libcurl")));
	relay_http = HttpClientCreate();

	DeliveryInit();
	relay_cycle_context = AllocSetContextCreate(TopMemoryContext,
										  "outbox_pg relay cycle",
										  ALLOCSET_DEFAULT_SIZES);

	/*
	 * "started" is logged once the relay has seen the extension (the first
	 * lease below): in a database without it the relay only starts, looks
	 * and exits, every discovery interval, and logs that once.
	 */

	for (;;)
	{
		TimestampTz now;
		long		wait_ms;
		bool		woken = false;
		HttpRequest *done;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		now = GetCurrentTimestamp();
		if (TimestampDifferenceExceeds(last_poll, now, outbox_poll_interval))
			need_lease = need_inbox = true;
		if (relay_circuit_recheck_at != 0 && now >= relay_circuit_recheck_at)
			need_lease = true;

		PG_TRY();
		{
			MemoryContext old = MemoryContextSwitchTo(relay_cycle_context);

			/*
			 * Record what completed: at once when nothing else is running,
			 * else in groups (128 results, or 10 ms after the first), so that
			 * one transaction records many results.
			 */
			if (pending_done != NIL &&
				(HttpClientRunning(relay_http) == 0 ||
				 list_length(pending_done) >= RECORD_BATCH ||
				 TimestampDifferenceExceeds(first_done_at, GetCurrentTimestamp(),
											RECORD_DELAY_MS)))
			{
				ListCell   *lc;

				relay_set_state(RELAY_WORKING, "recording results");
				DeliveryRecord(pending_done);
				foreach(lc, pending_done)
					DeliveryFreeEvent(lfirst(lc));
				list_free(pending_done);
				pending_done = NIL;
			}

			/* lease and start more */
			if (need_lease && DeliveryInFlight() < outbox_batch_size)
			{
				bool		missing;
				bool		started;
				bool		drained = true;

				relay_set_state(RELAY_WORKING, "leasing events");
				relay_circuit_recheck_at = 0; /* DeliveryLease() sets it again */
				started = relay_begin(&missing);
				if (!missing && !relay_announced)
					relay_announce();
				if (started)
				{
					List	   *dests = DeliveryLoadDestinations();

					if (relay_slot->worker_number == 0 &&
						TimestampDifferenceExceeds(last_route, now, ROUTE_INTERVAL_MS))
					{
						if (SPI_execute_plan(route_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
							elog(ERROR, "could not route pending events");
						last_route = now;
					}
					/* retention of published events: worker 0 (retention.c) */
					if (relay_slot->worker_number == 0)
						OutboxRetentionStep(now);
					if (relay_slot->worker_number == 0)	/* ops: backlog warning */
						OutboxOpsCheckBacklog(relay_database_name);
					MemoryContextSwitchTo(relay_events_context);
					DeliveryLease(dests, &drained, (List **) &leased);
					MemoryContextSwitchTo(relay_cycle_context);
				}
				relay_commit();
				/*
				 * Without the extension nothing in flight can be recorded
				 * (its rows are gone), so there is nothing to wait for.
				 */
				if (missing)
					relay_exit_no_extension();
				/*
				 * Each event leaves the list as curl takes it, so an error
				 * here never frees a request curl still uses.
				 */
				while (leased != NIL)
				{
					RelayEvent *ev = linitial(leased);

					leased = list_delete_first(leased);
					DeliveryStart(ev);
				}
				need_lease = !drained;
				if (drained)
					last_poll = now;
			}
			MemoryContextSwitchTo(old);
		}
		PG_CATCH();
		{
			ErrorData  *edata;
			ListCell   *lc;
			bool		repeated;
			char	   *safe;

			MemoryContextSwitchTo(TopMemoryContext);
			edata = CopyErrorData();
			FlushErrorState();
			AbortCurrentTransaction();
			OutboxSlotSetError(relay_slot, edata->message);
			OutboxSlotSetState(relay_slot, RELAY_ERROR);
			/* the same error again within a minute is not logged again */
			now = GetCurrentTimestamp();
			repeated = (strcmp(last_logged_error, edata->message) == 0 &&
						!TimestampDifferenceExceeds(last_logged_at, now, 60000));
			strlcpy(last_logged_error, edata->message, sizeof(last_logged_error));
			if (!repeated)
				last_logged_at = now;
			/* an error may quote what a destination said */
			safe = OutboxPeerText(edata->message, strlen(edata->message), false,
								  NULL, 8 * OUTBOX_ERROR_LEN);
			ereport(repeated ? DEBUG1 : LOG,
					(errmsg("outbox_pg relay for database \"%s\" failed a cycle: %s",
							relay_database_name, safe),
					 errhint("Leased events are sent again when their lease runs out. Retrying in %d ms.",
							 ERROR_PAUSE_MS)));
			pfree(safe);
			FreeErrorData(edata);
			/* results not recorded are re-sent after their lease */
			foreach(lc, pending_done)
				DeliveryFreeEvent(lfirst(lc));
			list_free(pending_done);
			pending_done = NIL;
			/* leased but never started: their lease was rolled back */
			foreach(lc, leased)
				DeliveryFreeEvent(lfirst(lc));
			list_free(leased);
			leased = NIL;
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 ERROR_PAUSE_MS, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			need_lease = true;
		}
		PG_END_TRY();
		MemoryContextReset(relay_cycle_context);

		/* inbox: one bounded batch of received messages, and retention */
		if (need_inbox)
			need_inbox = InboxWorkerCycle(relay_slot->worker_number == 0,
										  &inbox_wait_ms);

		/* send and wait */
		if (relay_outdated)
			relay_set_state(RELAY_OUTDATED,
							"waiting for ALTER EXTENSION outbox_pg UPDATE");
		else if (DeliveryInFlight() == 0)
			relay_set_state(RELAY_IDLE, "waiting for events");
		else
			relay_set_state(RELAY_WORKING, "sending");

		now = GetCurrentTimestamp();
		if (need_lease && DeliveryInFlight() < outbox_batch_size)
			wait_ms = 0;
		else if (pending_done != NIL)
			wait_ms = RECORD_DELAY_MS;
		else
		{
			wait_ms = outbox_poll_interval -
				(long) ((now - last_poll) / 1000);
			wait_ms = Max(wait_ms, 0);
			if (DeliveryInFlight() > 0)
				wait_ms = Min(wait_ms, 100);
			/* a circuit's pause ends: its probe goes out on time */
			if (relay_circuit_recheck_at != 0)
				wait_ms = Min(wait_ms,
							  Max((long) ((relay_circuit_recheck_at - now + 999) / 1000), 0));
		}
		if (need_inbox)
			wait_ms = Min(wait_ms, inbox_wait_ms);
		MemoryContextSwitchTo(relay_cycle_context);
		done = HttpClientWait(relay_http, wait_ms, &woken);
		if (woken)
			need_lease = need_inbox = true;
		MemoryContextSwitchTo(relay_events_context);
		if (done != NULL && pending_done == NIL)
			first_done_at = GetCurrentTimestamp();
		while (done != NULL)
		{
			HttpRequest *next = done->next_done;

			pending_done = DeliveryCompleted(pending_done, done);
			done = next;
		}
		MemoryContextSwitchTo(TopMemoryContext);
		if (pending_done != NIL)
			need_lease = true;
	}
}
