/*-------------------------------------------------------------------------
 *
 * webhook.c
 *		  The webhook wire format: CloudEvents 1.0 over HTTP, optionally
 *		  signed the Standard Webhooks way.
 *
 * Binary mode (default): the body is the payload, Content-Type is
 * application/json, and the attributes travel as ce-* headers (ce-id,
 * ce-specversion, ce-type, ce-source, ce-subject, ce-time; no
 * ce-datacontenttype since Content-Type carries it).  Header values are
 * percent-encoded outside printable ASCII, and '"', '%' and space, as the
 * CloudEvents HTTP binding asks.
 *
 * Structured mode: the body is the whole event as
 * application/cloudevents+json with the payload under "data".
 *
 * In both modes: Idempotency-Key and ce-id are the message id; traceparent
 * (and ce-traceparent) carry the trace context captured at emit time.
 *
 * Standard Webhooks: webhook-id (message id), webhook-timestamp (this
 * attempt's Unix seconds) and webhook-signature, a space-separated list of
 * "v1,<base64 HMAC-SHA256 of id.timestamp.body>", one per secret, so
 * secrets can be rotated.  A secret is "whsec_" followed by base64.
 *
 * Everything is built before the request starts; curl copies the header
 * list, and the body stays in the event's memory until completion.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/webhook.c
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
#include "utils/json.h"

#include "outbox_pg.h"
#include "destination/http.h"
#include "destination/destination.h"

static void
append_percent_encoded(StringInfo buf, const char *value)
{
	static const char hex[] = "0123456789ABCDEF";

	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		if (*p <= 0x20 || *p >= 0x7f || *p == '"' || *p == '%')
		{
			appendStringInfoChar(buf, '%');
			appendStringInfoChar(buf, hex[*p >> 4]);
			appendStringInfoChar(buf, hex[*p & 0x0f]);
		}
		else
			appendStringInfoChar(buf, (char) *p);
	}
}

/* "name: value", copied by curl */
static struct curl_slist *
add_header_value(struct curl_slist *list, const char *name, const char *value)
{
	char	   *line = psprintf("%s: %s", name, value);

	list = OutboxAddHeader(list, line);
	pfree(line);
	return list;
}

static struct curl_slist *
add_ce_header(struct curl_slist *list, const char *name, const char *value)
{
	StringInfoData line;

	initStringInfo(&line);
	appendStringInfo(&line, "%s: ", name);
	append_percent_encoded(&line, value);
	list = OutboxAddHeader(list, line.data);
	pfree(line.data);
	return list;
}

bool
OutboxDecodeSigningSecret(const char *secret, StringInfo key)
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

void
OutboxBuildWebhook(const WebhookEvent *ev, const WebhookTarget *t,
				   HttpRequest *req, char **body)
{
	struct curl_slist *h = NULL;
	StringInfoData buf;
	ListCell   *lc;
	size_t		body_len;

	/* body */
	if (t->structured)
	{
		initStringInfo(&buf);
		appendStringInfoString(&buf, "{\"specversion\":\"1.0\",\"id\":");
		escape_json(&buf, ev->id);
		appendStringInfoString(&buf, ",\"source\":");
		escape_json(&buf, t->source);
		appendStringInfoString(&buf, ",\"type\":");
		escape_json(&buf, ev->type);
		if (ev->aggregate_id)
		{
			appendStringInfoString(&buf, ",\"subject\":");
			escape_json(&buf, ev->aggregate_id);
		}
		appendStringInfoString(&buf, ",\"time\":");
		escape_json(&buf, ev->time);
		if (ev->traceparent)
		{
			appendStringInfoString(&buf, ",\"traceparent\":");
			escape_json(&buf, ev->traceparent);
		}
		appendStringInfoString(&buf, ",\"datacontenttype\":\"application/json\",\"data\":");
		appendStringInfoString(&buf, ev->payload);
		appendStringInfoChar(&buf, '}');
		*body = buf.data;
		body_len = buf.len;
	}
	else
	{
		*body = (char *) ev->payload;
		body_len = strlen(ev->payload);
	}

	PG_TRY();
	{
		if (t->structured)
			h = OutboxAddHeader(h, "Content-Type: application/cloudevents+json; charset=utf-8");
		else
		{
			h = OutboxAddHeader(h, "Content-Type: application/json");
			h = OutboxAddHeader(h, "ce-specversion: 1.0");
			h = add_ce_header(h, "ce-id", ev->id);
			h = add_ce_header(h, "ce-type", ev->type);
			h = add_ce_header(h, "ce-source", t->source);
			if (ev->aggregate_id)
				h = add_ce_header(h, "ce-subject", ev->aggregate_id);
			h = add_ce_header(h, "ce-time", ev->time);
			if (ev->traceparent)
				h = add_ce_header(h, "ce-traceparent", ev->traceparent);
		}
		h = add_header_value(h, "Idempotency-Key", ev->id);
		if (ev->traceparent)
			h = add_header_value(h, "traceparent", ev->traceparent);
		if (t->signing_keys != NIL)
		{
			char		ts[32];
			StringInfoData sigs;

			snprintf(ts, sizeof(ts), "%lld", (long long) time(NULL));
			h = add_header_value(h, "webhook-id", ev->id);
			h = add_header_value(h, "webhook-timestamp", ts);
			initStringInfo(&sigs);
			foreach(lc, t->signing_keys)
				append_signature(&sigs, (StringInfo) lfirst(lc), ev->id, ts,
								 *body, body_len);
			h = add_header_value(h, "webhook-signature", sigs.data);
		}
		if (t->bearer_token)
		{
			char	   *bearer = psprintf("Bearer %s", t->bearer_token);

			h = add_header_value(h, "Authorization", bearer);
		}
		foreach(lc, t->headers)
			h = OutboxAddHeader(h, (char *) lfirst(lc));
		foreach(lc, ev->extra_headers)
			h = OutboxAddHeader(h, (char *) lfirst(lc));
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

	req->headers = h;
	req->body = *body;
	req->body_len = body_len;
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption webhook_options[] =
{
	{"source", DEST_OPTION_STRING, false},	/* ce-source */
	{NULL}
};

/*
 * What delivery assumes of a webhook: every signing secret decodes to a key
 * (the relay used to drop one that did not, with a WARNING at each load),
 * the bearer token fits on a header line, ce-source is not empty.
 */
static void
webhook_validate(const DestinationDefinition *def)
{
	const char *source = DestinationOptionText(def, "source");
	ListCell   *lc;

	foreach(lc, def->signing_secrets)
	{
		const char *secret = lfirst(lc);
		StringInfoData key;

		if (secret == NULL)
			continue;
		initStringInfo(&key);
		if (!OutboxDecodeSigningSecret(secret, &key))
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

	if (source != NULL && source[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option source of destination \"%s\" must not be empty",
						def->name),
				 errhint("Remove the option to send the default, urn:outbox_pg:DATABASE.")));
}

const DestinationRoutine webhook_routine =
{
	.kind = "webhook",
	.max_batch = 1,
	.options = webhook_options,
	.validate = webhook_validate,
};
