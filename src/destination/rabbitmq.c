/*-------------------------------------------------------------------------
 *
 * rabbitmq.c
 *		  RabbitMQ destinations through the management plugin's HTTP API.
 *
 * Request: POST {url}/api/exchanges/{vhost}/{exchange}/publish, with
 * vhost and exchange percent-encoded ("/" is "%2F"; the default exchange
 * is "amq.default"), basic authentication from outbox.credentials
 * (handed to curl, never put in a header we build or a log), and a JSON
 * body:
 *
 *	{"properties": {"message_id": <event id>, "type": <event type>,
 *					"content_type": "application/json", "delivery_mode": 2,
 *					"app_id": "outbox_pg",
 *					"headers": {"aggregate_id": ..., "traceparent": ...}},
 *	 "routing_key": <options.routing_key with {type}, {aggregate_id},
 *					 {destination} replaced; default "{type}">,
 *	 "payload": <the payload's JSON text>, "payload_encoding": "string"}
 *
 * delivery_mode 2 makes the message persistent in durable queues.
 *
 * The broker publishes with confirms and answers {"routed": true} when at
 * least one queue took the message: only that is an acknowledgement.
 * {"routed": false} means no queue is bound for the routing key; that is
 * reported on the event ("unroutable: ...") and retried, since a binding
 * added later recovers it, or dead-lettered at once with
 * options.unroutable = 'dead'.  401, 403 and 404 (credentials,
 * permissions, no such vhost or exchange; RabbitMQ 3.10 reports a missing
 * exchange as a 400 whose reason says NOT_FOUND) are configuration problems
 * that affect every message: retried, and counted by the circuit breaker.
 * Other 4xx are the message's fault (dead letter); 5xx and network
 * errors are retried.
 *
 * Error texts quote the broker's answer as it came; the relay bounds,
 * escapes and redacts them (the basic credentials a broker may echo
 * included) when it records them (peertext.c).
 *
 * The management API is not a high-throughput path (one request per
 * message), but it is a real broker with real routing and persistence.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/rabbitmq.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/json.h"

#include "outbox_pg.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"

/* The routing key template with {type}, {aggregate_id}, {destination}. */
static char *
rabbit_routing_key(const BrokerTarget *t, const BrokerMessage *msg)
{
	StringInfoData out;
	const char *p = t->routing_key;

	initStringInfo(&out);
	while (*p)
	{
		if (strncmp(p, "{type}", 6) == 0)
		{
			appendStringInfoString(&out, msg->type);
			p += 6;
		}
		else if (strncmp(p, "{aggregate_id}", 14) == 0)
		{
			appendStringInfoString(&out, msg->aggregate_id ? msg->aggregate_id : "");
			p += 14;
		}
		else if (strncmp(p, "{destination}", 13) == 0)
		{
			appendStringInfoString(&out, t->name);
			p += 13;
		}
		else
			appendStringInfoChar(&out, *p++);
	}
	return out.data;
}

void
OutboxRabbitBuild(const BrokerTarget *t, BrokerMessage *msg,
				  HttpRequest *req, BrokerBatch *batch)
{
	StringInfoData url;
	StringInfoData body;
	struct curl_slist *h = NULL;
	size_t		base_len = strlen(t->url);

	while (base_len > 0 && t->url[base_len - 1] == '/')
		base_len--;
	initStringInfo(&url);
	appendBinaryStringInfo(&url, t->url, base_len);
	appendStringInfoString(&url, "/api/exchanges/");
	OutboxAppendPercentEncoded(&url, t->vhost);
	appendStringInfoChar(&url, '/');
	OutboxAppendPercentEncoded(&url, t->exchange);
	appendStringInfoString(&url, "/publish");

	initStringInfo(&body);
	appendStringInfoString(&body, "{\"properties\":{\"message_id\":");
	escape_json(&body, msg->id);
	appendStringInfoString(&body, ",\"type\":");
	escape_json(&body, msg->type);
	appendStringInfoString(&body, ",\"content_type\":\"application/json\",\"delivery_mode\":2,\"app_id\":\"outbox_pg\",\"headers\":{");
	appendStringInfoString(&body, "\"destination\":");
	escape_json(&body, t->name);
	if (msg->aggregate_id)
	{
		appendStringInfoString(&body, ",\"aggregate_id\":");
		escape_json(&body, msg->aggregate_id);
	}
	if (msg->traceparent)
	{
		appendStringInfoString(&body, ",\"traceparent\":");
		escape_json(&body, msg->traceparent);
	}
	if (msg->time)
	{
		appendStringInfoString(&body, ",\"time\":");
		escape_json(&body, msg->time);
	}
	appendStringInfoString(&body, "}},\"routing_key\":");
	escape_json(&body, rabbit_routing_key(t, msg));
	appendStringInfoString(&body, ",\"payload\":");
	escape_json(&body, msg->payload);
	appendStringInfoString(&body, ",\"payload_encoding\":\"string\"}");

	batch->msgs[0] = msg;
	batch->nmsgs = 1;
	batch->batch_call = false;

	PG_TRY();
	{
		h = OutboxAddHeader(h, "Content-Type: application/json");
		/* no 100-continue round trip */
		h = OutboxAddHeader(h, "Expect:");
	}
	PG_CATCH();
	{
		if (h)
			curl_slist_free_all(h);
		PG_RE_THROW();
	}
	PG_END_TRY();

	req->url = url.data;
	req->headers = h;
	req->body = body.data;
	req->body_len = body.len;
	req->username = t->username ? t->username : "";
	req->password = t->password ? t->password : "";
}

/* Does the (compact or spaced) JSON text say "routed": value? */
static bool
rabbit_says_routed(const char *text, const char *value)
{
	const char *p = strstr(text, "\"routed\"");

	if (p == NULL)
		return false;
	p += strlen("\"routed\"");
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ':')
		p++;
	return strncmp(p, value, strlen(value)) == 0;
}

void
OutboxRabbitClassify(BrokerBatch *batch, HttpRequest *req)
{
	BrokerMessage *msg = batch->msgs[0];
	const char *text = req->capture ? req->capture : req->response;
	int			status = req->status;

	if (status >= 200 && status < 300)
	{
		if (rabbit_says_routed(text, "true"))
			OutboxBrokerDecide(msg, OUTCOME_ACK, status, NULL);
		else if (rabbit_says_routed(text, "false"))
			OutboxBrokerDecide(msg, batch->unroutable_dead ? OUTCOME_DEAD : OUTCOME_RETRY,
							   status,
							   "unroutable: the exchange routed the message to no queue (routed: false); bind a queue for its routing key");
		else
			OutboxBrokerDecide(msg, OUTCOME_RETRY, status,
							   psprintf("HTTP %d: the answer does not say whether the message was routed: %s",
										status, text));
		return;
	}

	/*
	 * A missing vhost or exchange is a 404, or (3.10, publishing to an
	 * exchange that does not exist) a 400 whose reason says NOT_FOUND.
	 */
	if (status == 401 || status == 403 || status == 404 ||
		status == 408 || status == 429 || status >= 500 ||
		(status == 400 && strstr(text, "NOT_FOUND") != NULL))
	{
		batch->destination_failure = true;
		OutboxBrokerDecide(msg, OUTCOME_RETRY, status,
						   psprintf("HTTP %d: %s", status, text));
	}
	else
		OutboxBrokerDecide(msg, OUTCOME_DEAD, status,
						   psprintf("HTTP %d: %s", status, text));
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption rabbitmq_options[] =
{
	{"vhost", DEST_OPTION_STRING, false},	/* default "/" */
	{"exchange", DEST_OPTION_STRING, false},	/* default amq.default */
	{"routing_key", DEST_OPTION_STRING, false}, /* default "{type}" */
	{"unroutable", DEST_OPTION_STRING, false},	/* retry (default) or dead */
	{NULL}
};

static const char *const rabbitmq_unroutable[] = {"retry", "dead", NULL};

static void
rabbitmq_validate(const DestinationDefinition *def)
{
	const char *routing_key = DestinationOptionText(def, "routing_key");

	DestinationRequireCredentials(def, DEST_CREDENTIALS_BASIC);
	DestinationCheckChoice(def, "unroutable", rabbitmq_unroutable);
	if (routing_key != NULL && strlen(routing_key) > 255)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option routing_key is longer than 255 bytes"),
				 errdetail("AMQP routing keys have at most 255 bytes.")));
}

const DestinationRoutine rabbitmq_routine =
{
	.kind = "rabbitmq",
	.max_batch = 1,
	.options = rabbitmq_options,
	.validate = rabbitmq_validate,
};
