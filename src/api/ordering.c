/*-------------------------------------------------------------------------
 *
 * ordering.c
 *		  Per-aggregate ordering: the emit-side lock that makes it gap safe.
 *
 * A destination is ordered when its options say "ordering": "aggregate".
 * For such a destination no event of an aggregate (destination,
 * aggregate_id) is sent while an earlier event of the same aggregate is
 * unacknowledged: in flight, waiting for a retry, or (policy "block")
 * dead-lettered and not released.  Other aggregates keep flowing, on every
 * relay worker.  Events without an aggregate_id are not ordered.
 *
 * emit() marks an event of an ordered destination by copying its
 * aggregate id into ordering_key; only marked events are ordered, and only
 * they enter the index the lease probes (events_ordering_idx), so events of
 * unordered destinations pay nothing for the feature.  Switching ordering
 * on applies to events emitted from then on; switching it off takes effect
 * at the next lease.
 *
 * Emit order of an aggregate is the order of its message ids: ids are
 * UUIDv7, strictly increasing within a backend, and the lock below makes
 * the emits of one aggregate from different backends happen one after the
 * other (assuming the system clock does not step back by more than the
 * time between two such commits).
 *
 * The lease (store.c, lease_sql) takes only the head of each aggregate:
 * the pending row with no earlier pending row of the same ordering_key.
 *
 *	- Several workers: a worker can only take row 2 of an aggregate when
 *	  its snapshot no longer shows row 1 as pending, i.e. after row 1's
 *	  acknowledgement (or dead letter) committed.  While another worker's
 *	  lease of row 1 is uncommitted, row 1 is still pending in every
 *	  snapshot (so row 2 is no head) and its row lock makes FOR UPDATE SKIP
 *	  LOCKED pass over row 1 itself; once that lease commits, row 1 is
 *	  pending but not due (leased_until), which again keeps row 2 from being
 *	  a head.  A row locked after a concurrent update is rechecked against
 *	  its new version (EvalPlanQual), so a just-leased row is never leased
 *	  twice.  SKIP LOCKED alone could not give this: it only hides row 1.
 *
 *	- Gap safety: message ids and created_at are assigned before commit
 *	  and transactions commit in any order.  If T1 emits A/1 and T2 then
 *	  emits A/2 but commits first, a lease between the two commits would
 *	  see A/2 as the head and send it before A/1.  So emit() for an ordered
 *	  destination takes a transaction-scoped lock on (database, destination,
 *	  aggregate_id) before it generates the id.  T2 waits in emit() until T1
 *	  commits or aborts; T1's commit is visible to every new snapshot before
 *	  its locks are released (ProcArrayEndTransaction precedes the lock
 *	  release in CommitTransaction), so every snapshot that sees A/2 also
 *	  sees A/1 (or T1 aborted and A/1 never existed).  Per aggregate,
 *	  commit order is emit order, and the head test never meets a gap.
 *	  specs/order_gap.spec proves it; specs/order_lease.spec proves the
 *	  several-workers case.
 *
 * The lock is a heavyweight advisory lock (pg_locks shows it as locktype
 * "advisory" with objsubid 28751) keyed by a 64-bit hash of the
 * destination and aggregate id; a hash collision only serialises two
 * unrelated aggregates' emits.  Transactions that emit for several
 * aggregates of an ordered destination in opposite orders can deadlock;
 * PostgreSQL detects it and aborts one of them, as it would for row locks.
 * Rows inserted without emit(), and events routed to a destination after
 * the fact (outbox._route_pending), do not take the lock.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/ordering.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"

#include "outbox_pg.h"
#include "api/api.h"

/* field4 of our advisory lock tags; pg_advisory_lock() uses 1 and 2 */
#define ORDERING_LOCK_CLASS		0x704F	/* 28751 */
#define EVENT_ID_LOCK_CLASS		0x7049	/* 28745: OutboxLockEventId */

/* An advisory lock of ours, until the end of the transaction. */
static void
outbox_lock_key(uint64 key, uint16 lock_class)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (key >> 32), (uint32) key,
						 lock_class);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/*
 * Serialise, until the end of the transaction, the emits of one aggregate
 * of an ordered destination.  Called by emit() before it assigns the id.
 */
void
OutboxLockAggregate(const char *destination, const char *aggregate_id)
{
	size_t		dlen = strlen(destination);
	size_t		alen = strlen(aggregate_id);
	uint64		h;

	h = hash_bytes_extended((const unsigned char *) destination, (int) dlen, 0);
	h = hash_bytes_extended((const unsigned char *) aggregate_id, (int) alen, h);
	outbox_lock_key(h, ORDERING_LOCK_CLASS);
}

/*
 * Serialise, until the end of the transaction, the inserts that give one
 * event id (api/emit.c, emit_check_new_id).
 */
void
OutboxLockEventId(const pg_uuid_t *id)
{
	outbox_lock_key(hash_bytes_extended(id->data, UUID_LEN, 0),
					EVENT_ID_LOCK_CLASS);
}
