/*-------------------------------------------------------------------------
 *
 * destination.h
 *		  Destination kinds: webhook, sns, sqs, rabbitmq, kafka, amqp.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/destination.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_DESTINATION_H
#define OUTBOX_DESTINATION_H

#include "lib/stringinfo.h"
#include "utils/jsonb.h"
#include "nodes/pg_list.h"

#include "destination/http.h"
#include "retry.h"

/*
 * ---- The destination-kind interface ----
 *
 * Every kind (webhook.c, sns.c, sqs.c, rabbitmq.c, kafka.c) ends with one
 * static-const-initialised DestinationRoutine, exported under the name
 * <kind>_routine and listed in the registry (kindlist.h), the way table
 * access methods and FDWs describe themselves to the server.  Everything
 * the rest of the extension knows about a kind goes through it.
 *
 * Delivery (worker/delivery.c) drives a kind through four callbacks, and
 * a kind never calls back into delivery or the registry:
 *
 *	load			reads the destination's configuration into a kind-private
 *					target, in the current memory context, once per lease
 *					step; the target lives as long as any event leased with it.
 *	reject			(optional) says why a message can never be sent (too
 *					large, too many attributes): it is dead-lettered with that
 *					reason without a request.
 *	build_request	fills one HttpRequest for the first k (1 <= k <= n) of
 *					the messages and returns k; at most max_batch are given.
 *					Headers go through HttpRequestAddHeader(), everything else
 *					is palloc'd in the current (the request's) context.
 *	classify		reads an answer (never called when there was none: delivery
 *					retries those itself), gives each message its result, and
 *					returns true when the destination itself failed (counts
 *					for its circuit breaker).  It never ERRORs on what the peer
 *					sent; a message it leaves undecided is retried.
 *
 * Delivery applies, once for all kinds: transport failures, Retry-After,
 * max_attempts, max_age, the circuit breaker and the error text's safety
 * (peertext.c).  The kind decides what an answer means, nothing else.
 *
 * Per-event headers (emit(headers => ...)) reach every kind in the
 * OutboxMessage; each kind says in its file header what it does with
 * them (webhook: HTTP headers; rabbitmq: the message's headers property;
 * sns, sqs: message attributes, or a rejection when they do not fit;
 * kafka: Kafka record headers).
 *
 * ---- Non-HTTP transports (kafka.c is the first) ----
 *
 * A kind that speaks a broker's own protocol through a native client
 * (librdkafka, rabbitmq-c) leaves build_request and classify NULL and
 * sets start, poll and wait_events; GetDestinationRoutine() asserts that
 * a kind has exactly one of the two sets.  reject works as for HTTP.
 *
 *	- Connections outlive a lease step: such a kind keeps its client in
 *	  its own process-lifetime state keyed by destination name, and load
 *	  returns a target pointing at it (rebuilt when the configuration
 *	  changed).  The client runs in the relay process only; no library
 *	  thread ever calls into PostgreSQL.
 *	- start(target, msgs, n, token) hands up to n messages to the client
 *	  without blocking (produce, publish with confirms) and returns how
 *	  many it took; token names that group in its completions.  Delivery
 *	  calls it after the lease step's commit, one event (n = 1) at a time,
 *	  the event itself as token; 0 (a full local queue) holds the event
 *	  and every later one of its destination, in order, until the next
 *	  lease step.  A message the client refuses at once (too large, say)
 *	  is taken, and completes through the next poll.
 *	- Sockets: before every wait the relay asks wait_events() for the
 *	  descriptors the client wants watched (its sockets, or one event fd
 *	  the library signals) and adds them to the epoll set that the
 *	  WaitEventSet holding the latch and postmaster death already watches
 *	  for curl (HttpClientWatch); so SIGTERM, barriers and postmaster
 *	  death interrupt a broker wait exactly like an HTTP one.  A
 *	  descriptor leaves the set when the client closes it.
 *	- Completions: after every wait the relay calls poll() on the target
 *	  of every cached destination of the kind and every loaded one with
 *	  events started; it never blocks and returns up to max finished
 *	  groups as (token, one DeliveryResult per message, palloc'd in the
 *	  current context; destination failed): delivery records them exactly
 *	  as it records a classified HTTP answer, so retries, dead letters and
 *	  the circuit need nothing new.
 *	- SIGTERM: the relay leases nothing more and polls until every group
 *	  completed or the lease of the oldest in-flight event ends, whichever
 *	  comes first; what is unconfirmed then is not recorded and is sent
 *	  again after its lease (at-least-once), so the flush is bounded by
 *	  the lease (timeout_ms + outbox.lease_margin), never by the broker
 *	  (relay.c, relay_flush_step).
 *	- DestinationConfig.timeout_ms is the destination's timeout: a client
 *	  must complete every message it took within it (kafka.c sets
 *	  message.timeout.ms to it), so completions come within the lease.
 *	- A client that can never deliver again (librdkafka's fatal error)
 *	  calls DestinationReloadWanted(after_ms): the relay loads its
 *	  destinations again at its first lease step after that delay, and at
 *	  most once a second that way, where load makes a new client; the old
 *	  one is polled until its messages completed, as after a change of the
 *	  configuration.
 */

/*
 * Credentials of a destination (a row of outbox.credentials).  Validation
 * may test which fields are set; no message ever shows one.
 */
typedef struct DestinationCredentials
{
	const char *name;
	const char *aws_access_key_id;
	const char *aws_secret_access_key;
	const char *aws_session_token;
	const char *username;
	const char *password;
} DestinationCredentials;

typedef enum DestinationOptionType
{
	DEST_OPTION_STRING,
	DEST_OPTION_NUMBER,
	DEST_OPTION_BOOLEAN
} DestinationOptionType;

/*
 * One key a kind accepts in outbox.destinations.options.  validate.c
 * checks the JSON type of every key and that required ones are present
 * before the kind's validate callback sees the definition.
 */
typedef struct DestinationOption
{
	const char *name;			/* NULL ends the array */
	DestinationOptionType type;
	bool		required;
} DestinationOption;

/*
 * What validation sees of one outbox.destinations row.  The trigger on the
 * table builds it from the new row (and the credentials row it names), the
 * relay's loader from what it read.
 */
typedef struct DestinationDefinition
{
	const char *name;
	const char *kind;
	const char *url;
	Jsonb	   *options;		/* a jsonb object, '{}' when empty */
	List	   *signing_secrets;	/* char *, one per element; NULL for null */
	const char *bearer_token;	/* NULL if none */
	const char *credentials_name;	/* NULL when the row names none */
	/* that row; NULL if none, or if it does not exist (the foreign key says) */
	const DestinationCredentials *credentials;
} DestinationDefinition;

/* What a kind's load sees of one outbox.destinations row. */
typedef struct DestinationConfig
{
	const DestinationDefinition *def;	/* name, kind, url, options, credentials */
	bool		structured;		/* format = 'structured' (webhook) */
	List	   *header_lines;	/* destinations.headers as "Name: value" */
	List	   *signing_secrets;	/* destinations.signing_secrets, as text */
	const char *bearer_token;	/* NULL if none */
	const char *database;		/* the relay's database (default ce-source) */
	int			timeout_ms;		/* destinations.timeout_ms */
} DestinationConfig;

/* One per-event header (outbox.events.headers). */
typedef struct OutboxHeader
{
	const char *name;
	const char *value;
} OutboxHeader;

/* One event, as every kind sees it. */
typedef struct OutboxMessage
{
	const char *id;				/* the row's UUID: the message id everywhere */
	const char *type;
	const char *aggregate_id;	/* NULL if none */
	const char *payload;		/* JSON text */
	const char *traceparent;	/* NULL if none */
	const char *time;			/* RFC 3339, UTC; NULL for an infinite
								 * created_at (rows written around the
								 * insert trigger) */
	const char *destination;
	int			nheaders;
	OutboxHeader *headers;		/* per-event headers, in the object's order */
} OutboxMessage;

/* What became of one message; a message left undecided is retried. */
typedef struct DeliveryResult
{
	bool		decided;
	DeliveryOutcome outcome;
	char	   *error;			/* what the peer said; NULL when acknowledged */
	size_t		error_len;		/* error's length: it may quote binary bytes */
} DeliveryResult;

typedef struct DestinationRoutine
{
	const char *kind;			/* outbox.destinations.kind */
	int			max_batch;		/* messages per request; 1 = no batching */

	/* validation (one source of truth: the trigger and the relay's loader) */
	const DestinationOption *options;	/* the kind's own keys */
	void		(*validate) (const DestinationDefinition *def); /* ERROR 22023 */

	/* delivery over HTTP (see the notes above) */
	void	   *(*load) (const DestinationConfig *config);
	const char *(*reject) (void *target, const OutboxMessage *msg);
	int			(*build_request) (void *target, OutboxMessage *const *msgs,
								  int n, HttpRequest *req);
	bool		(*classify) (void *target, const HttpRequest *req,
							 OutboxMessage *const *msgs, int n,
							 DeliveryResult *results);

	/* delivery over a native client (see the notes above) */
	int			(*start) (void *target, OutboxMessage *const *msgs, int n,
						  void *token);
	int			(*wait_events) (void *target, pgsocket *socks, uint32 *events,
								int max);
	int			(*poll) (void *target, void **tokens, DeliveryResult **results,
						 bool *destination_failed, int max);
} DestinationRoutine;

/* the kinds, each defined at the end of its own file (kindlist.h) */
#define DESTINATION_KIND(name) extern const DestinationRoutine name##_routine;
#include "destination/kindlist.h"
#undef DESTINATION_KIND

/*
 * Give a message its result unless it has one (the first decision
 * stands).  Inline, so that kinds need nothing from destination.c.
 */
static inline void
DeliveryResultSetBinary(DeliveryResult *result, DeliveryOutcome outcome,
						const char *error, size_t len)
{
	if (result->decided)
		return;
	result->decided = true;
	result->outcome = outcome;
	result->error = NULL;
	result->error_len = 0;
	if (error != NULL)
	{
		result->error = palloc(len + 1);
		memcpy(result->error, error, len);
		result->error[len] = '\0';
		result->error_len = len;
	}
}

static inline void
DeliveryResultSet(DeliveryResult *result, DeliveryOutcome outcome,
				  const char *error)
{
	DeliveryResultSetBinary(result, outcome, error, error ? strlen(error) : 0);
}

/* destination.c */
extern const DestinationRoutine *GetDestinationRoutine(const char *kind);
extern TimestampTz destination_reload_at;
extern void DestinationReloadWanted(int after_ms);
extern bool DestinationClassify(const DestinationRoutine *routine,
								void *target, const HttpRequest *req,
								OutboxMessage *const *msgs, int n,
								DeliveryResult *results);

/* validate.c */
typedef enum DestinationCredentialsNeed
{
	DEST_CREDENTIALS_AWS,		/* access key id and secret access key */
	DEST_CREDENTIALS_BASIC		/* user name and password */
} DestinationCredentialsNeed;

extern void DestinationValidate(const DestinationDefinition *def);

/* options.c */
extern const char *DestinationOptionText(const DestinationDefinition *def,
										 const char *key);
extern bool DestinationMatches(const char *value, const char *pattern,
							   bool case_insensitive);
extern void DestinationRequireCredentials(const DestinationDefinition *def,
										  DestinationCredentialsNeed need);
extern void DestinationCheckChoice(const DestinationDefinition *def,
								   const char *key,
								   const char *const *choices);
extern void DestinationCheckInteger(const DestinationDefinition *def,
									const char *key, int min, int max,
									const char *hint);
extern void DestinationCheckNoQuery(const DestinationDefinition *def,
									const char *hint);
extern char *DestinationRoutingKey(const char *template,
								   const OutboxMessage *msg);
extern void DestinationCheckRouting(const DestinationDefinition *def);

/* cloudevents.c */
extern const char *CloudEventSource(const DestinationConfig *config);
extern void CloudEventAppendJson(StringInfo buf, const OutboxMessage *msg,
								 const char *source);
extern void CloudEventCheckSource(const DestinationDefinition *def);

#endif							/* OUTBOX_DESTINATION_H */
