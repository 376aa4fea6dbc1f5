/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		  Shared state of the launcher and the relay workers.
 *
 * One fixed array of relay slots lives in shared memory.  The launcher
 * assigns a slot to each (database, worker number) it starts; the worker
 * fills in its pid and procno when it runs and clears them at exit.  A
 * slot holds only plain values and atomics: ids, a state, counters,
 * timestamps and a short last-error text — never pointers.
 *
 * Locking: the slot array is protected by one LWLock.  Writers (the
 * launcher assigning, a worker starting or stopping, a worker updating
 * its state) take it exclusively; the monitoring functions share it.  The
 * commit wake-up (wake.c) reads dboid/procno without the lock: a torn or
 * stale read can only cause a spurious or a missed wake-up, and the poll
 * interval covers a missed one.  Counters are atomics, so a worker never
 * takes the lock per event.  So is each slot's configuration generation,
 * which a commit that changed the destinations bumps (wake.c) and the
 * slot's relay compares with the one it loaded (delivery.c).
 *
 * This file owns the library's one pair of shared-memory hooks: the
 * request and startup hooks below also size and attach the destinations'
 * statistics and circuits (deststats.c), as pgstat does for its kinds.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/shmem.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"

#include "outbox_pg.h"
#include "shmem.h"
#include "peertext.h"
#include "deststats.h"

OutboxShared *outbox_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(OutboxShared)));
	RequestNamedLWLockTranche("outbox_pg", 1);
	OutboxDestStatsShmemRequest();
}

static void
outbox_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox_pg", sizeof(OutboxShared), &found);
	if (!found)
	{
		memset(outbox_shared, 0, sizeof(OutboxShared));
		outbox_shared->lock = &(GetNamedLWLockTranche("outbox_pg"))->lock;
		outbox_shared->launcher_procno = -1;
		for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
		{
			outbox_shared->slots[i].procno = -1;
			pg_atomic_init_u64(&outbox_shared->slots[i].published, 0);
			pg_atomic_init_u64(&outbox_shared->slots[i].failed, 0);
			pg_atomic_init_u64(&outbox_shared->slots[i].config_generation, 0);
			pg_atomic_init_u64(&outbox_shared->slots[i].wake_generation, 0);
			pg_atomic_init_u64(&outbox_shared->slots[i].prepared_generation, 0);
			pg_atomic_init_u64(&outbox_shared->slots[i].emitted_generation, 0);
			pg_atomic_init_u64(&outbox_shared->slots[i].sweep_due_at, 0);
		}
		for (int i = 0; i < OUTBOX_EMIT_COUNTERS; i++)
			pg_atomic_init_u64(&outbox_shared->emitted[i], 0);
	}
	OutboxDestStatsShmemStartup();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Install the library's only pair of shared-memory hooks (the request hook
 * exists from PostgreSQL 15 on; RequestAddinShmemSpace must be called from
 * it).  Called by _PG_init when the library is preloaded.
 */
void
OutboxShmemInit(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
}

/*
 * Set the latch of a process by its procno; safe in a commit callback
 * (no allocation, no error).
 */
void
OutboxSetLatchByProcno(int procno)
{
	if (procno >= 0 && procno < (int) ProcGlobal->allProcCount)
		SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}

/*
 * Set the latches of the running relays of a set of slots (a bit per slot
 * index).  A slot's procno is read without the lock: a stale one costs a
 * spurious wake-up or a missed one, which the poll interval covers.
 */
void
OutboxWakeRelays(uint64 slots)
{
	for (int i = 0; slots != 0 && i < OUTBOX_MAX_RELAYS; i++)
	{
		if ((slots & (UINT64CONST(1) << i)) == 0)
			continue;
		slots &= ~(UINT64CONST(1) << i);
		if (outbox_shared->slots[i].pid != 0)
			OutboxSetLatchByProcno(outbox_shared->slots[i].procno);
	}
}

/*
 * The slot of the database's relay worker 0 while it has a process, or
 * NULL.  Without outbox_shared->lock the fields may be changing; take it
 * (shared) to read several of them together.
 */
RelaySlot *
OutboxFirstRelaySlot(Oid dboid)
{
	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot->dboid == dboid && slot->pid != 0 && slot->worker_number == 0)
			return slot;
	}
	return NULL;
}

/*
 * Record a worker's state; the text is truncated to fit the slot.
 */
void
OutboxSlotSetState(RelaySlot *slot, RelayState state)
{
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	slot->state = state;
	LWLockRelease(outbox_shared->lock);
}

void
OutboxSlotSetError(RelaySlot *slot, const char *error)
{
	/* cut between characters, controls escaped (peertext.c) */
	char	   *safe = OutboxPeerText(error, strlen(error), false, NULL,
									  sizeof(slot->last_error) - 1);

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	strlcpy(slot->last_error, safe, sizeof(slot->last_error));
	slot->last_error_at = GetCurrentTimestamp();
	LWLockRelease(outbox_shared->lock);
	pfree(safe);
}

/* The emitted-generation counter of a destination of a database. */
int
OutboxEmitCounterIndex(Oid dboid, const char *destination)
{
	uint32		h = hash_bytes((const unsigned char *) destination,
							   (int) strlen(destination));

	h = hash_combine(h, hash_bytes_uint32((uint32) dboid));
	return (int) (h % OUTBOX_EMIT_COUNTERS);
}

/*
 * Worker 0's rotation result (see RelaySlot).  blocked: the result is a
 * reason the rotation could not truncate.
 */
void
OutboxSlotSetRotation(RelaySlot *slot, const char *result, bool blocked,
					  TimestampTz now)
{
	char	   *safe = OutboxPeerText(result, strlen(result), false, NULL,
									  sizeof(slot->rotation) - 1);

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	strlcpy(slot->rotation, safe, sizeof(slot->rotation));
	slot->rotation_checked_at = now;
	if (strcmp(result, "rotated") == 0)
		slot->rotated_at = now;
	if (!blocked)
		slot->rotation_blocked_since = 0;
	else if (slot->rotation_blocked_since == 0)
		slot->rotation_blocked_since = now;
	LWLockRelease(outbox_shared->lock);
	pfree(safe);
}

const char *
OutboxRelayStateName(RelayState state)
{
	switch (state)
	{
		case RELAY_FREE:
			return "free";
		case RELAY_STARTING:
			return "starting";
		case RELAY_IDLE:
			return "idle";
		case RELAY_WORKING:
			return "working";
		case RELAY_NO_EXTENSION:
			return "no extension";
		case RELAY_ERROR:
			return "error";
		case RELAY_STOPPED:
			return "stopped";
		case RELAY_OUTDATED:
			return "waiting for update";
	}
	return "unknown";
}
