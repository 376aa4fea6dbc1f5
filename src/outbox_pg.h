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

#define OUTBOX_VERSION			"0.2.0"

/* Names of the extension's schemas and tables. */
#define OUTBOX_SCHEMA			"outbox"
#define INBOX_SCHEMA			"inbox"
#define OUTBOX_EVENTS_TABLE		"events"
#define OUTBOX_DESTINATIONS_TABLE "destinations"
#define OUTBOX_ROUTES_TABLE		"routes"
#define INBOX_CLAIMS_TABLE		"claims"

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

/* Most relay workers in one cluster (all databases together). */
#define OUTBOX_MAX_RELAYS		64
#define OUTBOX_ERROR_LEN		256

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
extern char *outbox_ca_file;
extern int	outbox_discovery_interval;
extern int	outbox_lease_margin;
extern int	outbox_retention;
extern int	outbox_retention_batch;

extern void OutboxDefineGucs(void);

/* config.c */
typedef struct OutboxConfig
{
	Oid			events_relid;
	Oid			destinations_relid;
	Oid			routes_relid;
	Oid			claims_relid;
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
	RELAY_STOPPED				/* exited */
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

/* http.c */
typedef struct HttpRequest
{
	/* set by the caller before HttpClientStart() */
	const char *url;
	struct curl_slist *headers;
	const char *body;
	size_t		body_len;
	long		timeout_ms;

	/* set by http.c */
	CURL	   *easy;
	int			status;			/* HTTP status, 0 if none */
	CURLcode	curl_code;
	bool		refused;		/* refused before sending (allow-list) */
	int			retry_after_secs;	/* -1 if absent */
	bool		response_too_large;
	size_t		response_total;
	size_t		response_len;
	char		response[256];	/* start of the response body */
	char		error[CURL_ERROR_SIZE];
	struct HttpRequest *next_done;
} HttpRequest;

typedef struct HttpClient HttpClient;

extern HttpClient *HttpClientCreate(void);
extern void HttpClientStart(HttpClient *client, HttpRequest *req);
extern HttpRequest *HttpClientWait(HttpClient *client, long timeout_ms,
								   bool *latch_set);
extern int	HttpClientRunning(HttpClient *client);

/* store.c */
extern SPIPlanPtr OutboxKeepPlan(SPIPlanPtr *plan, const char *sql,
								 int nargs, Oid *argtypes);
extern uint64 OutboxStoreLease(int batch_size, Interval *lease,
							   const char *destination);
extern uint64 OutboxStoreAck(Datum ids, Datum statuses);
extern uint64 OutboxStoreRetry(Datum ids, Datum next_at, Datum statuses,
							   Datum errors);
extern uint64 OutboxStoreDead(Datum ids, Datum statuses, Datum errors);

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
