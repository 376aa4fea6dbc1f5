/*-------------------------------------------------------------------------
 *
 * wake.c
 *		  Wake the relay when a transaction that emitted events commits.
 *
 * emit() calls OutboxWakeAtCommit(), which sets a backend-local flag and,
 * once per backend, registers a transaction callback.  At
 * XACT_EVENT_COMMIT — after the commit is durable and visible — the
 * callback sets the latch of every relay of this database, so delivery
 * starts within microseconds instead of at the next poll.  A rollback
 * clears the flag and wakes nobody.  The callback must not fail or
 * allocate: it only reads shared memory and sets latches.
 *
 * If no relay runs for this database (the extension was just created, or
 * its worker exited), the callback asks the launcher to start one.
 *
 * Events inserted without emit() (COPY, a restore, 2PC committed later by
 * COMMIT PREPARED in another session) are found by the poll.
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

#include "outbox_pg.h"
#include "shmem.h"
#include "api/api.h"
#include "worker/worker.h"

static bool wake_pending = false;
static bool wake_callback_registered = false;

static void
wake_xact_callback(XactEvent event, void *arg)
{
	bool		found = false;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			wake_pending = false;
			return;
		default:
			return;
	}

	if (!wake_pending)
		return;
	wake_pending = false;

	if (outbox_shared == NULL)
		return;

	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot->dboid == MyDatabaseId && slot->pid != 0)
		{
			OutboxSetLatchByProcno(slot->procno);
			found = true;
		}
	}
	/* ask once; the launcher clears the request when it has looked */
	if (!found && outbox_shared->launcher_wanted_db != MyDatabaseId)
	{
		outbox_shared->launcher_wanted_db = MyDatabaseId;
		OutboxSetLatchByProcno(outbox_shared->launcher_procno);
	}
}

void
OutboxWakeAtCommit(void)
{
	if (!wake_callback_registered)
	{
		RegisterXactCallback(wake_xact_callback, NULL);
		wake_callback_registered = true;
	}
	wake_pending = true;
}
