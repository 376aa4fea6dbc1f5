/*-------------------------------------------------------------------------
 *
 * outbox_pg.h
 *		  Shared declarations of the outbox_pg extension.
 *
 * Every function that crosses a file boundary is declared here, grouped
 * by the file that defines it.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/outbox_pg.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PG_H
#define OUTBOX_PG_H

#include <curl/curl.h>

#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "utils/relcache.h"
#include "utils/timestamp.h"

#include "compat.h"

#define OUTBOX_VERSION			"0.2.1"

/* Names of the extension's schemas and tables. */
#define OUTBOX_SCHEMA			"outbox"
#define INBOX_SCHEMA			"inbox"
#define OUTBOX_EVENTS_TABLE		"events"
#define OUTBOX_DESTINATIONS_TABLE "destinations"
#define OUTBOX_ROUTES_TABLE		"routes"
#define INBOX_CLAIMS_TABLE		"claims"
#define INBOX_MESSAGES_TABLE	"messages"
#define INBOX_MESSAGES_SEQ		"messages_seq"
#define INBOX_HANDLERS_TABLE	"handlers"
#define OUTBOX_CREDENTIALS_TABLE "credentials"

/* Limits on identifiers carried in events and claims. */
#define OUTBOX_MAX_TYPE_LEN		255
#define OUTBOX_MAX_ID_LEN		1024
#define OUTBOX_MAX_NAME_LEN		63

/* Claim retention bounds, in seconds. */
#define OUTBOX_MIN_CLAIM_TTL	1
#define OUTBOX_MAX_CLAIM_TTL	(10 * SECS_PER_YEAR)

/*
 * Columns of outbox.events, in table order.  The install and upgrade
 * scripts keep this order; config.c verifies it when it loads.
 */
typedef enum OutboxEventColumn
{
	EV_ID = 1,
	EV_TYPE,
	EV_AGGREGATE_TYPE,
	EV_AGGREGATE_ID,
	EV_PAYLOAD,
	EV_HEADERS,
	EV_TRACEPARENT,
	EV_DESTINATION,
	EV_STATUS,
	EV_ATTEMPTS,
	EV_NEXT_ATTEMPT_AT,
	EV_CREATED_AT,
	EV_PUBLISHED_AT,
	EV_LAST_STATUS,
	EV_LAST_ERROR,
	EV_LEASED_UNTIL,			/* 0.2.0 */
	EV_ORDERING_KEY,			/* 0.2.0 */
	EV_NATTS = EV_ORDERING_KEY
} OutboxEventColumn;

extern const char *const OutboxEventColumnNames[EV_NATTS + 1];

/*
 * Columns of inbox.messages, in table order (inbox.receive() fills them
 * positionally; columns are only ever appended).
 */
typedef enum InboxMessageColumn
{
	IM_ID = 1,
	IM_TYPE,
	IM_AGGREGATE_ID,
	IM_PAYLOAD,
	IM_HEADERS,
	IM_SOURCE,
	IM_STATUS,
	IM_ATTEMPTS,
	IM_NEXT_ATTEMPT_AT,
	IM_RECEIVED_AT,
	IM_PROCESSED_AT,
	IM_LAST_ERROR,
	IM_SEQ,
	IM_NATTS = IM_SEQ
} InboxMessageColumn;

/* Most relay workers in one cluster (all databases together). */
#define OUTBOX_MAX_RELAYS		64

/*
 * Stored error texts (outbox.events.last_error, a worker slot's last
 * error) hold at most OUTBOX_ERROR_LEN - 1 bytes (peertext.c cuts them).
 * The relay reads twice that much of a response body, so that a secret
 * across the stored limit is still seen whole and redacted.
 */
#define OUTBOX_ERROR_LEN		256
#define OUTBOX_RESPONSE_PREFIX_LEN (2 * OUTBOX_ERROR_LEN)

/* guc.c */
extern int	outbox_max_payload_size;
extern int	outbox_claim_retention;
extern int	outbox_redelivery_window;
extern char *outbox_traceparent;
extern char *outbox_databases;
extern int	outbox_workers_per_database;
extern int	outbox_poll_interval;
extern int	outbox_batch_size;
extern int	outbox_max_response_size;
extern char *outbox_allowed_hosts;
extern struct EgressList *outbox_allowed_hosts_list;	/* parsed form */
extern char *outbox_ca_file;
extern int	outbox_discovery_interval;
extern int	outbox_lease_margin;
extern int	outbox_circuit_max_pause;
extern int	outbox_retention;
extern int	outbox_retention_batch;
extern int	outbox_pending_age_warning;
extern int	outbox_pending_age_critical;
extern int	outbox_dead_letters_warning;
extern int	outbox_dead_letters_critical;
extern int	outbox_inbox_retention;
extern int	outbox_inbox_handler_timeout;

extern void OutboxDefineGucs(void);

/* egress.c */
typedef struct EgressList EgressList;
struct sockaddr;

extern EgressList *EgressParseList(const char *value, char *errbuf,
								   size_t errlen);
extern size_t EgressListSize(const EgressList *list);
extern bool EgressCheckUrl(const EgressList *list, const char *url,
						   bool *by_name, char *errbuf, size_t errlen);
extern bool EgressCheckAddress(const EgressList *list,
							   const struct sockaddr *sa, bool by_name,
							   char *errbuf, size_t errlen);

/* config.c */
typedef struct OutboxConfig
{
	Oid			events_relid;
	Oid			destinations_relid;
	Oid			routes_relid;
	Oid			claims_relid;
	int			events_natts;	/* EV_* columns present (see upgrade.c) */
} OutboxConfig;

extern const OutboxConfig *OutboxGetConfig(void);
extern bool OutboxDestinationExists(const char *name);
extern const char *OutboxRouteEventType(const char *type);
extern bool OutboxDestinationIsOrdered(const char *name);
extern bool OutboxPatternMatches(const char *pattern, const char *text);
extern void OutboxConfigInit(void);

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
	int			in_flight;		/* requests currently in flight */
	pg_atomic_uint64 published;
	pg_atomic_uint64 failed;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_ERROR_LEN];
	bool		absence_logged; /* "extension not installed" was logged for
								 * dboid: quiet until the relay finds it */
} RelaySlot;

typedef struct OutboxShared
{
	LWLock	   *lock;
	pid_t		launcher_pid;
	int			launcher_procno;
	Oid			launcher_wanted_db; /* a commit found no relay for this db */
	RelaySlot	slots[OUTBOX_MAX_RELAYS];
} OutboxShared;

extern OutboxShared *outbox_shared;

extern void OutboxShmemInit(void);
extern void OutboxSetLatchByProcno(int procno);
extern void OutboxSlotSetState(RelaySlot *slot, RelayState state);
extern void OutboxSlotSetError(RelaySlot *slot, const char *error);
extern const char *OutboxRelayStateName(RelayState state);

/* wake.c */
extern void OutboxWakeAtCommit(void);

/* launcher.c */
extern void OutboxRegisterLauncher(void);
extern PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* relay.c */
extern PGDLLEXPORT void OutboxRelayMain(Datum main_arg);

/* inbox_worker.c */
extern bool InboxWorkerCycle(bool run_retention, long *wait_ms);

/* http.c */
typedef struct HttpRequest
{
	/* set by the caller before HttpClientStart() */
	const char *url;
	struct curl_slist *headers;
	const char *body;
	size_t		body_len;
	long		timeout_ms;
	const char *username;		/* basic auth, or the AWS access key id */
	const char *password;		/* its password, or the AWS secret key */
	const char *aws_sigv4;		/* "aws:amz:REGION:SERVICE": sign with SigV4 */
	char	   *capture;		/* optional buffer for the whole response */
	size_t		capture_size;	/* its size, NUL included */
	size_t		capture_len;	/* set by http.c */

	/* set by http.c */
	CURL	   *easy;
	int			status;			/* HTTP status, 0 if none */
	CURLcode	curl_code;
	bool		refused;		/* refused by the allow-list, unsent */
	bool		egress_by_name; /* host allowed as a name (egress.c) */
	bool		egress_refused; /* an address was refused at connect */
	char		egress_error[192];	/* why, for the error if none connected */
	int			retry_after_secs;	/* -1 if absent */
	bool		response_too_large;
	int64		duration_us;	/* total time of the request */
	size_t		response_total;
	size_t		response_len;
	char		response[OUTBOX_RESPONSE_PREFIX_LEN];	/* start of the body */
	char		error[CURL_ERROR_SIZE];
	struct HttpRequest *next_done;
} HttpRequest;

typedef struct HttpClient HttpClient;

extern HttpClient *HttpClientCreate(void);
extern void HttpClientStart(HttpClient *client, HttpRequest *req);
extern HttpRequest *HttpClientWait(HttpClient *client, long timeout_ms,
								   bool *latch_set);
extern int	HttpClientRunning(HttpClient *client);
extern struct curl_slist *OutboxAddHeader(struct curl_slist *list,
										  const char *line);
extern void HttpClientSkip(HttpClient *client, HttpRequest *req);

/* store.c */
typedef struct OutboxTableLock
{
	const char *name;			/* table in the schema given with the array */
	LOCKMODE	lockmode;
} OutboxTableLock;

extern SPIPlanPtr OutboxKeepPlan(SPIPlanPtr *plan, const char *sql,
								 int nargs, Oid *argtypes);
extern bool OutboxLockTablesNoWait(const char *schema,
								   const OutboxTableLock *tables, int ntables);
extern uint64 OutboxStoreLease(int batch_size, Interval *lease,
							   const char *destination);
extern uint64 OutboxStoreAck(Datum ids, Datum statuses);
extern uint64 OutboxStoreRetry(Datum ids, Datum next_at, Datum statuses,
							   Datum errors, Datum leases);
extern uint64 OutboxStoreDead(Datum ids, Datum statuses, Datum errors,
							  Datum leases);
extern uint64 OutboxStoreRequeue(Datum ids, Datum next_at, Datum statuses,
								 Datum errors, Datum leases);

/* retry.c */
typedef enum DeliveryOutcome
{
	OUTCOME_ACK,				/* acknowledged: mark published */
	OUTCOME_RETRY,				/* transient failure: try again later */
	OUTCOME_DEAD				/* permanent failure or out of attempts */
} DeliveryOutcome;

extern int64 OutboxBackoffDelayMs(int attempt, int base_ms, int cap_ms,
								  double jitter);
extern DeliveryOutcome OutboxClassifyResponse(int status, CURLcode code,
											  bool refused);
extern bool OutboxIsDestinationFailure(int status, CURLcode code);

/* deststats.c */
typedef struct DestStats DestStats;

extern void OutboxDestStatsShmemInit(void);
extern DestStats *OutboxDestStatsAttach(int slot, const char *name);
extern void OutboxDestStatsSetInFlight(DestStats *ds, int slot, int n);
extern void OutboxDestStatsRecordResult(DestStats *ds, TimestampTz now,
										int status, DeliveryOutcome outcome,
										int64 duration_us);
extern void OutboxDestStatsRelayExit(int slot);

typedef enum CircuitPermit
{
	CIRCUIT_PASS,				/* closed: lease as usual */
	CIRCUIT_PROBE,				/* half-open: the caller sends the one probe */
	CIRCUIT_WAIT				/* open, or another relay's probe is out */
} CircuitPermit;

typedef enum CircuitTransition
{
	CIRCUIT_UNCHANGED,
	CIRCUIT_OPENED,
	CIRCUIT_CLOSED
} CircuitTransition;

extern CircuitPermit OutboxCircuitPermit(DestStats *ds, TimestampTz now,
										 TimestampTz probe_expires_at,
										 TimestampTz *recheck_at);
extern void OutboxCircuitReleaseProbe(DestStats *ds);
extern bool OutboxCircuitNote(DestStats *ds, bool failed,
							  TimestampTz started_at, int threshold,
							  CircuitTransition *transition, bool *log_it,
							  int *rounds);
extern void OutboxCircuitConfigure(DestStats *ds, bool disabled, bool resumed);

/* ops.c */
extern void OutboxOpsCheckBacklog(const char *database_name);
/* upgrade.c */
extern char *OutboxInstalledVersion(void);
extern bool OutboxRelayVersionMatches(RelaySlot *slot, const char *dbname,
									  bool *missing);

/* webhook.c */
typedef struct WebhookEvent
{
	const char *id;
	const char *type;
	const char *aggregate_id;
	const char *payload;
	const char *traceparent;
	const char *time;			/* RFC 3339, UTC */
	List	   *extra_headers;	/* "Name: value" strings */
} WebhookEvent;

typedef struct WebhookTarget
{
	bool		structured;		/* CloudEvents structured mode */
	const char *source;			/* ce-source */
	List	   *headers;		/* "Name: value" strings */
	List	   *signing_keys;	/* bytea-like: StringInfo of raw key bytes */
	const char *bearer_token;
} WebhookTarget;

extern void OutboxBuildWebhook(const WebhookEvent *ev, const WebhookTarget *t,
							   HttpRequest *req, char **body);
extern bool OutboxDecodeSigningSecret(const char *secret, StringInfo key);

/* broker.c: destinations of kind sns, sqs and rabbitmq */
#define OUTBOX_BROKER_MAX_BATCH	10	/* entries of one SNS/SQS batch call */
#define OUTBOX_SNS_MAX_BYTES	262144	/* SNS: message + attributes, and a batch */
#define OUTBOX_SQS_MAX_BYTES	1048576 /* SQS: message + attributes, and a batch */

typedef enum BrokerKind
{
	BROKER_SNS,
	BROKER_SQS,
	BROKER_RABBITMQ
} BrokerKind;

/* One destination's broker configuration, in cycle memory. */
typedef struct BrokerTarget
{
	BrokerKind	kind;
	const char *name;			/* destination name */
	const char *url;			/* endpoint, or management API base */
	int			batch_size;		/* SNS/SQS: 1 .. OUTBOX_BROKER_MAX_BATCH */
	/* AWS */
	const char *region;
	const char *topic_arn;		/* SNS */
	const char *queue_url;		/* SQS */
	bool		fifo;
	const char *group_key;		/* aggregate_id | type | destination */
	const char *access_key_id;
	const char *secret_access_key;
	const char *session_token;
	/* RabbitMQ */
	const char *vhost;
	const char *exchange;
	const char *routing_key;	/* template: {type} {aggregate_id} ... */
	bool		unroutable_dead;
	const char *username;
	const char *password;
} BrokerTarget;

/* One event as a broker message, and what became of it. */
typedef struct BrokerMessage
{
	const char *id;
	const char *type;
	const char *aggregate_id;
	const char *payload;		/* JSON text */
	const char *traceparent;
	const char *time;			/* RFC 3339, UTC */
	const char *destination;

	bool		decided;		/* outcome known before or without sending */
	DeliveryOutcome outcome;
	int			status;			/* HTTP status of its request, 0 if none */
	char	   *error;			/* NULL when acknowledged */
} BrokerMessage;

/* The messages one request carries, for classifying its response. */
typedef struct BrokerBatch
{
	BrokerKind	kind;
	bool		batch_call;		/* PublishBatch / SendMessageBatch */
	bool		unroutable_dead;
	int			nmsgs;
	BrokerMessage *msgs[OUTBOX_BROKER_MAX_BATCH];
	bool		destination_failure;	/* set by OutboxBrokerClassify() */
} BrokerBatch;

extern BrokerTarget *OutboxBrokerTarget(const char *kind, const char *name,
										const char *url, Datum options,
										const char *const *credentials);
extern void OutboxBrokerCheck(const BrokerTarget *t, BrokerMessage *msg);
extern int	OutboxBrokerBuild(const BrokerTarget *t, BrokerMessage **msgs, int n,
							  HttpRequest *req, BrokerBatch *batch);
extern void OutboxBrokerClassify(BrokerBatch *batch, HttpRequest *req);
extern void OutboxBrokerDecide(BrokerMessage *msg, DeliveryOutcome outcome,
							   int status, const char *error);
extern void OutboxAppendPercentEncoded(StringInfo buf, const char *value);

/* aws.c */
extern void OutboxAwsSign(const BrokerTarget *t, const char *service,
						  HttpRequest *req, struct curl_slist **headers);
extern const char *OutboxAwsRegion(const char *region, const char *url,
								   const char *arn);
extern bool OutboxAwsGroupIdValid(const char *value);
extern char *OutboxAwsGroupId(const BrokerTarget *t, const BrokerMessage *msg);
extern bool OutboxAwsErrorIsTransient(const char *code);
extern bool OutboxAwsErrorIsConfig(const char *code);
extern void OutboxAwsClassifyError(BrokerBatch *batch, HttpRequest *req,
								   const char *code, const char *message);
#define AWS_MAX_ATTRIBUTES		4
extern int	OutboxAwsAttributes(const BrokerMessage *msg,
								const char *names[AWS_MAX_ATTRIBUTES],
								const char *values[AWS_MAX_ATTRIBUTES]);
extern size_t OutboxAwsMessageSize(const BrokerMessage *msg);
extern void OutboxAwsRequest(const BrokerTarget *t, const char *service,
							 const char *content_type, const char *target,
							 StringInfo body, HttpRequest *req);

/* sns.c */
extern void OutboxSnsBuild(const BrokerTarget *t, BrokerMessage **msgs, int n,
						   HttpRequest *req, BrokerBatch *batch);
extern void OutboxSnsClassify(BrokerBatch *batch, HttpRequest *req);

/* sqs.c */
extern void OutboxSqsBuild(const BrokerTarget *t, BrokerMessage **msgs, int n,
						   HttpRequest *req, BrokerBatch *batch);
extern void OutboxSqsClassify(BrokerBatch *batch, HttpRequest *req);

/* rabbitmq.c */
extern void OutboxRabbitBuild(const BrokerTarget *t, BrokerMessage *msg,
							  HttpRequest *req, BrokerBatch *batch);
extern void OutboxRabbitClassify(BrokerBatch *batch, HttpRequest *req);

/* peertext.c */
/* Secrets shorter than this are redacted only where their context names them. */
#define OUTBOX_SECRET_MIN_LEN	6

typedef struct PeerSecrets PeerSecrets;

/* Where a destination keeps secrets (each member optional). */
typedef struct PeerSecretSources
{
	const char *url;			/* its userinfo */
	List	   *header_lines;	/* "Name: value" */
	const char *bearer_token;
	List	   *signing_secrets;	/* "whsec_..." as configured */
	const char *aws_access_key_id;
	const char *aws_secret_access_key;
	const char *aws_session_token;
	const char *username;
	const char *password;
} PeerSecretSources;

extern PeerSecrets *OutboxPeerSecrets(const PeerSecretSources *src);
extern PeerSecrets *OutboxPeerSecretsCopy(const PeerSecrets *secrets);
extern char *OutboxPeerText(const char *data, size_t len, bool truncated,
							const PeerSecrets *secrets, int max_bytes);

/* validate.c */
extern bool OutboxTraceparentIsValid(const char *value);
extern void OutboxCheckIdentifier(const char *what, const char *value,
								  int maxlen);
extern void OutboxCheckHeaders(Datum headers);

/* direct.c */
typedef struct OutboxInsertState
{
	Relation	rel;
	struct EState *estate;
	struct ResultRelInfo *rri;
	struct TupleTableSlot *slot;
} OutboxInsertState;

extern void OutboxBeginInsert(OutboxInsertState *st, Oid relid, bool speculative);
extern void OutboxEndInsert(OutboxInsertState *st);

/* ordering.c */
extern void OutboxLockAggregate(const char *destination,
								const char *aggregate_id);

/* retention.c */
extern uint64 OutboxExpirePublished(TimestampTz cutoff, int batch_size);
extern void OutboxRetentionStep(TimestampTz now);

/* emit.c */
extern void OutboxGenerateUuidV7(unsigned char *out);

#endif							/* OUTBOX_PG_H */
