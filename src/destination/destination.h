/*-------------------------------------------------------------------------
 *
 * destination.h
 *		  Destination kinds: webhook, sns, sqs, rabbitmq.
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
 * Every kind (webhook.c, sns.c, sqs.c, rabbitmq.c) ends with one
 * static-const-initialised DestinationRoutine, exported under the name
 * <kind>_routine and listed in destination.c's registry, the way table
 * access methods and FDWs describe themselves to the server.  Everything
 * the rest of the extension knows about a kind goes through it.
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

typedef struct DestinationRoutine
{
	const char *kind;			/* outbox.destinations.kind */
	int			max_batch;		/* messages per request; 1 = no batching */

	/* validation (one source of truth: the trigger and the relay's loader) */
	const DestinationOption *options;	/* the kind's own keys */
	void		(*validate) (const DestinationDefinition *def); /* ERROR 22023 */
} DestinationRoutine;

/* the kinds (each defined at the end of its own file) */
extern const DestinationRoutine webhook_routine;
extern const DestinationRoutine sns_routine;
extern const DestinationRoutine sqs_routine;
extern const DestinationRoutine rabbitmq_routine;

/* destination.c */
extern const DestinationRoutine *GetDestinationRoutine(const char *kind);
extern const DestinationRoutine *const *DestinationRoutines(int *n);
extern const char *DestinationKindList(void);

/* validate.c */
typedef enum DestinationCredentialsNeed
{
	DEST_CREDENTIALS_AWS,		/* access key id and secret access key */
	DEST_CREDENTIALS_BASIC		/* user name and password */
} DestinationCredentialsNeed;

extern void DestinationValidate(const DestinationDefinition *def);
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

#endif							/* OUTBOX_DESTINATION_H */
