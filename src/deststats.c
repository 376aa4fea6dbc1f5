/*-------------------------------------------------------------------------
 *
 * deststats.c
 *		  Per-destination runtime state of the relays, in shared memory, and
 *		  outbox.destination_runtime() that reads it.
 *
 * What only the relays know — requests in flight, circuit breakers, the
 * results and latency of recent requests — is published here so that SQL
 * can see it.  The entries live in a shared hash table keyed by (database
 * oid, destination name), of a fixed size: outbox.max_destinations
 * entries, all allocated at server start (1,128 bytes each, and the
 * table's own: about 1.2 MB per 1,000 destinations, which
 * docs/configuration.md states).  The table never grows.
 *
 * Design notes:
 *
 *	- A relay attaches to the entry of a destination when it loads the
 *	  destination (delivery.c) and keeps the pointer until it no longer
 *	  has the destination — deleted, or its row no longer usable — and
 *	  none of its events is alive any more (OutboxDestStatsDetach), or
 *	  until it exits (OutboxDestStatsRelayExit).  Attaching and detaching
 *	  take this file's own LWLock; nothing else does, so no relay ever
 *	  takes a lock shared with other parts per event.  Attaching is one
 *	  hash lookup.  An entry that no running relay is attached to stays,
 *	  with its circuit and counters, and is found again by the next relay
 *	  that loads the destination; when the table is full, such an entry
 *	  may be reused for another destination (the least recently used
 *	  first, and one whose circuit is closed before one whose circuit is
 *	  not).  Only then is the table scanned, and only when there is such
 *	  an entry (the count of unattached entries says so).  The reused
 *	  entry's counters start over, like a counter after a restart.
 *	- In-flight counts are kept per relay slot: each relay writes only its
 *	  own cells (plain aligned stores, no lock), the readers sum them, and
 *	  a relay clears its cells when it lets the entry go or exits.  They
 *	  are for the view only; the concurrency limit has cells of its own,
 *	  below.
 *	- Results (status class, outcome, latency) go under the entry's
 *	  spinlock: a few additions, once per completed request.  Recent
 *	  counts are kept in 5-second buckets over the last minute.
 *
 * The circuit breaker (one per destination, shared by every relay of the
 * database; its state lives under the entry's spinlock):
 *
 *	- Closed: events are leased as usual.  Every failed request that
 *	  counts against the destination (no answer, 429, 5xx; see
 *	  OutboxIsDestinationFailure) may count one "failed round".  A round
 *	  is what the relays sent before they could know the outcome: a
 *	  failure counts only when its request started after the previous
 *	  counted failure (round_counted_at).  Requests that were already in
 *	  flight then — the rest of a lease pass, another relay's batch — fail
 *	  for the same reason and add nothing, so 256 refused connections are
 *	  one round, not 256.  A success, from any relay, ends the run.
 *	- After options.circuit_threshold failed rounds in a row the circuit
 *	  opens for a pause of 1 s, doubling with every further failed round
 *	  up to outbox.circuit_max_pause.  While it is open no relay leases
 *	  events of the destination, so they neither fail nor use up attempts.
 *	- A failed answer with Retry-After opens it at once for that long
 *	  (OutboxCircuitHold), whatever the run; until then a success closes
 *	  it only if its request was sent after that answer came (held_at), and
 *	  a failed probe after the wait pauses it again.
 *	- When the pause ends the circuit is half-open: the first relay that
 *	  looks takes the probe (probe_pid, and probe_expires_at after the
 *	  request's timeout plus the lease margin, so the probe of a relay
 *	  that died or failed its cycle expires) and leases one event.  Other
 *	  relays keep off.  The probe failing counts one more round (it was
 *	  started after the last counted one) and reopens the circuit; any
 *	  success, the probe's or a late answer of an older request, closes it
 *	  for all relays at once, and the relay that saw it wakes the others.
 *	- Failures recorded while the circuit is open (the rest of the round
 *	  that opened it, and failed probes) are the destination's fault, not
 *	  the event's: relay.c gives their attempt back and makes them due at
 *	  once, so they go out as soon as the circuit closes.
 *	- The state is the destination's, not a relay's: it stays when a relay
 *	  exits or lets the destination go (only that relay's probe is
 *	  released).  An entry is reused only when no running relay is
 *	  attached to it, i.e. when no running relay of that database has the
 *	  destination loaded; if an open circuit is lost that way, the next
 *	  relay relearns it after circuit_threshold failed rounds — a few
 *	  requests, never an event.
 *	- Circuit transitions are logged at most once a minute per destination
 *	  (an opening; its closing is logged when its opening was), so a
 *	  flapping destination cannot flood the server log.
 *	- An entry that cannot be had (more than outbox.max_destinations
 *	  destinations, of all databases, loaded by running relays) means no
 *	  statistics and no circuit breaker for that destination: its events
 *	  retry one by one, as with circuit_threshold 0, and its concurrency
 *	  is split between the relays (see below).  That is logged, with a
 *	  hint to raise the setting.  The relay asks again at each load of
 *	  its destinations: an entry let go by then is taken.
 *
 * The concurrency of a destination (max_concurrency, shared by every relay
 * of the database; its state lives under the entry's spinlock):
 *
 *	- Each relay holds a number of the destination's slots (reserved[],
 *	  one cell per relay slot, and their sum reserved_total).  A relay
 *	  starts an event only while its events started and not yet answered
 *	  are fewer than the slots it holds (delivery.c), so the requests in
 *	  flight to the destination never exceed the sum, and the sum never
 *	  exceeds max_concurrency: it is only raised under the spinlock, by
 *	  what is free.  A batched request counts its events, so the limit
 *	  counts events, as it always did.
 *	- A relay settles its holding once per lease step and destination
 *	  (OutboxDestAdmit), together with the circuit's permit: one spinlock
 *	  acquisition, not one per event.  It asks for its events alive
 *	  (leased, not yet answered) plus what it would lease; it gets what is
 *	  free, gives back what it no longer needs (its events answered since
 *	  the last step), and never less than its requests in flight.  The
 *	  slots of an answered request are so given back at the relay's next
 *	  lease step, in the loop iteration after the answer.
 *	- Fair shares: a relay that got less than it asked for sets its bit in
 *	  wanting.  While other relays want more, a relay holds at most an
 *	  equal share of max_concurrency (or its events alive, if more: those
 *	  are never taken away), so a relay that came first cannot keep every
 *	  slot while another waits.  A relay that gives slots back while others
 *	  want them wakes those (their next lease step asks again).
 *	- A relay grows its holding in chunks of at least a quarter of
 *	  max_concurrency while it has events alive (as it leases), so that a
 *	  busy destination costs one lease per several completions; of an
 *	  eighth of the equal share while other relays want more.
 *	- The circuit's probe takes a slot like any event: a half-open
 *	  destination whose slots are all held by requests still in flight is
 *	  probed when one is free.
 *	- A relay's cells go when it lets the destination go or exits
 *	  (OutboxDestStatsDetach, OutboxDestStatsRelayExit), and a crash
 *	  restarts the cluster, so no slot outlives its holder.  Until
 *	  each relay has seen a change of max_concurrency, the relays may
 *	  count against different limits; a lowered limit is reached as the
 *	  requests in flight complete.
 *	- Without an entry (the table is full), a relay holds at most
 *	  max_concurrency / outbox.workers_per_database (at least 1) on its
 *	  own.
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
#include "port/pg_bitutils.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"
#include "guc.h"
#include "retry.h"
#include "shmem.h"
#include "deststats.h"
#include "destination/destination.h"
#include "util.h"

/* Recent results: 12 buckets of 5 seconds = the last minute. */
#define RECENT_BUCKETS			12
#define RECENT_BUCKET_USECS		(5 * USECS_PER_SEC)

/* A circuit transition is logged at most this often per destination. */
#define CIRCUIT_LOG_INTERVAL_MS 60000

/* The first pause of an opened circuit; it doubles up to the GUC's cap. */
#define CIRCUIT_FIRST_PAUSE_MS	1000

typedef enum ResultClass
{
	CLASS_2XX = 0,
	CLASS_3XX,
	CLASS_4XX,
	CLASS_5XX,
	CLASS_ERROR,				/* no HTTP answer: network error, timeout */
	NCLASSES
} ResultClass;

/*
 * One bucket of recent results; 40 bytes.  Its epoch, in 5-second units
 * since 2000, fits 32 bits until 2340.
 */
typedef struct RecentBucket
{
	int32		epoch;			/* time / RECENT_BUCKET_USECS it counts */
	uint32		counts[NCLASSES];
	uint32		latency_n;
	uint32		latency_max_us;
	uint64		latency_us;
} RecentBucket;

/* An entry's hash key: zeroed before it is filled in (compared whole). */
typedef struct DestStatsKey
{
	Oid			dboid;
	char		name[NAMEDATALEN];
} DestStatsKey;

struct DestStats
{
	DestStatsKey key;			/* the hash key: first */

	/* under deststats->lock */
	uint64		attached;		/* bit per relay slot attached to it */
	TimestampTz last_used;		/* last attached or let go */

	/* per relay slot, written only by that relay */
	int32		in_flight[OUTBOX_MAX_RELAYS];

	/* under mutex */
	slock_t		mutex;
	TimestampTz last_success_at;
	TimestampTz last_failure_at;

	/* the circuit, shared by the relays of the database (see above) */
	int			failed_rounds;	/* consecutive; 0 after any success */
	TimestampTz round_counted_at;	/* when the last failed round counted */
	TimestampTz open_until;		/* 0: closed; past: half-open */
	TimestampTz held_at;		/* when an answer's Retry-After opened it */
	pid_t		probe_pid;		/* relay whose probe is out, 0: none */
	TimestampTz probe_expires_at;
	TimestampTz last_circuit_log_at;
	bool		circuit_logged; /* the last opening was logged */
	TimestampTz clock_read_at;	/* the latest reading the times above
								 * came from (deststats_clock_back) */

	/*
	 * The concurrency, shared by the relays of the database (see above).
	 * A cell holds at most max_concurrency, which the table keeps within
	 * 1,000 (and OutboxDestAdmit within PG_INT16_MAX).
	 */
	int16		reserved[OUTBOX_MAX_RELAYS];	/* slots each relay holds */
	int32		reserved_total; /* their sum */
	uint64		wanting;		/* bit per relay slot short of what it asked */

	uint64		responses[NCLASSES];
	uint64		outcomes[3];	/* by DeliveryOutcome */
	uint64		latency_us;
	uint64		latency_n;
	RecentBucket recent[RECENT_BUCKETS];
};

typedef struct DestStatsShared
{
	LWLock	   *lock;
	int			unattached;		/* entries no running relay is attached to */
} DestStatsShared;

static DestStatsShared *deststats = NULL;
static HTAB *deststats_hash = NULL;
static TimestampTz last_full_warning = 0;

static Size deststats_shmem_size(void);
static bool deststats_better_victim(DestStats *a, DestStats *b);
static DestStats *deststats_victim(void);
static uint64 deststats_release(DestStats *ds, int slot, TimestampTz now);
static ResultClass deststats_class(int status);

/* The shared memory of the entries (outbox.max_destinations) */
static Size
deststats_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(DestStatsShared)),
					hash_estimate_size(outbox_max_destinations,
									   sizeof(DestStats)));
}

/* Called from shmem.c's request hook. */
void
OutboxDestStatsShmemRequest(void)
{
	RequestAddinShmemSpace(deststats_shmem_size());
	RequestNamedLWLockTranche("outbox_pg destinations", 1);
}

/*
 * Called from shmem.c's startup hook, under AddinShmemInitLock.  Every
 * entry is allocated here, and HASH_FIXED_SIZE keeps the table from
 * taking more: entering one more key into a full table fails
 * (HASH_ENTER_NULL) instead of eating into the shared memory of others.
 */
void
OutboxDestStatsShmemStartup(void)
{
	bool		found;
	HASHCTL		info;

	deststats = ShmemInitStruct("outbox_pg destinations",
								sizeof(DestStatsShared), &found);
	if (!found)
	{
		memset(deststats, 0, sizeof(DestStatsShared));
		deststats->lock = &(GetNamedLWLockTranche("outbox_pg destinations"))->lock;
	}

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(DestStatsKey);
	info.entrysize = sizeof(DestStats);
	deststats_hash = ShmemInitHash("outbox_pg destination entries",
								   outbox_max_destinations,
								   outbox_max_destinations,
								   &info,
								   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/*
 * Is the unattached entry a a better one to reuse than b?  One whose
 * circuit is closed goes before one whose circuit is not (losing an open
 * circuit costs circuit_threshold failed rounds when the destination is
 * seen again), then the least recently used.  The circuit is read without
 * the spinlock: a stale answer only changes which entry is reused.
 */
static bool
deststats_better_victim(DestStats *a, DestStats *b)
{
	bool		a_open = (a->open_until != 0);
	bool		b_open = (b->open_until != 0);

	if (a_open != b_open)
		return !a_open;
	return a->last_used < b->last_used;
}

/*
 * The unattached entry to reuse in a full table (see
 * deststats_better_victim), or NULL.  Scans the whole table: called only
 * when it is full and has such an entry.  Under deststats->lock.
 */
static DestStats *
deststats_victim(void)
{
	HASH_SEQ_STATUS status;
	DestStats  *ds;
	DestStats  *victim = NULL;

	hash_seq_init(&status, deststats_hash);
	while ((ds = hash_seq_search(&status)) != NULL)
	{
		if (ds->attached == 0 &&
			(victim == NULL || deststats_better_victim(ds, victim)))
			victim = ds;
	}
	return victim;
}

/*
 * The entry of a destination of this database for the relay in slot
 * `slot`, created if needed; NULL when every entry is in use by running
 * relays (logged at most once a minute; the relay works on unobserved).
 */
DestStats *
OutboxDestStatsAttach(int slot, const char *name)
{
	DestStatsKey key;
	DestStats  *ds;
	bool		found = false;
	TimestampTz now = GetCurrentTimestamp();

	if (deststats == NULL || slot < 0 || slot >= OUTBOX_MAX_RELAYS)
		return NULL;

	memset(&key, 0, sizeof(key));
	key.dboid = MyDatabaseId;
	strlcpy(key.name, name, NAMEDATALEN);

	LWLockAcquire(deststats->lock, LW_EXCLUSIVE);
	ds = hash_search(deststats_hash, &key, HASH_ENTER_NULL, &found);
	if (ds == NULL && deststats->unattached > 0)
	{
		/* full: take the place of a destination no running relay has */
		DestStats  *victim = deststats_victim();

		Assert(victim != NULL);
		if (victim != NULL)
		{
			DestStatsKey gone = victim->key;

			hash_search(deststats_hash, &gone, HASH_REMOVE, NULL);
			deststats->unattached--;
			ds = hash_search(deststats_hash, &key, HASH_ENTER_NULL, &found);
			Assert(ds != NULL && !found);
		}
	}
	if (ds != NULL && !found)
	{
		/* a new entry: all zero, and nobody else sees it yet */
		memset((char *) ds + offsetof(DestStats, attached), 0,
			   sizeof(DestStats) - offsetof(DestStats, attached));
		SpinLockInit(&ds->mutex);
	}
	else if (ds != NULL && ds->attached == 0)
		deststats->unattached--;
	if (ds != NULL)
	{
		ds->attached |= UINT64CONST(1) << slot;
		ds->last_used = now;
	}
	Assert(deststats->unattached >= 0);
	LWLockRelease(deststats->lock);

	if (ds == NULL &&
		OutboxTimePassed(last_full_warning, now, 60000))
	{
		last_full_warning = now;
		ereport(LOG,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("destination \"%s\" is relayed without runtime statistics or circuit breaker",
						name),
				 errdetail("Shared memory holds the runtime state of at most %d destinations, and running relays use all of it.",
						   outbox_max_destinations),
				 errhint("Raise outbox.max_destinations and restart the server.")));
	}
	return ds;
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
	b->epoch = (int32) epoch;
	b->counts[cls]++;
	b->latency_n++;
	b->latency_us += duration_us;
	b->latency_max_us = Max(b->latency_max_us, (uint32) Min(duration_us, PG_UINT32_MAX));
	SpinLockRelease(&ds->mutex);
}

/*
 * The slots a relay may hold of a destination whose shared entry could not
 * be had: an equal part of the limit, so that the relays of the database
 * together stay within it (each relay of a database without entries
 * counts alone).
 */
static int
deststats_unshared_share(int limit)
{
	return Max(1, limit / Max(outbox_workers_per_database, 1));
}

/*
 * The wall clock went back by more than CLOCK_STEP_MIN_MS since a relay
 * last wrote the circuit's times (util.h): they move back with it, so an
 * open circuit keeps what was left of its pause instead of lasting the
 * step too, and failures after the step count as rounds.  A smaller
 * difference is two relays reading the clock a moment apart, one of them
 * taking the lock later.  Under the entry's spinlock, with a reading taken
 * just before it.
 */
#define CLOCK_STEP_MIN_MS		10000

static void
deststats_clock_back(DestStats *ds, TimestampTz now)
{
	TimestampTz step;

	if (ds->clock_read_at - now <= (TimestampTz) CLOCK_STEP_MIN_MS * 1000)
	{
		ds->clock_read_at = Max(ds->clock_read_at, now);
		return;
	}
	step = ds->clock_read_at - now;
	if (ds->open_until != 0)
		ds->open_until = Max(ds->open_until - step, 1);
	if (ds->probe_expires_at != 0)
		ds->probe_expires_at -= step;
	if (ds->round_counted_at != 0)
		ds->round_counted_at -= step;
	if (ds->held_at != 0)
		ds->held_at -= step;
	ds->clock_read_at = now;
}

/*
 * May the calling relay (in relay slot `slot`) lease events of this
 * destination now, and how many?  Settles the slots it holds of the
 * destination's concurrency and asks the circuit breaker, under one
 * acquisition of the entry's spinlock (see the notes at the top).
 *
 * Closed circuit: adm->granted events may be leased (0 .. adm->want).
 * Half-open with no live probe and a slot free: the caller becomes the
 * prober until adm->probe_expires_at (adm->probe) and leases one event.
 * Open, or another relay's probe out: nothing, with adm->recheck_at set to
 * when asking again makes sense.  With adm->want 0 only the slots are
 * settled (what is no longer needed is given back).  adm->held is what
 * the relay holds afterwards, and adm->wake the relays to wake because it
 * gave back slots they want.
 */
void
OutboxDestAdmit(DestStats *ds, int slot, DestAdmission *adm)
{
	uint64		me = UINT64CONST(1) << slot;
	int			want = Max(adm->want, 0);
	int			chunk = adm->chunk;
	bool		probe = false;
	int			held;
	int			others;
	int			others_wanting;
	int			target;
	int			top;
	int			fair;
	int			now_held;
	int			limit;
	TimestampTz clock;

	adm->granted = 0;
	adm->probe = false;
	adm->recheck_at = 0;
	adm->wake = 0;
	if (ds == NULL)
	{
		/* no shared entry: a part of the limit, and no circuit */
		adm->held = Max(Min(adm->alive + want,
							deststats_unshared_share(adm->limit)),
						adm->in_use);
		adm->granted = Min(Max(adm->held - adm->alive, 0), want);
		return;
	}

	/* what a cell of reserved[] holds (the table allows 1,000) */
	limit = Min(adm->limit, PG_INT16_MAX);

	/* a fresh reading: adm->now was taken before the lease pass's claims */
	clock = GetCurrentTimestamp();
	SpinLockAcquire(&ds->mutex);
	deststats_clock_back(ds, clock);

	/* the circuit first: while it is open nothing more is leased */
	if (adm->circuit && want > 0 && ds->open_until != 0)
	{
		if (adm->now < ds->open_until)
		{
			adm->recheck_at = ds->open_until;
			want = 0;
		}
		else if (ds->probe_pid != 0 && adm->now < ds->probe_expires_at)
		{
			/* a probe is out (maybe the caller's own): one at a time */
			adm->recheck_at = ds->probe_expires_at;
			want = 0;
		}
		else
		{
			probe = true;		/* half-open: one event, if a slot is free */
			want = 1;
			chunk = 1;
		}
	}

	/*
	 * The share: what it asks for (events alive and more), within an equal
	 * share while others want more (never below its events alive), within
	 * what the others leave, never below its requests in flight.
	 */
	held = ds->reserved[slot];
	others = ds->reserved_total - held;
	others_wanting = pg_popcount64(ds->wanting & ~me);
	target = adm->alive + want;
	fair = (others_wanting > 0) ?
		Max(Max(limit / (others_wanting + 1), 1), adm->alive) :
		limit;
	top = Max(limit - others, adm->in_use);
	now_held = Min(Min(target, fair), top);
	now_held = Max(now_held, adm->in_use);

	/*
	 * While others want more, the chunk is an eighth of the equal share,
	 * not a quarter of max_concurrency: two relays sharing 1,000 slots held
	 * 500 each and leased again only once 250 of them were free, half their
	 * share (claims come in whole transactions too: on average each had
	 * 350 in flight; with an eighth, 460).
	 */
	if (others_wanting > 0)
		chunk = Min(chunk, Max(limit / (others_wanting + 1) / 8, 1));

	/* grown in chunks while events are alive; its own slots it keeps */
	adm->granted = Min(Max(now_held - adm->alive, 0), want);
	if (adm->granted > 0 && adm->granted < chunk && adm->alive > 0)
	{
		adm->granted = 0;
		now_held = Max(Min(now_held, Max(held, adm->alive)), adm->in_use);
	}
	if (probe && adm->granted > 0)
	{
		ds->probe_pid = MyProcPid;
		ds->probe_expires_at = adm->probe_expires_at;
		adm->probe = true;
	}

	if (now_held < target)
		ds->wanting |= me;
	else
		ds->wanting &= ~me;
	if (now_held < held && (ds->wanting & ~me) != 0)
	{
		adm->wake = ds->wanting & ~me;
		ds->wanting &= me;		/* they ask again when woken */
	}
	ds->reserved[slot] = now_held;
	ds->reserved_total += now_held - held;
	SpinLockRelease(&ds->mutex);
	adm->held = now_held;
}

/*
 * The calling relay no longer has a probe out for this destination (it
 * leased nothing, or its probe event is gone without a result).
 */
void
OutboxCircuitReleaseProbe(DestStats *ds)
{
	if (ds == NULL)
		return;
	SpinLockAcquire(&ds->mutex);
	if (ds->probe_pid == MyProcPid)
	{
		ds->probe_pid = 0;
		ds->probe_expires_at = 0;
	}
	SpinLockRelease(&ds->mutex);
}

/*
 * Open the circuit until `until`, or keep it open until then: never
 * shortens a pause already set (a Retry-After can ask for more than the
 * failed rounds' pause).  Returns CIRCUIT_OPENED if it was closed; *log_it
 * as for OutboxCircuitNote.  Under the entry's spinlock.
 */
static CircuitTransition
deststats_open(DestStats *ds, TimestampTz now, TimestampTz until, bool *log_it)
{
	CircuitTransition transition = CIRCUIT_UNCHANGED;

	if (ds->open_until == 0)
	{
		transition = CIRCUIT_OPENED;
		if (OutboxTimePassed(ds->last_circuit_log_at, now,
							 CIRCUIT_LOG_INTERVAL_MS))
		{
			ds->last_circuit_log_at = now;
			ds->circuit_logged = true;
			*log_it = true;
		}
	}
	if (until > ds->open_until)
	{
		ds->open_until = until;
		ds->probe_pid = 0;
		ds->probe_expires_at = 0;
	}
	return transition;
}

/*
 * Tell the circuit how a request of this destination ended: failed (it
 * counts against the destination) or not, and when it was started.
 * threshold is options.circuit_threshold (0: no circuit breaker).
 * Returns true when the destination is failing as a whole — the request
 * failed and the circuit is open now — so that the caller neither charges
 * the event an attempt nor backs it off.  *transition says whether this
 * call opened or closed the circuit, *log_it whether to log that (see
 * CIRCUIT_LOG_INTERVAL_MS), *rounds is the run of failed rounds.
 */
bool
OutboxCircuitNote(DestStats *ds, bool failed, TimestampTz started_at,
				  int threshold, CircuitTransition *transition,
				  bool *log_it, int *rounds)
{
	TimestampTz now;
	bool		outage = false;

	*transition = CIRCUIT_UNCHANGED;
	*log_it = false;
	*rounds = 0;
	if (ds == NULL || threshold <= 0)
		return false;

	now = GetCurrentTimestamp();
	SpinLockAcquire(&ds->mutex);
	deststats_clock_back(ds, now);
	if (!failed && started_at < ds->held_at && now < ds->open_until)
	{
		/*
		 * The answer to a request sent before the destination asked to
		 * wait: a receiver that sheds load lets some through, and one of
		 * them must not end the wait for every relay.
		 */
	}
	else if (!failed)
	{
		if (ds->open_until != 0)
		{
			*transition = CIRCUIT_CLOSED;
			*log_it = ds->circuit_logged;
			ds->circuit_logged = false;
		}
		ds->failed_rounds = 0;
		ds->open_until = 0;
		ds->probe_pid = 0;
		ds->probe_expires_at = 0;
	}
	else
	{
		int64		pause_ms = 0;

		/* one round: only a request started after the last counted one */
		if (started_at > ds->round_counted_at)
		{
			ds->failed_rounds++;
			ds->round_counted_at = now;
			if (ds->failed_rounds >= threshold)
			{
				int			doublings = Min(ds->failed_rounds - threshold, 20);

				pause_ms = Min((int64) CIRCUIT_FIRST_PAUSE_MS << doublings,
							   (int64) outbox_circuit_max_pause);
			}
			else if (ds->open_until != 0)
			{
				/* the probe after a Retry-After's wait failed: pause again */
				pause_ms = Min((int64) CIRCUIT_FIRST_PAUSE_MS,
							   (int64) outbox_circuit_max_pause);
			}
		}
		if (pause_ms > 0)
			*transition = deststats_open(ds, now,
										 TimestampTzPlusMilliseconds(now, pause_ms),
										 log_it);
		*rounds = ds->failed_rounds;
		outage = (ds->open_until != 0);
	}
	SpinLockRelease(&ds->mutex);
	return outage;
}

/*
 * A failed answer asked the sender to wait until `until` (Retry-After):
 * the circuit opens at once, for at least that long, whatever the run of
 * failed rounds.  A receiver that sheds load says so once, and no relay
 * leases the destination's events until then, instead of each of them
 * finding out for itself and paying an attempt for it.  The answer still
 * counts its round when it is recorded (OutboxCircuitNote), and finds the
 * circuit open: its event is not charged either.  Until then a success
 * closes the circuit only if its request was sent after the answer came
 * (the probe): answers to requests already in flight do not end the wait.
 * Returns the transition (CIRCUIT_OPENED or CIRCUIT_UNCHANGED); *log_it as
 * for OutboxCircuitNote.
 * Called by the caller only with the circuit breaker on.
 */
CircuitTransition
OutboxCircuitHold(DestStats *ds, TimestampTz until, bool *log_it)
{
	CircuitTransition transition;
	TimestampTz now = GetCurrentTimestamp();

	*log_it = false;
	if (ds == NULL)
		return CIRCUIT_UNCHANGED;
	SpinLockAcquire(&ds->mutex);
	deststats_clock_back(ds, now);
	transition = deststats_open(ds, now, until, log_it);
	ds->held_at = now;
	SpinLockRelease(&ds->mutex);
	return transition;
}

/*
 * Configuration changes seen by a relay: with circuit_threshold 0 the
 * circuit is closed for good; a destination just resumed gets its probe
 * at once instead of at the end of the pause.
 */
void
OutboxCircuitConfigure(DestStats *ds, bool disabled, bool resumed)
{
	if (ds == NULL)
		return;
	SpinLockAcquire(&ds->mutex);
	if (disabled)
	{
		ds->failed_rounds = 0;
		ds->open_until = 0;
		ds->probe_pid = 0;
		ds->probe_expires_at = 0;
		ds->circuit_logged = false;
	}
	else if (resumed && ds->open_until != 0)
	{
		ds->open_until = Min(ds->open_until, GetCurrentTimestamp());
		ds->probe_pid = 0;
		ds->probe_expires_at = 0;
	}
	SpinLockRelease(&ds->mutex);
}

/*
 * What the relay in slot `slot` holds of an entry goes: its in-flight
 * count, its slots of the destination's concurrency (the relays that want
 * them may have them: returned, to be woken once the lock is released),
 * its probe and its attachment.  The circuit stays: it describes the
 * destination, which the other relays (or this one, later) keep using.
 * Under deststats->lock, held exclusively.
 */
static uint64
deststats_release(DestStats *ds, int slot, TimestampTz now)
{
	uint64		me = UINT64CONST(1) << slot;
	uint64		wake = 0;

	ds->in_flight[slot] = 0;
	if ((ds->attached & me) != 0)
	{
		ds->attached &= ~me;
		ds->last_used = now;
		if (ds->attached == 0)
			deststats->unattached++;
	}
	OutboxCircuitReleaseProbe(ds);

	SpinLockAcquire(&ds->mutex);
	ds->wanting &= ~me;
	if (ds->reserved[slot] > 0)
	{
		ds->reserved_total -= ds->reserved[slot];
		ds->reserved[slot] = 0;
		wake = ds->wanting;
		ds->wanting = 0;
	}
	SpinLockRelease(&ds->mutex);
	return wake;
}

/*
 * The relay in slot `slot` no longer has this destination (delivery.c: it
 * was deleted, or its row is no longer usable, and none of its events is
 * alive in the relay): it lets the entry go, which may then be reused for
 * another destination.  Until then the entry keeps its circuit and
 * counters, and a relay that loads the destination again finds them.
 */
void
OutboxDestStatsDetach(DestStats *ds, int slot)
{
	uint64		wake;

	if (deststats == NULL || ds == NULL ||
		slot < 0 || slot >= OUTBOX_MAX_RELAYS)
		return;
	LWLockAcquire(deststats->lock, LW_EXCLUSIVE);
	wake = deststats_release(ds, slot, GetCurrentTimestamp());
	LWLockRelease(deststats->lock);
	OutboxWakeRelays(wake);
}

/*
 * A relay exits: what it held of every entry goes (deststats_release).
 */
void
OutboxDestStatsRelayExit(int slot)
{
	HASH_SEQ_STATUS status;
	DestStats  *ds;
	uint64		wake = 0;
	TimestampTz now = GetCurrentTimestamp();

	if (deststats == NULL || slot < 0 || slot >= OUTBOX_MAX_RELAYS)
		return;
	LWLockAcquire(deststats->lock, LW_EXCLUSIVE);
	hash_seq_init(&status, deststats_hash);
	while ((ds = hash_seq_search(&status)) != NULL)
		wake |= deststats_release(ds, slot, now);
	LWLockRelease(deststats->lock);
	OutboxWakeRelays(wake);
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
	HASH_SEQ_STATUS status;
	DestStats  *ds;

	InitMaterializedSRF(fcinfo, 0);
	if (deststats == NULL)
		return (Datum) 0;

	LWLockAcquire(deststats->lock, LW_SHARED);
	hash_seq_init(&status, deststats_hash);
	while ((ds = hash_seq_search(&status)) != NULL)
	{
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

		if (ds->key.dboid != MyDatabaseId)
			continue;
		for (int s = 0; s < OUTBOX_MAX_RELAYS; s++)
		{
			int32		n = ds->in_flight[s];

			in_flight += Max(n, 0);
		}

		SpinLockAcquire(&ds->mutex);
		open_until = ds->open_until;
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
		values[c++] = CStringGetTextDatum(ds->key.name);
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
