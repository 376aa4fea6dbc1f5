/*-------------------------------------------------------------------------
 *
 * shmem.h
 *		  Shared memory: worker slots and the launcher's latch (shmem.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/shmem.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHMEM_H
#define OUTBOX_SHMEM_H

#include "port/atomics.h"
#include "storage/lwlock.h"

#include "outbox_pg.h"

/*
 * Emitted generations (issue #19, README.store section 4): a commit that
 * emitted events for a destination bumps the counter at
 * OutboxEmitCounterIndex(database, destination) (wake.c); a relay claims a
 * destination only when its counter moved since its last claim that found
 * nothing more (or for the other reasons delivery.c lists).  A fixed
 * array: two destinations that share a counter only cost each other a
 * claim that finds nothing.  8,192 counters are 64 kB of shared memory.
 */
#define OUTBOX_EMIT_COUNTERS	8192

/* shmem.c */
typedef enum RelayState
{
	RELAY_FREE = 0,				/* slot unused */
	RELAY_STARTING,				/* registered, not connected yet */
	RELAY_IDLE,					/* nothing due; waiting for a wake-up or poll */
	RELAY_WORKING,				/* leasing, sending or recording */
	RELAY_NO_EXTENSION,			/* database has no outbox_pg; exited */
	RELAY_ERROR,				/* last cycle failed; retrying after a pause */
	RELAY_STOPPED,				/* exited */
	RELAY_OUTDATED				/* extension older than the library */
} RelayState;

typedef struct RelaySlot
{
	Oid			dboid;			/* database served, InvalidOid if free */
	int			worker_number;	/* 0 .. workers_per_database - 1 */
	pid_t		pid;			/* 0 unless running */
	int			procno;			/* for SetLatch; -1 unless running */
	RelayState	state;
	TimestampTz started_at;
	TimestampTz last_cycle_at;
	TimestampTz retry_after;	/* launcher: do not restart before */
	TimestampTz held_until;		/* a statement needs dboid without sessions
								 * (api/database_ddl.c): no relay starts
								 * before, 0: not held */
	pid_t		held_by;		/* the backend that holds it */
	bool		stopped_for_ddl;	/* its relay was stopped for such a
									 * statement: not a failure */
	int			in_flight;		/* requests currently in flight */
	pg_atomic_uint64 published;
	pg_atomic_uint64 failed;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_ERROR_LEN];
	bool		absence_logged; /* "extension not installed" was logged for
								 * dboid: quiet until the relay finds it */
	pg_atomic_uint64 config_generation; /* bumped by every commit that
										 * changed dboid's destinations,
										 * credentials or routes (wake.c) */

	pg_atomic_uint64 wake_generation;	/* bumped by every commit that woke
										 * the relays of dboid without naming
										 * its destinations (wake.c) */
	pg_atomic_uint64 emitted_generation;	/* bumped by every commit that
											 * bumped emitted counters for
											 * dboid, or woke untagged */
	pg_atomic_uint64 sweep_due_at;	/* worker 0: when its next periodic
									 * sweep is due, a TimestampTz; 0: not
									 * swept yet (delivery.c) */
	pg_atomic_uint64 prepared_generation;	/* bumped by every PREPARE
											 * TRANSACTION of dboid that
											 * emitted events (wake.c) */

	/*
	 * Worker 0 only: the last result of the log's rotation (retention.c,
	 * OutboxRotateLog): "rotated", "wait" (not due), "busy" (another
	 * transaction holds the rotation row), "never" (outbox.retention = -1),
	 * or why it is blocked: "writer" (a transaction that may still write to
	 * the slot to be truncated is running), "locked" (a reader such as
	 * pg_dump holds a lock on that slot), "unacknowledged: <destination>"
	 * (that destination's position or unacknowledged batch still needs
	 * rows of the slot: a paused, failing or slow destination), or
	 * "failed: <error>".  rotation_blocked_since: when the current run of
	 * blocked results began (0 while not blocked).
	 */
	char		rotation[OUTBOX_ERROR_LEN];
	TimestampTz rotation_checked_at;
	TimestampTz rotated_at;
	TimestampTz rotation_blocked_since;
} RelaySlot;

typedef struct OutboxShared
{
	LWLock	   *lock;
	pid_t		launcher_pid;
	int			launcher_procno;
	Oid			launcher_wanted_db; /* a commit found no relay for this db */
	bool		launcher_relist;	/* a database was dropped: read
									 * pg_database again now */
	RelaySlot	slots[OUTBOX_MAX_RELAYS];
	pg_atomic_uint64 emitted[OUTBOX_EMIT_COUNTERS];	/* see above */
} OutboxShared;

extern OutboxShared *outbox_shared;

extern void OutboxShmemInit(void);
extern void OutboxSetLatchByProcno(int procno);
extern void OutboxWakeRelays(uint64 slots);
extern RelaySlot *OutboxFirstRelaySlot(Oid dboid);
extern void OutboxSlotSetState(RelaySlot *slot, RelayState state);
extern void OutboxSlotSetError(RelaySlot *slot, const char *error);
extern void OutboxSlotSetRotation(RelaySlot *slot, const char *result,
								  bool blocked, TimestampTz now);
extern const char *OutboxRelayStateName(RelayState state);
extern int	OutboxEmitCounterIndex(Oid dboid, const char *destination);

/* api/wake.c: emit() names its destination (the others are in api.h) */

#endif							/* OUTBOX_SHMEM_H */
