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
 *					"headers": {"destination": ..., "aggregate_id": ...,
 *								"traceparent": ..., "time": ...,
 *								<per-event headers>}},
 *	 "routing_key": <options.routing_key with {type}, {aggregate_id},
 *					 {destination} replaced; default "{type}">,
 *	 "payload": <the payload's JSON text>, "payload_encoding": "string"}
 *
 * delivery_mode 2 makes the message persistent in durable queues.
 *
 * Per-event headers (emit(headers => ...)) go into the message's headers
 * property as string values, after the relay's own; a per-event header
 * with the name of one of the relay's own (destination, aggregate_id,
 * traceparent, time) is left out, so consumers can trust those.
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
 *		  src/destination/rabbitmq.c
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

#define RABBIT_CAPTURE_SIZE		4096

/* One RabbitMQ destination, as load read it. */
typedef struct RabbitTarget
{
	const char *name;			/* destination name */
	const char *url;			/* management API base */
	const char *vhost;
	const char *exchange;
	const char *routing_key;	/* template: {type} {aggregate_id} ... */
	bool		unroutable_dead;
	const char *username;
	const char *password;
} RabbitTarget;

/* The headers the relay sets itself; a per-event header cannot replace them. */
static const char *const own_headers[] = {
	"destination", "aggregate_id", "traceparent", "time"
};

static void *
rabbit_load(const DestinationConfig *config)
{
	const DestinationDefinition *def = config->def;
	RabbitTarget *t = palloc0(sizeof(RabbitTarget));
	const char *v;

	t->name = def->name;
	t->url = def->url;
	t->vhost = OutboxJsonbOption(def->options, "vhost");
	if (t->vhost == NULL)
		t->vhost = "/";
	t->exchange = OutboxJsonbOption(def->options, "exchange");
	if (t->exchange == NULL || t->exchange[0] == '\0')
		t->exchange = "amq.default";
	t->routing_key = OutboxJsonbOption(def->options, "routing_key");
	if (t->routing_key == NULL)
		t->routing_key = "{type}";
	v = OutboxJsonbOption(def->options, "unroutable");
	t->unroutable_dead = (v != NULL && strcmp(v, "dead") == 0);
	if (def->credentials != NULL)
	{
		t->username = def->credentials->username;
		t->password = def->credentials->password;
	}
	return t;
}

/* The publish endpoint: {url}/api/exchanges/{vhost}/{exchange}/publish */
static char *
rabbit_publish_url(const RabbitTarget *t)
{
	StringInfoData url;
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
	return url.data;
}

static void
rabbit_append_header(StringInfo body, const char *name, const char *value)
{
	appendStringInfoChar(body, ',');
	escape_json(body, name);
	appendStringInfoChar(body, ':');
	escape_json(body, value);
}

/* The headers property: the relay's own, then the per-event ones. */
static void
rabbit_append_headers(StringInfo body, const RabbitTarget *t,
					  const OutboxMessage *msg)
{
	appendStringInfoString(body, "\"headers\":{\"destination\":");
	escape_json(body, t->name);
	if (msg->aggregate_id)
		rabbit_append_header(body, "aggregate_id", msg->aggregate_id);
	if (msg->traceparent)
		rabbit_append_header(body, "traceparent", msg->traceparent);
	if (msg->time)
		rabbit_append_header(body, "time", msg->time);
	for (int i = 0; i < msg->nheaders; i++)
	{
		bool		own = false;

		for (int k = 0; k < lengthof(own_headers); k++)
			own |= (strcmp(msg->headers[i].name, own_headers[k]) == 0);
		if (!own)
			rabbit_append_header(body, msg->headers[i].name,
								 msg->headers[i].value);
	}
	appendStringInfoChar(body, '}');
}

/* One message per request: the management API publishes one at a time. */
static int
rabbit_build_request(void *target, OutboxMessage *const *msgs, int n,
					 HttpRequest *req)
{
	const RabbitTarget *t = (const RabbitTarget *) target;
	const OutboxMessage *msg = msgs[0];
	StringInfoData body;

	initStringInfo(&body);
	appendStringInfoString(&body, "{\"properties\":{\"message_id\":");
	escape_json(&body, msg->id);
	appendStringInfoString(&body, ",\"type\":");
	escape_json(&body, msg->type);
	appendStringInfoString(&body, ",\"content_type\":\"application/json\",\"delivery_mode\":2,\"app_id\":\"outbox_pg\",");
	rabbit_append_headers(&body, t, msg);
	appendStringInfoString(&body, "},\"routing_key\":");
	escape_json(&body, DestinationRoutingKey(t->routing_key, msg));
	appendStringInfoString(&body, ",\"payload\":");
	escape_json(&body, msg->payload);
	appendStringInfoString(&body, ",\"payload_encoding\":\"string\"}");

	HttpRequestAddHeader(req, "Content-Type: application/json");
	/* no 100-continue round trip */
	HttpRequestAddHeader(req, "Expect:");
	req->url = rabbit_publish_url(t);
	req->body = body.data;
	req->body_len = body.len;
	req->username = t->username ? t->username : "";
	req->password = t->password ? t->password : "";
	req->capture_size = RABBIT_CAPTURE_SIZE;
	req->capture = palloc0(req->capture_size);
	return 1;
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

static bool
rabbit_classify(void *target, const HttpRequest *req,
				OutboxMessage *const *msgs, int n, DeliveryResult *results)
{
	const RabbitTarget *t = (const RabbitTarget *) target;
	const char *text = req->capture ? req->capture : req->response;
	int			status = req->status;

	if (status >= 200 && status < 300)
	{
		if (rabbit_says_routed(text, "true"))
			DeliveryResultSet(&results[0], OUTCOME_ACK, NULL);
		else if (rabbit_says_routed(text, "false"))
			DeliveryResultSet(&results[0],
							  t->unroutable_dead ? OUTCOME_DEAD : OUTCOME_RETRY,
							  "unroutable: the exchange routed the message to no queue (routed: false); bind a queue for its routing key");
		else
			DeliveryResultSet(&results[0], OUTCOME_RETRY,
							  psprintf("HTTP %d: the answer does not say whether the message was routed: %s",
									   status, text));
		return false;
	}

	/*
	 * A missing vhost or exchange is a 404, or (3.10, publishing to an
	 * exchange that does not exist) a 400 whose reason says NOT_FOUND.
	 */
	if (status == 401 || status == 403 || status == 404 ||
		status == 408 || status == 429 || status >= 500 ||
		(status == 400 && strstr(text, "NOT_FOUND") != NULL))
	{
		DeliveryResultSet(&results[0], OUTCOME_RETRY,
						  psprintf("HTTP %d: %s", status, text));
		return true;
	}
	DeliveryResultSet(&results[0], OUTCOME_DEAD,
					  psprintf("HTTP %d: %s", status, text));
	return false;
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

static void
rabbitmq_validate(const DestinationDefinition *def)
{
	DestinationRequireCredentials(def, DEST_CREDENTIALS_BASIC);
	DestinationCheckRouting(def);
}

const DestinationRoutine rabbitmq_routine =
{
	.kind = "rabbitmq",
	.max_batch = 1,
	.options = rabbitmq_options,
	.validate = rabbitmq_validate,
	.load = rabbit_load,
	.build_request = rabbit_build_request,
	.classify = rabbit_classify,
};
