/*-------------------------------------------------------------------------
 *
 * version.c
 *		  Rolling upgrades: the library against the installed SQL objects.
 *
 * The upgrade order is: install the new files (library and scripts),
 * restart the server, then run ALTER EXTENSION outbox_pg UPDATE in every
 * database.  Between the restart and the UPDATE the new library runs
 * against the old SQL objects, so each side must know what it may do:
 *
 *	- outbox.emit() keeps working.  It writes outbox.events by column
 *	  position (the EV_* enum), and columns are only ever appended, so an
 *	  older table is a prefix of the enum: config.c accepts a table whose
 *	  columns match the enum as far as they go, and emit() leaves out the
 *	  columns the table does not have yet (they belong to features the old
 *	  SQL objects do not offer).  Applications keep committing events
 *	  while the upgrade is pending.
 *	- The relay does not deliver.  Its statements, and whatever later
 *	  versions add to a cycle (new tables, functions, columns), are written
 *	  for the SQL objects of its own version, and no general rule says
 *	  which of them an older schema supports.  So the relay compares the
 *	  installed extension version with the library's at the start of every
 *	  transaction and, when they differ, skips the cycle: the state shown
 *	  by outbox.workers() is "waiting for update", last_error says which
 *	  versions differ, and the server log says so once per version.
 *	  Nothing is lost: events stay pending and are delivered as soon as
 *	  ALTER EXTENSION UPDATE commits (the relay polls, so no restart is
 *	  needed).  Results of requests already in flight when the versions
 *	  start to differ are not recorded; those events are sent again after
 *	  their lease, with the same message id.
 *
 * Reading the version costs one index lookup in pg_extension, the same as
 * the existence check it replaces.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/version.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "outbox_pg.h"
#include "shmem.h"
#include "worker/worker.h"

/* the version last reported as different, so the log says it once */
static char reported_version[64] = "";

/*
 * The installed version of outbox_pg in the current database, palloc'd
 * in the current memory context, or NULL when the extension is not
 * installed.  Needs a transaction.
 */
char *
OutboxInstalledVersion(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum("outbox_pg"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		version = isnull ? pstrdup("") : TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Can the relay run a cycle against the SQL objects installed in its
 * database?  Sets *missing when the extension is not installed.  When the
 * installed version is not the library's, records why in the slot and logs
 * it once per version, and returns false.
 */
bool
OutboxRelayVersionMatches(RelaySlot *slot, bool *missing)
{
	char	   *version = OutboxInstalledVersion();
	char		error[OUTBOX_ERROR_LEN];

	*missing = (version == NULL);
	if (version == NULL)
		return false;
	if (strcmp(version, OUTBOX_VERSION) == 0)
	{
		reported_version[0] = '\0';
		return true;
	}

	snprintf(error, sizeof(error),
			 "extension outbox_pg is at version %s, the library at %s: run ALTER EXTENSION outbox_pg UPDATE",
			 version, OUTBOX_VERSION);
	if (strcmp(reported_version, version) != 0)
	{
		char	   *dbname = get_database_name(MyDatabaseId);

		strlcpy(reported_version, version, sizeof(reported_version));
		OutboxSlotSetError(slot, error);
		ereport(LOG,
				(errmsg("outbox_pg relay for database \"%s\" is waiting: extension outbox_pg is at version %s, the library at %s",
						dbname, version, OUTBOX_VERSION),
				 errdetail("Events are kept and emit() keeps working; nothing is delivered until the versions match."),
				 errhint("Run ALTER EXTENSION outbox_pg UPDATE in database \"%s\".",
						 dbname)));
	}
	return false;
}
