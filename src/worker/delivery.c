/*-------------------------------------------------------------------------
 *
 * delivery.c
 *		  The relay's events: lease, build requests, classify and record.
 *
 * relay.c describes the protocol (at-least-once, leases, the circuit) and
 * runs the loop; this file does each step of it for the events of every
 * destination.
 *
 * Brokers (kinds sns, sqs, rabbitmq; broker.c): leased events of such a
 * destination become BrokerMessages, and one request may carry several
 * of them (SNS PublishBatch, SQS SendMessageBatch).  The first event of a
 * batch owns the request and lists the events it carries; the others are
 * never sent themselves (DeliveryStart), and all of them complete together
 * (DeliveryCompleted).  When recording, the request's response is read once
 * (OutboxBrokerClassify) and gives every carried event its own outcome,
 * so a batch answered 200 with failed entries retries or dead-letters
 * just those.  A message that can never be sent (too large) is decided
 * before sending and completes without a request.  Webhooks keep one
 * request per event and the classification of retry.c.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/delivery.c
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
#include "worker/relay.h"
#include "destination/http.h"
#include "destination/destination.h"

#define RETRY_AFTER_MAX_MS		3600000

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

/* Per-destination state, keyed by name; lives as long as the process. */
static HTAB *destinations = NULL;

/* Leased events, each in its own child context until recorded. */
MemoryContext relay_events_context = NULL;

static int	total_in_flight = 0;
static pg_prng_state prng;
static SPIPlanPtr destinations_plan = NULL;

/* Set up the per-process state of delivery; called once at start-up. */
void
DeliveryInit(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(RelayDestination);
	destinations = hash_create("outbox_pg destinations", 16, &ctl,
							   HASH_ELEM | HASH_STRINGS);
	relay_events_context = AllocSetContextCreate(TopMemoryContext,
												 "outbox_pg events",
												 ALLOCSET_DEFAULT_SIZES);
	pg_prng_seed(&prng, (uint64) MyProcPid ^ (uint64) GetCurrentTimestamp());
}

/* Events in flight (leased and not yet recorded), all destinations. */
int
DeliveryInFlight(void)
{
	return total_in_flight;
}

/* The plans delivery runs; called in every transaction that leases. */
void
DeliveryPreparePlans(void)
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
}

static RelayEvent *
relay_event_of(HttpRequest *req)
{
	return (RelayEvent *) ((char *) req - offsetof(RelayEvent, req));
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
List *
DeliveryLoadDestinations(void)
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
		MemoryContext old = MemoryContextSwitchTo(relay_cycle_context);
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
			d->target.source = psprintf("urn:outbox_pg:%s", relay_database_name);
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
			rd->stats = OutboxDestStatsAttach(RELAY_SLOT_INDEX, d->name);

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

		old = MemoryContextSwitchTo(relay_cycle_context);
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
			if (relay_circuit_recheck_at == 0 || recheck_at < relay_circuit_recheck_at)
				relay_circuit_recheck_at = recheck_at;
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
void
DeliveryStart(RelayEvent *ev)
{
	if (ev->carrier != NULL)
		return;
	ev->started_at = GetCurrentTimestamp();
	if (ev->msg != NULL && ev->msg->decided)
		HttpClientSkip(relay_http, &ev->req);
	else
		HttpClientStart(relay_http, &ev->req);
}

/* A completed request: the events it carried, in order. */
List *
DeliveryCompleted(List *pending, HttpRequest *req)
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
void
DeliveryLease(List *dests, bool *drained, List **leased)
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
	lease = MemoryContextAllocZero(relay_cycle_context, sizeof(Interval));
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

			cxt = AllocSetContextCreate(relay_events_context, "outbox_pg event",
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
			OutboxDestStatsSetInFlight(rd->stats, RELAY_SLOT_INDEX, rd->in_flight);	/* ops */

			/*
			 * SPI calls leave CurrentMemoryContext in SPI's own (transaction)
			 * memory; the list must outlive the transaction.
			 */
			old = MemoryContextSwitchTo(relay_events_context);
			*leased = lappend(*leased, ev);
			if (ev->msg != NULL)
				broker_events = lappend(broker_events, ev);
			MemoryContextSwitchTo(old);
		}
		if (broker_events != NIL)
			relay_broker_batches(d, broker_events);
	}
}

void
DeliveryFreeEvent(RelayEvent *ev)
{
	Assert(ev->req.easy == NULL);	/* never while curl still uses it */
	if (ev->req.headers)
		curl_slist_free_all(ev->req.headers);
	ev->req.headers = NULL;
	if (ev->probe)				/* gone without a result: let another probe */
		OutboxCircuitReleaseProbe(ev->dest->stats);
	ev->dest->in_flight--;
	total_in_flight--;
	OutboxDestStatsSetInFlight(ev->dest->stats, RELAY_SLOT_INDEX, ev->dest->in_flight);	/* ops */
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

		if (slot != relay_slot && slot->dboid == MyDatabaseId && slot->pid != 0)
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
void
DeliveryRecord(List *done)
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

	pg_atomic_fetch_add_u64(&relay_slot->published, nack);
	pg_atomic_fetch_add_u64(&relay_slot->failed, nretry + ndead + nrequeue);
}
