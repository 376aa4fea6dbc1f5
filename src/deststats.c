/*-------------------------------------------------------------------------
 *
 * deststats.c
 *		  Per-destination runtime state of the relays, in shared memory, and
 *		  outbox.destination_runtime() that reads it.
 *
 * What only the relays know — requests in flight, circuit breakers, the
 * results and latency of recent requests — is published here so that SQL
 * can see it.  One fixed array of entries, keyed by (database oid,
 * destination name), lives in shared memory.
 *
 * Design notes:
 *
 *	- A relay attaches to the entry of a destination once (when it first
 *	  sees the destination) and keeps the pointer for its lifetime.
 *	  Attaching takes this file's own LWLock; nothing else does, so no
 *	  relay ever takes a lock shared with other parts per event.  An entry
 *	  that no running relay is attached to may be reused for another
 *	  destination when the array is full (the least recently used first);
 *	  its counters then start over, like a counter after a restart.
 *	- In-flight counts and circuit states are kept per relay slot: each
 *	  relay writes only its own cells (plain aligned stores, no lock), the
 *	  readers sum them, and a relay clears its cells when it exits, so a
 *	  relay that stopped never leaves a count or an open circuit behind.
 *	- Results (status class, outcome, latency) go under the entry's
 *	  spinlock: a few additions, once per completed request.  Recent
 *	  counts are kept in 5-second buckets over the last minute.
 *	- Circuit transitions are logged at most once a minute per destination
 *	  across all relays of the database (see OutboxDestStatsSetCircuit), so
 *	  a flapping destination cannot flood the server log.
 *
 * Everything here describes the life of the running server: counters
 * start at zero when the server starts.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/deststats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"

/* Most destinations tracked in the whole cluster (all databases). */
#define DESTSTATS_MAX			512

/* Recent results: 12 buckets of 5 seconds = the last minute. */
#define RECENT_BUCKETS			12
#define RECENT_BUCKET_USECS		(5 * USECS_PER_SEC)

/* A circuit transition is logged at most this often per destination. */
#define CIRCUIT_LOG_INTERVAL_MS 60000

typedef enum ResultClass
{
	CLASS_2XX = 0,
	CLASS_3XX,
	CLASS_4XX,
	CLASS_5XX,
	CLASS_ERROR,				/* no HTTP answer: network error, timeout */
	NCLASSES
} ResultClass;

typedef struct RecentBucket
{
	int64		epoch;			/* time / RECENT_BUCKET_USECS it counts */
	uint32		counts[NCLASSES];
	uint32		latency_n;
	uint64		latency_us;
	uint32		latency_max_us;
} RecentBucket;

struct DestStats
{
	/* set under deststats_lock; dboid InvalidOid when free */
	Oid			dboid;
	char		name[NAMEDATALEN];
	uint64		attached;		/* bit per relay slot attached to it */
	TimestampTz last_used;

	/* per relay slot, written only by that relay */
	int32		in_flight[OUTBOX_MAX_RELAYS];
	TimestampTz circuit_open_until[OUTBOX_MAX_RELAYS];	/* 0: closed */

	/* under mutex */
	slock_t		mutex;
	TimestampTz last_success_at;
	TimestampTz last_failure_at;
	TimestampTz last_circuit_log_at;
	bool		circuit_logged; /* the last opening was logged */
	uint64		responses[NCLASSES];
	uint64		outcomes[3];	/* by DeliveryOutcome */
	uint64		latency_us;
	uint64		latency_n;
	RecentBucket recent[RECENT_BUCKETS];
};

typedef struct DestStatsShared
{
	LWLock	   *lock;
	DestStats	entries[DESTSTATS_MAX];
} DestStatsShared;

static DestStatsShared *deststats = NULL;
static TimestampTz last_full_warning = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
deststats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(DestStatsShared)));
	RequestNamedLWLockTranche("outbox_pg destinations", 1);
}

static void
deststats_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	deststats = ShmemInitStruct("outbox_pg destinations",
								sizeof(DestStatsShared), &found);
	if (!found)
	{
		memset(deststats, 0, sizeof(DestStatsShared));
		deststats->lock = &(GetNamedLWLockTranche("outbox_pg destinations"))->lock;
		for (int i = 0; i < DESTSTATS_MAX; i++)
			SpinLockInit(&deststats->entries[i].mutex);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
OutboxDestStatsShmemInit(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = deststats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = deststats_shmem_startup;
}

static void
deststats_reset(DestStats *ds, Oid dboid, const char *name)
{
	ds->dboid = dboid;
	strlcpy(ds->name, name, NAMEDATALEN);
	ds->attached = 0;
	memset(ds->in_flight, 0, sizeof(ds->in_flight));
	memset(ds->circuit_open_until, 0, sizeof(ds->circuit_open_until));
	SpinLockAcquire(&ds->mutex);
	ds->last_success_at = 0;
	ds->last_failure_at = 0;
	ds->last_circuit_log_at = 0;
	ds->circuit_logged = false;
	memset(ds->responses, 0, sizeof(ds->responses));
	memset(ds->outcomes, 0, sizeof(ds->outcomes));
	ds->latency_us = 0;
	ds->latency_n = 0;
	memset(ds->recent, 0, sizeof(ds->recent));
	SpinLockRelease(&ds->mutex);
}

/*
 * The entry of a destination of this database for the relay in slot
 * `slot`, created if needed; NULL when every entry is in use by running
 * relays (logged at most once a minute; the relay works on unobserved).
 */
DestStats *
OutboxDestStatsAttach(int slot, const char *name)
{
	DestStats  *result = NULL;
	DestStats  *victim = NULL;
	TimestampTz now = GetCurrentTimestamp();

	if (deststats == NULL || slot < 0 || slot >= OUTBOX_MAX_RELAYS)
		return NULL;

	LWLockAcquire(deststats->lock, LW_EXCLUSIVE);
	for (int i = 0; i < DESTSTATS_MAX && result == NULL; i++)
	{
		DestStats  *ds = &deststats->entries[i];

		if (ds->dboid == MyDatabaseId && strcmp(ds->name, name) == 0)
			result = ds;
		else if (!OidIsValid(ds->dboid))
		{
			if (victim == NULL || OidIsValid(victim->dboid))
				victim = ds;
		}
		else if (ds->attached == 0 &&
				 (victim == NULL ||
				  (OidIsValid(victim->dboid) && ds->last_used < victim->last_used)))
			victim = ds;
	}
	if (result == NULL && victim != NULL)
	{
		deststats_reset(victim, MyDatabaseId, name);
		result = victim;
	}
	if (result != NULL)
	{
		result->attached |= UINT64CONST(1) << slot;
		result->last_used = now;
	}
	LWLockRelease(deststats->lock);

	if (result == NULL &&
		TimestampDifferenceExceeds(last_full_warning, now, 60000))
	{
		last_full_warning = now;
		ereport(LOG,
				(errmsg("outbox_pg tracks at most %d destinations; \"%s\" is relayed without runtime statistics",
						DESTSTATS_MAX, name)));
	}
	return result;
}

void
OutboxDestStatsSetInFlight(DestStats *ds, int slot, int n)
{
	if (ds != NULL)
		ds->in_flight[slot] = n;
}

static ResultClass
deststats_class(int status)
{
	if (status >= 200 && status < 300)
		return CLASS_2XX;
	if (status >= 300 && status < 400)
		return CLASS_3XX;
	if (status >= 400 && status < 500)
		return CLASS_4XX;
	if (status >= 500 && status < 600)
		return CLASS_5XX;
	return CLASS_ERROR;
}

/*
 * Count one completed request: its HTTP status (0: no answer), what the
 * relay made of it, and how long it took.
 */
void
OutboxDestStatsRecordResult(DestStats *ds, TimestampTz now, int status,
							DeliveryOutcome outcome, int64 duration_us)
{
	ResultClass cls = deststats_class(status);
	int64		epoch = now / RECENT_BUCKET_USECS;
	RecentBucket *b;

	if (ds == NULL)
		return;
	duration_us = Max(duration_us, 0);
	SpinLockAcquire(&ds->mutex);
	ds->responses[cls]++;
	ds->outcomes[outcome]++;
	ds->latency_us += duration_us;
	ds->latency_n++;
	if (outcome == OUTCOME_ACK)
		ds->last_success_at = now;
	else
		ds->last_failure_at = now;
	b = &ds->recent[epoch % RECENT_BUCKETS];
	if (b->epoch != epoch)
		memset(b, 0, sizeof(RecentBucket));
	b->epoch = epoch;
	b->counts[cls]++;
	b->latency_n++;
	b->latency_us += duration_us;
	b->latency_max_us = Max(b->latency_max_us, (uint32) Min(duration_us, PG_UINT32_MAX));
	SpinLockRelease(&ds->mutex);
}

/*
 * Publish the circuit state of the relay in `slot`: open until
 * open_until, or closed (0).  Returns true when the transition should be
 * logged: an opening when no opening of this destination was logged in
 * the last minute, a closing when its opening was logged and no other
 * relay still has the circuit open.
 */
bool
OutboxDestStatsSetCircuit(DestStats *ds, int slot, TimestampTz open_until)
{
	bool		was_open;
	bool		any_open = false;
	bool		log_it = false;
	TimestampTz now;

	if (ds == NULL)
		return true;
	was_open = (ds->circuit_open_until[slot] != 0);
	ds->circuit_open_until[slot] = open_until;
	if (was_open == (open_until != 0))
		return false;

	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
		if (ds->circuit_open_until[i] != 0)
			any_open = true;
	now = GetCurrentTimestamp();
	SpinLockAcquire(&ds->mutex);
	if (open_until != 0 &&
		TimestampDifferenceExceeds(ds->last_circuit_log_at, now,
								   CIRCUIT_LOG_INTERVAL_MS))
	{
		ds->last_circuit_log_at = now;
		ds->circuit_logged = true;
		log_it = true;
	}
	else if (open_until == 0 && !any_open && ds->circuit_logged)
	{
		ds->circuit_logged = false;
		log_it = true;
	}
	SpinLockRelease(&ds->mutex);
	return log_it;
}

/*
 * A relay exits: its in-flight counts and circuits are no more, and it no
 * longer holds its entries.
 */
void
OutboxDestStatsRelayExit(int slot)
{
	if (deststats == NULL || slot < 0 || slot >= OUTBOX_MAX_RELAYS)
		return;
	LWLockAcquire(deststats->lock, LW_EXCLUSIVE);
	for (int i = 0; i < DESTSTATS_MAX; i++)
	{
		DestStats  *ds = &deststats->entries[i];

		ds->in_flight[slot] = 0;
		ds->circuit_open_until[slot] = 0;
		ds->attached &= ~(UINT64CONST(1) << slot);
	}
	LWLockRelease(deststats->lock);
}

/*
 * outbox.destination_runtime(): one row per destination of the current
 * database that a relay has worked on since the server started.  Empty
 * when the library is not preloaded (then there is no relay either).
 */
PG_FUNCTION_INFO_V1(outbox_destination_runtime);

#define RUNTIME_COLS 23

Datum
outbox_destination_runtime(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTimestamp();
	int64		epoch = now / RECENT_BUCKET_USECS;

	InitMaterializedSRF(fcinfo, 0);
	if (deststats == NULL)
		return (Datum) 0;

	LWLockAcquire(deststats->lock, LW_SHARED);
	for (int i = 0; i < DESTSTATS_MAX; i++)
	{
		DestStats  *ds = &deststats->entries[i];
		Datum		values[RUNTIME_COLS];
		bool		nulls[RUNTIME_COLS];
		int64		in_flight = 0;
		TimestampTz open_until = 0;
		TimestampTz last_success_at;
		TimestampTz last_failure_at;
		uint64		responses[NCLASSES];
		uint64		outcomes[3];
		uint64		latency_us;
		uint64		latency_n;
		uint64		recent[NCLASSES] = {0};
		uint64		recent_n = 0;
		uint64		recent_us = 0;
		uint32		recent_max_us = 0;
		const char *circuit;
		int			c = 0;

		if (ds->dboid != MyDatabaseId)
			continue;
		for (int s = 0; s < OUTBOX_MAX_RELAYS; s++)
		{
			int32		n = ds->in_flight[s];
			TimestampTz until = ds->circuit_open_until[s];

			in_flight += Max(n, 0);
			open_until = Max(open_until, until);
		}

		SpinLockAcquire(&ds->mutex);
		last_success_at = ds->last_success_at;
		last_failure_at = ds->last_failure_at;
		memcpy(responses, ds->responses, sizeof(responses));
		memcpy(outcomes, ds->outcomes, sizeof(outcomes));
		latency_us = ds->latency_us;
		latency_n = ds->latency_n;
		for (int b = 0; b < RECENT_BUCKETS; b++)
		{
			RecentBucket *rb = &ds->recent[b];

			if (rb->epoch <= epoch - RECENT_BUCKETS || rb->epoch > epoch)
				continue;
			for (int k = 0; k < NCLASSES; k++)
				recent[k] += rb->counts[k];
			recent_n += rb->latency_n;
			recent_us += rb->latency_us;
			recent_max_us = Max(recent_max_us, rb->latency_max_us);
		}
		SpinLockRelease(&ds->mutex);

		if (open_until == 0)
			circuit = "closed";
		else if (now < open_until)
			circuit = "open";
		else
			circuit = "half-open";

		memset(nulls, false, sizeof(nulls));
		values[c++] = CStringGetTextDatum(ds->name);
		values[c++] = Int64GetDatum(in_flight);
		values[c++] = CStringGetTextDatum(circuit);
		values[c] = TimestampTzGetDatum(open_until);
		nulls[c++] = (open_until == 0);
		values[c] = TimestampTzGetDatum(last_success_at);
		nulls[c++] = (last_success_at == 0);
		values[c] = TimestampTzGetDatum(last_failure_at);
		nulls[c++] = (last_failure_at == 0);
		for (int k = 0; k < NCLASSES; k++)
			values[c++] = Int64GetDatum((int64) recent[k]);
		values[c] = Float8GetDatum(recent_n ? (double) recent_us / recent_n / 1000.0 : 0);
		nulls[c++] = (recent_n == 0);
		values[c] = Float8GetDatum(recent_max_us / 1000.0);
		nulls[c++] = (recent_n == 0);
		for (int k = 0; k < NCLASSES; k++)
			values[c++] = Int64GetDatum((int64) responses[k]);
		values[c++] = Int64GetDatum((int64) outcomes[OUTCOME_ACK]);
		values[c++] = Int64GetDatum((int64) outcomes[OUTCOME_RETRY]);
		values[c++] = Int64GetDatum((int64) outcomes[OUTCOME_DEAD]);
		values[c++] = Int64GetDatum((int64) latency_n);
		values[c++] = Float8GetDatum((double) latency_us / 1000000.0);
		Assert(c == RUNTIME_COLS);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(deststats->lock);
	return (Datum) 0;
}
