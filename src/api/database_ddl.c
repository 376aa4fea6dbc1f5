/*-------------------------------------------------------------------------
 *
 * database_ddl.c
 *		  Statements that need a database without sessions stop its relays
 *		  first.
 *
 * DROP DATABASE, ALTER DATABASE ... RENAME TO, ALTER DATABASE ... SET
 * TABLESPACE and CREATE DATABASE copying a database as its template fail
 * with "database ... is being accessed by other users" while any other
 * session is connected to that database, and the relays are sessions.  So,
 * with the extension installed, an application's test suite could not drop
 * or clone its database.  (Databases marked as templates have no relays:
 * the launcher skips them.)
 *
 * Before such a statement runs, the ProcessUtility hook holds the
 * database's relay slots (the launcher starts none of them while the hold
 * lasts, and a relay that connects meanwhile exits at once), asks the
 * running relays to exit (SIGTERM, sent again every second; the slot is
 * marked first, so a relay flushing a broker client does not wait for its
 * confirmations) and waits for them, up to DDL_STOP_WAIT_MS; PostgreSQL's
 * own wait for sessions follows.  Once the statement holds its lock on
 * the database, a relay that starts waits for that lock before it counts
 * as a session.  The hold ends with the statement, whether it succeeded
 * or failed; the relays start again
 * (under the new name, or from the new tablespace), and a relay stopped
 * this way does not count as a failure that delays its restart.  After a
 * DROP the hold is left to run out, and when the transaction ends the
 * launcher is asked to read pg_database again (after a RENAME too): the
 * slots go with the database, and their hold with them.  A backend that
 * exits while holding (terminated, say) releases its holds.
 *
 * Only a superuser or the database's owner stops the relays (copying a
 * database that is not a template takes its owner too).  Anybody else's
 * statement fails its own permission check as before, with the relays
 * untouched.
 *
 * At-least-once holds: a relay that exits leaves the events it leased to
 * be sent again when their lease ends.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/database_ddl.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/utility.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "compat.h"
#include "shmem.h"
#include "api/api.h"
#include "util.h"

/* How long the statement waits for the relays before its own wait. */
#define DDL_STOP_WAIT_MS		5000
/* A hold outlives its statement only after a DROP (or if never ended). */
#define DDL_HOLD_MS				60000

static ProcessUtility_hook_type prev_process_utility = NULL;
static bool exit_callback_registered = false;
static bool xact_callback_registered = false;
static Oid	relist_at_end = InvalidOid;	/* dropped or renamed in this
										 * transaction */

/*
 * The database a statement needs without sessions, by name (NULL if the
 * statement is not one of those); *what names the statement for the log.
 */
static const char *
database_ddl_target(Node *stmt, const char **what)
{
	ListCell   *lc;

	switch (nodeTag(stmt))
	{
		case T_DropdbStmt:
			*what = "DROP DATABASE";
			return ((DropdbStmt *) stmt)->dbname;
		case T_RenameStmt:
			if (((RenameStmt *) stmt)->renameType != OBJECT_DATABASE)
				return NULL;
			*what = "ALTER DATABASE RENAME";
			return ((RenameStmt *) stmt)->subname;
		case T_AlterDatabaseStmt:
			foreach(lc, ((AlterDatabaseStmt *) stmt)->options)
			{
				if (strcmp(lfirst_node(DefElem, lc)->defname, "tablespace") == 0)
				{
					*what = "ALTER DATABASE SET TABLESPACE";
					return ((AlterDatabaseStmt *) stmt)->dbname;
				}
			}
			return NULL;
		case T_CreatedbStmt:
			*what = "CREATE DATABASE";
			foreach(lc, ((CreatedbStmt *) stmt)->options)
			{
				DefElem    *opt = lfirst_node(DefElem, lc);

				/* TEMPLATE DEFAULT (no argument) is template1, as createdb() has it */
				if (strcmp(opt->defname, "template") == 0 && opt->arg != NULL)
					return defGetString(opt);
			}
			return "template1";
		default:
			return NULL;
	}
}

/* May the current role stop the database's relays (see above)? */
static bool
database_ddl_allowed(Oid dboid)
{
	return superuser() ||
		object_ownercheck(DatabaseRelationId, dboid, GetUserId());
}

/*
 * Hold (until hold_until) or release (0) the database's relay slots; with
 * signal, send SIGTERM to their running relays.  Returns how many run.
 */
static int
database_ddl_hold(Oid dboid, TimestampTz hold_until, bool signal)
{
	int			running = 0;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot->dboid != dboid)
			continue;
		if (hold_until != 0 || slot->held_by == MyProcPid)
		{
			slot->held_until = hold_until;
			slot->held_by = hold_until != 0 ? MyProcPid : 0;
		}
		if (slot->pid != 0)
		{
			running++;
			if (signal)
			{
				slot->stopped_for_ddl = true;
				(void) kill(slot->pid, SIGTERM);
			}
		}
	}
	LWLockRelease(outbox_shared->lock);
	return running;
}

/* The launcher starts what the hold kept from it, or forgets a dropped database. */
static void
database_ddl_wake_launcher(bool relist)
{
	if (relist)
		outbox_shared->launcher_relist = true;
	OutboxSetLatchByProcno(outbox_shared->launcher_procno);
}

/* A backend that exits holding slots (terminated mid-statement) lets go. */
static void
database_ddl_on_exit(int code, Datum arg)
{
	bool		released = false;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot->held_by == MyProcPid && slot->held_until != 0)
		{
			slot->held_until = 0;
			slot->held_by = 0;
			released = true;
		}
	}
	LWLockRelease(outbox_shared->lock);
	if (released)
		database_ddl_wake_launcher(false);
}

/*
 * When a transaction that dropped or renamed a database ends, the launcher
 * reads pg_database again (a dropped database's slots go, a renamed one's
 * relays get the new name).  A DROP that is rolled back lets its hold go.
 * A prepared RENAME is read again at the next discovery after COMMIT
 * PREPARED.
 */
static void
database_ddl_xact_callback(XactEvent event, void *arg)
{
	if (!OidIsValid(relist_at_end) ||
		(event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT &&
		 event != XACT_EVENT_PREPARE))
		return;
	if (event == XACT_EVENT_ABORT)
		(void) database_ddl_hold(relist_at_end, 0, false);
	database_ddl_wake_launcher(true);
	relist_at_end = InvalidOid;
}

/*
 * Stop the relays of the database, up to DDL_STOP_WAIT_MS; the user may
 * cancel the wait.  What still runs afterwards is left to PostgreSQL's
 * own wait, and to its error if it does not end.
 */
static void
database_ddl_stop_relays(Oid dboid, Node *stmt)
{
	const char *what = NULL;
	const char *dbname = database_ddl_target(stmt, &what);
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz signalled = start;
	TimestampTz hold_until = TimestampTzPlusMilliseconds(start, DDL_HOLD_MS);

	if (!exit_callback_registered)
	{
		before_shmem_exit(database_ddl_on_exit, (Datum) 0);
		exit_callback_registered = true;
	}
	if (database_ddl_hold(dboid, hold_until, true) == 0)
		return;

	ereport(LOG,
			(errmsg("stopping the outbox_pg relays of database \"%s\" for %s",
					dbname, what),
			 errdetail("They start again when the statement is over; events they had leased are sent again after their lease.")));
	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		bool		signal = OutboxTimePassed(signalled, now, 1000);

		if (database_ddl_hold(dboid, hold_until, signal) == 0 ||
			OutboxTimePassed(start, now, DDL_STOP_WAIT_MS))
			break;
		if (signal)
			signalled = now;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* The next ProcessUtility: another extension's hook, or the standard one. */
static void
database_ddl_next(PlannedStmt *pstmt, const char *queryString,
				  bool readOnlyTree, ProcessUtilityContext context,
				  ParamListInfo params, QueryEnvironment *queryEnv,
				  DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree,
								context, params, queryEnv, dest, qc);
}

static void
database_ddl_process_utility(PlannedStmt *pstmt, const char *queryString,
							 bool readOnlyTree, ProcessUtilityContext context,
							 ParamListInfo params, QueryEnvironment *queryEnv,
							 DestReceiver *dest, QueryCompletion *qc)
{
	const char *what;
	const char *dbname = database_ddl_target(pstmt->utilityStmt, &what);
	Oid			dboid = InvalidOid;
	bool		drop = IsA(pstmt->utilityStmt, DropdbStmt);

	if (dbname != NULL)
		dboid = get_database_oid(dbname, true);
	if (!OidIsValid(dboid) || dboid == MyDatabaseId ||
		!database_ddl_allowed(dboid))
	{
		database_ddl_next(pstmt, queryString, readOnlyTree, context, params,
						  queryEnv, dest, qc);
		return;
	}

	PG_TRY();
	{
		/* cancelling the wait for the relays ends the hold too */
		database_ddl_stop_relays(dboid, pstmt->utilityStmt);
		database_ddl_next(pstmt, queryString, readOnlyTree, context, params,
						  queryEnv, dest, qc);
	}
	PG_CATCH();
	{
		/* a failed DROP may have left the database invalid: read again */
		(void) database_ddl_hold(dboid, 0, false);
		database_ddl_wake_launcher(drop);
		PG_RE_THROW();
	}
	PG_END_TRY();

	/* after a DROP the hold runs out (or goes with the slots) */
	if (!drop)
	{
		(void) database_ddl_hold(dboid, 0, false);
		database_ddl_wake_launcher(false);
	}
	if (drop || IsA(pstmt->utilityStmt, RenameStmt))
	{
		if (!xact_callback_registered)
		{
			RegisterXactCallback(database_ddl_xact_callback, NULL);
			xact_callback_registered = true;
		}
		relist_at_end = dboid;
	}
}

/*
 * Install the hook.  Called by _PG_init when the library is preloaded (the
 * relay slots exist only then).
 */
void
OutboxDatabaseDdlInit(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = database_ddl_process_utility;
}
