/*-------------------------------------------------------------------------
 *
 * launcher.c
 *		  The launcher: starts and restarts relay workers per database.
 *
 * One launcher runs per cluster (registered at postmaster start, after
 * recovery has finished — on a hot standby nothing is relayed until
 * promotion).  It connects to no database and reads pg_database to decide
 * which databases to serve: those named in outbox.databases, or with '*'
 * every database that allows connections.  For each it starts
 * outbox.workers_per_database relay workers as dynamic background
 * workers, each bound to one slot of the shared array.
 *
 * A relay that finds no outbox_pg extension in its database exits and is
 * not started again before outbox.discovery_interval has passed — unless a
 * commit in that database calls for a relay (wake.c), which happens right
 * after CREATE EXTENSION and the first emit().  Such a database logs one
 * line when it is first found without the extension and nothing more until
 * a relay finds the extension there (the slot remembers, see relay.c), not
 * a start and an exit every interval.  A relay that exits on an
 * error is restarted after a pause that grows with repeated failures, so
 * a broken database cannot cause a restart storm.  A database that was
 * dropped simply disappears from the list.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/launcher.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/varlena.h"

/* 15.4 and later mark a database an interrupted DROP DATABASE left */
#ifndef DATCONNLIMIT_INVALID_DB
#define DATCONNLIMIT_INVALID_DB		(-2)
#endif

/* a failed relay's restart: after 250 ms doubled per failure, up to 7 */
#define RESTART_BASE_MS			250
#define RESTART_MAX_DOUBLINGS	7
#define RESTART_MAX_MS			(RESTART_BASE_MS << RESTART_MAX_DOUBLINGS)

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "worker/worker.h"
#include "util.h"

typedef struct LauncherDatabase
{
	Oid			oid;
	char		name[NAMEDATALEN];
} LauncherDatabase;

/*
 * The handles of the relays started, in TopMemoryContext: the launcher's
 * passes run in a context reset after each, where a handle once lived and
 * was reused by later allocations (two slots came to share one handle, and
 * the launcher took a stopped relay for running, or a running one for
 * stopped).
 */
static BackgroundWorkerHandle *handles[OUTBOX_MAX_RELAYS];
static int	failures[OUTBOX_MAX_RELAYS];
static TimestampTz last_no_slot_warning = 0;
static TimestampTz last_no_relay_slot_warning = 0;

/* The databases to relay, as last read from pg_database. */
static LauncherDatabase *listed = NULL;
static int	nlisted = 0;
static MemoryContext listed_context = NULL;
static TimestampTz last_list = 0;	/* when; 0: read again now */
static Oid	last_list_for = InvalidOid; /* the wanted database it was for */

/* The launcher reads a shared catalog: no database, nothing to check. */
static const WorkerStepSpec launcher_step =
{
	WORKER_CHECK_NONE, NULL, NULL, 0, NULL
};

void
OutboxRegisterLauncher(void)
{
	BackgroundWorker bgw;

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = 5;
	strlcpy(bgw.bgw_library_name, "outbox_pg", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "OutboxLauncherMain", BGW_MAXLEN);
	strlcpy(bgw.bgw_name, "outbox_pg launcher", BGW_MAXLEN);
	strlcpy(bgw.bgw_type, "outbox_pg launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&bgw);
}

static void
launcher_on_exit(int code, Datum arg)
{
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	outbox_shared->launcher_pid = 0;
	outbox_shared->launcher_procno = -1;
	LWLockRelease(outbox_shared->lock);
}

static bool
database_is_wanted(const char *name, List *names, bool all)
{
	ListCell   *lc;

	if (all)
		return true;
	foreach(lc, names)
	{
		if (strcmp((char *) lfirst(lc), name) == 0)
			return true;
	}
	return false;
}

/*
 * The databases to relay, read from pg_database into the caller's memory
 * context; NULL if outbox.databases cannot be parsed.
 */
static LauncherDatabase *
launcher_list_databases(int *count)
{
	LauncherDatabase *dbs;
	int			n = 0;
	int			allocated = 8;
	char	   *raw;
	List	   *names = NIL;
	bool		all;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	dbs = palloc(allocated * sizeof(LauncherDatabase));

	raw = pstrdup(outbox_databases);
	all = (strcmp(raw, "*") == 0);
	if (!all && !SplitIdentifierString(raw, ',', &names))
	{
		ereport(LOG,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid list syntax in outbox.databases"),
				 errdetail("Relays already running keep running; no other database is relayed until the setting is fixed."),
				 errhint("Use a comma-separated list of database names, or *, and reload.")));
		*count = 0;
		return NULL;
	}

	(void) WorkerStepBegin(&launcher_step, NULL, NULL);
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		/* an invalid one is what an interrupted DROP DATABASE leaves */
		if (!db->datallowconn || db->datistemplate ||
			db->datconnlimit == DATCONNLIMIT_INVALID_DB)
			continue;
		if (!database_is_wanted(NameStr(db->datname), names, all))
			continue;
		if (n == allocated)
		{
			allocated *= 2;
			dbs = repalloc(dbs, allocated * sizeof(LauncherDatabase));
		}
		dbs[n].oid = db->oid;
		strlcpy(dbs[n].name, NameStr(db->datname), NAMEDATALEN);
		n++;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	WorkerStepCommit();

	*count = n;
	return dbs;
}

static bool
slot_is_running(int i)
{
	pid_t		pid;

	if (handles[i] != NULL &&
		GetBackgroundWorkerPid(handles[i], &pid) != BGWH_STOPPED)
		return true;
	return outbox_shared->slots[i].pid != 0;
}

static void
launcher_start_relay(int i, LauncherDatabase *db, int worker_number)
{
	BackgroundWorker bgw;
	RelaySlot  *slot = &outbox_shared->slots[i];
	MemoryContext old;
	bool		registered;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	if (slot->pid != 0)
	{
		/* a relay (of a launcher before this one) claimed it meanwhile */
		LWLockRelease(outbox_shared->lock);
		return;
	}
	if (slot->dboid != db->oid)
	{
		slot->absence_logged = false;
		/* a hold on the database the slot served is not this one's */
		slot->held_until = 0;
		slot->held_by = 0;
	}
	slot->stopped_for_ddl = false;
	slot->dboid = db->oid;
	slot->worker_number = worker_number;
	slot->state = RELAY_STARTING;
	slot->pid = 0;
	slot->procno = -1;

	/*
	 * The relay sets it again once connected.  Set here too, so that one
	 * that never connects (its database cannot be entered) counts as a
	 * quick failure and backs off; with the last run's time it was
	 * restarted every 0.5 s for ever.
	 */
	slot->started_at = GetCurrentTimestamp();
	LWLockRelease(outbox_shared->lock);

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(bgw.bgw_library_name, "outbox_pg", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "OutboxRelayMain", BGW_MAXLEN);
	snprintf(bgw.bgw_name, BGW_MAXLEN, "outbox_pg relay %d for database \"%s\"",
			 worker_number, db->name);
	strlcpy(bgw.bgw_type, "outbox_pg relay", BGW_MAXLEN);
	bgw.bgw_main_arg = Int32GetDatum(i);
	memcpy(bgw.bgw_extra, &db->oid, sizeof(Oid));	/* relay_start() */
	bgw.bgw_notify_pid = MyProcPid;

	old = MemoryContextSwitchTo(TopMemoryContext);
	registered = RegisterDynamicBackgroundWorker(&bgw, &handles[i]);
	MemoryContextSwitchTo(old);
	if (!registered)
	{
		TimestampTz now = GetCurrentTimestamp();

		handles[i] = NULL;
		slot->state = RELAY_STOPPED;
		slot->retry_after = TimestampTzPlusMilliseconds(now, 5000);
		if (OutboxTimePassed(last_no_slot_warning, now, 60000))
		{
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("could not start an outbox_pg relay for database \"%s\"",
							db->name),
					 errdetail("All background worker slots are in use."),
					 errhint("Raise max_worker_processes, or lower outbox.workers_per_database.")));
			last_no_slot_warning = now;
		}
	}
}

/*
 * One pass: reap stopped relays, start missing ones, stop unwanted ones.
 */
static void
launcher_reconcile(LauncherDatabase *dbs, int ndbs)
{
	TimestampTz now = GetCurrentTimestamp();
	Oid			wanted = outbox_shared->launcher_wanted_db;
	int			nshort = 0;		/* databases short of a relay slot */
	const char *short_db = NULL;	/* the first of them */
	int			short_has = 0;	/* how many relays it has */
	bool		releasing = false;	/* relays not wanted are stopping */

	outbox_shared->launcher_wanted_db = InvalidOid;

	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];
		bool		keep = false;

		if (!OidIsValid(slot->dboid))
			continue;
		for (int d = 0; d < ndbs; d++)
			if (dbs[d].oid == slot->dboid &&
				slot->worker_number < outbox_workers_per_database)
				keep = true;

		if (slot_is_running(i))
		{
			if (!keep)
			{
				pid_t		pid;

				releasing = true;
				if (handles[i] != NULL &&
					GetBackgroundWorkerPid(handles[i], &pid) != BGWH_STOPPED)
					TerminateBackgroundWorker(handles[i]);
				else if (slot->pid != 0)
					/* started by a launcher before this one: no handle */
					(void) kill(slot->pid, SIGTERM);
			}
			continue;
		}

		/* stopped: note how it ended, then free or schedule a restart */
		if (handles[i] != NULL)
		{
			pfree(handles[i]);
			handles[i] = NULL;
			if (slot->held_until > now || slot->stopped_for_ddl)
			{
				/* stopped for a statement on its database: no failure */
				slot->stopped_for_ddl = false;
				slot->retry_after = 0;
			}
			else if (slot->state == RELAY_NO_EXTENSION)
			{
				failures[i] = 0;
				slot->retry_after = TimestampTzPlusMilliseconds(now,
																outbox_discovery_interval * 1000);
			}
			else
			{
				/* a relay that ran for a while starts over at 0.5 s; up to 32 s */
				if (TimestampDifferenceExceeds(slot->started_at, now, 60000))
					failures[i] = 0;
				failures[i] = Min(failures[i] + 1, RESTART_MAX_DOUBLINGS);
				slot->retry_after = TimestampTzPlusMilliseconds(now,
																RESTART_BASE_MS << failures[i]);
			}
		}
		/* a commit's request ends a wait for the extension, not a backoff */
		if (slot->dboid == wanted && failures[i] == 0)
			slot->retry_after = 0;
		if (!keep)
		{
			LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
			slot->dboid = InvalidOid;
			slot->state = RELAY_FREE;
			slot->held_until = 0;
			slot->held_by = 0;
			slot->stopped_for_ddl = false;
			LWLockRelease(outbox_shared->lock);
			failures[i] = 0;
		}
	}

	/* start what is missing */
	for (int d = 0; d < ndbs; d++)
	{
		int			no_slot = 0;

		for (int w = 0; w < outbox_workers_per_database; w++)
		{
			int			found = -1;
			int			free_slot = -1;

			for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
			{
				RelaySlot  *slot = &outbox_shared->slots[i];

				if (slot->dboid == dbs[d].oid && slot->worker_number == w)
					found = i;
				else if (!OidIsValid(slot->dboid) && free_slot < 0 &&
						 handles[i] == NULL)
					free_slot = i;
			}
			if (found >= 0)
			{
				RelaySlot  *slot = &outbox_shared->slots[found];

				if (dbs[d].oid == wanted && failures[found] == 0)
					slot->retry_after = 0;
				/* a handle not reaped yet waits for the next pass */
				if (handles[found] == NULL && !slot_is_running(found) &&
					OutboxDeadlineReached(slot->retry_after,
										  Max(RESTART_MAX_MS,
											  outbox_discovery_interval * 1000L),
										  now) &&
					slot->held_until <= now)
					launcher_start_relay(found, &dbs[d], w);
			}
			else if (free_slot >= 0)
				launcher_start_relay(free_slot, &dbs[d], w);
			else
				no_slot++;
		}
		if (no_slot > 0 && nshort++ == 0)
		{
			short_db = dbs[d].name;
			short_has = outbox_workers_per_database - no_slot;
		}
	}

	/*
	 * Out of relay slots: a database left without a relay has nobody to
	 * warn about its events, so the launcher does (once a minute).  Not
	 * while relays no longer wanted are stopping: their slots come free.
	 */
	if (nshort > 0 && !releasing &&
		OutboxTimePassed(last_no_relay_slot_warning, now, 60000))
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg_plural("outbox_pg has no relay slot left for %d database",
							   "outbox_pg has no relay slot left for %d databases",
							   nshort, nshort),
				 short_has == 0 ?
				 errdetail("All %d relay slots are in use; database \"%s\" has no relay, and its events are not delivered.",
						   OUTBOX_MAX_RELAYS, short_db) :
				 errdetail("All %d relay slots are in use; database \"%s\" has %d of its %d relays.",
						   OUTBOX_MAX_RELAYS, short_db, short_has,
						   outbox_workers_per_database),
				 errhint("Set outbox.databases to the databases that use outbox_pg (every database it names takes outbox.workers_per_database slots, with the extension or not), or lower outbox.workers_per_database.")));
		last_no_relay_slot_warning = now;
	}
}

/*
 * Re-read pg_database every discovery interval, or when a commit found no
 * relay for a database we have not listed (it is new) — at once the first
 * time, then at most once a second for the same database, so a busy
 * database excluded by outbox.databases costs nothing.  A listed database
 * needs no re-read: reconcile starts its relay.  At once, too, after a
 * DROP DATABASE that stopped relays (api/database_ddl.c).
 */
static void
launcher_refresh_databases(void)
{
	TimestampTz now = GetCurrentTimestamp();
	Oid			wanted = outbox_shared->launcher_wanted_db;
	bool		wanted_unlisted = OidIsValid(wanted);
	MemoryContext new_context;
	MemoryContext old;
	LauncherDatabase *new_dbs;
	int			new_ndbs;

	for (int d = 0; d < nlisted && wanted_unlisted; d++)
		if (listed[d].oid == wanted)
			wanted_unlisted = false;
	if (outbox_shared->launcher_relist)
	{
		/* a database was dropped (api/database_ddl.c) */
		outbox_shared->launcher_relist = false;
		last_list = 0;
	}
	if (!(wanted_unlisted &&
		  (wanted != last_list_for ||
		   OutboxTimePassed(last_list, now, 1000))) &&
		!OutboxTimePassed(last_list, now,
						  outbox_discovery_interval * 1000))
		return;

	new_context = AllocSetContextCreate(TopMemoryContext,
										"outbox_pg launcher databases",
										ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(new_context);
	new_dbs = launcher_list_databases(&new_ndbs);
	MemoryContextSwitchTo(old);
	if (new_dbs == NULL)
		MemoryContextDelete(new_context);	/* keep the last good list */
	else
	{
		if (listed_context)
			MemoryContextDelete(listed_context);
		listed_context = new_context;
		listed = new_dbs;
		nlisted = new_ndbs;
	}
	last_list = now;
	last_list_for = wanted;
}

void
OutboxLauncherMain(Datum main_arg)
{
	MemoryContext pass_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("outbox_pg launcher");

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	outbox_shared->launcher_pid = MyProcPid;
	outbox_shared->launcher_procno = MyProcNumber;
	LWLockRelease(outbox_shared->lock);
	before_shmem_exit(launcher_on_exit, (Datum) 0);

	pass_context = AllocSetContextCreate(TopMemoryContext,
										 "outbox_pg launcher pass",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(pass_context);

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			last_list = 0;
		}

		launcher_refresh_databases();
		launcher_reconcile(listed, nlisted);
		MemoryContextReset(pass_context);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1000L,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
