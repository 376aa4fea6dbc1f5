/*-------------------------------------------------------------------------
 *
 * relay_state.c
 *		  The relay process's state and its transactions.
 *
 * relay.c (the process and its loop) and delivery.c (the events) both use
 * what is here, and this file uses neither, so the two never call each
 * other in a circle: relay.c drives delivery.c, and both begin and commit
 * their transactions here.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/relay_state.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/lockdefs.h"

#include "outbox_pg.h"
#include "shmem.h"
#include "worker/worker.h"
#include "worker/relay.h"

RelaySlot  *relay_slot = NULL;
HttpClient *relay_http = NULL;
MemoryContext relay_cycle_context = NULL;
char	   *relay_database_name = NULL;

/*
 * lease again then: a circuit's pause ends, another relay's probe expires
 * or a destination's claim waits for more events (delivery.c)
 */
TimestampTz relay_lease_again_at = 0;

bool		relay_outdated = false; /* the extension needs an UPDATE */
bool		relay_locked_out = false;	/* the last step found the tables locked */

/* The tables a relay cycle touches, in the order it locks them. */
static const OutboxTableLock relay_tables[] =
{
	{"streams", RowShareLock},
	{"batches", RowExclusiveLock},
	{"batch_acks", RowExclusiveLock},
	{"retries", RowExclusiveLock},
	{"dead_events", RowExclusiveLock},
	{OUTBOX_DESTINATIONS_TABLE, AccessShareLock},
	{OUTBOX_ROUTES_TABLE, AccessShareLock},
	{OUTBOX_CREDENTIALS_TABLE, AccessShareLock},
};

/* A relay transaction: the library's version, then the tables, NOWAIT. */
static const WorkerStepSpec relay_step =
{
	WORKER_CHECK_VERSION, OUTBOX_SCHEMA, relay_tables, lengthof(relay_tables),
	NULL
};

/*
 * Begin a relay transaction (a worker step, step.c).  Returns false when
 * the cycle must be skipped, its transaction already committed; sets
 * *missing when the extension is not installed at all.  Used by this
 * file and by delivery.c, which ends a begun step with relay_commit().
 */
bool
relay_begin(bool *missing)
{
	WorkerStepSkip skip;
	bool		begun;

	/* ha: deliver only with the SQL objects of this library's version */
	begun = WorkerStepBegin(&relay_step, relay_slot, &skip);
	*missing = (skip == WORKER_STEP_NO_EXTENSION);
	relay_outdated = (skip == WORKER_STEP_OUTDATED);
	relay_locked_out = (skip == WORKER_STEP_LOCKED);
	return begun;
}

/* Commit a relay transaction; nothing to do after a skipped begin. */
void
relay_commit(void)
{
	WorkerStepCommit();
}
