/*-------------------------------------------------------------------------
 *
 * webhook.c
 *		  The webhook wire format: CloudEvents 1.0 over HTTP, optionally
 *		  signed the Standard Webhooks way.
 *
 * Binary mode (format = 'binary', the default): the body is the payload,
 * Content-Type is application/json, and the attributes travel as ce-*
 * headers (ce-id, ce-specversion, ce-type, ce-source, ce-subject,
 * ce-time; no ce-datacontenttype since Content-Type carries it).  Header
 * values are percent-encoded outside printable ASCII, and '"', '%' and
 * space, as the CloudEvents HTTP binding asks.
 *
 * Structured mode (format = 'structured'): the body is the whole event as
 * application/cloudevents+json with the payload under "data"
 * (cloudevents.c); attribute values are JSON strings, never encoded.
 *
 * Percent-encoding (options.percent_encoding, binary mode only): the
 * binding leaves decoding to the receiver, and not every receiver does it:
 * the JavaScript SDK (npm cloudevents, HTTP.toEvent) hands a subject
 * "café" sent as "caf%C3%A9" to the application as "caf%C3%A9"
 * (test/t/054_cloudevents_sdk.pl shows it).  So:
 *	- 'allow' (the default, what every release before did): every event in
 *	  binary mode, ce-* values percent-encoded where needed.  The body is
 *	  always the bare payload: for receivers that read the body as their
 *	  payload (a plain HTTP handler, a Standard Webhooks verifier) and for
 *	  SDKs that decode ce-* values as the binding asks.
 *	- 'avoid': an event whose type, source or subject would need
 *	  percent-encoding is sent in structured mode instead, the others in
 *	  binary mode.  For receivers that tell the mode by Content-Type, as
 *	  a CloudEvents SDK's HTTP reader does: the JavaScript SDK then reads
 *	  the exact text.  Not for a receiver that reads the body as the
 *	  payload: the body's shape would depend on the data.
 *	- format = 'structured' sends every event as a whole: for receivers
 *	  that read the envelope themselves, or any SDK; the option has no
 *	  effect there.
 * The default stays 'allow' because the format column cannot tell a
 * destination that chose binary from one that kept the default, and
 * 'binary' must keep meaning a body that is the payload.
 *
 * In both modes: Idempotency-Key and ce-id are the message id; traceparent
 * (and ce-traceparent) carry the trace context captured at emit time.
 *
 * Batches (options.batch, opt-in): one request carries up to batch_size
 * events (default 100, at most WEBHOOK_MAX_BATCH) in a JSON array of at
 * most batch_max_bytes (default 1 MiB; one event larger than that goes
 * alone), in the order they were claimed:
 *	- 'cloudevents': application/cloudevents-batch+json, an array of
 *	  structured-mode events (the CloudEvents HTTP binding's batched mode:
 *	  no ce-* headers);
 *	- 'array': application/json, an array of {"id", "type",
 *	  "aggregate_id", "time", "traceparent", "payload"} objects.
 * The answer is the batch's: 2xx acknowledges every event of it, anything
 * else retries (or dead-letters) every event of it.  webhook-id and
 * Idempotency-Key name the batch: "batch_" and 32 hex digits of SHA-256
 * over its events' ids, so a batch sent again with the same events has
 * the same id; consumers dedupe on the events' own ids.  The signature
 * covers the whole body.  An event with per-event headers travels in a
 * batch of its own, its headers as HTTP headers, as without batching.
 *
 * Standard Webhooks: webhook-id (message id), webhook-timestamp (this
 * attempt's Unix seconds) and webhook-signature, a space-separated list of
 * "v1,<base64 HMAC-SHA256 of id.timestamp.body>", one per secret, so
 * secrets can be rotated.  A secret is "whsec_" followed by base64.
 *
 * Per-event headers (emit(headers => ...)) are sent as HTTP headers, after
 * the destination's own headers (outbox.destinations.headers).
 *
 * Answers: retry.c's classification (2xx acknowledged; 408, 429, 5xx
 * retried and counted against the destination's circuit; other 3xx and
 * 4xx dead-lettered), the start of the body quoted in the error.
 *
 * Everything is built before the request starts; curl copies the header
 * list, and the body stays in the event's memory until completion.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/webhook.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <time.h>

#include "common/base64.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"

#include "outbox_pg.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"

static bool webhook_decode_secret(const char *secret, StringInfo key);

#define WEBHOOK_MAX_BATCH		1000
#define WEBHOOK_DEFAULT_BATCH	100
#define WEBHOOK_DEFAULT_BATCH_BYTES	(1024 * 1024)
#define WEBHOOK_MAX_BATCH_BYTES	(16 * 1024 * 1024)

typedef enum WebhookBatch
{
	WEBHOOK_BATCH_NONE,
	WEBHOOK_BATCH_CLOUDEVENTS,
	WEBHOOK_BATCH_ARRAY
} WebhookBatch;

/* One webhook destination, as load read it. */
typedef struct WebhookTarget
{
	WebhookBatch batch;			/* options.batch */
	int			batch_size;		/* events per request, when batched */
	int			batch_max_bytes;	/* body bytes per request, when batched */
	bool		structured;		/* CloudEvents structured mode */
	bool		avoid_encoding;	/* percent_encoding = 'avoid' */
	HttpVersion http_version;	/* options.http_version */
	const char *source;			/* ce-source */
	List	   *headers;		/* "Name: value" strings */
	List	   *signing_keys;	/* StringInfo of raw key bytes */
	const char *bearer_token;
} WebhookTarget;

/* What a CloudEvents binary-mode header value keeps unencoded. */
static bool
ce_header_keeps(unsigned char c)
{
	return c > 0x20 && c < 0x7f && c != '"' && c != '%';
}

/* Does binary mode percent-encode any of this value? */
static bool
ce_needs_encoding(const char *value)
{
	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
		if (!ce_header_keeps(*p))
			return true;
	return false;
}

/*
 * Is this event sent in structured mode?  Always with format =
 * 'structured'; with percent_encoding = 'avoid', when any ce-* header of
 * binary mode would be percent-encoded (in practice type, source or
 * subject: a UUID, an RFC 3339 time and a W3C traceparent need none).
 */
static bool
webhook_structured(const WebhookTarget *t, const OutboxMessage *ev)
{
	if (t->structured)
		return true;
	if (!t->avoid_encoding)
		return false;
	return ce_needs_encoding(ev->type) || ce_needs_encoding(t->source) ||
		(ev->aggregate_id && ce_needs_encoding(ev->aggregate_id)) ||
		ce_needs_encoding(ev->id) || (ev->time && ce_needs_encoding(ev->time)) ||
		(ev->traceparent && ce_needs_encoding(ev->traceparent));
}

/* "name: value", copied by curl */
static void
add_header_value(HttpRequest *req, const char *name, const char *value)
{
	char	   *line = HttpHeaderLine(name, value);

	HttpRequestAddHeader(req, line);
	pfree(line);
}

static void
add_ce_header(HttpRequest *req, const char *name, const char *value)
{
	StringInfoData line;

	initStringInfo(&line);
	appendStringInfo(&line, "%s: ", name);
	OutboxAppendPercentEncodedKeeping(&line, value, ce_header_keeps);
	HttpRequestAddHeader(req, line.data);
	pfree(line.data);
}

static bool
webhook_decode_secret(const char *secret, StringInfo key)
{
	const char *b64 = secret;
	int			len;
	int			declen;

	if (strncmp(b64, "whsec_", 6) == 0)
		b64 += 6;
	len = strlen(b64);
	if (len == 0)
		return false;
	declen = pg_b64_dec_len(len);
	enlargeStringInfo(key, declen + 1);
	declen = pg_b64_decode(b64, len, (uint8 *) key->data, declen);
	if (declen <= 0)
		return false;
	key->len = declen;
	return true;
}

static void
append_signature(StringInfo out, const StringInfo key, const char *id,
				 const char *timestamp, const char *body, size_t body_len)
{
	pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);
	uint8		mac[PG_SHA256_DIGEST_LENGTH];
	char		b64[64];
	int			n;

	if (ctx == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (pg_hmac_init(ctx, (uint8 *) key->data, key->len) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) id, strlen(id)) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) ".", 1) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) timestamp, strlen(timestamp)) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) ".", 1) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) body, body_len) < 0 ||
		pg_hmac_final(ctx, mac, sizeof(mac)) < 0)
	{
		pg_hmac_free(ctx);
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute a webhook signature")));
	}
	pg_hmac_free(ctx);
	n = pg_b64_encode(mac, sizeof(mac), b64, sizeof(b64) - 1);
	b64[n] = '\0';
	if (out->len > 0)
		appendStringInfoChar(out, ' ');
	appendStringInfo(out, "v1,%s", b64);
}

/*
 * The configuration of a webhook destination.  The loader validated it
 * (webhook_validate), so every signing secret decodes.
 */
static void *
webhook_load(const DestinationConfig *config)
{
	WebhookTarget *t = palloc0(sizeof(WebhookTarget));
	const char *batch = OutboxJsonbOption(config->def->options, "batch");
	const char *encoding = DestinationOptionText(config->def, "percent_encoding");
	const char *version = DestinationOptionText(config->def, "http_version");
	const char *v;
	ListCell   *lc;

	t->batch = WEBHOOK_BATCH_NONE;
	if (batch != NULL && strcmp(batch, "cloudevents") == 0)
		t->batch = WEBHOOK_BATCH_CLOUDEVENTS;
	else if (batch != NULL && strcmp(batch, "array") == 0)
		t->batch = WEBHOOK_BATCH_ARRAY;
	t->batch_size = WEBHOOK_DEFAULT_BATCH;
	if ((v = OutboxJsonbOption(config->def->options, "batch_size")) != NULL)
		t->batch_size = Max(1, Min(WEBHOOK_MAX_BATCH, atoi(v)));
	t->batch_max_bytes = WEBHOOK_DEFAULT_BATCH_BYTES;
	if ((v = OutboxJsonbOption(config->def->options, "batch_max_bytes")) != NULL)
		t->batch_max_bytes = Max(1024, Min(WEBHOOK_MAX_BATCH_BYTES, atoi(v)));
	t->structured = config->structured;
	t->avoid_encoding = (encoding != NULL && strcmp(encoding, "avoid") == 0);
	t->http_version = HTTP_VERSION_AUTO;
	if (version != NULL && strcmp(version, "1.1") == 0)
		t->http_version = HTTP_VERSION_1_1;
	else if (version != NULL && strcmp(version, "2") == 0)
		t->http_version = HTTP_VERSION_2;
	t->headers = config->header_lines;
	t->bearer_token = config->bearer_token;
	t->source = CloudEventSource(config);
	foreach(lc, config->signing_secrets)
	{
		StringInfo	key = makeStringInfo();

		if (!webhook_decode_secret((const char *) lfirst(lc), key))
			elog(ERROR, "signing secret %d of destination \"%s\" is not valid base64",
				 foreach_current_index(lc) + 1, config->def->name);
		t->signing_keys = lappend(t->signing_keys, key);
	}
	return t;
}

/* One event in a plain array batch. */
static void
append_array_event(StringInfo buf, const OutboxMessage *ev)
{
	appendStringInfoString(buf, "{\"id\":");
	escape_json(buf, ev->id);
	appendStringInfoString(buf, ",\"type\":");
	escape_json(buf, ev->type);
	appendStringInfoString(buf, ",\"aggregate_id\":");
	if (ev->aggregate_id)
		escape_json(buf, ev->aggregate_id);
	else
		appendStringInfoString(buf, "null");
	appendStringInfoString(buf, ",\"time\":");
	if (ev->time)
		escape_json(buf, ev->time);
	else
		appendStringInfoString(buf, "null");	/* an infinite created_at */
	appendStringInfoString(buf, ",\"traceparent\":");
	if (ev->traceparent)
		escape_json(buf, ev->traceparent);
	else
		appendStringInfoString(buf, "null");
	appendStringInfoString(buf, ",\"payload\":");
	appendStringInfoString(buf, ev->payload);
	appendStringInfoChar(buf, '}');
}

/* The body: the payload (binary mode) or the whole event (structured). */
static void
webhook_body(const WebhookTarget *t, const OutboxMessage *ev, bool structured,
			 HttpRequest *req)
{
	StringInfoData buf;

	if (!structured)
	{
		req->body = ev->payload;
		req->body_len = strlen(ev->payload);
		return;
	}
	initStringInfo(&buf);
	CloudEventAppendJson(&buf, ev, t->source);
	req->body = buf.data;
	req->body_len = buf.len;
}

/*
 * A batch's body: the first k of the n events that fit batch_size and
 * batch_max_bytes (at least one); returns k.  An event with per-event
 * headers goes alone: the first of a batch, it ends it.
 */
static int
webhook_batch_body(const WebhookTarget *t, OutboxMessage *const *msgs, int n,
				   HttpRequest *req)
{
	StringInfoData buf;
	int			k = 0;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '[');
	while (k < n && k < t->batch_size)
	{
		const OutboxMessage *ev = msgs[k];
		int			mark = buf.len;

		if (k > 0 && ev->nheaders > 0)
			break;
		if (k > 0)
			appendStringInfoChar(&buf, ',');
		if (t->batch == WEBHOOK_BATCH_CLOUDEVENTS)
			CloudEventAppendJson(&buf, ev, t->source);
		else
			append_array_event(&buf, ev);
		if (k > 0 && buf.len + 1 > t->batch_max_bytes)
		{
			buf.len = mark;
			buf.data[mark] = '\0';
			break;
		}
		k++;
		if (ev->nheaders > 0)
			break;
	}
	appendStringInfoChar(&buf, ']');
	req->body = buf.data;
	req->body_len = buf.len;
	return k;
}

/*
 * A batch's id: "batch_" and the first 16 bytes of SHA-256 over its
 * events' ids (comma-separated), in hex.
 */
static char *
webhook_batch_id(OutboxMessage *const *msgs, int k)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char	   *id = palloc(6 + 32 + 1);
	bool		ok = ctx != NULL && pg_cryptohash_init(ctx) == 0;

	for (int i = 0; ok && i < k; i++)
		ok = (i == 0 || pg_cryptohash_update(ctx, (const uint8 *) ",", 1) == 0) &&
			pg_cryptohash_update(ctx, (const uint8 *) msgs[i]->id,
								 strlen(msgs[i]->id)) == 0;
	if (!ok || pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
	{
		pg_cryptohash_free(ctx);
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute a webhook batch id")));
	}
	pg_cryptohash_free(ctx);
	memcpy(id, "batch_", 6);
	hex_encode((const char *) digest, 16, id + 6);
	id[6 + 32] = '\0';
	return id;
}

/* Standard Webhooks: id, this attempt's timestamp, one signature per key. */
static void
webhook_sign(const WebhookTarget *t, const char *id, HttpRequest *req)
{
	char		ts[32];
	StringInfoData sigs;
	ListCell   *lc;

	snprintf(ts, sizeof(ts), "%lld", (long long) time(NULL));
	add_header_value(req, "webhook-id", id);
	add_header_value(req, "webhook-timestamp", ts);
	initStringInfo(&sigs);
	foreach(lc, t->signing_keys)
		append_signature(&sigs, (StringInfo) lfirst(lc), id, ts,
						 req->body, req->body_len);
	add_header_value(req, "webhook-signature", sigs.data);
}

/*
 * What every request carries after its own headers: the bearer token, the
 * destination's headers, the per-event headers of ev (NULL: none).
 */
static void
webhook_common_headers(const WebhookTarget *t, const OutboxMessage *ev,
					   HttpRequest *req)
{
	ListCell   *lc;

	if (t->bearer_token)
		add_header_value(req, "Authorization",
						 psprintf("Bearer %s", t->bearer_token));
	foreach(lc, t->headers)
		HttpRequestAddHeader(req, (const char *) lfirst(lc));
	for (int i = 0; ev != NULL && i < ev->nheaders; i++)
		add_header_value(req, ev->headers[i].name, ev->headers[i].value);
	/* no 100-continue round trip */
	HttpRequestAddHeader(req, "Expect:");
}

/* A batched request (see the file header); returns the events it carries. */
static int
webhook_build_batch(const WebhookTarget *t, OutboxMessage *const *msgs, int n,
					HttpRequest *req)
{
	int			k = webhook_batch_body(t, msgs, n, req);
	char	   *id = webhook_batch_id(msgs, k);

	if (t->batch == WEBHOOK_BATCH_CLOUDEVENTS)
		HttpRequestAddHeader(req, "Content-Type: application/cloudevents-batch+json; charset=utf-8");
	else
		HttpRequestAddHeader(req, "Content-Type: application/json");
	add_header_value(req, "Idempotency-Key", id);
	if (t->signing_keys != NIL)
		webhook_sign(t, id, req);
	/* a batch of one event with per-event headers (webhook_batch_body) */
	webhook_common_headers(t, k == 1 ? msgs[0] : NULL, req);
	return k;
}

static int
webhook_build_request(void *target, OutboxMessage *const *msgs, int n,
					  HttpRequest *req)
{
	const WebhookTarget *t = (const WebhookTarget *) target;
	const OutboxMessage *ev = msgs[0];
	bool		structured = webhook_structured(t, ev);

	req->http_version = t->http_version;
	if (t->batch != WEBHOOK_BATCH_NONE)
		return webhook_build_batch(t, msgs, n, req);

	webhook_body(t, ev, structured, req);
	if (structured)
		HttpRequestAddHeader(req, "Content-Type: application/cloudevents+json; charset=utf-8");
	else
	{
		HttpRequestAddHeader(req, "Content-Type: application/json");
		HttpRequestAddHeader(req, "ce-specversion: 1.0");
		add_ce_header(req, "ce-id", ev->id);
		add_ce_header(req, "ce-type", ev->type);
		add_ce_header(req, "ce-source", t->source);
		if (ev->aggregate_id)
			add_ce_header(req, "ce-subject", ev->aggregate_id);
		if (ev->time)
			add_ce_header(req, "ce-time", ev->time);
		if (ev->traceparent)
			add_ce_header(req, "ce-traceparent", ev->traceparent);
	}
	add_header_value(req, "Idempotency-Key", ev->id);
	if (ev->traceparent)
		add_header_value(req, "traceparent", ev->traceparent);
	if (t->signing_keys != NIL)
		webhook_sign(t, ev->id, req);
	webhook_common_headers(t, ev, req);
	return 1;
}

/* retry.c's classification; the error quotes the start of the body. */
static bool
webhook_classify(void *target, const HttpRequest *req,
				 OutboxMessage *const *msgs, int n, DeliveryResult *results)
{
	int			status = req->status;
	DeliveryOutcome outcome = OutboxClassifyResponse(status, TRANSPORT_OK);
	StringInfoData error;

	initStringInfo(&error);
	if (outcome == OUTCOME_ACK)
	{
		/* a batch's answer is every event's */
		for (int i = 0; i < n; i++)
			DeliveryResultSet(&results[i], outcome, NULL);
		return false;
	}
	if (status >= 300 && status < 400)
		appendStringInfo(&error, "HTTP %d: redirects are not followed", status);
	else if (req->response_len > 0)
	{
		/* the body's bytes as they came: the relay makes them safe */
		appendStringInfo(&error, "HTTP %d: ", status);
		appendBinaryStringInfo(&error, req->response, req->response_len);
	}
	else
		appendStringInfo(&error, "HTTP %d", status);
	for (int i = 0; i < n; i++)
		DeliveryResultSetBinary(&results[i], outcome, error.data, error.len);
	return outcome != OUTCOME_ACK &&
		OutboxIsDestinationFailure(status, TRANSPORT_OK);
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption webhook_options[] =
{
	{"source", DEST_OPTION_STRING, false},	/* ce-source */
	{"percent_encoding", DEST_OPTION_STRING, false},	/* allow | avoid */
	{"batch", DEST_OPTION_STRING, false},
	{"batch_size", DEST_OPTION_NUMBER, false},
	{"batch_max_bytes", DEST_OPTION_NUMBER, false},
	{"http_version", DEST_OPTION_STRING, false},	/* auto | 1.1 | 2 */
	{NULL}
};

static const char *const webhook_percent_encodings[] = {"allow", "avoid", NULL};
static const char *const webhook_batch_choices[] = {"cloudevents", "array", NULL};
static const char *const webhook_http_versions[] = {"auto", "1.1", "2", NULL};

/*
 * http_version 2 needs a libcurl with HTTP/2, and over plain http (h2c) one
 * that can reuse such a connection (8.0 or later, HttpClientHttp2Sound).
 */
static void
webhook_check_http2(const DestinationDefinition *def)
{
	const char *version = DestinationOptionText(def, "http_version");
	bool		cleartext;

	if (version == NULL || strcmp(version, "2") != 0)
		return;
	cleartext = (def->url != NULL && pg_strncasecmp(def->url, "http:", 5) == 0);
	if (!HttpClientHttp2())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("option http_version of destination \"%s\" is 2, but this server's libcurl %s has no HTTP/2",
						def->name, HttpClientLibcurlVersion()),
				 errhint("Use http_version auto or 1.1, or a libcurl built with nghttp2.")));
	if (cleartext && !HttpClientHttp2Sound())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("option http_version of destination \"%s\" is 2 over plain http, which needs libcurl 8.0 or later",
						def->name),
				 errdetail("This server's libcurl %s cannot reuse an HTTP/2 connection without TLS.",
						   HttpClientLibcurlVersion()),
				 errhint("Use an https:// URL (HTTP/2 over TLS works), or http_version auto or 1.1.")));
}

/*
 * What delivery assumes of a webhook: every signing secret decodes to a key
 * (the relay used to drop one that did not, with a WARNING at each load),
 * the bearer token fits on a header line, ce-source is not empty.
 */
static void
webhook_validate(const DestinationDefinition *def)
{
	ListCell   *lc;

	foreach(lc, def->signing_secrets)
	{
		const char *secret = lfirst(lc);
		StringInfoData key;

		if (secret == NULL)
			continue;
		initStringInfo(&key);
		if (!webhook_decode_secret(secret, &key))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("signing secret %d of destination \"%s\" is not valid base64",
							foreach_current_index(lc) + 1, def->name),
					 errhint("A Standard Webhooks secret is \"whsec_\" followed by base64, padded with \"=\" to a multiple of four characters.")));
		pfree(key.data);
	}

	if (def->bearer_token != NULL)
	{
		if (def->bearer_token[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("bearer_token of destination \"%s\" must not be empty",
							def->name),
					 errhint("Set bearer_token to NULL to send no Authorization header.")));
		for (const unsigned char *p = (const unsigned char *) def->bearer_token; *p; p++)
			if (*p < 0x20 || *p == 0x7f)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("bearer_token of destination \"%s\" must not contain control characters",
								def->name),
						 errdetail("The token is sent on the Authorization header line.")));
	}

	CloudEventCheckSource(def);
	DestinationCheckChoice(def, "percent_encoding", webhook_percent_encodings);
	DestinationCheckChoice(def, "batch", webhook_batch_choices);
	DestinationCheckChoice(def, "http_version", webhook_http_versions);
	webhook_check_http2(def);
	DestinationCheckInteger(def, "batch_size", 1, WEBHOOK_MAX_BATCH,
							"A batch carries at most 1000 events.");
	DestinationCheckInteger(def, "batch_max_bytes", 1024, WEBHOOK_MAX_BATCH_BYTES,
							"A batch's body is from 1 KiB to 16 MiB.");
	if (DestinationOptionText(def, "batch") == NULL)
	{
		const char *size_key = DestinationOptionText(def, "batch_size") ?
			"batch_size" : "batch_max_bytes";

		if (DestinationOptionText(def, size_key) != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option %s of destination \"%s\" needs option batch",
							size_key, def->name),
					 errhint("Set batch to 'cloudevents' or 'array' to send events in batches.")));
	}

}

const DestinationRoutine webhook_routine =
{
	.kind = "webhook",
	.max_batch = WEBHOOK_MAX_BATCH,
	.options = webhook_options,
	.validate = webhook_validate,
	.load = webhook_load,
	.build_request = webhook_build_request,
	.classify = webhook_classify,
};
