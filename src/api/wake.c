/*-------------------------------------------------------------------------
 *
 * wake.c
 *		  Wake the relays when a transaction that emitted events (or changed
 *		  their destinations) commits.
 *
 * emit() calls OutboxWakeDestinationAtCommit(destination) (other callers
 * that make work for the relays, OutboxWakeAtCommit()), which sets a
 * backend-local flag and,
 * once per backend, registers a transaction callback.  At
 * XACT_EVENT_COMMIT — after the commit is durable and visible — the
 * callback sets the latch of every relay of this database, so delivery
 * starts within microseconds instead of at the next poll.  A rollback
 * clears the flag and wakes nobody.  The callback must not fail or
 * allocate: it only reads shared memory and sets latches.
 *
 * With the destination named, the callback also bumps that destination's
 * emitted generation (a counter in shared memory, shmem.h): a relay claims
 * a destination only when its generation moved, or for the other reasons
 * delivery.c lists (issue #19).  OutboxWakeAtCommit() names none: it bumps
 * the wake generation of the database's relay slots instead, and they look
 * at every destination.
 *
 * If no relay runs for this database (the extension was just created, or
 * its worker exited), the callback asks the launcher to start one (at
 * most once a second per backend).
 *
 * Events inserted without emit() (a restore) are found by the poll, and so
 * are those of a prepared transaction, committed later by COMMIT PREPARED
 * in any session: its PREPARE bumps the prepared generation of the
 * database's relay slots, which tells the relays' periodic sweep to look
 * for them (delivery.c, delivery_sweep).
 *
 * The same callback tells the relays that the destinations changed.  The
 * statement trigger of outbox.destinations, outbox.credentials and
 * outbox.routes (outbox._config_changed(), routing.c) calls
 * OutboxConfigChangedAtCommit(); at XACT_EVENT_COMMIT the callback bumps
 * the configuration generation of every relay slot of this database
 * (shmem.h) and sets their latches, and each relay reloads its cached
 * destinations at its next lease step (delivery.c).  The bump must come
 * after the commit is visible, never before (not at PRE_COMMIT, not in
 * the trigger): a relay that saw the new generation before the commit
 * would reload the old rows, record the new generation as loaded and keep
 * the old configuration until the next change.  A rollback bumps nothing;
 * a subtransaction rolled back leaves the flag set, which only costs the
 * relays one reload.  A prepared transaction clears it: its COMMIT
 * PREPARED runs no callback of ours, and the relays' periodic reload is
 * the safety net for it, as the poll is for its events.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/wake.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "shmem.h"
#include "api/api.h"
#include "worker/worker.h"
#include "util.h"

/*
 * The emitted-generation counters (shmem.h) to bump at commit: those of
 * the destinations the transaction emitted for, each once.  More than
 * fit: the commit wakes without naming destinations (wake_untagged),
 * which makes the relays look at all of them.
 */
#define WAKE_MAX_COUNTERS	32

static int	wake_counters[WAKE_MAX_COUNTERS];
static int	wake_ncounters = 0;
static bool wake_untagged = false;

static bool wake_pending = false;
static bool config_pending = false;
static bool wake_callback_registered = false;

/* when this backend last asked the launcher for a relay (see below) */
#define WAKE_LAUNCHER_ASK_MS	1000
static TimestampTz wake_asked_launcher_at = 0;

static void wake_register_callback(void);

/*
 * A transaction that emitted events was prepared: its COMMIT PREPARED, in
 * any session, later, runs no callback of ours, so the relays' periodic
 * sweep must look for its events (delivery.c, delivery_sweep).
 */
static void
wake_prepared(void)
{
	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot->dboid == MyDatabaseId)
			pg_atomic_fetch_add_u64(&slot->prepared_generation, 1);
	}
}

static void
wake_xact_callback(XactEvent event, void *arg)
{
	bool		found = false;
	bool		wake;
	bool		config;
	bool		untagged;
	int			ncounters;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			break;
		case XACT_EVENT_PREPARE:
			if (wake_pending && outbox_shared != NULL)
				wake_prepared();
			/* FALLTHROUGH */
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_pending = false;
			config_pending = false;
			wake_ncounters = 0;
			wake_untagged = false;
			return;
		default:
			return;
	}

	if (!wake_pending && !config_pending)
		return;
	wake = wake_pending;
	config = config_pending;
	untagged = wake_untagged;
	ncounters = wake_ncounters;
	wake_pending = false;
	config_pending = false;
	wake_untagged = false;
	wake_ncounters = 0;

	if (outbox_shared == NULL)
		return;

	/*
	 * After the commit is visible (this callback runs after it), so a relay
	 * that sees a counter move finds the events with its next snapshot.
	 */
	for (int i = 0; i < ncounters; i++)
		pg_atomic_fetch_add_u64(&outbox_shared->emitted[wake_counters[i]], 1);

	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot->dboid != MyDatabaseId)
			continue;
		/* also a slot whose relay is starting: it loads after this */
		if (config)
			pg_atomic_fetch_add_u64(&slot->config_generation, 1);
		/* after the counters: a relay that sees this sees them (delivery.c) */
		if (ncounters > 0 || untagged)
			pg_atomic_fetch_add_u64(&slot->emitted_generation, 1);
		if (untagged)
			pg_atomic_fetch_add_u64(&slot->wake_generation, 1);
		if (slot->pid != 0)
		{
			OutboxSetLatchByProcno(slot->procno);
			found = true;
		}
	}
	/*
	 * Ask once; the launcher clears the request when it has looked, and
	 * this backend asks again at most once per WAKE_LAUNCHER_ASK_MS.  Asked
	 * at every commit, a database no relay serves (not in
	 * outbox.databases) had every emitting commit signal the launcher: a
	 * kill() each, 0.84 more per commit than a plain INSERT's (perf stat,
	 * pgbench, one client), for a launcher that lists the databases at
	 * most once a second anyway.
	 */
	if (wake && !found && outbox_shared->launcher_wanted_db != MyDatabaseId)
	{
		TimestampTz now = GetCurrentTimestamp();

		/* 0, never asked, is long enough ago */
		if (OutboxTimePassed(wake_asked_launcher_at, now,
							 WAKE_LAUNCHER_ASK_MS))
		{
			wake_asked_launcher_at = now;
			outbox_shared->launcher_wanted_db = MyDatabaseId;
			OutboxSetLatchByProcno(outbox_shared->launcher_procno);
		}
	}
}

/* One callback per backend, for both flags. */
static void
wake_register_callback(void)
{
	if (!wake_callback_registered)
	{
		RegisterXactCallback(wake_xact_callback, NULL);
		wake_callback_registered = true;
	}
}

/*
 * The transaction made work for the relays without saying for which
 * destinations (inbox, redrive, ...): wake them when it commits, and have
 * them look at every destination.
 */
void
OutboxWakeAtCommit(void)
{
	wake_register_callback();
	wake_pending = true;
	wake_untagged = true;
}

/*
 * The transaction emitted events for destination (NULL: unrouted, nothing
 * for a relay to claim yet): wake the relays when it commits, and bump
 * the destination's emitted generation so that they claim it.
 */
void
OutboxWakeDestinationAtCommit(const char *destination)
{
	int			index;

	wake_register_callback();
	wake_pending = true;
	if (destination == NULL)
		return;
	index = OutboxEmitCounterIndex(MyDatabaseId, destination);
	for (int i = 0; i < wake_ncounters; i++)
		if (wake_counters[i] == index)
			return;
	if (wake_ncounters < WAKE_MAX_COUNTERS)
		wake_counters[wake_ncounters++] = index;
	else
		wake_untagged = true;
}

/*
 * The transaction changed the destinations, their credentials or the
 * routes: when it commits, have the relays reload them.
 */
void
OutboxConfigChangedAtCommit(void)
{
	wake_register_callback();
	config_pending = true;
}
