/*-------------------------------------------------------------------------
 *
 * relay.c
 *		  The relay worker: lease due events, deliver them, record results.
 *
 * Protocol (at-least-once):
 *
 *	1. Lease, in a short transaction: outbox._lease() picks due pending
 *	   rows of one destination with FOR UPDATE SKIP LOCKED (only the head
 *	   of each aggregate on an ordered destination, see ordering.c), counts
 *	   the attempt and sets leased_until to the end of the lease, then the
 *	   transaction commits.  Other workers skip the rows while the
 *	   transaction runs and ignore them afterwards because they are no
 *	   longer due.  No transaction stays open while HTTP runs.
 *	2. Send, with no transaction open: every leased event becomes a request
 *	   on the curl multi handle (http.c); requests run concurrently and the
 *	   loop keeps leasing for destinations with free capacity, so a slow
 *	   destination never holds up a healthy one.
 *	3. Record, in a short transaction per group of completions:
 *	   acknowledged rows become published; failed rows get their next
 *	   attempt time or go to the dead letters, but only while the row is
 *	   still under the lease that sent it (store.c): a worker that stalled
 *	   past its lease cannot fail a row another worker has taken over.
 *
 * A worker that dies anywhere after step 1 leaves its rows leased; when
 * the lease runs out they are due again and another worker (or this one,
 * restarted) sends them again, with the same message id.  Rows are never
 * marked published before the destination acknowledged them.
 *
 * Each lease counts as an attempt, so a message that kills the worker
 * every time still runs out of attempts instead of crash-looping it.
 *
 * Per destination the worker keeps an in-flight count (capped by
 * max_concurrency) and asks the destination's circuit breaker before it
 * leases: the circuit is shared by all relays of the database and lives
 * in shared memory (deststats.c has the protocol).  After
 * options.circuit_threshold (default 5; 0 disables it) failed rounds in a
 * row no relay leases events of the destination for a pause (1 s,
 * doubling up to outbox.circuit_max_pause); then one relay sends a single
 * probe; any success closes the circuit and wakes the other relays.  A
 * failure recorded while the circuit is open is the destination's, not
 * the event's: the event gets its attempt back and is due at once, so it
 * neither backs off nor runs out of attempts during an outage (max_age
 * still applies).
 *
 * Brokers (kinds sns, sqs, rabbitmq; broker.c): leased events of such a
 * destination become BrokerMessages, and one request may carry several
 * of them (SNS PublishBatch, SQS SendMessageBatch).  The first event of a
 * batch owns the request and lists the events it carries; the others are
 * never sent themselves (relay_start), and all of them complete together
 * (relay_completed).  When recording, the request's response is read once
 * (OutboxBrokerClassify) and gives every carried event its own outcome,
 * so a batch answered 200 with failed entries retries or dead-letters
 * just those.  A message that can never be sent (too large) is decided
 * before sending and completes without a request.  Webhooks keep one
 * request per event and the classification of retry.c.
 *
 * Memory: each event lives in its own small memory context, deleted
 * after its result is recorded; everything else per cycle is reset every
 * loop.  Errors inside a cycle are caught, logged, shown in the worker's
 * slot, and followed by a pause; they never restart the worker.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/relay.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "retry.h"
#include "deststats.h"
#include "peertext.h"
#include "api/api.h"
#include "worker/worker.h"
#include "destination/http.h"
#include "destination/destination.h"

#define RETRY_AFTER_MAX_MS		3600000
#define ROUTE_INTERVAL_MS		5000
#define ERROR_PAUSE_MS			1000
#define RECORD_BATCH			128
#define RECORD_DELAY_MS			10

/* Per-destination state that outlives a cycle; hash entry keyed by name. */
typedef struct RelayDestination
{
	char		name[NAMEDATALEN];	/* key */
	int			in_flight;

	DestStats  *stats;			/* ops: statistics and the circuit (deststats.c) */

	/* configuration, refreshed at every lease step */
	bool		paused;
	int			max_concurrency;
	int			circuit_threshold;	/* 0: no circuit breaker */
	int			timeout_ms;
} RelayDestination;

/* The configuration one lease step reads, in cycle memory. */
typedef struct DestinationConfig
{
	char	   *name;
	char	   *url;
	bool		paused;
	int			timeout_ms;
	int			max_concurrency;
	int			max_attempts;
	int			backoff_base_ms;
	int			backoff_max_ms;
	double		max_age_secs;
	int			circuit_threshold;
	WebhookTarget target;
	BrokerTarget *broker;		/* kinds sns, sqs, rabbitmq; NULL: webhook */
	PeerSecrets *secrets;		/* redacted from what the peer says */
} DestinationConfig;

/* One leased event, in its own memory context until recorded. */
typedef struct RelayEvent
{
	MemoryContext context;
	RelayDestination *dest;
	pg_uuid_t	id;
	TimestampTz leased_until;	/* the lease's fence (store.c) */
	int			attempts;
	double		age_secs;
	int			max_attempts;
	int			backoff_base_ms;
	int			backoff_max_ms;
	double		max_age_secs;
	char	   *url;
	char	   *body;
	PeerSecrets *secrets;		/* its destination's, when leased */
	HttpRequest req;			/* req.owner: see relay_event_of() */
	TimestampTz started_at;		/* when its request was started */
	bool		probe;			/* the circuit's probe (deststats.c) */
	bool		outage;			/* failed while the circuit was open */

	/*
	 * Brokers (broker.c): one request may carry several events.  The event
	 * whose req is sent owns the batch and lists the events it carries
	 * (itself first); the others point to it and are never sent themselves.
	 */
	BrokerMessage *msg;			/* NULL for webhooks */
	BrokerBatch *batch;			/* on the event whose req carries them */
	List	   *carried;
	struct RelayEvent *carrier; /* set on the events carried by another */
} RelayEvent;

static RelaySlot *my_slot = NULL;
static HTAB *destinations = NULL;
static HttpClient *http = NULL;
static MemoryContext events_context = NULL;
static MemoryContext cycle_context = NULL;
static char *database_name = NULL;
static int	total_in_flight = 0;
static pg_prng_state prng;
static char last_logged_error[OUTBOX_ERROR_LEN];
static TimestampTz last_logged_at = 0;

static bool relay_outdated = false;	/* extension needs an UPDATE */
static bool relay_announced = false;	/* "started" is logged */

/* lease again then: a circuit's pause ends or another relay's probe expires */
static TimestampTz circuit_recheck_at = 0;

/* ops: this relay's slot number, for its cells in deststats.c */
#define MY_SLOT_INDEX ((int) (my_slot - outbox_shared->slots))

static SPIPlanPtr destinations_plan = NULL;
static SPIPlanPtr route_plan = NULL;

/* The tables a relay cycle touches, in the order it locks them. */
static const OutboxTableLock relay_tables[] =
{
	{OUTBOX_EVENTS_TABLE, RowExclusiveLock},
	{OUTBOX_DESTINATIONS_TABLE, AccessShareLock},
	{OUTBOX_ROUTES_TABLE, AccessShareLock},
	{OUTBOX_CREDENTIALS_TABLE, AccessShareLock},
};

static RelayEvent *
relay_event_of(HttpRequest *req)
{
	return (RelayEvent *) ((char *) req - offsetof(RelayEvent, req));
}

static void
relay_on_exit(int code, Datum arg)
{
	if (my_slot == NULL)
		return;
	OutboxDestStatsRelayExit(MY_SLOT_INDEX);	/* ops */
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	my_slot->pid = 0;
	my_slot->procno = -1;
	my_slot->in_flight = 0;
	if (my_slot->state != RELAY_NO_EXTENSION)
		my_slot->state = RELAY_STOPPED;
	LWLockRelease(outbox_shared->lock);
}

static void
relay_prepare_plans(void)
{
	OutboxKeepPlan(&destinations_plan,
				   "SELECT d.name, d.url, d.paused, d.timeout_ms, d.max_concurrency,"
				   " d.max_attempts, d.backoff_base_ms, d.backoff_max_ms,"
				   " extract(epoch FROM d.max_age)::float8, d.format, d.headers,"
				   " d.signing_secrets, d.bearer_token, d.options ->> 'source',"
				   " CASE WHEN (d.options ->> 'circuit_threshold') ~ '^[0-9]{1,6}$'"
				   "      THEN (d.options ->> 'circuit_threshold')::int4 ELSE 5 END,"
				   " d.kind, d.options, c.aws_access_key_id, c.aws_secret_access_key,"
				   " c.aws_session_token, c.username, c.password"
				   " FROM outbox.destinations AS d"
				   " LEFT JOIN outbox.credentials AS c"
				   "   ON c.name OPERATOR(pg_catalog.=) d.credentials",
				   0, NULL);
	OutboxKeepPlan(&route_plan, "SELECT outbox._route_pending()", 0, NULL);
}

/*
 * Start a transaction and check that the extension is installed and its
 * events table is not locked away (DROP EXTENSION in progress).  Returns
 * false, with the transaction still open, when the cycle should be
 * skipped; sets *missing when the extension is not there at all.
 */
static bool
relay_begin(bool *missing)
{
	*missing = false;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/* ha: deliver only with the SQL objects of this library's version */
	relay_outdated = false;
	if (!OutboxRelayVersionMatches(my_slot, database_name, missing))
	{
		relay_outdated = !*missing;
		return false;
	}

	/*
	 * Take every table lock of the cycle now, without waiting: if DROP
	 * EXTENSION (or an ALTER) holds one, skip this cycle instead of queueing
	 * behind it and deadlocking against it.
	 */
	if (!OutboxLockTablesNoWait(OUTBOX_SCHEMA, relay_tables, lengthof(relay_tables)))
		return false;
	relay_prepare_plans();
	return true;
}

static void
relay_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
}

/*
 * The relay has found the extension: say that it started, and let the
 * slot report the extension missing again should it be dropped.
 */
static void
relay_announce(void)
{
	ereport(LOG,
			(errmsg("outbox_pg relay %d started for database \"%s\"",
					my_slot->worker_number, database_name)));
	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	my_slot->absence_logged = false;
	LWLockRelease(outbox_shared->lock);
	relay_announced = true;
}

/*
 * No extension in this database: exit; the launcher starts a relay again
 * after outbox.discovery_interval, or at once when a commit asks for one.
 * Worker 0 says so for its database, once: the next relays that find no
 * extension exit quietly until one finds it (relay_announce()).
 */
static void
relay_exit_no_extension(void)
{
	bool		log_it;

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	my_slot->state = RELAY_NO_EXTENSION;
	log_it = my_slot->worker_number == 0 && !my_slot->absence_logged;
	my_slot->absence_logged = true;
	LWLockRelease(outbox_shared->lock);
	if (log_it)
		ereport(LOG,
				(errmsg("outbox_pg relay for database \"%s\" is exiting: the extension is not installed",
						database_name),
				 errdetail("The database is looked at again every outbox.discovery_interval; this is not logged again until the extension is found."),
				 errhint("Run CREATE EXTENSION outbox_pg in that database; a relay starts by itself after the first emit().")));
	proc_exit(0);
}

static char *
spi_text(HeapTuple tup, TupleDesc desc, int col)
{
	return SPI_getvalue(tup, desc, col);
}

/* "Name: value" lines from a jsonb object of strings. */
static List *
relay_header_lines(Datum jsonb_datum)
{
	Jsonb	   *jb = DatumGetJsonbP(jsonb_datum);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	List	   *lines = NIL;
	char	   *key = NULL;

	if (!JB_ROOT_IS_OBJECT(jb))
		return NIL;
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			key = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && key != NULL && v.type == jbvString)
			lines = lappend(lines, psprintf("%s: %.*s", key,
											v.val.string.len, v.val.string.val));
	}
	return lines;
}

/*
 * Read outbox.destinations into cycle memory and refresh the persistent
 * per-destination state.
 */
static List *
relay_load_destinations(void)
{
	List	   *result = NIL;
	RelayDestination *rd;

	if (SPI_execute_plan(destinations_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read outbox.destinations");

	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		DestinationConfig *d;
		MemoryContext old = MemoryContextSwitchTo(cycle_context);
		bool		isnull;
		Datum		secrets;
		bool		found;
		char	   *format;
		char	   *kind;
		PeerSecretSources src;

		memset(&src, 0, sizeof(src));
		d = palloc0(sizeof(DestinationConfig));
		d->name = spi_text(tup, desc, 1);
		d->url = spi_text(tup, desc, 2);
		d->paused = DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull));
		d->timeout_ms = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
		d->max_concurrency = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
		d->max_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
		d->backoff_base_ms = DatumGetInt32(SPI_getbinval(tup, desc, 7, &isnull));
		d->backoff_max_ms = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
		d->max_age_secs = DatumGetFloat8(SPI_getbinval(tup, desc, 9, &isnull));
		format = spi_text(tup, desc, 10);
		d->target.structured = (format && strcmp(format, "structured") == 0);
		d->target.headers = relay_header_lines(SPI_getbinval(tup, desc, 11, &isnull));
		secrets = SPI_getbinval(tup, desc, 12, &isnull);
		if (!isnull)
		{
			ArrayType  *arr = DatumGetArrayTypeP(secrets);
			Datum	   *elems;
			bool	   *nulls;
			int			n;

			deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
							  &elems, &nulls, &n);
			for (int k = 0; k < n; k++)
			{
				StringInfo	key = makeStringInfo();
				char	   *secret;

				if (nulls[k])
					continue;
				secret = TextDatumGetCString(elems[k]);
				src.signing_secrets = lappend(src.signing_secrets, secret);
				if (OutboxDecodeSigningSecret(secret, key))
					d->target.signing_keys = lappend(d->target.signing_keys, key);
				else
					ereport(WARNING,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("signing secret %d of destination \"%s\" is not valid base64; it is ignored",
									k + 1, d->name),
							 errhint("A Standard Webhooks secret is \"whsec_\" followed by base64.")));
			}
		}
		d->target.bearer_token = spi_text(tup, desc, 13);
		d->target.source = spi_text(tup, desc, 14);
		d->circuit_threshold = DatumGetInt32(SPI_getbinval(tup, desc, 15, &isnull));
		if (d->target.source == NULL)
			d->target.source = psprintf("urn:outbox_pg:%s", database_name);
		kind = spi_text(tup, desc, 16);
		if (strcmp(kind, "webhook") != 0)
		{
			const char *credentials[5];

			for (int k = 0; k < 5; k++)
				credentials[k] = spi_text(tup, desc, 18 + k);
			d->broker = OutboxBrokerTarget(kind, d->name, d->url,
										   SPI_getbinval(tup, desc, 17, &isnull),
										   credentials);
			src.aws_access_key_id = credentials[0];
			src.aws_secret_access_key = credentials[1];
			src.aws_session_token = credentials[2];
			src.username = credentials[3];
			src.password = credentials[4];
		}
		src.url = d->url;
		src.header_lines = d->target.headers;
		src.bearer_token = d->target.bearer_token;
		d->secrets = OutboxPeerSecrets(&src);
		MemoryContextSwitchTo(old);

		rd = hash_search(destinations, d->name, HASH_ENTER, &found);
		if (!found)
		{
			rd->in_flight = 0;
			rd->stats = NULL;
			rd->paused = false;
		}
		if (rd->stats == NULL)	/* ops */
			rd->stats = OutboxDestStatsAttach(MY_SLOT_INDEX, d->name);

		/*
		 * The shared circuit: closed for good without a threshold; a
		 * destination just resumed gets its probe at once.
		 */
		if (d->circuit_threshold <= 0 || (rd->paused && !d->paused))
			OutboxCircuitConfigure(rd->stats, d->circuit_threshold <= 0,
								   rd->paused && !d->paused);
		rd->paused = d->paused;
		rd->max_concurrency = d->max_concurrency;
		rd->circuit_threshold = d->circuit_threshold;
		rd->timeout_ms = d->timeout_ms;

		old = MemoryContextSwitchTo(cycle_context);
		result = lappend(result, d);
		MemoryContextSwitchTo(old);
	}
	return result;
}

/*
 * How many events of this destination may be leased now; *probe is set
 * when the one event to lease is the circuit's probe.
 */
static int
relay_capacity(RelayDestination *rd, TimestampTz now, bool *probe)
{
	int			free_slots;
	TimestampTz recheck_at;

	if (rd->paused)
		return 0;
	free_slots = Min(rd->max_concurrency - rd->in_flight,
					 outbox_batch_size - total_in_flight);
	if (free_slots <= 0)
		return 0;

	/*
	 * Lease in chunks of at least a quarter of the destination's
	 * concurrency, so a busy destination costs one lease per several
	 * completions instead of one per completion.
	 */
	if (rd->in_flight > 0 && free_slots < Max(1, rd->max_concurrency / 4))
		return 0;
	if (rd->circuit_threshold <= 0)
		return free_slots;
	switch (OutboxCircuitPermit(rd->stats, now,
								TimestampTzPlusMilliseconds(now, rd->timeout_ms +
															outbox_lease_margin),
								&recheck_at))
	{
		case CIRCUIT_PASS:
			break;
		case CIRCUIT_PROBE:
			*probe = true;
			return 1;
		case CIRCUIT_WAIT:
			if (circuit_recheck_at == 0 || recheck_at < circuit_recheck_at)
				circuit_recheck_at = recheck_at;
			return 0;
	}
	return free_slots;
}

/* ---- brokers (sns, sqs, rabbitmq: see broker.c) ---- */

static BrokerMessage *
relay_broker_message(const WebhookEvent *wev, const DestinationConfig *d)
{
	BrokerMessage *msg = palloc0(sizeof(BrokerMessage));

	msg->id = wev->id;
	msg->type = wev->type;
	msg->aggregate_id = wev->aggregate_id;
	msg->payload = wev->payload;
	msg->traceparent = wev->traceparent;
	msg->time = wev->time;
	msg->destination = d->name;
	return msg;
}

/*
 * Group a destination's leased events into requests: each request is
 * built in, and owned by, its first event's memory; a message that can
 * never be sent is decided here and completes without a request.
 */
static void
relay_broker_batches(DestinationConfig *d, List *events)
{
	int			n = list_length(events);
	RelayEvent **evs = palloc(n * sizeof(RelayEvent *));
	BrokerMessage **msgs = palloc(n * sizeof(BrokerMessage *));
	int			nsend = 0;
	ListCell   *lc;

	foreach(lc, events)
	{
		RelayEvent *ev = lfirst(lc);
		MemoryContext old = MemoryContextSwitchTo(ev->context);

		OutboxBrokerCheck(d->broker, ev->msg);
		if (ev->msg->decided)
			ev->carried = list_make1(ev);	/* completes unsent */
		else
		{
			evs[nsend] = ev;
			msgs[nsend++] = ev->msg;
		}
		MemoryContextSwitchTo(old);
	}
	for (int i = 0; i < nsend;)
	{
		RelayEvent *first = evs[i];
		MemoryContext old = MemoryContextSwitchTo(first->context);
		int			k;

		first->batch = palloc0(sizeof(BrokerBatch));
		k = OutboxBrokerBuild(d->broker, &msgs[i], nsend - i, &first->req,
							  first->batch);
		for (int j = i; j < i + k; j++)
		{
			first->carried = lappend(first->carried, evs[j]);
			if (j > i)
				evs[j]->carrier = first;
		}
		MemoryContextSwitchTo(old);
		i += k;
	}
	pfree(evs);
	pfree(msgs);
}

/* Send a leased event's request (unless another event's request carries it). */
static void
relay_start(RelayEvent *ev)
{
	if (ev->carrier != NULL)
		return;
	ev->started_at = GetCurrentTimestamp();
	if (ev->msg != NULL && ev->msg->decided)
		HttpClientSkip(http, &ev->req);
	else
		HttpClientStart(http, &ev->req);
}

/* A completed request: the events it carried, in order. */
static List *
relay_completed(List *pending, HttpRequest *req)
{
	RelayEvent *ev = relay_event_of(req);

	if (ev->carried != NIL)
		return list_concat(pending, ev->carried);
	return lappend(pending, ev);
}

/*
 * Lease due events of every destination with free capacity and turn them
 * into requests (started after the commit).  Each event is appended to
 * *leased as soon as it exists and counts as in flight, so that if
 * anything fails later in the cycle the error path finds and frees every
 * one of them (their lease rolls back with the transaction).
 */
static void
relay_lease(List *dests, bool *drained, List **leased)
{
	ListCell   *lc;
	TimestampTz now = GetCurrentTimestamp();
	int			lease_ms = 0;
	Interval   *lease;

	*drained = true;
	foreach(lc, dests)
	{
		DestinationConfig *d = lfirst(lc);

		lease_ms = Max(lease_ms, d->timeout_ms + outbox_lease_margin);
	}
	lease = MemoryContextAllocZero(cycle_context, sizeof(Interval));
	lease->time = (int64) lease_ms * 1000;

	foreach(lc, dests)
	{
		DestinationConfig *d = lfirst(lc);
		RelayDestination *rd = hash_search(destinations, d->name, HASH_FIND, NULL);
		bool		probe = false;
		int			want = relay_capacity(rd, now, &probe);
		uint64		n;
		List	   *broker_events = NIL;

		if (want <= 0)
			continue;
		n = OutboxStoreLease(want, lease, d->name);
		if (probe && n == 0)
			OutboxCircuitReleaseProbe(rd->stats);	/* nothing to probe with */
		else if (n >= (uint64) want && !probe)
			*drained = false;

		for (uint64 i = 0; i < n; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			MemoryContext cxt;
			MemoryContext old;
			RelayEvent *ev;
			WebhookEvent wev;
			bool		isnull;
			Datum		hdrs;

			cxt = AllocSetContextCreate(events_context, "outbox_pg event",
										ALLOCSET_SMALL_SIZES);
			old = MemoryContextSwitchTo(cxt);
			ev = palloc0(sizeof(RelayEvent));
			ev->context = cxt;
			ev->dest = rd;
			ev->probe = probe;
			memcpy(&ev->id, DatumGetUUIDP(SPI_getbinval(tup, desc, 1, &isnull)),
				   sizeof(pg_uuid_t));
			ev->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
			ev->age_secs = DatumGetFloat8(SPI_getbinval(tup, desc, 9, &isnull));
			ev->leased_until = DatumGetTimestampTz(SPI_getbinval(tup, desc, 10, &isnull));
			ev->max_attempts = d->max_attempts;
			ev->backoff_base_ms = d->backoff_base_ms;
			ev->backoff_max_ms = d->backoff_max_ms;
			ev->max_age_secs = d->max_age_secs;
			ev->url = pstrdup(d->url);
			ev->secrets = OutboxPeerSecretsCopy(d->secrets);

			memset(&wev, 0, sizeof(wev));
			wev.id = spi_text(tup, desc, 1);
			wev.type = spi_text(tup, desc, 2);
			wev.aggregate_id = spi_text(tup, desc, 3);
			wev.payload = spi_text(tup, desc, 4);
			hdrs = SPI_getbinval(tup, desc, 5, &isnull);
			if (!isnull)
				wev.extra_headers = relay_header_lines(hdrs);
			wev.traceparent = spi_text(tup, desc, 6);
			wev.time = spi_text(tup, desc, 7);

			ev->req.url = ev->url;
			ev->req.timeout_ms = d->timeout_ms;
			if (d->broker != NULL)
				ev->msg = relay_broker_message(&wev, d);
			else
				OutboxBuildWebhook(&wev, &d->target, &ev->req, &ev->body);
			MemoryContextSwitchTo(old);

			rd->in_flight++;
			total_in_flight++;
			OutboxDestStatsSetInFlight(rd->stats, MY_SLOT_INDEX, rd->in_flight);	/* ops */

			/*
			 * SPI calls leave CurrentMemoryContext in SPI's own (transaction)
			 * memory; the list must outlive the transaction.
			 */
			old = MemoryContextSwitchTo(events_context);
			*leased = lappend(*leased, ev);
			if (ev->msg != NULL)
				broker_events = lappend(broker_events, ev);
			MemoryContextSwitchTo(old);
		}
		if (broker_events != NIL)
			relay_broker_batches(d, broker_events);
	}
}

static void
relay_free_event(RelayEvent *ev)
{
	Assert(ev->req.easy == NULL);	/* never while curl still uses it */
	if (ev->req.headers)
		curl_slist_free_all(ev->req.headers);
	ev->req.headers = NULL;
	if (ev->probe)				/* gone without a result: let another probe */
		OutboxCircuitReleaseProbe(ev->dest->stats);
	ev->dest->in_flight--;
	total_in_flight--;
	OutboxDestStatsSetInFlight(ev->dest->stats, MY_SLOT_INDEX, ev->dest->in_flight);	/* ops */
	MemoryContextDelete(ev->context);
}

/*
 * Wake the other relays of this database: the circuit of a destination
 * closed, and its events are due for all of them now.
 */
static void
relay_wake_others(void)
{
	for (int i = 0; i < OUTBOX_MAX_RELAYS; i++)
	{
		RelaySlot  *slot = &outbox_shared->slots[i];

		if (slot != my_slot && slot->dboid == MyDatabaseId && slot->pid != 0)
			OutboxSetLatchByProcno(slot->procno);
	}
}

/*
 * Tell the destination's shared circuit how the request of ev ended.
 * Returns true when the request failed while the circuit is open: the
 * failure is the destination's, and the event must not pay for it.
 */
static bool
relay_note_destination(RelayEvent *ev, bool failed)
{
	RelayDestination *rd = ev->dest;
	CircuitTransition transition;
	bool		log_it;
	int			rounds;
	bool		outage;

	outage = OutboxCircuitNote(rd->stats, failed, ev->started_at,
							   rd->circuit_threshold, &transition, &log_it,
							   &rounds);
	if (transition == CIRCUIT_CLOSED)
	{
		relay_wake_others();
		if (log_it)
			ereport(LOG,
					(errmsg("outbox_pg destination \"%s\" is healthy again; circuit closed",
							rd->name)));
	}
	else if (transition == CIRCUIT_OPENED && log_it)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("outbox_pg destination \"%s\" failed %d times in a row; circuit opened",
						rd->name, rounds),
				 errdetail("Each time is a round of requests that failed together; all relays of the database pause the destination and probe it with one event."),
				 errhint("Events for it wait; other destinations are not affected. See outbox.destination_stats and outbox.events.last_error.")));
	return outage;
}

static int
relay_status(RelayEvent *ev)
{
	return ev->msg != NULL ? ev->msg->status : ev->req.status;
}

/*
 * The error recorded on the event: what the destination said (or libcurl
 * about it), made safe to store by peertext.c, secrets redacted.
 */
static char *
relay_error_text(RelayEvent *ev)
{
	HttpRequest *req = &ev->req;
	HttpRequest *sent = ev->carrier ? &ev->carrier->req : req;
	StringInfoData text;
	bool		cut = false;

	initStringInfo(&text);
	if (ev->msg != NULL)
	{
		appendStringInfoString(&text, ev->msg->error ? ev->msg->error : "failed");
		/* a broker's text may end where its response buffer did */
		cut = sent->response_total > (sent->capture ? sent->capture_len :
									  sent->response_len);
	}
	else if (req->curl_code != CURLE_OK || req->refused)
		appendStringInfoString(&text, req->error[0] ? req->error : "request failed");
	else if (req->status >= 300 && req->status < 400)
		appendStringInfo(&text, "HTTP %d: redirects are not followed", req->status);
	else if (req->response_len > 0)
	{
		appendStringInfo(&text, "HTTP %d: ", req->status);
		appendBinaryStringInfo(&text, req->response, req->response_len);
		cut = req->response_total > req->response_len;
	}
	else
		appendStringInfo(&text, "HTTP %d", req->status);
	return OutboxPeerText(text.data, text.len, cut, ev->secrets,
						  OUTBOX_ERROR_LEN - 1);
}

/* Arrays for the record statements; status 0 (no HTTP answer) is NULL. */
static Datum
uuid_array(Datum *ids, int n)
{
	return PointerGetDatum(construct_array(ids, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR));
}

static Datum
text_array(Datum *texts, int n)
{
	return PointerGetDatum(construct_array(texts, n, TEXTOID, -1, false, TYPALIGN_INT));
}

static Datum
timestamptz_array(Datum *times, int n)
{
	return PointerGetDatum(construct_array(times, n, TIMESTAMPTZOID, 8,
										   FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

static Datum
status_array(Datum *statuses, int n)
{
	bool	   *nulls = palloc(n * sizeof(bool));
	int			dims[1] = {n};
	int			lbs[1] = {1};

	for (int i = 0; i < n; i++)
		nulls[i] = (DatumGetInt32(statuses[i]) == 0);
	return PointerGetDatum(construct_md_array(statuses, nulls, 1, dims, lbs,
											  INT4OID, 4, true, TYPALIGN_INT));
}

/*
 * Record the results of completed requests in one transaction.
 */
static void
relay_record(List *done)
{
	ListCell   *lc;
	int			n = list_length(done);
	Datum	   *ack_ids = palloc(n * sizeof(Datum));
	Datum	   *ack_status = palloc(n * sizeof(Datum));
	Datum	   *retry_ids = palloc(n * sizeof(Datum));
	Datum	   *retry_at = palloc(n * sizeof(Datum));
	Datum	   *retry_status = palloc(n * sizeof(Datum));
	Datum	   *retry_error = palloc(n * sizeof(Datum));
	Datum	   *retry_lease = palloc(n * sizeof(Datum));
	Datum	   *dead_ids = palloc(n * sizeof(Datum));
	Datum	   *dead_status = palloc(n * sizeof(Datum));
	Datum	   *dead_error = palloc(n * sizeof(Datum));
	Datum	   *requeue_ids = palloc(n * sizeof(Datum));
	Datum	   *requeue_at = palloc(n * sizeof(Datum));
	Datum	   *requeue_status = palloc(n * sizeof(Datum));
	Datum	   *requeue_error = palloc(n * sizeof(Datum));
	Datum	   *requeue_lease = palloc(n * sizeof(Datum));
	Datum	   *dead_lease = palloc(n * sizeof(Datum));
	int			nack = 0,
				nretry = 0,
				ndead = 0,
				nrequeue = 0;
	TimestampTz now = GetCurrentTimestamp();
	bool		missing;

	foreach(lc, done)
	{
		RelayEvent *ev = lfirst(lc);
		HttpRequest *req = &ev->req;
		DeliveryOutcome outcome;
		pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

		memcpy(id, &ev->id, sizeof(pg_uuid_t));
		if (ev->msg != NULL)
		{
			/* a broker request decides each message it carried */
			if (ev->batch != NULL)
			{
				OutboxBrokerClassify(ev->batch, req);
				ev->outage = relay_note_destination(ev, ev->batch->destination_failure);
			}
			else if (ev->carrier != NULL)
				ev->outage = ev->carrier->outage;	/* recorded just before */
			outcome = ev->msg->outcome;
		}
		else
		{
			/* an oversized body or a refused host comes back as a curl error */
			outcome = OutboxClassifyResponse(req->status, req->curl_code, req->refused);
			ev->outage = relay_note_destination(ev,
												outcome != OUTCOME_ACK &&
												OutboxIsDestinationFailure(req->status, req->curl_code));
		}

		/* an outage uses up no attempts; max_age still holds */
		if (outcome == OUTCOME_RETRY &&
			((ev->attempts >= ev->max_attempts && !ev->outage) ||
			 ev->age_secs >= ev->max_age_secs))
			outcome = OUTCOME_DEAD;
		/* ops: an event carried in another's request has that request's answer */
		{
			HttpRequest *sent = ev->carrier ? &ev->carrier->req : req;

			OutboxDestStatsRecordResult(ev->dest->stats, now, relay_status(ev),
										outcome, sent->duration_us);
		}

		switch (outcome)
		{
			case OUTCOME_ACK:
				ack_ids[nack] = UUIDPGetDatum(id);
				ack_status[nack] = Int32GetDatum(relay_status(ev));
				nack++;
				break;
			case OUTCOME_RETRY:
				if (ev->outage)
				{
					/*
					 * The destination failed, not the event: give the
					 * attempt back and make it due at once; the circuit
					 * keeps it from being leased until it closes.
					 */
					int64		delay = 0;

					if (ev->msg == NULL && req->retry_after_secs >= 0)
						delay = Min((int64) req->retry_after_secs * 1000,
									RETRY_AFTER_MAX_MS);
					requeue_ids[nrequeue] = UUIDPGetDatum(id);
					requeue_at[nrequeue] = TimestampTzGetDatum(TimestampTzPlusMilliseconds(now, delay));
					requeue_status[nrequeue] = Int32GetDatum(relay_status(ev));
					requeue_error[nrequeue] = CStringGetTextDatum(relay_error_text(ev));
					requeue_lease[nrequeue] = TimestampTzGetDatum(ev->leased_until);
					nrequeue++;
				}
				else
				{
					int64		delay = OutboxBackoffDelayMs(ev->attempts,
															 ev->backoff_base_ms,
															 ev->backoff_max_ms,
															 pg_prng_double(&prng));

					if (ev->msg == NULL && req->retry_after_secs >= 0)
						delay = Max(delay, Min((int64) req->retry_after_secs * 1000,
											   RETRY_AFTER_MAX_MS));
					retry_ids[nretry] = UUIDPGetDatum(id);
					retry_at[nretry] = TimestampTzGetDatum(TimestampTzPlusMilliseconds(now, delay));
					retry_status[nretry] = Int32GetDatum(relay_status(ev));
					retry_error[nretry] = CStringGetTextDatum(relay_error_text(ev));
					retry_lease[nretry] = TimestampTzGetDatum(ev->leased_until);
					nretry++;
				}
				break;
			case OUTCOME_DEAD:
				dead_ids[ndead] = UUIDPGetDatum(id);
				dead_status[ndead] = Int32GetDatum(relay_status(ev));
				dead_error[ndead] = CStringGetTextDatum(relay_error_text(ev));
				dead_lease[ndead] = TimestampTzGetDatum(ev->leased_until);
				ndead++;
				break;
		}
	}

	if (!relay_begin(&missing))
	{
		/* extension gone or being dropped: the rows are gone or leased */
		relay_commit();
		return;
	}
	if (nack > 0)
		OutboxStoreAck(uuid_array(ack_ids, nack), status_array(ack_status, nack));
	/* retry and dead change a row only under the lease they belong to */
	if (nretry > 0)
		OutboxStoreRetry(uuid_array(retry_ids, nretry),
						 timestamptz_array(retry_at, nretry),
						 status_array(retry_status, nretry),
						 text_array(retry_error, nretry),
						 timestamptz_array(retry_lease, nretry));
	if (ndead > 0)
		OutboxStoreDead(uuid_array(dead_ids, ndead), status_array(dead_status, ndead),
						text_array(dead_error, ndead),
						timestamptz_array(dead_lease, ndead));
	if (nrequeue > 0)
		OutboxStoreRequeue(uuid_array(requeue_ids, nrequeue),
						   timestamptz_array(requeue_at, nrequeue),
						   status_array(requeue_status, nrequeue),
						   text_array(requeue_error, nrequeue),
						   timestamptz_array(requeue_lease, nrequeue));
	relay_commit();

	pg_atomic_fetch_add_u64(&my_slot->published, nack);
	pg_atomic_fetch_add_u64(&my_slot->failed, nretry + ndead + nrequeue);
}

static void
relay_set_state(RelayState state, const char *activity)
{
	if (my_slot->state != state)
		OutboxSlotSetState(my_slot, state);
	my_slot->in_flight = total_in_flight;
	my_slot->last_cycle_at = GetCurrentTimestamp();
	pgstat_report_activity(state == RELAY_IDLE ? STATE_IDLE : STATE_RUNNING,
						   activity);
}

void
OutboxRelayMain(Datum main_arg)
{
	int			slot_index = DatumGetInt32(main_arg);
	volatile bool need_lease = true;
	volatile bool need_inbox = true;	/* inbox work (inbox_worker.c) */
	long		inbox_wait_ms = 0;	/* set by every InboxWorkerCycle() */
	volatile TimestampTz last_poll = 0;
	volatile TimestampTz last_route = 0;
	TimestampTz first_done_at = 0;
	HASHCTL		ctl;
	List	   *volatile pending_done = NIL;
	List	   *volatile leased = NIL;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (slot_index < 0 || slot_index >= OUTBOX_MAX_RELAYS)
		elog(ERROR, "invalid relay slot %d", slot_index);
	my_slot = &outbox_shared->slots[slot_index];

	BackgroundWorkerInitializeConnectionByOid(my_slot->dboid, InvalidOid, 0);

	LWLockAcquire(outbox_shared->lock, LW_EXCLUSIVE);
	my_slot->pid = MyProcPid;
	my_slot->procno = MyProcNumber;
	my_slot->started_at = GetCurrentTimestamp();
	my_slot->state = RELAY_STARTING;
	my_slot->in_flight = 0;
	my_slot->last_error[0] = '\0';
	LWLockRelease(outbox_shared->lock);
	before_shmem_exit(relay_on_exit, (Datum) 0);

	pgstat_report_appname("outbox_pg relay");
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("application_name", "outbox_pg relay", PGC_USERSET, PGC_S_OVERRIDE);

	/*
	 * The relay's own commits need not wait for the WAL flush: a lease lost
	 * in a crash leaves its rows due (sent again), and a lost result means
	 * the event is sent again after its lease.  Either way at-least-once
	 * holds, and each cycle saves a disk flush.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * The lease relies on READ COMMITTED (FOR UPDATE SKIP LOCKED with a
	 * recheck of the row): never take a database's or role's default.
	 */
	SetConfigOption("default_transaction_isolation", "read committed",
					PGC_SUSET, PGC_S_OVERRIDE);
	/* plan every lease with its real LIMIT and array sizes (see store.c) */
	SetConfigOption("plan_cache_mode", "force_custom_plan", PGC_USERSET, PGC_S_OVERRIDE);
	pg_prng_seed(&prng, (uint64) MyProcPid ^ (uint64) GetCurrentTimestamp());

	StartTransactionCommand();
	database_name = MemoryContextStrdup(TopMemoryContext,
										get_database_name(MyDatabaseId));
	CommitTransactionCommand();

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR),
				 errmsg("could not initialize libcurl")));
	http = HttpClientCreate();

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(RelayDestination);
	destinations = hash_create("outbox_pg destinations", 16, &ctl,
							   HASH_ELEM | HASH_STRINGS);
	events_context = AllocSetContextCreate(TopMemoryContext,
										   "outbox_pg events",
										   ALLOCSET_DEFAULT_SIZES);
	cycle_context = AllocSetContextCreate(TopMemoryContext,
										  "outbox_pg relay cycle",
										  ALLOCSET_DEFAULT_SIZES);

	/*
	 * "started" is logged once the relay has seen the extension (the first
	 * lease below): in a database without it the relay only starts, looks
	 * and exits, every discovery interval, and logs that once.
	 */

	for (;;)
	{
		TimestampTz now;
		long		wait_ms;
		bool		woken = false;
		HttpRequest *done;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		now = GetCurrentTimestamp();
		if (TimestampDifferenceExceeds(last_poll, now, outbox_poll_interval))
			need_lease = need_inbox = true;
		if (circuit_recheck_at != 0 && now >= circuit_recheck_at)
			need_lease = true;

		PG_TRY();
		{
			MemoryContext old = MemoryContextSwitchTo(cycle_context);

			/*
			 * Record what completed: at once when nothing else is running,
			 * else in groups (128 results, or 10 ms after the first), so that
			 * one transaction records many results.
			 */
			if (pending_done != NIL &&
				(HttpClientRunning(http) == 0 ||
				 list_length(pending_done) >= RECORD_BATCH ||
				 TimestampDifferenceExceeds(first_done_at, GetCurrentTimestamp(),
											RECORD_DELAY_MS)))
			{
				ListCell   *lc;

				relay_set_state(RELAY_WORKING, "recording results");
				relay_record(pending_done);
				foreach(lc, pending_done)
					relay_free_event(lfirst(lc));
				list_free(pending_done);
				pending_done = NIL;
			}

			/* lease and start more */
			if (need_lease && total_in_flight < outbox_batch_size)
			{
				bool		missing;
				bool		started;
				bool		drained = true;

				relay_set_state(RELAY_WORKING, "leasing events");
				circuit_recheck_at = 0; /* relay_lease() sets it again */
				started = relay_begin(&missing);
				if (!missing && !relay_announced)
					relay_announce();
				if (started)
				{
					List	   *dests = relay_load_destinations();

					if (my_slot->worker_number == 0 &&
						TimestampDifferenceExceeds(last_route, now, ROUTE_INTERVAL_MS))
					{
						if (SPI_execute_plan(route_plan, NULL, NULL, false, 0) != SPI_OK_SELECT)
							elog(ERROR, "could not route pending events");
						last_route = now;
					}
					/* retention of published events: worker 0 (retention.c) */
					if (my_slot->worker_number == 0)
						OutboxRetentionStep(now);
					if (my_slot->worker_number == 0)	/* ops: backlog warning */
						OutboxOpsCheckBacklog(database_name);
					MemoryContextSwitchTo(events_context);
					relay_lease(dests, &drained, (List **) &leased);
					MemoryContextSwitchTo(cycle_context);
				}
				relay_commit();
				/*
				 * Without the extension nothing in flight can be recorded
				 * (its rows are gone), so there is nothing to wait for.
				 */
				if (missing)
					relay_exit_no_extension();
				/*
				 * Each event leaves the list as curl takes it, so an error
				 * here never frees a request curl still uses.
				 */
				while (leased != NIL)
				{
					RelayEvent *ev = linitial(leased);

					leased = list_delete_first(leased);
					relay_start(ev);
				}
				need_lease = !drained;
				if (drained)
					last_poll = now;
			}
			MemoryContextSwitchTo(old);
		}
		PG_CATCH();
		{
			ErrorData  *edata;
			ListCell   *lc;
			bool		repeated;
			char	   *safe;

			MemoryContextSwitchTo(TopMemoryContext);
			edata = CopyErrorData();
			FlushErrorState();
			AbortCurrentTransaction();
			OutboxSlotSetError(my_slot, edata->message);
			OutboxSlotSetState(my_slot, RELAY_ERROR);
			/* the same error again within a minute is not logged again */
			now = GetCurrentTimestamp();
			repeated = (strcmp(last_logged_error, edata->message) == 0 &&
						!TimestampDifferenceExceeds(last_logged_at, now, 60000));
			strlcpy(last_logged_error, edata->message, sizeof(last_logged_error));
			if (!repeated)
				last_logged_at = now;
			/* an error may quote what a destination said */
			safe = OutboxPeerText(edata->message, strlen(edata->message), false,
								  NULL, 8 * OUTBOX_ERROR_LEN);
			ereport(repeated ? DEBUG1 : LOG,
					(errmsg("outbox_pg relay for database \"%s\" failed a cycle: %s",
							database_name, safe),
					 errhint("Leased events are sent again when their lease runs out. Retrying in %d ms.",
							 ERROR_PAUSE_MS)));
			pfree(safe);
			FreeErrorData(edata);
			/* results not recorded are re-sent after their lease */
			foreach(lc, pending_done)
				relay_free_event(lfirst(lc));
			list_free(pending_done);
			pending_done = NIL;
			/* leased but never started: their lease was rolled back */
			foreach(lc, leased)
				relay_free_event(lfirst(lc));
			list_free(leased);
			leased = NIL;
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 ERROR_PAUSE_MS, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			need_lease = true;
		}
		PG_END_TRY();
		MemoryContextReset(cycle_context);

		/* inbox: one bounded batch of received messages, and retention */
		if (need_inbox)
			need_inbox = InboxWorkerCycle(my_slot->worker_number == 0,
										  &inbox_wait_ms);

		/* send and wait */
		if (relay_outdated)
			relay_set_state(RELAY_OUTDATED,
							"waiting for ALTER EXTENSION outbox_pg UPDATE");
		else if (total_in_flight == 0)
			relay_set_state(RELAY_IDLE, "waiting for events");
		else
			relay_set_state(RELAY_WORKING, "sending");

		now = GetCurrentTimestamp();
		if (need_lease && total_in_flight < outbox_batch_size)
			wait_ms = 0;
		else if (pending_done != NIL)
			wait_ms = RECORD_DELAY_MS;
		else
		{
			wait_ms = outbox_poll_interval -
				(long) ((now - last_poll) / 1000);
			wait_ms = Max(wait_ms, 0);
			if (total_in_flight > 0)
				wait_ms = Min(wait_ms, 100);
			/* a circuit's pause ends: its probe goes out on time */
			if (circuit_recheck_at != 0)
				wait_ms = Min(wait_ms,
							  Max((long) ((circuit_recheck_at - now + 999) / 1000), 0));
		}
		if (need_inbox)
			wait_ms = Min(wait_ms, inbox_wait_ms);
		MemoryContextSwitchTo(cycle_context);
		done = HttpClientWait(http, wait_ms, &woken);
		if (woken)
			need_lease = need_inbox = true;
		MemoryContextSwitchTo(events_context);
		if (done != NULL && pending_done == NIL)
			first_done_at = GetCurrentTimestamp();
		while (done != NULL)
		{
			HttpRequest *next = done->next_done;

			pending_done = relay_completed(pending_done, done);
			done = next;
		}
		MemoryContextSwitchTo(TopMemoryContext);
		if (pending_done != NIL)
			need_lease = true;
	}
}
