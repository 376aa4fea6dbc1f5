/*-------------------------------------------------------------------------
 *
 * broker.c
 *		  Destinations of kind sns, sqs and rabbitmq: configuration, size
 *		  checks, batching, and the per-kind dispatch the relay calls.
 *
 * The relay (relay.c) leases events of a destination and hands them here
 * as BrokerMessages.  For SNS and SQS one HTTP request carries up to
 * options.batch_size (default 10) messages: OutboxBrokerBuild() takes as
 * many of the given messages as fit the count and the service's total
 * size limit, builds the request (sns.c, sqs.c) and records in a
 * BrokerBatch which messages the request carries.  RabbitMQ's management
 * API publishes one message per request (rabbitmq.c).
 *
 * When the request completes, OutboxBrokerClassify() gives every message
 * of the batch its own outcome: a transport failure retries them all; a
 * response is read by the kind's parser, which checks each batch entry
 * (an HTTP 200 can carry failed entries; those are retried or
 * dead-lettered one by one, the others are acknowledged).
 *
 * A message that can never be sent (larger than the service accepts) is
 * decided before sending by OutboxBrokerCheck(): it goes to the dead
 * letters with the reason, instead of being retried until it runs out of
 * attempts.
 *
 * Configuration comes from outbox.destinations (url, options) and
 * outbox.credentials (see the upgrade script, where a trigger validates
 * it with clear errors); this file only reads it, with the defaults the
 * README documents.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/broker.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "outbox_pg.h"
#include "util.h"
#include "retry.h"
#include "deststats.h"
#include "destination/http.h"
#include "destination/destination.h"

/* Room for the response of a batch call (ten result entries and more). */
#define BROKER_CAPTURE_BATCH	65536
#define BROKER_CAPTURE_SINGLE	4096

static bool
ends_with(const char *s, const char *suffix)
{
	size_t		n = strlen(s);
	size_t		m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/*
 * The broker configuration of one destination row.  credentials holds
 * access key id, secret access key, session token, username and password
 * (each NULL when not set).
 */
BrokerTarget *
OutboxBrokerTarget(const char *kind, const char *name, const char *url,
				   Datum options_datum, const char *const *credentials)
{
	BrokerTarget *t = palloc0(sizeof(BrokerTarget));
	Jsonb	   *options = DatumGetJsonbP(options_datum);
	const char *v;

	if (strcmp(kind, "sns") == 0)
		t->kind = BROKER_SNS;
	else if (strcmp(kind, "sqs") == 0)
		t->kind = BROKER_SQS;
	else
		t->kind = BROKER_RABBITMQ;
	t->name = name;
	t->url = url;

	t->batch_size = OUTBOX_BROKER_MAX_BATCH;
	if ((v = OutboxJsonbOption(options, "batch_size")) != NULL)
		t->batch_size = Max(1, Min(OUTBOX_BROKER_MAX_BATCH, atoi(v)));
	t->topic_arn = OutboxJsonbOption(options, "topic_arn");
	t->queue_url = OutboxJsonbOption(options, "queue_url");
	if (t->queue_url == NULL)
		t->queue_url = url;
	t->region = OutboxAwsRegion(OutboxJsonbOption(options, "region"), url,
								t->topic_arn);
	if ((v = OutboxJsonbOption(options, "fifo")) != NULL)
		t->fifo = (strcmp(v, "true") == 0);
	else if (t->kind == BROKER_SNS)
		t->fifo = (t->topic_arn != NULL && ends_with(t->topic_arn, ".fifo"));
	else if (t->kind == BROKER_SQS)
		t->fifo = ends_with(t->queue_url, ".fifo");
	t->group_key = OutboxJsonbOption(options, "message_group_key");
	if (t->group_key == NULL)
		t->group_key = "aggregate_id";

	t->vhost = OutboxJsonbOption(options, "vhost");
	if (t->vhost == NULL)
		t->vhost = "/";
	t->exchange = OutboxJsonbOption(options, "exchange");
	if (t->exchange == NULL || t->exchange[0] == '\0')
		t->exchange = "amq.default";
	t->routing_key = OutboxJsonbOption(options, "routing_key");
	if (t->routing_key == NULL)
		t->routing_key = "{type}";
	v = OutboxJsonbOption(options, "unroutable");
	t->unroutable_dead = (v != NULL && strcmp(v, "dead") == 0);

	t->access_key_id = credentials[0];
	t->secret_access_key = credentials[1];
	t->session_token = credentials[2];
	t->username = credentials[3];
	t->password = credentials[4];
	return t;
}

/*
 * Give a message its outcome, unless it already has one.
 */
void
OutboxBrokerDecide(BrokerMessage *msg, DeliveryOutcome outcome, int status,
				   const char *error)
{
	if (msg->decided)
		return;
	msg->decided = true;
	msg->outcome = outcome;
	msg->status = status;
	msg->error = error ? pstrdup(error) : NULL;
}

/*
 * Decide at once what can never be sent: a message over the service's
 * size limit goes to the dead letters with the reason.
 */
void
OutboxBrokerCheck(const BrokerTarget *t, BrokerMessage *msg)
{
	size_t		size;
	size_t		limit;
	const char *service;

	switch (t->kind)
	{
		case BROKER_SNS:
			size = OutboxAwsMessageSize(msg);
			limit = OUTBOX_SNS_MAX_BYTES;
			service = "SNS";
			break;
		case BROKER_SQS:
			size = OutboxAwsMessageSize(msg);
			limit = OUTBOX_SQS_MAX_BYTES;
			service = "SQS";
			break;
		default:
			return;
	}
	if (size > limit)
		OutboxBrokerDecide(msg, OUTCOME_DEAD, 0,
						   psprintf("message too large for %s: %zu bytes with its attributes, the limit is %zu; not sent",
									service, size, limit));
}

/*
 * Build one request carrying the first k of msgs (1 <= k <= n) and return
 * k.  Every message given must be undecided.  The request's memory
 * (body, header list, response buffer) is allocated in the current
 * memory context.
 */
int
OutboxBrokerBuild(const BrokerTarget *t, BrokerMessage **msgs, int n,
				  HttpRequest *req, BrokerBatch *batch)
{
	int			k = 0;
	size_t		total = 0;
	size_t		limit = (t->kind == BROKER_SNS) ? OUTBOX_SNS_MAX_BYTES : OUTBOX_SQS_MAX_BYTES;

	Assert(n > 0);
	memset(batch, 0, sizeof(BrokerBatch));
	batch->kind = t->kind;
	batch->unroutable_dead = t->unroutable_dead;

	if (t->kind == BROKER_RABBITMQ)
	{
		req->capture_size = BROKER_CAPTURE_SINGLE;
		req->capture = palloc0(req->capture_size);
		OutboxRabbitBuild(t, msgs[0], req, batch);
		return 1;
	}

	/* as many as fit the count and the batch's total size limit */
	while (k < n && k < t->batch_size)
	{
		size_t		size = OutboxAwsMessageSize(msgs[k]);

		if (k > 0 && total + size > limit)
			break;
		total += size;
		k++;
	}

	req->capture_size = (k > 1) ? BROKER_CAPTURE_BATCH : BROKER_CAPTURE_SINGLE;
	req->capture = palloc0(req->capture_size);
	if (t->kind == BROKER_SNS)
		OutboxSnsBuild(t, msgs, k, req, batch);
	else
		OutboxSqsBuild(t, msgs, k, req, batch);
	Assert(batch->nmsgs == k);
	return k;
}

/*
 * Give every message of a completed request its outcome.
 */
void
OutboxBrokerClassify(BrokerBatch *batch, HttpRequest *req)
{
	/* no answer at all: every message is retried */
	if (req->curl_code != CURLE_OK || req->refused || req->status == 0)
	{
		const char *error = req->error[0] ? req->error : "request failed";

		batch->destination_failure = true;
		for (int i = 0; i < batch->nmsgs; i++)
			OutboxBrokerDecide(batch->msgs[i], OUTCOME_RETRY, 0, error);
		return;
	}

	switch (batch->kind)
	{
		case BROKER_SNS:
			OutboxSnsClassify(batch, req);
			break;
		case BROKER_SQS:
			OutboxSqsClassify(batch, req);
			break;
		case BROKER_RABBITMQ:
			OutboxRabbitClassify(batch, req);
			break;
	}

	/* a parser that left a message out: retry it rather than guess */
	for (int i = 0; i < batch->nmsgs; i++)
		OutboxBrokerDecide(batch->msgs[i], OUTCOME_RETRY, req->status,
						   "the response gave no result for this message");
}
