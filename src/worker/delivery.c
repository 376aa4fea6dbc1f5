/*-------------------------------------------------------------------------
 *
 * delivery.c
 *		  The relay's events: lease, build requests, classify and record.
 *
 * relay.c describes the protocol (at-least-once, leases, the circuit) and
 * runs the loop; this file does each step of it for the events of every
 * destination.
 *
 * Every kind is driven the same way, through its DestinationRoutine
 * (destination/destination.h); nothing here knows a kind by name.
 *
 *	- Load: the relay reads outbox.destinations (with their credentials),
 *	  checks every row with DestinationValidate() and has its kind load it,
 *	  both inside a subtransaction: a row that fails is skipped until the
 *	  next load (its events stay pending), with a WARNING at most once a
 *	  minute per destination and the reason in the relay's slot; the other
 *	  destinations go on.  Each destination loaded lives in its own memory
 *	  context (LoadedDestination), reference-counted: the cache holds one
 *	  reference and every event leased with it one more, so an event leased
 *	  before a reload keeps its old target until it is recorded.  Each
 *	  loaded destination is attached to its entry of runtime state in
 *	  shared memory (deststats.c); one no longer loaded lets it go once
 *	  none of its events is alive (delivery_let_go).
 *	- The cache: what was loaded is kept across lease steps, so a lease
 *	  step costs no SPI, no validation and no allocation per destination,
 *	  and a paused or circuit-open destination costs nothing at all.  It is
 *	  loaded again only when (1) the configuration generation of the
 *	  relay's slot moved: a commit that changed outbox.destinations,
 *	  outbox.credentials or outbox.routes bumps it and wakes the relays
 *	  (wake.c), so a change takes effect at the next lease step, well
 *	  within one poll; (2) the relay's previous step was skipped (extension
 *	  being updated, dropped or of another version: relay.c), or it reread
 *	  the server configuration, or a kind's client was lost for good
 *	  (DestinationReloadWanted: Kafka's fatal error; at most once per
 *	  CONFIG_RELOAD_WANTED_MS); (3) as a safety net, when the cache is
 *	  older than outbox.poll_interval, CONFIG_RELOAD_MIN_MS and
 *	  CONFIG_RELOAD_FACTOR times what the last load took, whichever is
 *	  longest.  The safety net covers the changes no commit of ours
 *	  announces: COMMIT PREPARED of a prepared transaction, and rows
 *	  written with the triggers off (session_replication_role = replica,
 *	  as logical replication applies them).  Those used to take effect at
 *	  the next lease step; they now take effect within a poll, or 10 s
 *	  when the poll is shorter.  A load costs about 10 us per destination
 *	  (validation, the kind's load, a subtransaction; measured with 1,000),
 *	  so a reload at every short poll, or every lease step under load,
 *	  would bring back what the cache saves; 10 s keeps it small, and the
 *	  factor keeps it under 0.1 % of a core per relay with tens of
 *	  thousands of destinations (a load that takes 0.5 s is redone after
 *	  500 s; with 100 it was 1 % per relay, the largest part of what two
 *	  idle relays spent with 10,000 destinations, and with 400 a fifth of
 *	  it still).
 *	- Build: leased events become OutboxMessages.  A message the kind
 *	  rejects (can never be sent) is decided dead before sending and
 *	  completes without a request.  The others go to build_request in
 *	  order; one request may carry several (SNS PublishBatch, SQS
 *	  SendMessageBatch).  The first event of a request owns it and lists
 *	  the events it carries; the others are never sent themselves
 *	  (DeliveryStart), and all complete together (DeliveryCompleted).
 *	- Native clients (destination.h; kind kafka): a kind with start/poll
 *	  gets each event after the lease step's commit (DeliveryStart), one
 *	  group per event; events its client does not take (a full queue)
 *	  wait again, in order, in front of their destination's list.  Before
 *	  each wait the clients' descriptors join the HTTP client's epoll set
 *	  (DeliveryWatchNative), after it every client is polled
 *	  (DeliveryPollNative) and its completions join the answered requests.
 *	  A client's result is the event's result; what it says about the
 *	  destination goes to the circuit like a classified answer.
 *	- Record: each request's answer is classified once
 *	  (DestinationClassify: the kind's classify, or a transport failure)
 *	  and gives every carried event its own result, so a batch answered 200
 *	  with failed entries retries or dead-letters just those.  Then, the
 *	  same for all kinds: the circuit breaker, max_attempts and max_age,
 *	  backoff and Retry-After, and the error text made safe (peertext.c).
 *	  Acks, retries (an outage's give back their attempt) and dead letters
 *	  are written with one statement each (store.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/delivery.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heaptoast.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "retry.h"
#include "deststats.h"
#include "peertext.h"
#include "util.h"
#include "worker/worker.h"
#include "worker/relay.h"
#include "destination/http.h"
#include "destination/destination.h"

#define RETRY_AFTER_MAX_MS		3600000
#define UNUSABLE_LOG_INTERVAL_MS	60000
#define CONFIG_RELOAD_MIN_MS	10000	/* the safety net's floor (see above) */
#define CONFIG_RELOAD_FACTOR	1000	/* ... and its cost's ceiling: 0.1 % */
#define CONFIG_RELOAD_WANTED_MS	1000	/* a kind's requests: at most this often */
#define CLAIM_GATHER_MS			2	/* see DeliveryLease() */
#define CLAIM_LOCKED_MS			5	/* another relay claimed: again after */
#define SWEEP_COST_FACTOR		200 /* the periodic sweep: 0.5 % of a core */
#define SWEEP_MAX_MS			60000	/* ... but at least once a minute */
#define SWEEP_GRACE_MS			5000	/* the first worker's, overdue by this */
#define SWEEP_EXPIRED_MARGIN_MS	10000	/* batches: expired since the last, less */
#define SWEEP_ALL_BATCHES_MS	600000	/* ... but all of them this often */
#define SWEEP_RETRY_MS			100 /* a failed sweep: again after this, */
#define SWEEP_RETRY_MAX_MS		10000	/* doubled up to this */
#define RECORD_DELAY_NATIVE_MS	10	/* a native client's queue was full */

/* Per-destination state that outlives a cycle; hash entry keyed by name. */
typedef struct RelayDestination
{
	char		name[NAMEDATALEN];	/* key */
	int			in_flight;		/* its events alive: sending or waiting */
	int			sending;		/* ... of which started, not answered */
	int			answered;		/* ... of which answered, not recorded */
	int			slots;			/* of its concurrency, held by this relay
								 * (deststats.c): sending never exceeds
								 * them */
	bool		probing;		/* the circuit's probe is among them */
	int			batches;		/* its log batches in flight here */
	dlist_head	waiting;		/* claimed, not started yet (in order);
								 * a list, not a List: a batch of one large
								 * transaction can be 100,000 events long,
								 * and each start took one off its head */
	dlist_head	held;			/* taken from waiting, refused by a native
								 * client's start (back-pressure): first
								 * again at the next pump (by wait_node) */
	dlist_node	answered_node;	/* in answered_dests, when answered_listed */
	bool		answered_listed;
	/* when to claim it (issue #19; see DeliveryLease) */
	int			counter;		/* its emitted generation (shmem.h) */
	uint64		seen_generation;	/* ... at its last claim that drained */
	bool		busy;			/* its last claim was full: claim again */
	bool		due;			/* the sweep found due work */
	uint64		lease_pass;		/* the last lease pass that leased for it */
	TimestampTz retry_due;		/* the earliest retry this relay wrote; 0: none */
	TimestampTz retries_look_at;	/* outbox.retries leased again then at the
									 * latest; 0: at once (delivery_lease_one) */
	TimestampTz claimed_at;		/* its last claim of new events */
	int			locked_out;		/* claims in a row that found its stream
								 * locked by another relay */
	/* its share of the worker's connections (delivery_connection_room) */
	bool		http;			/* its kind sends through the HTTP client */
	bool		multiplexed;	/* its last answer came over HTTP/2 */
	int			conn_reserve;	/* connections kept for it at the last pass */
	TimestampTz asked_until;	/* its receiver asked to wait until then
								 * (Retry-After): nothing is sent before */
	TimestampTz asked_at;		/* ... the reading asked_until came from */

	DestStats  *stats;			/* ops: statistics and the circuit (deststats.c) */
	bool		configured;		/* in the cache: loaded by the last load */

	/* configuration, refreshed at every load */
	bool		loaded;			/* by a load before this one */
	bool		paused;
	int			max_concurrency;
	int			circuit_threshold;	/* 0: no circuit breaker */
	int			timeout_ms;

	TimestampTz unusable_logged_at; /* last WARNING about its definition */
} RelayDestination;

/*
 * One destination as the relay loaded it: its row, its kind and the kind's
 * target.  In its own memory context, which goes when the cache has
 * dropped it and every event leased with it is done (refs).
 */
typedef struct LoadedDestination
{
	MemoryContext context;
	int			refs;			/* the cache's, and one per event */
	RelayDestination *dest;		/* its persistent state */
	const DestinationRoutine *routine;
	void	   *target;			/* the kind's (routine->load) */
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
	bool		ordered;		/* options.ordering = 'aggregate' */
	PeerSecrets *secrets;		/* redacted from what the peer says */
	bool		cached;			/* in the cache (config_loaded) */
	int			outstanding;	/* native client: its events started, not
								 * completed (see native_busy) */
} LoadedDestination;

/*
 * One claimed batch of a destination's log (store.c), in its own memory
 * context while any of its events is alive.  It is acknowledged, with the
 * copies of its failures, once each of its events has a result; an event
 * that goes without one (a failed cycle) abandons it to the recovery.
 */
typedef struct RelayBatch
{
	MemoryContext context;
	RelayDestination *dest;
	char	   *destination;
	int64		seq;
	TimestampTz lease_end;		/* its leased_until as this relay set it:
								 * the fence of its acknowledgement */
	int			refs;			/* its events alive */
	int			unrecorded;		/* its events without a result */
	bool		abandoned;		/* never acknowledged by this relay */
	int			nfailed;		/* to outbox.retries */
	Datum	   *f_ids;
	Datum	   *f_due;
	Datum	   *f_attempts;
	Datum	   *f_statuses;
	Datum	   *f_errors;
	bool	   *f_errnull;
	int			ndead;			/* to outbox.dead_events */
	Datum	   *d_ids;
	Datum	   *d_statuses;
	Datum	   *d_errors;
} RelayBatch;

/* One leased event, in its own memory context until recorded. */
typedef struct RelayEvent
{
	MemoryContext context;
	RelayDestination *dest;
	LoadedDestination *loaded;	/* its destination as leased; a reference */
	RelayBatch *batch;			/* its log batch; NULL: an outbox.retries row */
	pg_uuid_t	id;
	TimestampTz leased_until;	/* the lease's fence (store.c) */
	int			attempts;
	double		age_secs;
	HeapTuple	row;			/* its leased row until its message is read
								 * (delivery_fill_events); then NULL */
	OutboxMessage msg;
	DeliveryResult result;
	HttpRequest req;			/* req.owner: see relay_event_of() */
	TimestampTz pumped_at;		/* when it left its waiting list */
	TimestampTz started_at;		/* when its request was started */
	bool		probe;			/* the circuit's probe (deststats.c) */
	bool		outage;			/* failed while the circuit was open */
	bool		rejected;		/* decided before sending: no request */
	bool		deferred;		/* not sent: its receiver asked to wait */
	bool		sending;		/* started (counted in dest->sending) */
	bool		answered;		/* completed, its result not recorded yet
								 * (counted in dest->answered) */
	bool		recorded;		/* has its result (a log event's batch) */
	bool		blocked;		/* waits for an earlier event of its aggregate */
	bool		native_started; /* handed to a native client, not completed */
	bool		native_failed;	/* ... completed: the destination failed */
	bool		waiting;		/* in dest->waiting or dest->held, by
								 * wait_node */
	dlist_node	wait_node;
	dlist_node	native_node;	/* in native_events while native_started */
	struct RelayEvent *chain_next;	/* the next event of its aggregate in
									 * its batch (ordered destinations) */
	struct RelayEvent *chain_prev;	/* ... and the one before it */

	/*
	 * One request may carry several events.  The event whose req is sent
	 * lists the events it carries (itself first); the others point to it
	 * and are never sent themselves.
	 */
	List	   *carried;
	struct RelayEvent *carrier; /* set on the events carried by another */
} RelayEvent;

/* The rows one record statement changes, as its array arguments. */
typedef struct RecordRows
{
	int			n;
	Datum	   *ids;
	Datum	   *next_at;
	Datum	   *statuses;
	Datum	   *errors;
	Datum	   *leases;
	Datum	   *give_back;
} RecordRows;

/* Per-destination state, keyed by name; lives as long as the process. */
static HTAB *destinations = NULL;

/*
 * The cache of loaded destinations (LoadedDestination, one reference each)
 * and what it was loaded for.  The list lives in config_context, the
 * parent of every LoadedDestination's context.
 */
static MemoryContext config_context = NULL;
static List *config_loaded = NIL;
static bool config_valid = false;
static uint64 config_generation = 0;	/* of the slot, when loaded */
static uint64 config_seen_generation = 0;	/* read before this step */
static TimestampTz config_loaded_at = 0;
static int64 config_load_ms = 0;	/* what the last load took */
static int	config_lease_ms = 0;	/* the slowest destination's lease */

/* Leased events, each in its own child context until recorded. */
MemoryContext relay_events_context = NULL;

static int	total_in_flight = 0;
static int	total_answered = 0; /* of them, answered and not recorded */

/*
 * Destinations a wait's answers freed slots of (answered with a success,
 * events of theirs waiting): DeliveryStartAnswered() starts those events
 * before the cycle records and claims.
 */
static dlist_head answered_dests = DLIST_STATIC_INIT(answered_dests);

/*
 * The native-client transport (destination.h): the cached destinations of
 * such kinds (config_native, in config_context), the loaded destinations
 * with events started and not completed (native_busy, in
 * relay_events_context; each entry kept alive by those events), those
 * events (their leases bound the SIGTERM flush: DeliveryStop) and how
 * many.  Once stopping, nothing more is handed to a native client.
 */
static List *config_native = NIL;
static List *native_busy = NIL;
static dlist_head native_events = DLIST_STATIC_INIT(native_events);
static int	native_outstanding = 0;
static bool delivery_stopping = false;

#define NATIVE_POLL_MAX			64
#define NATIVE_MAX_EVENTS		4

/* the due-work sweep (DeliveryLease): when, and the wake generation seen */
static WorkerPace sweep_pace = {SWEEP_COST_FACTOR, SWEEP_MAX_MS, 0, 0};
static bool sweep_all = true;
static TimestampTz sweep_recovery_at = -1;	/* -1: not set yet, 0: done */
static uint64 sweep_prepared_generation = 0;
static bool sweep_on_reload = true; /* the next load is followed by one */
static bool sweep_prepared = false; /* prepared transactions at the last one */
static uint64 sweep_wake_generation = 0;
static TimestampTz sweep_expired_since = DT_NOBEGIN;
static TimestampTz sweep_all_batches_at = 0;
static int	sweep_failures = 0; /* in a row */
static TimestampTz sweep_retry_at = 0;	/* after a failed one: not before */
static WorkerErrorThrottle sweep_errors;

/*
 * The last pass (DeliveryLease): the emitted generation it saw, and
 * whether it left any destination with business; a load, the sweep's find
 * and a retry written set it again.
 */
static uint64 pass_emitted_generation = 0;
static uint64 lease_pass = 0;	/* lease passes run (DeliveryLease) */
static bool lease_pass_open = false;	/* ... the last one not committed */
static bool pass_business = true;

/*
 * The events the current pass made, whose messages are read after its
 * claims committed (DeliveryLeaseStart): one group per statement's rows,
 * with a copy of their shape.  In relay_cycle_context; pass_ran: the pass
 * was not skipped, so its destinations are pumped.
 */
typedef struct UnreadRows
{
	TupleDesc	desc;
	List	   *events;
} UnreadRows;

static List *pass_unread = NIL;
static bool pass_ran = false;
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
	config_context = AllocSetContextCreate(TopMemoryContext,
										   "outbox_pg destinations",
										   ALLOCSET_DEFAULT_SIZES);
	pg_prng_seed(&prng, (uint64) MyProcPid ^ (uint64) GetCurrentTimestamp());
}

/*
 * Events in flight (leased and not yet answered), all destinations.  An
 * answered event waits a little for its result to be recorded with
 * others (relay.c); it no longer counts.
 */
int
DeliveryInFlight(void)
{
	return total_in_flight - total_answered;
}

/* The plans delivery runs (kept: only the first call prepares them). */
static void
delivery_prepare_plans(void)
{
	WorkerKeepPlan(&destinations_plan,
				   "SELECT d.name, d.url, d.paused, d.timeout_ms, d.max_concurrency,"
				   " d.max_attempts, d.backoff_base_ms, d.backoff_max_ms,"
				   " extract(epoch FROM d.max_age)::float8, d.format, d.headers,"
				   " d.signing_secrets, d.bearer_token, d.credentials,"
				   " CASE WHEN (d.options ->> 'circuit_threshold') ~ '^[0-9]{1,6}$'"
				   "      THEN (d.options ->> 'circuit_threshold')::int4 ELSE 5 END,"
				   " d.kind, d.options, c.aws_access_key_id, c.aws_secret_access_key,"
				   " c.aws_session_token, c.username, c.password,"
				   " COALESCE(d.options ->> 'ordering' = 'aggregate', false)"
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

/* ---- loading destinations ---- */

/*
 * The string members of a jsonb object, as name/value pairs (others are
 * skipped: emit() and the configuration trigger allow strings only).
 */
static OutboxHeader *
delivery_string_pairs(Datum jsonb_datum, int *n)
{
	Jsonb	   *jb = DatumGetJsonbP(jsonb_datum);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	OutboxHeader *pairs;
	char	   *key = NULL;

	*n = 0;
	if (!JB_ROOT_IS_OBJECT(jb))
		return NULL;
	pairs = palloc(Max(JB_ROOT_COUNT(jb), 1) * sizeof(OutboxHeader));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			key = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && key != NULL && v.type == jbvString)
		{
			pairs[*n].name = key;
			pairs[(*n)++].value = pnstrdup(v.val.string.val, v.val.string.len);
		}
	}
	return pairs;
}

/* Header lines (HttpHeaderLine) from a jsonb object of strings. */
static List *
delivery_header_lines(Datum jsonb_datum)
{
	int			n;
	OutboxHeader *pairs = delivery_string_pairs(jsonb_datum, &n);
	List	   *lines = NIL;

	for (int i = 0; i < n; i++)
		lines = lappend(lines, HttpHeaderLine(pairs[i].name, pairs[i].value));
	return lines;
}

static List *
delivery_text_list(Datum array_datum)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	List	   *result = NIL;

	deconstruct_array(DatumGetArrayTypeP(array_datum), TEXTOID, -1, false,
					  TYPALIGN_INT, &elems, &nulls, &n);
	for (int k = 0; k < n; k++)
		if (!nulls[k])
			result = lappend(result, TextDatumGetCString(elems[k]));
	return result;
}

/*
 * Read one row of the destinations plan into the current memory context:
 * the delivery policy into d, what the kind sees into config.
 */
static void
delivery_read_row(HeapTuple tup, TupleDesc desc, LoadedDestination *d,
				  DestinationConfig *config)
{
	DestinationDefinition *def = palloc0(sizeof(DestinationDefinition));
	DestinationCredentials *cred = palloc0(sizeof(DestinationCredentials));
	char	   *format;
	bool		isnull;
	Datum		value;

	d->name = SPI_getvalue(tup, desc, 1);
	d->url = SPI_getvalue(tup, desc, 2);
	d->paused = DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull));
	d->timeout_ms = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
	d->max_concurrency = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
	d->max_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
	d->backoff_base_ms = DatumGetInt32(SPI_getbinval(tup, desc, 7, &isnull));
	d->backoff_max_ms = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
	d->max_age_secs = DatumGetFloat8(SPI_getbinval(tup, desc, 9, &isnull));
	format = SPI_getvalue(tup, desc, 10);
	config->structured = (format && strcmp(format, "structured") == 0);
	value = SPI_getbinval(tup, desc, 11, &isnull);
	config->header_lines = isnull ? NIL : delivery_header_lines(value);
	value = SPI_getbinval(tup, desc, 12, &isnull);
	config->signing_secrets = isnull ? NIL : delivery_text_list(value);
	config->bearer_token = SPI_getvalue(tup, desc, 13);
	config->database = relay_database_name;
	config->timeout_ms = d->timeout_ms;
	d->circuit_threshold = DatumGetInt32(SPI_getbinval(tup, desc, 15, &isnull));
	d->ordered = DatumGetBool(SPI_getbinval(tup, desc, 23, &isnull));

	def->name = d->name;
	def->url = d->url;
	def->kind = SPI_getvalue(tup, desc, 16);
	def->options = DatumGetJsonbPCopy(SPI_getbinval(tup, desc, 17, &isnull));
	def->credentials_name = SPI_getvalue(tup, desc, 14);
	cred->name = def->credentials_name;
	cred->aws_access_key_id = SPI_getvalue(tup, desc, 18);
	cred->aws_secret_access_key = SPI_getvalue(tup, desc, 19);
	cred->aws_session_token = SPI_getvalue(tup, desc, 20);
	cred->username = SPI_getvalue(tup, desc, 21);
	cred->password = SPI_getvalue(tup, desc, 22);
	def->credentials = def->credentials_name ? cred : NULL;
	config->def = def;
}

/* What the peer may echo of this destination's secrets (peertext.c). */
static PeerSecrets *
delivery_secrets(const DestinationConfig *config)
{
	const DestinationCredentials *cred = config->def->credentials;
	PeerSecretSources src;

	memset(&src, 0, sizeof(src));
	src.url = config->def->url;
	src.header_lines = config->header_lines;
	src.bearer_token = config->bearer_token;
	src.signing_secrets = config->signing_secrets;
	if (cred != NULL)
	{
		src.aws_access_key_id = cred->aws_access_key_id;
		src.aws_secret_access_key = cred->aws_secret_access_key;
		src.aws_session_token = cred->aws_session_token;
		src.username = cred->username;
		src.password = cred->password;
	}
	return OutboxPeerSecrets(&src);
}

/* The persistent state of a destination, made on first use. */
static RelayDestination *
delivery_destination(const char *name)
{
	bool		found;
	RelayDestination *rd = hash_search(destinations, name, HASH_ENTER, &found);

	if (!found)
	{
		/*
		 * Every field but the key zero, false or NULL, then the rest:
		 * dynahash does not zero a new entry (claimed_at, locked_out and
		 * conn_reserve were read before anything set them).
		 */
		memset((char *) rd + offsetof(RelayDestination, in_flight), 0,
			   sizeof(RelayDestination) - offsetof(RelayDestination, in_flight));
		dlist_init(&rd->waiting);
		dlist_init(&rd->held);
		rd->counter = OutboxEmitCounterIndex(MyDatabaseId, name);
	}
	return rd;
}

static void
delivery_release(LoadedDestination *d)
{
	Assert(d->refs > 0);
	if (--d->refs == 0)
		MemoryContextDelete(d->context);
}

/* Drop the references a list holds, and the list. */
static void
delivery_release_all(List *dests)
{
	ListCell   *lc;

	foreach(lc, dests)
		delivery_release(lfirst(lc));
	list_free(dests);
}

/*
 * A destination whose definition failed (validation or the kind's load):
 * say so in the relay's slot every time, and in a WARNING at most once a
 * minute per destination.
 */
static void
delivery_report_unusable(const char *name, ErrorData *edata)
{
	RelayDestination *rd = delivery_destination(name);
	TimestampTz now = GetCurrentTimestamp();
	bool		log_it;
	char	   *slot_error;

	log_it = (rd->unusable_logged_at == 0 ||
			  OutboxTimePassed(rd->unusable_logged_at, now,
							   UNUSABLE_LOG_INTERVAL_MS));
	if (log_it)
		rd->unusable_logged_at = now;
	ereport(log_it ? WARNING : DEBUG1,
			(errcode(edata->sqlerrcode),
			 errmsg("outbox_pg relay skips destination \"%s\"", name),
			 errdetail_internal("%s", edata->message),
			 errhint("%s", edata->hint ? edata->hint :
					 "Its events stay pending until its row in outbox.destinations is fixed; other destinations are not affected.")));
	slot_error = psprintf("destination \"%s\" skipped: %s", name, edata->message);
	OutboxSlotSetError(relay_slot, slot_error);
	pfree(slot_error);
}

/* What delivery_prepare() runs in its subtransaction. */
typedef struct DeliveryPrepareArgs
{
	LoadedDestination *d;
	const DestinationConfig *config;
} DeliveryPrepareArgs;

static void
delivery_validate_and_load(void *arg)
{
	DeliveryPrepareArgs *a = arg;
	MemoryContext old = MemoryContextSwitchTo(a->d->context);

	DestinationValidate(a->config->def);
	a->d->routine = GetDestinationRoutine(a->config->def->kind);
	a->d->target = a->d->routine->load(a->config);
	MemoryContextSwitchTo(old);
}

/*
 * Validate the definition and have its kind load it, in a subtransaction
 * (step.c): false, with the error reported, when either fails.
 * Allocations go to d->context.
 */
static bool
delivery_prepare(LoadedDestination *d, const DestinationConfig *config)
{
	DeliveryPrepareArgs args = {d, config};
	ErrorData  *edata;

	if (WorkerRunInSubtransaction(delivery_validate_and_load, &args, &edata))
		return true;
	delivery_report_unusable(config->def->name, edata);
	FreeErrorData(edata);
	return false;
}

/*
 * Load one row into its own context, or NULL when its definition is not
 * usable (skipped until the next load, see delivery_prepare()).  The
 * caller holds the one reference it returns with.
 */
static LoadedDestination *
delivery_load_row(HeapTuple tup, TupleDesc desc)
{
	MemoryContext cxt = AllocSetContextCreate(config_context,
											  "outbox_pg destination",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	LoadedDestination *d = palloc0(sizeof(LoadedDestination));
	DestinationConfig *config = palloc0(sizeof(DestinationConfig));

	d->context = cxt;
	delivery_read_row(tup, desc, d, config);
	d->secrets = delivery_secrets(config);
	MemoryContextSwitchTo(old);
	if (!delivery_prepare(d, config))
	{
		MemoryContextDelete(cxt);
		return NULL;
	}

	d->refs = 1;
	return d;
}

/* Refresh the persistent per-destination state from what was loaded. */
static void
delivery_refresh_state(LoadedDestination *d)
{
	RelayDestination *rd = delivery_destination(d->name);

	d->dest = rd;

	if (rd->stats == NULL)		/* ops */
		rd->stats = OutboxDestStatsAttach(RELAY_SLOT_INDEX, d->name);

	/*
	 * The shared circuit: closed for good without a threshold; a
	 * destination just resumed gets its probe at once.
	 */
	if (d->circuit_threshold <= 0 || (rd->paused && !d->paused))
	{
		OutboxCircuitConfigure(rd->stats, d->circuit_threshold <= 0,
							   rd->paused && !d->paused);
		rd->asked_until = 0;	/* and what its receiver asked is forgotten */
	}
	/* new to this relay, or resumed: the sweep looks at its log */
	if (!rd->loaded || (rd->paused && !d->paused))
		sweep_on_reload = true;
	rd->loaded = true;
	rd->paused = d->paused;
	rd->max_concurrency = d->max_concurrency;
	rd->http = (d->routine->start == NULL);
	rd->circuit_threshold = d->circuit_threshold;
	rd->timeout_ms = d->timeout_ms;
	rd->unusable_logged_at = 0;
}

/*
 * A destination the relay no longer has (deleted, or its row no longer
 * usable) lets its shared entry go (deststats.c) once none of its events
 * is alive here: the slots of its concurrency that this relay held go
 * back to the other relays, and the entry may serve another destination
 * when shared memory is full (outbox.max_destinations).  While events of
 * it are alive (they are recorded with the target they were leased with)
 * it keeps the entry, for their results and the circuit; the last one
 * lets it go (DeliveryFreeEvent).  Loaded again, the destination attaches
 * again, and finds its circuit and counters if the entry is still there.
 */
static void
delivery_let_go(RelayDestination *rd)
{
	if (rd->configured || rd->stats == NULL || rd->in_flight > 0)
		return;
	OutboxDestStatsDetach(rd->stats, RELAY_SLOT_INDEX);
	rd->stats = NULL;
	rd->slots = 0;
}

/*
 * Note which destinations a fresh load has, and let the others go
 * (delivery_let_go) before the new ones attach: a destination deleted and
 * one added by the same change may so share the last free entry.
 */
static void
delivery_note_configured(List *fresh)
{
	HASH_SEQ_STATUS status;
	RelayDestination *rd;
	ListCell   *lc;

	hash_seq_init(&status, destinations);
	while ((rd = hash_seq_search(&status)) != NULL)
		rd->configured = false;
	foreach(lc, fresh)
		delivery_destination(((LoadedDestination *) lfirst(lc))->name)->configured = true;
	hash_seq_init(&status, destinations);
	while ((rd = hash_seq_search(&status)) != NULL)
		delivery_let_go(rd);
}

/*
 * Before a lease step's transaction begins: note the slot's configuration
 * generation, and whether the cache must be loaded again (see the file's
 * header for when).  Reading the generation before the transaction takes
 * its snapshot is what makes the cache safe: a commit that bumped it
 * before this read was visible before the bump (wake.c), so the load sees
 * its rows; a bump after this read moves the generation again and is
 * caught at the next step.  (Starting the transaction takes locks, which
 * are memory barriers.)
 */
void
DeliveryCheckConfig(void)
{
	uint64		generation = pg_atomic_read_u64(&relay_slot->config_generation);
	int64		max_age_ms;
	TimestampTz now = GetCurrentTimestamp();

	max_age_ms = Max(Max(outbox_poll_interval, CONFIG_RELOAD_MIN_MS),
					 CONFIG_RELOAD_FACTOR * config_load_ms);
	if (generation != config_generation)
	{
		config_valid = false;
		sweep_on_reload = true;
	}
	else if (now - config_loaded_at >= max_age_ms * 1000 ||
			 (destination_reload_at != 0 && now >= destination_reload_at &&
			  now - config_loaded_at >= (int64) CONFIG_RELOAD_WANTED_MS * 1000))
		config_valid = false;
	if (!config_valid)
		destination_reload_at = 0;	/* this load is the one wanted */
	config_seen_generation = generation;
}

/*
 * Load the destinations again at the next lease step: the relay's step was
 * skipped (the extension is being updated, dropped or is of another
 * version) or it reread the server configuration.
 */
void
DeliveryForgetConfig(void)
{
	config_valid = false;
	sweep_on_reload = true;
}

/*
 * Read outbox.destinations and load every usable one: a list of
 * references in config_context.  On an error, nothing stays loaded.
 */
static List *
delivery_load_all(void)
{
	List	   *volatile loaded = NIL;

	delivery_prepare_plans();
	PG_TRY();
	{
		SPITupleTable *rows;
		uint64		nrows;

		if (SPI_execute_plan(destinations_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read outbox.destinations");
		rows = SPI_tuptable;
		nrows = SPI_processed;

		for (uint64 i = 0; i < nrows; i++)
		{
			LoadedDestination *d = delivery_load_row(rows->vals[i], rows->tupdesc);
			MemoryContext old;

			if (d == NULL)
				continue;
			old = MemoryContextSwitchTo(config_context);
			loaded = lappend(loaded, d);
			MemoryContextSwitchTo(old);
		}
	}
	PG_CATCH();
	{
		delivery_release_all(loaded);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return loaded;
}

/*
 * Load the destinations again and refresh their persistent state; the
 * cache then holds them instead of what it held, whose events keep their
 * own references.  On an error the cache stays invalid (loaded again at
 * the next step) but keeps what it held.
 */
static void
delivery_reload(void)
{
	List	   *fresh;
	ListCell   *lc;
	int			lease_ms = 0;
	TimestampTz start = GetCurrentTimestamp();

	config_valid = false;
	fresh = delivery_load_all();
	delivery_note_configured(fresh);
	foreach(lc, config_loaded)
		((LoadedDestination *) lfirst(lc))->cached = false;
	list_free(config_native);
	config_native = NIL;
	delivery_release_all(config_loaded);
	config_loaded = fresh;
	foreach(lc, config_loaded)
	{
		LoadedDestination *d = lfirst(lc);

		d->cached = true;
		if (d->routine->start != NULL)
		{
			MemoryContext old = MemoryContextSwitchTo(config_context);

			config_native = lappend(config_native, d);
			MemoryContextSwitchTo(old);
		}
		delivery_refresh_state(d);
		lease_ms = Max(lease_ms, d->timeout_ms + outbox_lease_margin);
	}
	config_lease_ms = lease_ms;
	config_generation = config_seen_generation;
	config_loaded_at = GetCurrentTimestamp();
	/*
	 * After a load that a change caused, or that found a destination new or
	 * resumed, look at all of them; the periodic reload of an unchanged
	 * configuration (the safety net) costs no sweep.
	 */
	if (sweep_on_reload)
	{
		sweep_all = true;
		sweep_retry_at = 0;		/* what failed may have been changed */
	}
	sweep_on_reload = false;
	pass_business = true;
	if (sweep_recovery_at < 0)
		sweep_recovery_at = TimestampTzPlusMilliseconds(config_loaded_at,
														lease_ms + 1000);
	config_load_ms = (config_loaded_at - start) / 1000;
	config_valid = true;
}

/*
 * The usable destinations, from the cache, loaded again first when
 * DeliveryCheckConfig() or DeliveryForgetConfig() said so.  In a relay
 * transaction; the list belongs to the cache and stays valid until the
 * next call.
 */
List *
DeliveryLoadDestinations(void)
{
	if (!config_valid)
		delivery_reload();
	return config_loaded;
}

/* ---- leasing and building requests ---- */

/* Lease again no later than at (relay_lease_again_at keeps the earliest). */
static void
relay_lease_again_by(TimestampTz at)
{
	if (relay_lease_again_at == 0 || at < relay_lease_again_at)
		relay_lease_again_at = at;
}

/*
 * A destination's events that need a slot of its concurrency: waiting or
 * sending.  Answered ones wait for their result to be recorded with others
 * (relay.c), and their slots may serve new events meanwhile: while slow
 * requests are in flight the record step waits up to RECORD_DELAY_MS for
 * more results, and a fast destination next to a slow one would wait
 * with it, its slots idle.
 */
static inline int
delivery_unanswered(RelayDestination *rd)
{
	return rd->in_flight - rd->answered;
}

/*
 * The worker's connections (outbox.max_connections_per_worker, http.c),
 * shared by its HTTP destinations that have work.  Over HTTP/1.1 every
 * request in flight holds a connection, and a request started when all
 * are busy waits inside curl for one, behind every other such request and
 * its timeout running.  A destination whose share of its concurrency in
 * this worker came close to the limit (a slow receiver: 500 requests in
 * flight, each on its own connection, under 512) left the others a few
 * connections, and their requests queued behind its (a fast neighbour
 * kept 0.79x of its rate alone).
 *
 * So each pass keeps for every HTTP destination with work the connections
 * it needs at its concurrency, at most an equal share of the limit, and a
 * destination leases no more requests than the connections the others'
 * reserves leave it (at least one).  What a destination needs is its
 * concurrency while its claims come back full, else what it has in
 * flight; over HTTP/2 a connection carries HTTP_STREAMS_PER_CONNECTION
 * requests.  The reserves are the last pass's, so a destination that
 * starts to have work takes its share within two passes, as the other's
 * requests finish.
 */
static int	conn_destinations = 0;	/* with work at the last pass */
static int	conn_reserved = 0;	/* their reserves at the last pass */

/* Connections n requests of this destination hold at once. */
static inline int
delivery_connections_for(RelayDestination *rd, int n)
{
	if (rd->multiplexed)
		return (n + HTTP_STREAMS_PER_CONNECTION - 1) / HTTP_STREAMS_PER_CONNECTION;
	return n;
}

/* Requests of this destination in flight at most, given the others. */
static int
delivery_connection_room(RelayDestination *rd)
{
	int			room;

	if (!rd->http)
		return INT_MAX;
	room = Max(HttpClientMaxConnections(relay_http) -
			   (conn_reserved - rd->conn_reserve), 1);
	/* at most 65,536 connections (the setting's bound): no overflow */
	if (rd->multiplexed)
		return room * HTTP_STREAMS_PER_CONNECTION;
	return room;
}

/*
 * After a destination's turn in a pass: its reserve for the next, added to
 * the pass's sums.
 */
static void
delivery_connection_reserve(RelayDestination *rd, bool business,
							int *destinations, int *reserved)
{
	int			fair;
	int			need;

	rd->conn_reserve = 0;
	if (!rd->http || !business)
		return;
	fair = Max(HttpClientMaxConnections(relay_http) / Max(conn_destinations, 1), 1);
	need = delivery_connections_for(rd, rd->busy ? rd->max_concurrency :
									delivery_unanswered(rd));
	rd->conn_reserve = Min(need, fair);
	*reserved += rd->conn_reserve;
	(*destinations)++;
}

/*
 * Until when a destination's receiver asked to wait (Retry-After), 0 if it
 * did not; forgotten if the clock went back since it asked (util.h).
 */
static TimestampTz
delivery_asked(RelayDestination *rd, TimestampTz now)
{
	if (rd->asked_until != 0 && now < rd->asked_at)
		rd->asked_until = 0;
	return rd->asked_until;
}

/*
 * How many events of this destination may be leased now; *probe is set
 * when the one event to lease is the circuit's probe.  The slots of the
 * destination's concurrency are shared by the relays of the database
 * (deststats.c): this settles what this relay holds of them, once per
 * lease step, and gives back what its answered events held.
 */
static int
relay_capacity(RelayDestination *rd, TimestampTz now, bool *probe)
{
	DestAdmission adm;
	int			alive = delivery_unanswered(rd);

	adm.limit = rd->max_concurrency;
	adm.alive = alive;
	adm.in_use = rd->sending;
	adm.want = 0;
	if (delivery_asked(rd, now) > now)
		relay_lease_again_by(rd->asked_until);	/* see delivery_asked_to_wait */
	else if (!rd->paused)
		adm.want = Max(Min(Min(rd->max_concurrency - alive,
							   outbox_batch_size - DeliveryInFlight()),
						   delivery_connection_room(rd) - alive), 0);

	/*
	 * Lease in chunks of at least a quarter of the destination's
	 * concurrency, so a busy destination costs one lease per several
	 * completions instead of one per completion.
	 */
	adm.chunk = (alive > 0) ? Max(1, rd->max_concurrency / 4) : 1;
	adm.circuit = (rd->circuit_threshold > 0);
	adm.now = now;
	adm.probe_expires_at = TimestampTzPlusMilliseconds(now, rd->timeout_ms +
													   outbox_lease_margin);
	OutboxDestAdmit(rd->stats, RELAY_SLOT_INDEX, &adm);
	rd->slots = adm.held;
	OutboxWakeRelays(adm.wake);
	if (adm.recheck_at != 0)
		relay_lease_again_by(adm.recheck_at);
	*probe = adm.probe;
	return adm.granted;
}

/*
 * Nothing more to lease for this destination now: give back the slots of
 * its concurrency that its events no longer need (or take those its
 * waiting events lack, if free).  Costs nothing when they match.
 */
static void
relay_settle(RelayDestination *rd, TimestampTz now)
{
	DestAdmission adm;

	if (rd->slots == delivery_unanswered(rd))
		return;
	memset(&adm, 0, sizeof(adm));
	adm.limit = rd->max_concurrency;
	adm.alive = delivery_unanswered(rd);
	adm.in_use = rd->sending;
	adm.chunk = 1;
	adm.now = now;
	OutboxDestAdmit(rd->stats, RELAY_SLOT_INDEX, &adm);
	rd->slots = adm.held;
	OutboxWakeRelays(adm.wake);
}

/*
 * One claimed or leased row (store.c: a claim's or a retries lease's) as
 * an event in its own memory context, counted in flight.
 */
static RelayEvent *
delivery_new_event(LoadedDestination *d, RelayDestination *rd, bool probe,
				   RelayBatch *batch, HeapTuple tup, TupleDesc desc)
{
	MemoryContext cxt = AllocSetContextCreate(relay_events_context,
											  "outbox_pg event",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	RelayEvent *ev = palloc0(sizeof(RelayEvent));
	bool		isnull;

	ev->context = cxt;
	ev->dest = rd;
	ev->loaded = d;
	memcpy(&ev->id, DatumGetUUIDP(SPI_getbinval(tup, desc, 1, &isnull)),
		   sizeof(pg_uuid_t));
	ev->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
	ev->age_secs = DatumGetFloat8(SPI_getbinval(tup, desc, 9, &isnull));
	ev->leased_until = DatumGetTimestampTz(SPI_getbinval(tup, desc, 10, &isnull));

	/* ordering chains events by it (delivery_queue_rows) */
	ev->msg.aggregate_id = SPI_getvalue(tup, desc, 3);
	/* the rest is read after the stream locks are gone */
	ev->row = HeapTupleHasExternal(tup) ? toast_flatten_tuple(tup, desc) :
		heap_copytuple(tup);
	ev->msg.destination = d->name;

	ev->req.url = d->url;
	ev->req.timeout_ms = d->timeout_ms;
	MemoryContextSwitchTo(old);

	/*
	 * Counted once nothing above can fail (out of memory, a toasted value
	 * that cannot be read): an error there leaves no reference, probe or
	 * batch counted for an event that does not exist (a batch counted in
	 * rd->batches for ever held an ordered destination's claims back).
	 */
	d->refs++;
	ev->probe = probe;
	if (probe)
		rd->probing = true;
	ev->batch = batch;
	if (batch != NULL)
	{
		if (batch->refs++ == 0)
			rd->batches++;
		batch->unrecorded++;
	}
	rd->in_flight++;
	total_in_flight++;
	OutboxDestStatsSetInFlight(rd->stats, RELAY_SLOT_INDEX, rd->in_flight);	/* ops */
	return ev;
}

/*
 * An event's created_at as its message's time: RFC 3339 in UTC with
 * microseconds, what the SQL functions' to_char() gives
 * (STORE_EVENT_COLUMNS), without to_char's format parsing.
 */
static char *
delivery_event_time(Datum created_at)
{
	TimestampTz ts = DatumGetTimestampTz(created_at);
	struct pg_tm tm;
	fsec_t		fsec;

	if (TIMESTAMP_NOT_FINITE(ts))
		return NULL;			/* as to_char() */
	if (timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0 ||
		tm.tm_year < 1 || tm.tm_year > 9999)
	{
		/* outside four-digit years: to_char() itself */
		Datum		utc = DirectFunctionCall2(timestamptz_zone,
											  CStringGetTextDatum("UTC"),
											  created_at);
		Datum		format = CStringGetTextDatum("YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"");

		return TextDatumGetCString(DirectFunctionCall2(timestamp_to_char,
													   utc, format));
	}
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
					tm.tm_year, tm.tm_mon, tm.tm_mday,
					tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec);
}

/*
 * Read the message of each event a lease pass made (delivery_new_event),
 * from its row as leased, in desc's shape.  In a transaction (the output
 * functions are looked up), after the pass's claims committed.
 */
static void
delivery_fill_events(TupleDesc desc, List *events)
{
	ListCell   *lc;

	foreach(lc, events)
	{
		RelayEvent *ev = lfirst(lc);
		MemoryContext old = MemoryContextSwitchTo(ev->context);
		HeapTuple	tup = ev->row;
		bool		isnull;
		Datum		headers;

		ev->msg.id = SPI_getvalue(tup, desc, 1);
		ev->msg.type = SPI_getvalue(tup, desc, 2);
		ev->msg.payload = SPI_getvalue(tup, desc, 4);
		headers = SPI_getbinval(tup, desc, 5, &isnull);
		if (!isnull)
			ev->msg.headers = delivery_string_pairs(headers, &ev->msg.nheaders);
		ev->msg.traceparent = SPI_getvalue(tup, desc, 6);

		/*
		 * A traceparent that is not valid now (stored by 0.4.0, which let any
		 * text follow a later version's fields) is left out of every kind's
		 * message: headers, bodies and attributes alike.
		 */
		if (ev->msg.traceparent != NULL &&
			!OutboxTraceparentIsValid(ev->msg.traceparent))
			ev->msg.traceparent = NULL;
		if (TupleDescAttr(desc, 6)->atttypid == TIMESTAMPTZOID)
			ev->msg.time = delivery_event_time(SPI_getbinval(tup, desc, 7,
															 &isnull));
		else
			ev->msg.time = SPI_getvalue(tup, desc, 7);
		heap_freetuple(tup);
		ev->row = NULL;
		MemoryContextSwitchTo(old);
	}
}

/*
 * Turn the events to send into HTTP requests, in order: each request is
 * built in, and owned by, its first event's memory, and carries as many
 * of the following events as the kind took.
 */
static void
delivery_build_requests(LoadedDestination *d, RelayEvent **evs,
						OutboxMessage **msgs, int n)
{
	for (int i = 0; i < n;)
	{
		RelayEvent *first = evs[i];
		MemoryContext old = MemoryContextSwitchTo(first->context);
		int			k;

		Assert(first->carried == NIL);	/* built once (delivery_pump) */
		k = d->routine->build_request(d->target, &msgs[i],
									  Min(n - i, d->routine->max_batch),
									  &first->req);
		Assert(k >= 1 && k <= Min(n - i, d->routine->max_batch));
		for (int j = i; j < i + k; j++)
		{
			first->carried = lappend(first->carried, evs[j]);
			if (j > i)
				evs[j]->carrier = first;
		}
		MemoryContextSwitchTo(old);
		i += k;
	}
}

/*
 * Prepare a destination's leased events for sending: a message its kind
 * rejects is decided dead here and completes without a request; the
 * others become requests.
 */
static void
delivery_build(LoadedDestination *d, List *events)
{
	int			n = list_length(events);
	RelayEvent **evs = palloc(n * sizeof(RelayEvent *));
	OutboxMessage **msgs = palloc(n * sizeof(OutboxMessage *));
	int			nsend = 0;
	ListCell   *lc;

	foreach(lc, events)
	{
		RelayEvent *ev = lfirst(lc);
		MemoryContext old = MemoryContextSwitchTo(ev->context);
		const char *why = NULL;

		if (d->routine->reject != NULL)
			why = d->routine->reject(d->target, &ev->msg);
		if (why != NULL)
		{
			DeliveryResultSet(&ev->result, OUTCOME_DEAD, why);
			ev->rejected = true;
			ev->carried = list_make1(ev);	/* completes unsent */
		}
		else
		{
			evs[nsend] = ev;
			msgs[nsend++] = &ev->msg;
		}
		MemoryContextSwitchTo(old);
	}

	/*
	 * A kind with a native client (start/poll, see destination.h) is
	 * handed each message after the commit (DeliveryStart), one group per
	 * event; the others become requests now.
	 */
	if (d->routine->start != NULL)
	{
		for (int i = 0; i < nsend; i++)
		{
			MemoryContext old = MemoryContextSwitchTo(evs[i]->context);

			evs[i]->carried = list_make1(evs[i]);
			evs[i]->req.retry_after_secs = -1;
			MemoryContextSwitchTo(old);
		}
	}
	else if (nsend > 0)
		delivery_build_requests(d, evs, msgs, nsend);
	pfree(evs);
	pfree(msgs);
}

/*
 * A native client took nothing (back-pressure), or the relay is stopping:
 * the event waits again, in front of what its destination still has
 * waiting, and in order behind those held before it.  The next lease step
 * (soon: relay_lease_again_by) pumps it again.
 */
static void
delivery_hold(RelayEvent *ev)
{
	RelayDestination *rd = ev->dest;

	dlist_push_tail(&rd->held, &ev->wait_node);
	ev->waiting = true;
	if (ev->sending)
	{
		ev->sending = false;
		rd->sending--;
	}
	if (!delivery_stopping)
		relay_lease_again_by(TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														 RECORD_DELAY_NATIVE_MS));
}

/* Hand a leased event to its destination's native client (destination.h). */
static void
delivery_start_native(RelayEvent *ev)
{
	LoadedDestination *d = ev->loaded;
	OutboxMessage *msg = &ev->msg;

	/* in order: nothing passes an event held before it */
	if (delivery_stopping || !dlist_is_empty(&ev->dest->held) ||
		d->routine->start(d->target, &msg, 1, ev) == 0)
	{
		delivery_hold(ev);
		return;
	}
	ev->native_started = true;
	/* before anything that can fail: the completion takes it off the list */
	dlist_push_tail(&native_events, &ev->native_node);
	native_outstanding++;
	if (d->outstanding++ == 0)
	{
		MemoryContext old = MemoryContextSwitchTo(relay_events_context);

		native_busy = lappend(native_busy, d);
		MemoryContextSwitchTo(old);
	}
}

/*
 * The receiver of ev's destination asked this relay to wait (Retry-After,
 * delivery_asked_to_wait): ev is not sent, and completes at once as a
 * retry due when the wait ends.  Like an event failed while the circuit is
 * open (the circuit is open until then), it is not charged an attempt.
 * Its error says why; the destination's statistics do not count it, as no
 * request was made.
 */
static void
delivery_defer(RelayEvent *ev, TimestampTz now)
{
	ListCell   *lc;
	char	   *why;
	MemoryContext old = MemoryContextSwitchTo(ev->context);

	why = psprintf("not sent: the destination asked to wait until %s (Retry-After)",
				   timestamptz_to_str(ev->dest->asked_until));
	ev->deferred = true;
	if (ev->carried == NIL)
		ev->carried = list_make1(ev);
	foreach(lc, ev->carried)
	{
		RelayEvent *carried = lfirst(lc);

		DeliveryResultSet(&carried->result, OUTCOME_RETRY, why);
		carried->outage = true;
	}
	ev->req.retry_after_secs =
		(int) ((ev->dest->asked_until - now + USECS_PER_SEC - 1) / USECS_PER_SEC);
	MemoryContextSwitchTo(old);
	HttpClientSkip(relay_http, &ev->req);
}

/* Send a leased event's request (unless another event's request carries it). */
void
DeliveryStart(RelayEvent *ev)
{
	if (ev->carrier != NULL || ev->blocked)
		return;
	ev->started_at = GetCurrentTimestamp();
	if (ev->rejected)
		HttpClientSkip(relay_http, &ev->req);
	else if (delivery_asked(ev->dest, ev->started_at) > ev->started_at &&
			 ev->loaded->routine->start == NULL)
		delivery_defer(ev, ev->started_at);
	else if (ev->loaded->routine->start != NULL)
		delivery_start_native(ev);
	else
		HttpClientStart(relay_http, &ev->req);
}

/*
 * Whether ev waited to start for a quarter of outbox.lease_margin since it
 * was pumped: its lease had about its timeout and half the margin left
 * then (delivery_pump; a renewal counts from its transaction's start), and
 * its request must end before the lease does, so relay.c starts it now
 * whatever it has started already.  Checked only where relay.c starts
 * events, so the bound is approximate: the record and inbox steps between
 * two starts add their time.
 */
bool
DeliveryStartOverdue(RelayEvent *ev, TimestampTz now)
{
	return OutboxTimePassed(ev->pumped_at, now, outbox_lease_margin / 4);
}

/* Whether DeliveryStart() would start a request of the HTTP client for ev. */
bool
DeliveryWouldSend(RelayEvent *ev)
{
	return ev->carrier == NULL && !ev->blocked && !ev->rejected &&
		ev->loaded->routine->start == NULL;
}

/*
 * An event's request was answered (or its native client reported): it no
 * longer holds a slot of its destination's concurrency, and waits for its
 * result to be recorded.
 */
static void
delivery_answered(RelayEvent *ev)
{
	if (ev->sending)
	{
		ev->sending = false;
		ev->dest->sending--;
	}
	if (!ev->answered)
	{
		ev->answered = true;
		ev->dest->answered++;
		total_answered++;
	}
}

/*
 * Before a wait: the descriptors every native client wants watched join
 * the HTTP client's wait (HttpClientWatch), so its completions end the
 * wait like an answer does.
 */
void
DeliveryWatchNative(void)
{
	List	   *lists[2] = {config_native, native_busy};

	for (int l = 0; l < lengthof(lists); l++)
	{
		ListCell   *lc;

		foreach(lc, lists[l])
		{
			LoadedDestination *d = lfirst(lc);
			pgsocket	socks[NATIVE_MAX_EVENTS];
			uint32		events[NATIVE_MAX_EVENTS];
			int			n;

			if (l == 1 && d->cached)
				continue;		/* done in the first list */
			n = d->routine->wait_events(d->target, socks, events,
										NATIVE_MAX_EVENTS);
			for (int i = 0; i < n; i++)
				if (!HttpClientWatch(relay_http, socks[i], events[i]))
					elog(DEBUG1, "could not watch a broker client's descriptor: %m");
		}
	}
}

/* Poll one loaded destination's client: its completed events onto pending. */
static List *
delivery_poll_one(LoadedDestination *d, List *pending)
{
	void	   *tokens[NATIVE_POLL_MAX];
	DeliveryResult *results[NATIVE_POLL_MAX];
	bool		failed[NATIVE_POLL_MAX];
	int			k;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext old;

	do
	{
		/* the results are the loop's: its context is reset every iteration */
		old = MemoryContextSwitchTo(relay_cycle_context);
		k = d->routine->poll(d->target, tokens, results, failed, NATIVE_POLL_MAX);
		MemoryContextSwitchTo(old);
		for (int i = 0; i < k; i++)
		{
			RelayEvent *ev = (RelayEvent *) tokens[i];

			old = MemoryContextSwitchTo(ev->context);
			Assert(ev->native_started);
			if (results[i]->decided)
				DeliveryResultSetBinary(&ev->result, results[i]->outcome,
										results[i]->error,
										results[i]->error_len);
			MemoryContextSwitchTo(old);
			ev->native_failed = failed[i];
			ev->native_started = false;
			dlist_delete(&ev->native_node);
			delivery_answered(ev);
			ev->req.duration_us = now - ev->started_at;
			ev->loaded->outstanding--;
			native_outstanding--;
			old = MemoryContextSwitchTo(relay_events_context);
			pending = lappend(pending, ev);
			MemoryContextSwitchTo(old);
		}
	} while (k == NATIVE_POLL_MAX);
	return pending;
}

/*
 * After a wait: poll every native client that has work or may have
 * something to say (the cached destinations of such kinds, and loaded ones
 * with events started), never blocking; the events that completed are
 * appended to pending, for DeliveryRecord() like answered requests.
 */
List *
DeliveryPollNative(List *pending)
{
	ListCell   *lc;
	List	   *still = NIL;
	MemoryContext old;

	if (config_native == NIL && native_busy == NIL)
		return pending;
	foreach(lc, config_native)
		pending = delivery_poll_one(lfirst(lc), pending);
	foreach(lc, native_busy)
	{
		LoadedDestination *d = lfirst(lc);

		if (!d->cached)
			pending = delivery_poll_one(d, pending);
	}

	/* before any is recorded, and so perhaps freed */
	old = MemoryContextSwitchTo(relay_events_context);
	foreach(lc, native_busy)
	{
		LoadedDestination *d = lfirst(lc);

		if (d->outstanding > 0)
			still = lappend(still, d);
	}
	list_free(native_busy);
	native_busy = still;
	MemoryContextSwitchTo(old);
	return pending;
}

/* Events handed to native clients and not completed. */
int
DeliveryNativeOutstanding(void)
{
	return native_outstanding;
}

/*
 * A failed answer with Retry-After (429, or a 5xx: OutboxIsDestinationFailure)
 * asks the sender to wait: with the circuit breaker on, its circuit opens
 * at once for that long (up to an hour), for every relay of the database
 * (OutboxCircuitHold), and this relay sends none of the destination's
 * events it has already leased until then (delivery_defer).  Done as the
 * answer arrives, before the relay starts more requests; the answer is
 * classified and recorded later, like any other, and its event is not
 * charged (the circuit is open).  Without the circuit breaker only the
 * event answered waits (delivery_retry_at), as every failure is then the
 * event's.  A native client's completion carries no Retry-After.
 */
static void
delivery_asked_to_wait(RelayEvent *ev, HttpRequest *req)
{
	RelayDestination *rd = ev->dest;
	TimestampTz now;
	TimestampTz until;
	bool		log_it;

	if (rd->circuit_threshold <= 0 || rd->stats == NULL || req->status == 0 ||
		!OutboxIsDestinationFailure(req->status, req->failure))
		return;
	now = GetCurrentTimestamp();
	until = TimestampTzPlusMilliseconds(now,
										Min((int64) req->retry_after_secs * 1000,
											RETRY_AFTER_MAX_MS));
	rd->asked_until = Max(delivery_asked(rd, now), until);
	rd->asked_at = now;
	if (OutboxCircuitHold(rd->stats, until, &log_it) == CIRCUIT_OPENED && log_it)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("outbox_pg destination \"%s\" answered %d with Retry-After: %d s; circuit opened",
						rd->name, req->status, req->retry_after_secs),
				 errdetail("All relays of the database pause the destination for that long (at most an hour), then probe it with one event."),
				 errhint("Events for it wait without using up attempts; other destinations are not affected. Pausing and resuming it (outbox.pause(), outbox.resume()) probes at once.")));
}

/*
 * The relay is stopping (SIGTERM): nothing more goes to a native client.
 * Returns until when it may wait for the outstanding ones: the earliest
 * lease among them, after which another relay may send them again (0 if
 * there are none).  Read from the events themselves: a bound kept as they
 * were started was the lease of the first event started since the last
 * moment none was outstanding, under a steady load long past, and the
 * flush gave up at once.
 */
TimestampTz
DeliveryStop(void)
{
	TimestampTz deadline = 0;
	dlist_iter	iter;

	delivery_stopping = true;
	dlist_foreach(iter, &native_events)
	{
		RelayEvent *ev = dlist_container(RelayEvent, native_node, iter.cur);
		TimestampTz fence = ev->batch ? ev->batch->lease_end : ev->leased_until;

		if (deadline == 0 || fence < deadline)
			deadline = fence;
	}
	return deadline;
}

/* A completed request: the events it carried, in order. */
List *
DeliveryCompleted(List *pending, HttpRequest *req)
{
	RelayEvent *ev = relay_event_of(req);
	ListCell   *lc;

	if (req->status != 0)
		ev->dest->multiplexed = req->multiplexed;
	if (req->retry_after_secs > 0 && !ev->deferred)
		delivery_asked_to_wait(ev, req);

	/*
	 * A success (nothing for the circuit or the backoff to weigh first)
	 * lets the destination's next events take the slot at once (not an
	 * ordered destination's: what waits there is mostly blocked until this
	 * result is recorded, and the record step starts it).
	 */
	if (req->failure == TRANSPORT_OK && req->status >= 200 &&
		req->status < 300 && !ev->probe && !ev->loaded->ordered &&
		!ev->dest->answered_listed && !ev->dest->probing &&
		!dlist_is_empty(&ev->dest->waiting))
	{
		dlist_push_tail(&answered_dests, &ev->dest->answered_node);
		ev->dest->answered_listed = true;
	}
	if (ev->carried == NIL)
	{
		delivery_answered(ev);
		return lappend(pending, ev);
	}
	foreach(lc, ev->carried)
		delivery_answered(lfirst(lc));
	return list_concat(pending, ev->carried);
}

/*
 * The lease's length: long enough for the slowest destination's request
 * (worked out when the destinations were loaded).
 */
static Interval *
delivery_lease_interval(void)
{
	Interval   *lease;

	lease = MemoryContextAllocZero(relay_cycle_context, sizeof(Interval));
	lease->time = (int64) config_lease_ms * 1000;
	return lease;
}

/*
 * A batch the claim (or the recovery) left in SPI_tuptable: seq is its
 * last column.  Counted in flight for its destination until its last
 * event is freed.
 */
static RelayBatch *
delivery_new_batch(RelayDestination *rd, uint64 n)
{
	MemoryContext cxt = AllocSetContextCreate(relay_events_context,
											  "outbox_pg batch",
											  ALLOCSET_SMALL_SIZES);
	RelayBatch *b = MemoryContextAllocZero(cxt, sizeof(RelayBatch));
	bool		isnull;

	b->context = cxt;
	b->dest = rd;
	b->destination = MemoryContextStrdup(cxt, rd->name);
	b->seq = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc,
										 SPI_tuptable->tupdesc->natts, &isnull));
	b->lease_end = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 10,
													 &isnull));
	b->f_ids = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->f_due = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->f_attempts = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->f_statuses = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->f_errors = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->f_errnull = MemoryContextAlloc(cxt, n * sizeof(bool));
	b->d_ids = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->d_statuses = MemoryContextAlloc(cxt, n * sizeof(Datum));
	b->d_errors = MemoryContextAlloc(cxt, n * sizeof(Datum));
	return b;				/* counted in rd->batches with its first event */
}

/* The last event of a batch is gone. */
static void
delivery_free_batch(RelayBatch *b)
{
	b->dest->batches--;
	MemoryContextDelete(b->context);
}

/* an event of a claimed batch and its place in it, for the sort below */
typedef struct ChainEntry
{
	const char *aggregate_id;
	uint64		pos;
	RelayEvent *ev;
} ChainEntry;

static int
chain_entry_cmp(const void *a, const void *b)
{
	const ChainEntry *x = a;
	const ChainEntry *y = b;
	int			c = strcmp(x->aggregate_id, y->aggregate_id);

	if (c != 0)
		return c;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

/*
 * Chain each event of a claimed batch of an ordered destination behind the
 * previous event of its aggregate in the batch, which it waits for
 * (blocked).  Sorted by aggregate, then position: a claim takes whole
 * transactions, so a batch can hold tens of thousands of events, and a
 * search back from each event for its aggregate's previous one was
 * quadratic in the worst case.
 */
static void
delivery_chain_aggregates(RelayEvent **evs, uint64 n)
{
	ChainEntry *entries = palloc(Max(n, 1) * sizeof(ChainEntry));
	uint64		m = 0;

	for (uint64 i = 0; i < n; i++)
	{
		if (evs[i]->msg.aggregate_id == NULL)
			continue;
		entries[m].aggregate_id = evs[i]->msg.aggregate_id;
		entries[m].pos = i;
		entries[m].ev = evs[i];
		m++;
	}
	if (m > 1)
		qsort(entries, m, sizeof(ChainEntry), chain_entry_cmp);
	for (uint64 k = 1; k < m; k++)
	{
		if (strcmp(entries[k - 1].aggregate_id, entries[k].aggregate_id) != 0)
			continue;
		entries[k - 1].ev->chain_next = entries[k].ev;
		entries[k].ev->chain_prev = entries[k - 1].ev;
		entries[k].ev->blocked = true;
	}
	pfree(entries);
}

/*
 * Make events of the n rows in SPI_tuptable (a retries lease when batch is
 * NULL, else a claimed batch) and queue them, in order, on the
 * destination's waiting list; their messages are read from their rows by
 * DeliveryLeaseStart, after the claims committed.  On an ordered
 * destination each event of a batch whose aggregate has an earlier event
 * in the batch waits for that one's acknowledgement (blocked, chained
 * behind it).
 */
static void
delivery_queue_rows(LoadedDestination *d, RelayDestination *rd, bool probe,
					RelayBatch *batch, uint64 n)
{
	SPITupleTable *rows = SPI_tuptable;
	RelayEvent **evs = palloc(Max(n, 1) * sizeof(RelayEvent *));
	MemoryContext old = MemoryContextSwitchTo(relay_cycle_context);
	UnreadRows *unread = palloc(sizeof(UnreadRows));

	unread->desc = CreateTupleDescCopy(rows->tupdesc);
	unread->events = NIL;
	pass_unread = lappend(pass_unread, unread);
	MemoryContextSwitchTo(old);

	for (uint64 i = 0; i < n; i++)
	{
		RelayEvent *ev = delivery_new_event(d, rd, probe && i == 0, batch,
											rows->vals[i], rows->tupdesc);

		old = MemoryContextSwitchTo(relay_cycle_context);
		unread->events = lappend(unread->events, ev);
		MemoryContextSwitchTo(old);
		evs[i] = ev;
		dlist_push_tail(&rd->waiting, &ev->wait_node);
		ev->waiting = true;
	}
	if (batch != NULL && d->ordered)
		delivery_chain_aggregates(evs, n);
	pfree(evs);
}

/*
 * Take from the destination's waiting list what may start now: in order,
 * skipping blocked events, while fewer are sending than the slots this
 * relay holds of the destination's concurrency (relay_capacity; nothing
 * but the circuit's probe while it is out).  Their requests
 * are built; the list of them (in relay_cycle_context: callers copy it) is
 * returned for DeliveryStart().
 *
 * They leave the waiting list only once their lease is renewed and their
 * requests built: an error before (the renewal's UPDATE refused or
 * cancelled, a request that could not be built) leaves them there, where
 * the failed cycle frees them (DeliveryDropWaiting) with the slots they
 * would have taken.  Taken off first, they were referenced by nothing and
 * counted as sending for as long as the worker lived: the destination's
 * slots stayed full, and this relay never sent to it again.
 */
static List *
delivery_pump(RelayDestination *rd)
{
	List	   *ready = NIL;
	ListCell   *lc;
	dlist_iter	iter;
	int			sending = rd->sending;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext old = MemoryContextSwitchTo(relay_cycle_context);

	/* what a native client did not take goes first, in its order */
	while (!dlist_is_empty(&rd->held))
	{
		dlist_node *node = dlist_tail_node(&rd->held);

		dlist_delete(node);
		dlist_push_head(&rd->waiting, node);
	}
	dlist_foreach(iter, &rd->waiting)
	{
		RelayEvent *ev = dlist_container(RelayEvent, wait_node, iter.cur);

		if (sending >= rd->slots)
			break;
		if (rd->probing && !ev->probe)
			break;
		if (ev->blocked)
			continue;
		sending++;
		ready = lappend(ready, ev);
	}
	MemoryContextSwitchTo(old);

	/*
	 * A batch sent in several rounds (more events than the destination's
	 * concurrency, or an aggregate's events one after the other): its
	 * lease is renewed when a round starts that could outlast it, so the
	 * recovery does not take it while it is still being sent.  In the
	 * caller's transaction.
	 */
	foreach(lc, ready)
	{
		RelayEvent *ev = lfirst(lc);
		int			ms = ev->loaded->timeout_ms + outbox_lease_margin;

		/*
		 * Renewed when less than the request's timeout and half the lease
		 * margin is left: a round that starts soon after the claim does
		 * not renew (the claim's lease, from its transaction's start, was
		 * always a little short of a full one from now: every event of
		 * every batch renewed it, an UPDATE per event).
		 */
		if (ev->batch != NULL &&
			TimestampTzPlusMilliseconds(now, ev->loaded->timeout_ms +
										outbox_lease_margin / 2) > ev->batch->lease_end)
		{
			Interval   *lease = palloc0(sizeof(Interval));

			lease->time = (int64) Max(ms, config_lease_ms) * 1000;
			/*
			 * Not moved: another worker recovered the batch after its lease
			 * ran out (this relay was stopped or slow) and sends it again;
			 * this relay's results are late and must not acknowledge it.
			 */
			if (!ev->batch->abandoned &&
				!OutboxStoreBatchLease(ev->batch->destination, ev->batch->seq,
									   lease, &ev->batch->lease_end))
				ev->batch->abandoned = true;
		}
	}

	/* built per run of events loaded with the same configuration */
	for (int i = 0; i < list_length(ready);)
	{
		LoadedDestination *d = ((RelayEvent *) list_nth(ready, i))->loaded;
		List	   *run = NIL;

		old = MemoryContextSwitchTo(relay_cycle_context);
		while (i < list_length(ready) &&
			   ((RelayEvent *) list_nth(ready, i))->loaded == d)
			run = lappend(run, list_nth(ready, i++));
		delivery_build(d, run);
		list_free(run);
		MemoryContextSwitchTo(old);
	}

	foreach(lc, ready)
	{
		RelayEvent *ev = lfirst(lc);

		dlist_delete(&ev->wait_node);
		ev->pumped_at = now;
		ev->waiting = false;
		ev->sending = true;
		rd->sending++;
	}
	return ready;
}

/*
 * Is the periodic sweep of the database's worker 0 overdue (see
 * delivery_sweep)?  Also when there is no worker 0 at the moment.
 */
static bool
delivery_sweeper_overdue(TimestampTz now)
{
	int64		grace_ms = Max(SWEEP_GRACE_MS, 2 * (int64) outbox_poll_interval);
	RelaySlot  *first = OutboxFirstRelaySlot(MyDatabaseId);
	TimestampTz due;

	if (first == NULL)
		return true;			/* no first worker: it is not sweeping */
	due = (TimestampTz) pg_atomic_read_u64(&first->sweep_due_at);
	return (due != 0 && now >= TimestampTzPlusMilliseconds(due, grace_ms));
}

/*
 * The sweep: mark the destinations with due work (store.c,
 * OutboxStoreDueDestinations), after the destinations were loaded again,
 * when a commit woke the relays without naming its destinations (wake.c),
 * and periodically on the database's first relay worker (on another
 * while the first one's is overdue).  What the periodic one finds is
 * work no commit announced (events committed by
 * COMMIT PREPARED, a retry another worker wrote, a batch of a relay that
 * died or stopped), and the first worker claims it; a worker's own
 * retries coming due are its own to claim (retry_due).  The periodic
 * sweep leaves out the log (its costlier half) unless a transaction that
 * emitted events was prepared since the last one (wake.c bumps the
 * prepared generation at PREPARE) or prepared transactions exist now or
 * did then: every other event was announced by its commit.
 *
 * Its cost grows with the destinations that exist (a few index probes
 * each; on the development VM, one acknowledged batch per destination:
 * with the log 11 ms for 1,000 and 136 ms for 10,000, without it 3 and
 * 42 ms), so the periodic sweep is paced (pace.c): every
 * outbox.poll_interval, or SWEEP_COST_FACTOR times its last duration if
 * that is longer, at most SWEEP_MAX_MS.  With 10,000 destinations that
 * is every 8-30 s instead of every second; only what the periodic sweep
 * alone finds waits that long.  The other workers leave it to the first,
 * unless its sweep is overdue by SWEEP_GRACE_MS (and two poll intervals):
 * a first worker that is stopped or stuck would otherwise leave the
 * batches it holds unacknowledged for as long as it stays so, since only
 * the periodic sweep finds them (delivery_sweeper_overdue).
 *
 * The one case that is not rare, a relay that died (a crash restarts
 * every relay; an error restarts the one), does not wait for it: every
 * relay sweeps once more, unpaced, when the leases its predecessor may
 * have taken have run out (sweep_recovery_at: its first load of the
 * destinations plus their longest lease), and claims the batches left
 * unacknowledged.
 *
 * A sweep that fails is retried (see delivery_sweep), and what it was
 * asked for stays asked for until one succeeds.
 */

/* What delivery_sweep() runs in its subtransaction. */
typedef struct SweepRun
{
	TimestampTz now;
	bool		full;			/* with the log */
	uint64		prepared;		/* the slot's prepared generation */
	bool		prepared_now;	/* prepared transactions now */
	TimestampTz expired_since;	/* the batches whose lease ran out since */
} SweepRun;

static void
delivery_sweep_run(void *arg)
{
	SweepRun   *run = arg;
	uint64		n;

	/*
	 * The log is looked at by the periodic sweep only for prepared
	 * transactions: one prepared since the last sweep (its generation
	 * moved; it may have been committed since), or one there now or at the
	 * last sweep (committed meanwhile, or still to be).
	 */
	run->prepared_now = OutboxStorePreparedTransactions();
	run->full |= (run->prepared != sweep_prepared_generation ||
				  run->prepared_now || sweep_prepared);

	/*
	 * The batches whose lease ran out: those that expired since 10 s
	 * before this worker's last sweep, not all of them (each costs a probe
	 * of batch_acks, and there is one per destination that ever had
	 * events).  A batch that expired earlier was there for the last sweep
	 * to see, unless the transaction that leased it ran for longer than
	 * its lease and the margin together; all of them are looked at by a
	 * full sweep, and every SWEEP_ALL_BATCHES_MS.
	 */
	if (run->full ||
		OutboxDeadlineReached(sweep_all_batches_at, SWEEP_ALL_BATCHES_MS,
							  run->now))
		run->expired_since = DT_NOBEGIN;
	else
		run->expired_since = sweep_expired_since;
	n = OutboxStoreDueDestinations(run->full, run->expired_since);
	for (uint64 i = 0; i < n; i++)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i],
										SPI_tuptable->tupdesc, 1);
		RelayDestination *rd = hash_search(destinations, name, HASH_FIND, NULL);

		if (rd != NULL)
		{
			rd->due = true;
			pass_business = true;
		}
	}
}

/* Whether the sweep after a relay's first load is due (sweep_recovery_at). */
static bool
delivery_recovery_due(TimestampTz now)
{
	return OutboxDeadlineReached(sweep_recovery_at, config_lease_ms + 1000,
								 now);
}

static void
delivery_sweep(TimestampTz now)
{
	uint64		wake = pg_atomic_read_u64(&relay_slot->wake_generation);
	SweepRun	run;
	ErrorData  *edata;

	if (sweep_recovery_at > 0 && !delivery_recovery_due(now))
		relay_lease_again_by(sweep_recovery_at);
	run.now = now;
	run.prepared = pg_atomic_read_u64(&relay_slot->prepared_generation);
	run.full = (wake != sweep_wake_generation || sweep_all ||
				(sweep_recovery_at > 0 && delivery_recovery_due(now)));
	if (!run.full &&
		(!WorkerPaceDue(&sweep_pace, now) ||
		 (relay_slot->worker_number != 0 && !delivery_sweeper_overdue(now))))
		return;
	if (!OutboxDeadlineReached(sweep_retry_at, SWEEP_RETRY_MAX_MS, now))
	{
		relay_lease_again_by(sweep_retry_at);
		return;
	}

	/*
	 * In a subtransaction: a sweep that fails (a lock_timeout on the log's
	 * tables) is logged, and tried again after SWEEP_RETRY_MS, doubled while
	 * it keeps failing; the lease step goes on without it.  What it was
	 * asked for is forgotten only once it ran: forgotten before, the events
	 * of a transaction committed by COMMIT PREPARED meanwhile waited for
	 * their destination's next emit().
	 */
	if (!WorkerRunInSubtransaction(delivery_sweep_run, &run, &edata))
	{
		int64		retry_ms;

		sweep_failures = Min(sweep_failures + 1, 16);
		retry_ms = Min((int64) SWEEP_RETRY_MS << (sweep_failures - 1),
					   SWEEP_RETRY_MAX_MS);
		sweep_retry_at = TimestampTzPlusMilliseconds(now, retry_ms);
		relay_lease_again_by(sweep_retry_at);
		WorkerReportJobError(&sweep_errors, edata,
							 "outbox_pg sweep for due events",
							 psprintf("Delivery continues; what only a sweep finds (the events of a prepared transaction, a batch whose lease ran out) is looked for again in " INT64_FORMAT " ms.",
									  retry_ms));
		return;
	}
	sweep_failures = 0;
	sweep_retry_at = 0;
	sweep_all = false;
	if (sweep_recovery_at > 0 && delivery_recovery_due(now))
		sweep_recovery_at = 0;
	sweep_wake_generation = wake;
	sweep_prepared_generation = run.prepared;
	sweep_prepared = run.prepared_now;
	sweep_expired_since = TimestampTzPlusMilliseconds(now,
													  -SWEEP_EXPIRED_MARGIN_MS);
	if (TIMESTAMP_IS_NOBEGIN(run.expired_since))
		sweep_all_batches_at = TimestampTzPlusMilliseconds(now,
														   SWEEP_ALL_BATCHES_MS);
	(void) WorkerPaceDone(&sweep_pace, now, outbox_poll_interval);
	if (relay_slot->worker_number == 0)
		pg_atomic_write_u64(&relay_slot->sweep_due_at,
							(uint64) sweep_pace.next);
}

/* delivery_pump(), onto the lease step's list of events to start */
static void
delivery_pump_into(RelayDestination *rd, List **leased)
{
	List	   *ready;
	MemoryContext old;

	if (dlist_is_empty(&rd->waiting) && dlist_is_empty(&rd->held))
		return;
	ready = delivery_pump(rd);
	old = MemoryContextSwitchTo(relay_events_context);
	*leased = list_concat(*leased, ready);
	MemoryContextSwitchTo(old);
	list_free(ready);
}

/* Whether DeliveryStartAnswered() has events to start. */
bool
DeliveryStartable(void)
{
	return !dlist_is_empty(&answered_dests);
}

/*
 * Build the requests of the events that wait for the slots the last
 * wait's answers freed, in a relay transaction (a batch's lease may be
 * renewed); *leased gets them, as from DeliveryLeaseStart().  leased NULL:
 * forget them (the lease step starts them).
 *
 * Started only by the lease step, after the record step and the claims,
 * an answered slot stayed empty while those ran (issue #20: next to a
 * destination with 1,000 requests in flight to a receiver that answers
 * after 200 ms, one with 8 slots whose receiver answers after 5 ms kept
 * 5.5 of them busy on average, 6.7 alone).  With the relay starting about
 * RELAY_START_PER_TURN requests at a time (relay.c) this shortens the wait;
 * docs/performance.md has the figures.
 */
void
DeliveryStartAnswered(List **leased)
{
	while (!dlist_is_empty(&answered_dests))
	{
		RelayDestination *rd = dlist_container(RelayDestination, answered_node,
											   dlist_pop_head_node(&answered_dests));

		rd->answered_listed = false;
		/* every waiting event is read once a lease step is over */
		if (leased != NULL && pass_unread == NIL && rd->sending < rd->slots)
			delivery_pump_into(rd, leased);
	}
}

/*
 * Whether a destination may have something for the next pass: events of
 * its own alive or slots held, a claim or a retry to make, new events not
 * claimed yet.  Nothing else changes it between passes but the sweep, a
 * load of the destinations and the record step (its events: alive).
 */
static bool
delivery_has_business(RelayDestination *rd)
{
	return (rd->in_flight > 0 || rd->slots > 0 || rd->busy || rd->due ||
			rd->retry_due != 0 ||
			pg_atomic_read_u64(&outbox_shared->emitted[rd->counter]) !=
			rd->seen_generation);
}

/* DeliveryLease() for one destination; see there. */
static void
delivery_lease_one(LoadedDestination *d, TimestampTz now, Interval *lease,
				   bool *drained, bool *claimed)
{
	RelayDestination *rd = d->dest;
	uint64		generation = pg_atomic_read_u64(&outbox_shared->emitted[rd->counter]);
	bool		retry_due = (rd->retry_due != 0 && now >= rd->retry_due);
	bool		probe = false;
	bool		recover = rd->due;
	int			want;
	uint64		n = 0;
	uint64		m = 0;
	bool		more = false;
	bool		locked_out = false;
	bool		held_back = false;

	/* a retry of its own to come: the relay wakes for it, not at a poll */
	if (rd->retry_due != 0 && !retry_due)
		relay_lease_again_by(rd->retry_due);
	if (!rd->busy && !rd->due && !retry_due)
	{
		TimestampTz gathered = TimestampTzPlusMilliseconds(rd->claimed_at,
														   CLAIM_GATHER_MS);

		if (generation == rd->seen_generation)
		{
			relay_settle(rd, now);
			return;
		}

		/*
		 * New events only, and a claim of this destination ended less than
		 * CLAIM_GATHER_MS ago: claimed when that time is up, with the
		 * events committed meanwhile.  At 1,000 commits of one event a
		 * second, two workers made 0.85 claims per event and spent
		 * 0.67-0.87 ms of CPU per event; with 2 ms, 0.45 claims and
		 * 0.53-0.63 ms (5 ms: 0.24 and 0.44-0.51 ms, for more latency).  An
		 * event after a quiet spell is claimed at once.
		 */
		if (rd->claimed_at != 0 &&
			!OutboxDeadlineReached(gathered, CLAIM_GATHER_MS, now))
		{
			relay_lease_again_by(gathered);
			relay_settle(rd, now);
			return;
		}
	}
	want = relay_capacity(rd, now, &probe);
	if (want <= 0)
		return;
	rd->lease_pass = lease_pass;	/* what follows a rollback undoes */

	/*
	 * outbox.retries, when something there may have come due since this
	 * relay last found less than it wanted: a retry it wrote (or an
	 * aggregate's copy it settled, whose next copy is the head now), what
	 * the sweep found (another relay's retries, a lease that ran out, an
	 * operator's replay, announced by its commit), and at least every poll
	 * interval (a copy deferred by a claim).  Leased at every pass, an
	 * ordered destination with one held aggregate of 10,000 copies spent
	 * 14 ms a pass finding that none of them was its aggregate's head.
	 */
	if (retry_due || recover || rd->retries_look_at == 0 ||
		OutboxDeadlineReached(rd->retries_look_at, outbox_poll_interval, now))
	{
		n = OutboxStoreRetriesLease(want, lease, d->name, d->ordered);
		rd->retries_look_at = (n >= (uint64) want) ? 0 :
			TimestampTzPlusMilliseconds(now, outbox_poll_interval);
	}
	if (n > 0)
		delivery_queue_rows(d, rd, probe, NULL, n);
	held_back = (n < (uint64) want && d->ordered && rd->batches > 0);
	if (n < (uint64) want && !held_back)
	{
		int			rest = want - (int) n;

		if (recover)
		{
			m = OutboxStoreClaimRecover(lease, d->name, 0, true);

			/*
			 * Nothing (more) to recover: what else the sweep found, new
			 * events, is claimed now and again while the claims are full
			 * (busy).  Left set, every claim of a backlog found by a sweep
			 * (after a restart, a resume, an outage) first looked for an
			 * expired batch among all its destination's batches: 3 % of
			 * the relay's CPU in a Kafka backlog of 800,000 events.
			 */
			if (m == 0)
				rd->due = false;
		}
		if (m == 0)
			m = OutboxStoreClaimNext(rest, lease, d->name, d->ordered, &more,
									 &locked_out);
		if (m > 0)
		{
			delivery_queue_rows(d, rd, probe && n == 0,
								delivery_new_batch(rd, m), m);
			*claimed = true;
		}
		rd->claimed_at = GetCurrentTimestamp();
	}
	if (probe && n == 0 && m == 0)
		OutboxCircuitReleaseProbe(rd->stats);	/* nothing to probe with */

	/*
	 * A claim cut at a transaction boundary may return far fewer events
	 * than wanted with many more behind them (a backlog of transactions of
	 * 100 events each, claimed 256 at a time, gave 200: taken for drained,
	 * the rest waited for the next poll, 200 events per poll interval).
	 */
	if ((n + m >= (uint64) want || more) && !probe)
	{
		rd->busy = true;		/* there may be more: again at once */
		*drained = false;
	}
	else if (!probe)
	{
		rd->busy = false;
		if (retry_due)
			rd->retry_due = 0;

		/*
		 * An ordered destination with its batch still out was not claimed:
		 * what it has (new events, the sweep's find) waits for that batch's
		 * acknowledgement, whose record step leases again.  Taken for seen,
		 * an event committed while the batch was out waited for a sweep
		 * that reads the log.
		 *
		 * Nor was one whose stream another relay held: that relay's claim
		 * may stop short of what this one was told of.  Taken for drained,
		 * a second relay sharing a backlog with the first stopped at the
		 * first such claim, for good (nothing more was emitted), and the
		 * first held the destination's whole concurrency.  Claimed again
		 * after CLAIM_LOCKED_MS, doubled while it stays locked, at most a
		 * poll interval.
		 */
		if (locked_out && m == 0)
		{
			int64		delay_ms = Min((int64) CLAIM_LOCKED_MS << rd->locked_out,
									   (int64) outbox_poll_interval);

			rd->locked_out = Min(rd->locked_out + 1, 16);
			relay_lease_again_by(TimestampTzPlusMilliseconds(now, delay_ms));
			rd->busy = true;
		}
		else if (!held_back)
		{
			rd->due = false;
			rd->seen_generation = generation;
		}
	}
	if (m > 0 || !locked_out)
		rd->locked_out = 0;

	/* slots granted and not used: the others may have them */
	if (!rd->busy || probe)
		relay_settle(rd, now);
}

/*
 * Lease due work of the destinations that have some and free capacity
 * (what may start is built by DeliveryLeaseStart and started by the
 * caller): due outbox.retries rows first, then a batch of the log whose
 * lease ran out unacknowledged (recovery, when the sweep found one), else
 * a new batch claimed from the destination's position (store.c).  An
 * ordered destination has one batch in flight at a time.
 *
 * Issue #19: a pass costs per destination with due work.  A destination
 * is claimed when its emitted generation (bumped by emit()'s commit,
 * wake.c) moved since its last claim that drained it, when that claim was
 * full (busy: claimed again at once), when a retry this relay wrote is
 * due, or when the sweep found due work; the others cost an atomic read,
 * and a settling of their slots (relay_settle) when events of theirs
 * completed since.  Paused and circuit-open destinations are not claimed
 * (their flags stay until they are).  And when no destination had any
 * business at the end of the last pass (delivery_has_business) and no
 * emit() has committed since (the slot's emitted generation, bumped with
 * the destinations' counters), the pass is skipped whole: an idle relay's
 * poll costs nothing per destination (with 10,000 destinations the pass
 * over them was 0.34 % of a core, a third of the issue's idle budget).
 *
 * *claimed is set when a claim locked a destination's stream and made a
 * batch: the caller commits then, before DeliveryLeaseStart reads and
 * builds the events, so that the lock (held to the commit) serialises
 * only the claims of the relays sharing the destination.  Read under it,
 * each claim of 631 Kafka events held it 6.4 ms and the two relays took
 * turns (docs/performance.md).
 *
 * Every event counts as in flight as soon as it exists, and waits on its
 * destination's list, then on the relay's lists of events to start
 * (relay.c), until it is started; if anything fails later the error path
 * frees every one of them (DeliveryDropWaiting and relay.c;
 * their lease rolls back with the transaction, or once committed runs
 * out: their batches go to the recovery, their retries rows are due
 * again).
 */
void
DeliveryLease(List *dests, bool *drained, bool *claimed)
{
	ListCell   *lc;
	TimestampTz now = GetCurrentTimestamp();
	Interval   *lease;
	uint64		emitted = pg_atomic_read_u64(&relay_slot->emitted_generation);
	bool		business = false;
	int			destinations = 0;	/* delivery_connection_reserve's sums */
	int			reserved = 0;

	/* a counter bumped before the slot's generation is seen with it */
	pg_read_barrier();
	*drained = true;
	*claimed = false;
	pass_unread = NIL;
	pass_ran = false;
	delivery_sweep(now);
	if (!pass_business && emitted == pass_emitted_generation)
		return;
	pass_ran = true;
	lease_pass++;
	lease_pass_open = true;
	lease = delivery_lease_interval();
	foreach(lc, dests)
	{
		LoadedDestination *d = lfirst(lc);
		bool		has;

		delivery_lease_one(d, now, lease, drained, claimed);
		has = delivery_has_business(d->dest);
		delivery_connection_reserve(d->dest, has, &destinations, &reserved);
		business |= has;
	}
	conn_destinations = destinations;
	conn_reserved = reserved;
	pass_emitted_generation = emitted;
	pass_business = business;
}

/*
 * Read the messages of the events the last DeliveryLease made; in a
 * transaction.  DeliveryLeaseStart does it; the caller alone when it
 * cannot begin a relay transaction (the events wait, readable, for the
 * next pump).
 */
void
DeliveryLeaseRead(void)
{
	ListCell   *lc;

	foreach(lc, pass_unread)
	{
		UnreadRows *unread = lfirst(lc);

		delivery_fill_events(unread->desc, unread->events);
	}
	pass_unread = NIL;
}

/*
 * The second half of a lease pass, in a relay transaction: read the
 * messages of what it leased, and turn what may start into requests, for
 * the caller to start after the commit (*leased gets each one, until it
 * is started or freed).
 */
void
DeliveryLeaseStart(List *dests, List **leased)
{
	ListCell   *lc;

	DeliveryLeaseRead();
	if (!pass_ran)
		return;
	foreach(lc, dests)
		delivery_pump_into(((LoadedDestination *) lfirst(lc))->dest, leased);
}

/*
 * Free the events that wait on their destinations' lists (a failed
 * cycle): their batches are left to the recovery, their retries rows to
 * their lease's end.  The next sweep looks at every batch whose lease ran
 * out: what the failed cycle's sweep found was not claimed.  When the
 * failed cycle's lease pass had not committed (DeliveryLeaseCommitted),
 * the destinations it leased for are due again: their claims and retries
 * leases were rolled back after the pass had set their state (drained,
 * their generation seen, their retries looked at), and nothing else
 * claimed those events again before the destination's next emit() (the
 * periodic sweep reads the log only for prepared transactions).  Due, the
 * next pass leases their retries, looks for an expired batch and claims.
 */
void
DeliveryDropWaiting(void)
{
	HASH_SEQ_STATUS status;
	RelayDestination *rd;

	sweep_expired_since = DT_NOBEGIN;
	pass_unread = NIL;
	DeliveryStartAnswered(NULL);

	hash_seq_init(&status, destinations);
	while ((rd = hash_seq_search(&status)) != NULL)
	{
		if (lease_pass_open && rd->lease_pass == lease_pass)
		{
			rd->due = true;
			pass_business = true;
		}
		while (!dlist_is_empty(&rd->waiting))
			DeliveryFreeEvent(dlist_container(RelayEvent, wait_node,
											  dlist_head_node(&rd->waiting)));
		while (!dlist_is_empty(&rd->held))
			DeliveryFreeEvent(dlist_container(RelayEvent, wait_node,
											  dlist_head_node(&rd->held)));
	}
	lease_pass_open = false;
}

/* The lease pass's claims and retries leases committed (relay.c). */
void
DeliveryLeaseCommitted(void)
{
	lease_pass_open = false;
}

void
DeliveryFreeEvent(RelayEvent *ev)
{
	LoadedDestination *loaded = ev->loaded;

	Assert(ev->req.easy == NULL);	/* never while curl still uses it */
	Assert(!ev->native_started);	/* nor while a native client has it */
	if (ev->probe)				/* gone without a result: let another probe */
	{
		OutboxCircuitReleaseProbe(ev->dest->stats);
		ev->dest->probing = false;
	}
	if (ev->sending)
		ev->dest->sending--;
	if (ev->answered)
	{
		ev->dest->answered--;
		total_answered--;
	}
	if (ev->waiting)
		dlist_delete(&ev->wait_node);
	if (ev->chain_prev != NULL)
		ev->chain_prev->chain_next = NULL;
	if (ev->chain_next != NULL)
		ev->chain_next->chain_prev = NULL;
	if (ev->batch != NULL)
	{
		if (!ev->recorded)
			ev->batch->abandoned = true;
		if (--ev->batch->refs == 0)
			delivery_free_batch(ev->batch);
	}
	ev->dest->in_flight--;
	total_in_flight--;
	OutboxDestStatsSetInFlight(ev->dest->stats, RELAY_SLOT_INDEX, ev->dest->in_flight);	/* ops */
	delivery_let_go(ev->dest);	/* the last event of a deleted destination */

	/*
	 * ev lives in its own context: read what is needed of it first.  Its
	 * header list goes with it (http.c's reset callback).
	 */
	MemoryContextDelete(ev->context);
	delivery_release(loaded);
}

/* ---- recording results ---- */

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

/*
 * Classify the answer to the request ev sent, for every event it carried,
 * and tell the circuit.
 */
static void
delivery_classify(RelayEvent *ev)
{
	LoadedDestination *d = ev->loaded;
	int			n = list_length(ev->carried);
	OutboxMessage **msgs = palloc(n * sizeof(OutboxMessage *));
	DeliveryResult *results = palloc0(n * sizeof(DeliveryResult));
	bool		failed;
	bool		outage;
	ListCell   *lc;

	if (d->routine->start != NULL)
	{
		/* a native client's completion: its result came with it */
		Assert(n == 1 && linitial(ev->carried) == ev);
		ev->outage = relay_note_destination(ev, ev->native_failed);
		return;
	}
	foreach(lc, ev->carried)
		msgs[foreach_current_index(lc)] = &((RelayEvent *) lfirst(lc))->msg;
	failed = DestinationClassify(d->routine, d->target, &ev->req, msgs, n,
								 results);
	outage = relay_note_destination(ev, failed);
	foreach(lc, ev->carried)
	{
		RelayEvent *carried = lfirst(lc);

		carried->result = results[foreach_current_index(lc)];
		carried->outage = outage;
	}
}

/* The request that carried ev (its own, or its carrier's). */
static HttpRequest *
delivery_sent(RelayEvent *ev)
{
	return ev->carrier ? &ev->carrier->req : &ev->req;
}

/*
 * The error recorded on the event: what the destination said (or the
 * transport about it), made safe to store by peertext.c, secrets
 * redacted.  A quote of an answer may end where its buffer did.
 */
static char *
relay_error_text(RelayEvent *ev)
{
	HttpRequest *sent = delivery_sent(ev);
	const char *error = ev->result.error ? ev->result.error : "failed";
	size_t		len = ev->result.error ? ev->result.error_len : strlen(error);
	bool		cut = false;

	if (!ev->rejected && sent->failure == TRANSPORT_OK)
		cut = sent->response_total > (sent->capture ? sent->capture_len :
									  sent->response_len);
	return OutboxPeerText(error, len, cut, ev->loaded->secrets,
						  OUTBOX_ERROR_LEN - 1);
}

/*
 * The event's final outcome, with max_attempts and max_age applied: an
 * outage uses up no attempts; max_age still holds.
 */
static DeliveryOutcome
delivery_outcome(RelayEvent *ev)
{
	DeliveryOutcome outcome = ev->result.decided ? ev->result.outcome : OUTCOME_RETRY;
	LoadedDestination *d = ev->loaded;

	if (outcome == OUTCOME_RETRY &&
		((ev->attempts >= d->max_attempts && !ev->outage) ||
		 ev->age_secs >= d->max_age_secs))
		outcome = OUTCOME_DEAD;
	return outcome;
}

/*
 * When a retried event is due again: after its backoff, or at once in an
 * outage (the circuit keeps it from being leased until it closes); never
 * before the destination's Retry-After.
 */
static TimestampTz
delivery_retry_at(RelayEvent *ev, TimestampTz now)
{
	HttpRequest *sent = delivery_sent(ev);
	int64		delay = 0;

	if (!ev->outage)
		delay = OutboxBackoffDelayMs(ev->attempts, ev->loaded->backoff_base_ms,
									 ev->loaded->backoff_max_ms,
									 pg_prng_double(&prng));
	if (sent->retry_after_secs >= 0)
		delay = Max(delay, Min((int64) sent->retry_after_secs * 1000,
							   RETRY_AFTER_MAX_MS));
	return TimestampTzPlusMilliseconds(now, delay);
}

static void
record_rows_init(RecordRows *rows, int n)
{
	rows->n = 0;
	rows->ids = palloc(n * sizeof(Datum));
	rows->next_at = palloc(n * sizeof(Datum));
	rows->statuses = palloc(n * sizeof(Datum));
	rows->errors = palloc(n * sizeof(Datum));
	rows->leases = palloc(n * sizeof(Datum));
	rows->give_back = palloc(n * sizeof(Datum));
}

/* One event's row; error NULL for an acknowledgement. */
static void
record_rows_add(RecordRows *rows, RelayEvent *ev, TimestampTz next_at,
				char *error)
{
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	int			i = rows->n++;

	memcpy(id, &ev->id, sizeof(pg_uuid_t));
	rows->ids[i] = UUIDPGetDatum(id);
	rows->next_at[i] = TimestampTzGetDatum(next_at);
	rows->statuses[i] = Int32GetDatum(delivery_sent(ev)->status);
	rows->errors[i] = error ? CStringGetTextDatum(error) : (Datum) 0;
	rows->leases[i] = TimestampTzGetDatum(ev->leased_until);
	rows->give_back[i] = BoolGetDatum(ev->outage);
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
bool_array(Datum *values, int n)
{
	return PointerGetDatum(construct_array(values, n, BOOLOID, 1, true,
										   TYPALIGN_CHAR));
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

/* A text array; a null Datum is a null element. */
static Datum
text_array_nulls(Datum *texts, bool *nulls, int n)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};

	return PointerGetDatum(construct_md_array(texts, nulls, 1, dims, lbs,
											  TEXTOID, -1, false, TYPALIGN_INT));
}

static Datum
int4_array(Datum *values, int n)
{
	return PointerGetDatum(construct_array(values, n, INT4OID, 4, true,
										   TYPALIGN_INT));
}

/*
 * Note a log event's failure in its batch: copied to outbox.retries (due
 * at due_at, with attempts, status 0 = none and error, NULL = none) when
 * the batch is acknowledged.
 */
static void
batch_add_failed(RelayBatch *b, RelayEvent *ev, TimestampTz due_at,
				 int attempts, int status, char *error)
{
	MemoryContext old = MemoryContextSwitchTo(b->context);
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	int			i = b->nfailed++;

	memcpy(id, &ev->id, sizeof(pg_uuid_t));
	b->f_ids[i] = UUIDPGetDatum(id);
	b->f_due[i] = TimestampTzGetDatum(due_at);
	b->f_attempts[i] = Int32GetDatum(attempts);
	b->f_statuses[i] = Int32GetDatum(status);
	b->f_errnull[i] = (error == NULL);
	b->f_errors[i] = error ? CStringGetTextDatum(error) : (Datum) 0;
	MemoryContextSwitchTo(old);
}

static void
batch_add_dead(RelayBatch *b, RelayEvent *ev, int status, char *error)
{
	MemoryContext old = MemoryContextSwitchTo(b->context);
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	int			i = b->ndead++;

	memcpy(id, &ev->id, sizeof(pg_uuid_t));
	b->d_ids[i] = UUIDPGetDatum(id);
	b->d_statuses[i] = Int32GetDatum(status);
	b->d_errors[i] = CStringGetTextDatum(error);
	MemoryContextSwitchTo(old);
}

/*
 * One of ev's batch's events has its result: returns true when that was
 * the last one and the batch is to be acknowledged.
 */
static bool
batch_note_recorded(RelayEvent *ev)
{
	RelayBatch *b = ev->batch;

	ev->recorded = true;
	return --b->unrecorded == 0 && !b->abandoned;
}

/* Acknowledge a batch with the copies of its failures. */
static void
batch_acknowledge(RelayBatch *b)
{
	OutboxStoreClaimAck(b->destination, b->seq,
						uuid_array(b->f_ids, b->nfailed),
						timestamptz_array(b->f_due, b->nfailed),
						int4_array(b->f_attempts, b->nfailed),
						status_array(b->f_statuses, b->nfailed),
						text_array_nulls(b->f_errors, b->f_errnull, b->nfailed),
						uuid_array(b->d_ids, b->ndead),
						status_array(b->d_statuses, b->ndead),
						text_array(b->d_errors, b->ndead),
						b->lease_end);
}

/* Free a list of events, and the list. */
void
DeliveryFreeEvents(List *events)
{
	ListCell   *lc;

	foreach(lc, events)
		DeliveryFreeEvent(lfirst(lc));
	list_free(events);
}

/*
 * Write the rows (outbox.retries rows) and the acknowledgements of the
 * batches done, in a transaction of their own.
 */
static List *
delivery_store(RecordRows *ack, RecordRows *retry, RecordRows *dead,
			   List *batches, List *touched)
{
	ListCell   *lc;
	List	   *volatile ready = NIL;

	if (ack->n > 0)
		OutboxStoreRetriesAck(uuid_array(ack->ids, ack->n));
	/* retry and dead change a row only under the lease they belong to */
	if (retry->n > 0)
		OutboxStoreRetriesRetry(uuid_array(retry->ids, retry->n),
								timestamptz_array(retry->next_at, retry->n),
								status_array(retry->statuses, retry->n),
								text_array(retry->errors, retry->n),
								timestamptz_array(retry->leases, retry->n),
								bool_array(retry->give_back, retry->n));
	if (dead->n > 0)
		OutboxStoreRetriesDead(uuid_array(dead->ids, dead->n),
							   status_array(dead->statuses, dead->n),
							   text_array(dead->errors, dead->n),
							   timestamptz_array(dead->leases, dead->n));
	foreach(lc, batches)
		batch_acknowledge(lfirst(lc));

	/*
	 * What may start now is built here: signing may need the
	 * transaction's resource owner.  It is started after the commit.  If a
	 * later pump or the commit fails, what earlier pumps took is freed
	 * with the slots it holds (their batches go to the recovery), as the
	 * failed cycle frees what still waits.
	 */
	PG_TRY();
	{
		foreach(lc, touched)
		{
			List	   *more = delivery_pump(lfirst(lc));
			MemoryContext old = MemoryContextSwitchTo(relay_events_context);

			ready = list_concat(ready, more);
			MemoryContextSwitchTo(old);
			list_free(more);
		}
		relay_commit();
	}
	PG_CATCH();
	{
		DeliveryFreeEvents(ready);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return ready;
}

/* A retry of the destination is due at at: claim it then. */
static void
delivery_note_retry(RelayDestination *rd, TimestampTz at)
{
	if (rd->retry_due == 0 || at < rd->retry_due)
		rd->retry_due = at;
	relay_lease_again_by(rd->retry_due);
	pass_business = true;
}

/*
 * A log event of an ordered destination did not go through: the later
 * events of its aggregate in its batch were never sent, and go to
 * outbox.retries behind it (attempts 0, due now: the retries lease takes
 * the aggregate's head only, which is ev).
 */
static void
delivery_hold_chain(RelayEvent *ev, TimestampTz now, List **batches)
{
	RelayEvent *next = ev->chain_next;

	while (next != NULL)
	{
		RelayEvent *after = next->chain_next;
		RelayDestination *rd = next->dest;

		batch_add_failed(next->batch, next, now, 0, 0, NULL);
		delivery_note_retry(rd, now);
		if (batch_note_recorded(next))
			*batches = lappend(*batches, next->batch);
		DeliveryFreeEvent(next);	/* unlinks it from its neighbours */
		next = after;
	}
}

/*
 * Record the results of completed requests in one transaction, then start
 * what waited for them (the next event of an aggregate, events beyond
 * max_concurrency).  false when the relay's tables are locked (VACUUM
 * FULL, LOCK TABLE): nothing is recorded, nor changed in memory, and the
 * caller keeps the results for a later call.  Recorded in memory first
 * and then dropped, they left their batches unacknowledged, and each was
 * sent again when its lease ran out.  Without the extension (or with its
 * SQL objects outdated) they are dropped: their rows are gone, or leased
 * to be sent again.
 */
bool
DeliveryRecord(List *done)
{
	bool		missing;
	ListCell   *lc;
	int			n = list_length(done);
	RecordRows	ack;
	RecordRows	retry;
	RecordRows	dead;
	List	   *batches = NIL;
	List	   *touched = NIL;
	List	   *volatile ready;
	int64		published = 0;
	int64		failed = 0;
	TimestampTz now = GetCurrentTimestamp();

	if (!relay_begin(&missing))
		return missing || relay_outdated;
	record_rows_init(&ack, n);
	record_rows_init(&retry, n);
	record_rows_init(&dead, n);

	/* each answer once, for every event its request carried */
	foreach(lc, done)
	{
		RelayEvent *ev = lfirst(lc);

		if (ev->carried != NIL && !ev->rejected && !ev->deferred)
			delivery_classify(ev);
	}

	foreach(lc, done)
	{
		RelayEvent *ev = lfirst(lc);
		DeliveryOutcome outcome = delivery_outcome(ev);
		int			status = delivery_sent(ev)->status;

		/* ops: an event carried in another's request has that request's answer */
		if (!(ev->carrier ? ev->carrier : ev)->deferred)
			OutboxDestStatsRecordResult(ev->dest->stats, now, status,
										outcome, delivery_sent(ev)->duration_us);
		touched = list_append_unique_ptr(touched, ev->dest);
		if (outcome == OUTCOME_ACK)
			published++;
		else if (!(ev->carrier ? ev->carrier : ev)->deferred)
			failed++;

		if (ev->batch == NULL)
		{
			if (outcome == OUTCOME_ACK)
				record_rows_add(&ack, ev, now, NULL);
			else if (outcome == OUTCOME_RETRY)
			{
				TimestampTz at = delivery_retry_at(ev, now);

				record_rows_add(&retry, ev, at, relay_error_text(ev));
				delivery_note_retry(ev->dest, at);
			}
			else
				record_rows_add(&dead, ev, now, relay_error_text(ev));

			/*
			 * On an ordered destination the copy behind this one in its
			 * aggregate may be the head now: leased at once, not when a
			 * sweep finds it (a sweep is paced by its cost, which a large
			 * retries table raises: a spilled backlog of 100,000 copies of
			 * 100 aggregates drained one head per aggregate every 16 s).
			 */
			if (outcome != OUTCOME_RETRY && ev->loaded->ordered &&
				ev->msg.aggregate_id != NULL)
				delivery_note_retry(ev->dest, now);
			continue;
		}

		/* a log event: its batch collects the failures */
		if (outcome == OUTCOME_ACK)
		{
			if (ev->chain_next != NULL)
				ev->chain_next->blocked = false;
		}
		else
		{
			if (outcome == OUTCOME_RETRY)
			{
				TimestampTz at = delivery_retry_at(ev, now);

				batch_add_failed(ev->batch, ev, at, ev->outage ? 0 : 1, status,
								 relay_error_text(ev));
				delivery_note_retry(ev->dest, at);
			}
			else
				batch_add_dead(ev->batch, ev, status, relay_error_text(ev));
			delivery_hold_chain(ev, now, &batches);
		}
		if (batch_note_recorded(ev))
			batches = lappend(batches, ev->batch);
	}

	/* these are done: what they held back may start (in the open step) */
	foreach(lc, done)
	{
		RelayEvent *ev = lfirst(lc);

		if (ev->sending)
		{
			ev->sending = false;
			ev->dest->sending--;
		}
		if (ev->probe)
			ev->dest->probing = false;
	}
	ready = delivery_store(&ack, &retry, &dead, batches, touched);
	pg_atomic_fetch_add_u64(&relay_slot->published, published);
	pg_atomic_fetch_add_u64(&relay_slot->failed, failed);

	/*
	 * Each leaves the list before it starts (curl may use it once
	 * started); if a start fails, those not started are freed.
	 */
	PG_TRY();
	{
		while (ready != NIL)
		{
			RelayEvent *ev = linitial(ready);

			ready = list_delete_first(ready);
			DeliveryStart(ev);
		}
	}
	PG_CATCH();
	{
		DeliveryFreeEvents(ready);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return true;
}
