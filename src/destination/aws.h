/*-------------------------------------------------------------------------
 *
 * aws.h
 *		  What SNS and SQS share (aws.c): a library for sns.c and sqs.c
 *		  only; nothing else includes this.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/aws.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_AWS_H
#define OUTBOX_AWS_H

#include "lib/stringinfo.h"

#include "destination/destination.h"

#define AWS_MAX_BATCH			10	/* entries of one SNS/SQS batch call */
#define AWS_MAX_ATTRIBUTES		10	/* message attributes per message */
#define AWS_SNS_MAX_BYTES		262144	/* message + attributes, and a batch */
#define AWS_SQS_MAX_BYTES		1048576 /* message + attributes, and a batch */

/* One SNS or SQS destination, as load read it. */
typedef struct AwsTarget
{
	const char *name;			/* destination name */
	const char *url;			/* endpoint */
	const char *service;		/* "sns" or "sqs": SigV4 service */
	const char *service_name;	/* "SNS" or "SQS": for messages */
	size_t		max_bytes;		/* per message and per batch */
	int			batch_size;		/* 1 .. AWS_MAX_BATCH */
	const char *region;
	const char *topic_arn;		/* SNS */
	const char *queue_url;		/* SQS */
	bool		fifo;
	const char *group_key;		/* aggregate_id | type | destination */
	bool		cloudevents;	/* body = 'cloudevents': the body is the event */
	const char *source;			/* its source (cloudevents.c) */
	const char *access_key_id;
	const char *secret_access_key;
	const char *session_token;
} AwsTarget;

/* One message's String attributes, in the order they are sent. */
typedef struct AwsAttributes
{
	int			n;
	int			own;			/* the first own are the relay's, then headers */
	const char *names[AWS_MAX_ATTRIBUTES];
	const char *values[AWS_MAX_ATTRIBUTES];
} AwsAttributes;

extern AwsTarget *AwsLoadTarget(const DestinationConfig *config,
								const char *service);
extern const char *AwsRegion(const char *region, const char *url,
							 const char *arn);
extern const char *AwsReject(void *target, const OutboxMessage *msg);
extern const char *AwsMessageBody(const AwsTarget *t, const OutboxMessage *msg);
extern int	AwsBatchSize(const AwsTarget *t, OutboxMessage *const *msgs, int n);
extern void AwsMessageAttributes(const OutboxMessage *msg, AwsAttributes *attrs);
extern char *AwsGroupId(const AwsTarget *t, const OutboxMessage *msg);
extern void AwsRequest(const AwsTarget *t, const char *content_type,
					   const char *target, StringInfo body, HttpRequest *req);
extern bool AwsClassifyError(const HttpRequest *req, const char *code,
							 const char *message, int n,
							 DeliveryResult *results);
extern bool AwsClassifyEntry(const char *call, const char *code,
							 const char *message, bool sender_fault,
							 DeliveryResult *result);

#endif							/* OUTBOX_AWS_H */
