/*-------------------------------------------------------------------------
 *
 * aws.c
 *		  What SNS and SQS requests share: SigV4 signing through libcurl,
 *		  region, FIFO message groups, and the meaning of AWS error codes.
 *
 * Signing.  libcurl signs the request itself (CURLOPT_AWS_SIGV4 with
 * "aws:amz:REGION:SERVICE", the access key id and secret as user name and
 * password).  It hashes the body given with CURLOPT_POSTFIELDS and signs
 * host, x-amz-date and the headers we pass.  libcurl 7.88 (Debian
 * bookworm) gets three things wrong, so the requests are designed around
 * them:
 *
 *	- a header passed with an empty value (such as "Expect:", which only
 *	  suppresses a header) is signed although it is not sent: our AWS
 *	  requests carry no empty header at all (webhook.c's "Expect:" is not
 *	  used here);
 *	- the query string is signed unsorted: our requests have none (every
 *	  parameter is in the POST body; the destination trigger refuses a
 *	  URL with a query string);
 *	- header values are signed as given, without collapsing inner spaces:
 *	  we send only values without runs of spaces (Content-Type without a
 *	  charset parameter, X-Amz-Target, X-Amz-Security-Token).
 *
 * test/t/050_sigv4.pl checks every request against botocore's own SigV4
 * implementation (test/sink/aws_sink.py), batches and non-ASCII bodies
 * included, and checks that a wrong secret is rejected.
 *
 * Secrets: the secret key is handed to curl as the password; it is never
 * put in a header, an error text or a log line.
 *
 * Errors.  AWS answers errors with a code (Query protocol: <Code> in the
 * XML; JSON protocol: "__type", after the '#').  Throttling and server
 * errors are retried; credential, permission and missing-resource errors
 * are configuration problems that affect every message, so they are
 * retried too (fixing the configuration recovers the backlog) and count
 * against the destination's circuit breaker; other client errors are the
 * message's fault and go to the dead letters.
 * The code and message are quoted as AWS sent them; the relay bounds,
 * escapes and redacts them (keys and session token) when it records them
 * (peertext.c).
 *
 * Attributes.  Every message carries String attributes event_type,
 * message_id, and aggregate_id and traceparent when present; then its
 * per-event headers (emit(headers => ...)), each as a String attribute
 * named like the header.  AWS allows 10 attributes per message, names of
 * letters, digits, '-', '_' and '.' (no leading, trailing or doubled '.',
 * no "AWS." or "Amazon." prefix) and non-empty values.  A message whose
 * headers do not fit these rules, or whose header names one of the
 * relay's own attributes, is rejected before sending (dead letter, with
 * the reason): the relay never drops or renames a header silently.
 *
 * Body.  The message body is the payload (options.body = 'payload', the
 * default) or the whole event as a CloudEvents JSON object
 * (options.body = 'cloudevents', cloudevents.c: id, source, type, subject,
 * time, traceparent, and the payload under "data"), so that a consumer
 * reads the event's metadata without asking for message attributes.  The
 * attributes are the same either way.
 *
 * This file is a library for sns.c and sqs.c (aws.h); it knows nothing
 * of delivery or the registry.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/aws.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/builtins.h"

#include "outbox_pg.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"
#include "destination/aws.h"

static bool aws_error_is_config(const char *code);

static bool aws_error_is_transient(const char *code);

/* Error codes that mean "try again later". */
static const char *const transient_codes[] = {
	"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
	"RequestThrottledException", "TooManyRequestsException", "ServiceUnavailable",
	"InternalError", "InternalFailure", "InternalErrorException",
	"KMSThrottling", "KMSThrottlingException", "KmsThrottled",
	"KMSUnavailable", "KMSUnavailableException", "ServiceUnavailableException",
	"RequestTimeout", "RequestTimeoutException",
};

/* Error codes that mean "the destination is configured wrongly". */
static const char *const config_codes[] = {
	"InvalidClientTokenId", "SignatureDoesNotMatch", "InvalidSignatureException",
	"IncompleteSignature",
	"ExpiredToken", "ExpiredTokenException", "UnrecognizedClientException",
	"MissingAuthenticationToken", "MissingAuthenticationTokenException",
	"AccessDenied", "AccessDeniedException", "AuthorizationError",
	"AuthorizationErrorException", "InvalidSecurity", "RequestExpired",
	"NotFound", "NotFoundException", "QueueDoesNotExist",
	"AWS.SimpleQueueService.NonExistentQueue", "KMSAccessDenied",
	"KMSDisabled", "KMSNotFound", "KMSInvalidState", "KMSAccessDeniedException",
	"KMSDisabledException", "KMSNotFoundException", "KMSInvalidStateException",
	"InvalidAddress", "OptInRequired",
};

static bool
code_in(const char *code, const char *const *list, int n)
{
	if (code == NULL)
		return false;
	for (int i = 0; i < n; i++)
		if (strcmp(code, list[i]) == 0)
			return true;
	return false;
}

static bool
aws_error_is_transient(const char *code)
{
	return code_in(code, transient_codes, lengthof(transient_codes));
}

static bool
aws_error_is_config(const char *code)
{
	return code_in(code, config_codes, lengthof(config_codes));
}

static bool
ends_with(const char *s, const char *suffix)
{
	size_t		n = strlen(s);
	size_t		m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/*
 * The region: the option if given, else the region of an ARN
 * (arn:PARTITION:SERVICE:REGION:...), else the one in an AWS host name
 * (SERVICE.REGION.amazonaws.com).  NULL if none.
 */
const char *
AwsRegion(const char *region, const char *url, const char *arn)
{
	const char *p;

	if (region != NULL && region[0] != '\0')
		return region;
	if (arn != NULL && strncmp(arn, "arn:", 4) == 0)
	{
		const char *start = arn;

		for (int field = 0; field < 3 && start; field++)
		{
			start = strchr(start, ':');
			if (start)
				start++;
		}
		if (start)
		{
			const char *end = strchr(start, ':');

			if (end && end > start)
				return pnstrdup(start, end - start);
		}
	}
	if (url != NULL && (p = strstr(url, "://")) != NULL)
	{
		const char *host = p + 3;
		const char *dot1 = strchr(host, '.');
		const char *dot2 = dot1 ? strchr(dot1 + 1, '.') : NULL;

		if (dot2 && strncmp(dot2, ".amazonaws.com", 14) == 0 && dot2 > dot1 + 1)
			return pnstrdup(dot1 + 1, dot2 - dot1 - 1);
	}
	return NULL;
}

/*
 * A FIFO MessageGroupId may hold 1 to 128 characters: ASCII letters,
 * digits and punctuation.
 */
static bool
aws_group_id_valid(const char *value)
{
	size_t		n = value ? strlen(value) : 0;

	if (n == 0 || n > 128)
		return false;
	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
		if (*p <= 0x20 || *p >= 0x7f)
			return false;
	return true;
}

/*
 * The message group of a FIFO message: by default the aggregate id (so
 * each aggregate's events stay in order), or the event type, or the
 * destination name (one group: total order).  A value AWS would refuse
 * (too long, non-ASCII, empty) becomes the hex SHA-256 of itself, which
 * keeps one group per value.  An event without an aggregate id falls back
 * to its type.
 */
char *
AwsGroupId(const AwsTarget *t, const OutboxMessage *msg)
{
	const char *value;
	pg_cryptohash_ctx *ctx;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char	   *hex;

	if (strcmp(t->group_key, "type") == 0)
		value = msg->type;
	else if (strcmp(t->group_key, "destination") == 0)
		value = t->name;
	else
		value = (msg->aggregate_id && msg->aggregate_id[0]) ? msg->aggregate_id : msg->type;

	if (aws_group_id_valid(value))
		return pstrdup(value);

	ctx = pg_cryptohash_create(PG_SHA256);
	if (ctx == NULL ||
		pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) value, strlen(value)) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
	{
		pg_cryptohash_free(ctx);
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute a message group id")));
	}
	pg_cryptohash_free(ctx);
	hex = palloc(2 * sizeof(digest) + 1);
	hex_encode((const char *) digest, sizeof(digest), hex);
	hex[2 * sizeof(digest)] = '\0';
	return hex;
}

/*
 * The configuration of an SNS (service "sns") or SQS ("sqs") destination,
 * with the defaults docs/destinations.md documents.
 */
AwsTarget *
AwsLoadTarget(const DestinationConfig *config, const char *service)
{
	const DestinationDefinition *def = config->def;
	const DestinationCredentials *cred = def->credentials;
	AwsTarget  *t = palloc0(sizeof(AwsTarget));
	bool		sns = (strcmp(service, "sns") == 0);
	const char *v;

	t->name = def->name;
	t->url = def->url;
	t->service = service;
	t->service_name = sns ? "SNS" : "SQS";
	t->max_bytes = sns ? AWS_SNS_MAX_BYTES : AWS_SQS_MAX_BYTES;
	t->batch_size = AWS_MAX_BATCH;
	if ((v = OutboxJsonbOption(def->options, "batch_size")) != NULL)
		t->batch_size = Max(1, Min(AWS_MAX_BATCH, atoi(v)));
	t->topic_arn = OutboxJsonbOption(def->options, "topic_arn");
	t->queue_url = OutboxJsonbOption(def->options, "queue_url");
	if (t->queue_url == NULL)
		t->queue_url = def->url;
	t->region = AwsRegion(OutboxJsonbOption(def->options, "region"),
						   def->url, t->topic_arn);
	if ((v = OutboxJsonbOption(def->options, "fifo")) != NULL)
		t->fifo = (strcmp(v, "true") == 0);
	else if (sns)
		t->fifo = (t->topic_arn != NULL && ends_with(t->topic_arn, ".fifo"));
	else
		t->fifo = ends_with(t->queue_url, ".fifo");
	t->group_key = OutboxJsonbOption(def->options, "message_group_key");
	if (t->group_key == NULL)
		t->group_key = "aggregate_id";
	v = OutboxJsonbOption(def->options, "body");
	t->cloudevents = (v != NULL && strcmp(v, "cloudevents") == 0);
	t->source = CloudEventSource(config);
	if (cred != NULL)
	{
		t->access_key_id = cred->aws_access_key_id;
		t->secret_access_key = cred->aws_secret_access_key;
		t->session_token = cred->aws_session_token;
	}
	return t;
}

/*
 * The String attributes of a message, the same for SNS and SQS: event
 * type, message id, the aggregate id and trace context when present, then
 * the per-event headers.  Whether they are acceptable is AwsReject()'s
 * to say; only the first AWS_MAX_ATTRIBUTES are listed.
 */
void
AwsMessageAttributes(const OutboxMessage *msg, AwsAttributes *attrs)
{
	int			n = 0;

	attrs->names[n] = "event_type";
	attrs->values[n++] = msg->type;
	attrs->names[n] = "message_id";
	attrs->values[n++] = msg->id;
	if (msg->aggregate_id && msg->aggregate_id[0])
	{
		attrs->names[n] = "aggregate_id";
		attrs->values[n++] = msg->aggregate_id;
	}
	if (msg->traceparent && msg->traceparent[0])
	{
		attrs->names[n] = "traceparent";
		attrs->values[n++] = msg->traceparent;
	}
	attrs->own = n;
	for (int i = 0; i < msg->nheaders && n < AWS_MAX_ATTRIBUTES; i++)
	{
		attrs->names[n] = msg->headers[i].name;
		attrs->values[n++] = msg->headers[i].value;
	}
	attrs->n = n;
}

/* Is this a name AWS accepts for a message attribute? */
static bool
aws_attribute_name_valid(const char *name)
{
	size_t		len = strlen(name);

	if (len == 0 || len > 256 || name[0] == '.' || name[len - 1] == '.' ||
		strstr(name, "..") != NULL ||
		pg_strncasecmp(name, "aws.", 4) == 0 ||
		pg_strncasecmp(name, "amazon.", 7) == 0)
		return false;
	for (const char *p = name; *p; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
			  (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
			return false;
	return true;
}

/*
 * The message body: the payload, or the event as a CloudEvent (a new
 * string in the current memory context).
 */
const char *
AwsMessageBody(const AwsTarget *t, const OutboxMessage *msg)
{
	StringInfoData buf;

	if (!t->cloudevents)
		return msg->payload;
	initStringInfo(&buf);
	CloudEventAppendJson(&buf, msg, t->source);
	return buf.data;
}

/*
 * The size AWS counts: the body as sent (the CloudEvent, when the body is
 * one) plus every attribute's name, type and value.
 */
static size_t
aws_message_size(const AwsTarget *t, const OutboxMessage *msg)
{
	AwsAttributes attrs;
	const char *body = AwsMessageBody(t, msg);
	size_t		size = strlen(body);

	if (body != msg->payload)
		pfree((char *) body);

	AwsMessageAttributes(msg, &attrs);
	for (int i = 0; i < attrs.n; i++)
		size += strlen(attrs.names[i]) + strlen("String") + strlen(attrs.values[i]);
	return size;
}

/*
 * Why a message can never be sent (NULL if it can): its per-event headers
 * do not make valid attributes, or it is larger than the service takes.
 * The reject callback of both kinds (target: an AwsTarget).
 */
const char *
AwsReject(void *target, const OutboxMessage *msg)
{
	const AwsTarget *t = (const AwsTarget *) target;
	AwsAttributes attrs;
	int			own;
	size_t		size;

	AwsMessageAttributes(msg, &attrs);
	own = attrs.own;
	if (own + msg->nheaders > AWS_MAX_ATTRIBUTES)
		return psprintf("too many headers for %s: %d headers and %d attributes of the relay's own make %d message attributes, the limit is %d; not sent",
						t->service_name, msg->nheaders, own,
						own + msg->nheaders, AWS_MAX_ATTRIBUTES);
	for (int i = 0; i < msg->nheaders; i++)
	{
		const OutboxHeader *h = &msg->headers[i];

		if (!aws_attribute_name_valid(h->name))
			return psprintf("header \"%s\" is not a valid %s message attribute name; not sent",
							h->name, t->service_name);
		for (int k = 0; k < own; k++)
			if (strcmp(h->name, attrs.names[k]) == 0)
				return psprintf("header \"%s\" has the name of an attribute the relay sets itself; not sent",
								h->name);
		if (h->value[0] == '\0')
			return psprintf("header \"%s\" is empty, and %s message attributes cannot be; not sent",
							h->name, t->service_name);
	}
	size = aws_message_size(t, msg);
	if (size > t->max_bytes)
		return psprintf("message too large for %s: %zu bytes with its attributes, the limit is %zu; not sent",
						t->service_name, size, t->max_bytes);
	return NULL;
}

/*
 * How many of the messages (each accepted by AwsReject) one request
 * carries: up to batch_size, within the service's size limit for a batch.
 */
int
AwsBatchSize(const AwsTarget *t, OutboxMessage *const *msgs, int n)
{
	int			k = 0;
	size_t		total = 0;

	while (k < n && k < t->batch_size)
	{
		size_t		size = aws_message_size(t, msgs[k]);

		if (k > 0 && total + size > t->max_bytes)
			break;
		total += size;
		k++;
	}
	return k;
}

/*
 * An error answer for the whole request: decide every message by the
 * status and the AWS error code.  Returns whether the destination failed.
 */
bool
AwsClassifyError(const HttpRequest *req, const char *code,
				 const char *message, int n, DeliveryResult *results)
{
	DeliveryOutcome outcome;
	bool		failed = false;
	char	   *error;
	int			status = req->status;

	if (status >= 500 || status == 408 || status == 429 ||
		aws_error_is_transient(code) ||
		aws_error_is_config(code) || status == 401 || status == 403)
	{
		outcome = OUTCOME_RETRY;
		failed = true;
	}
	else if (status >= 200 && status < 300)
	{
		/* a success status with a body we could not read */
		outcome = OUTCOME_RETRY;
	}
	else
		outcome = OUTCOME_DEAD;

	error = psprintf("HTTP %d: %s: %s", status,
					 code ? code : "error", message ? message : "");
	for (int i = 0; i < n; i++)
		DeliveryResultSet(&results[i], outcome, error);
	return failed;
}

/*
 * A failed entry of a batch answer (call: "PublishBatch" or
 * "SendMessageBatch"): the sender's fault is the message's (dead letter)
 * unless the code says otherwise; anything else is retried.
 */
bool
AwsClassifyEntry(const char *call, const char *code, const char *message,
				 bool sender_fault, DeliveryResult *result)
{
	DeliveryOutcome outcome = OUTCOME_RETRY;

	if (sender_fault && !aws_error_is_transient(code) && !aws_error_is_config(code))
		outcome = OUTCOME_DEAD;
	DeliveryResultSet(result, outcome,
					  psprintf("%s entry failed (%s): %s: %s", call,
							   sender_fault ? "sender fault" : "service fault",
							   code ? code : "error", message ? message : ""));
	return false;
}

/*
 * Finish an AWS request: its headers (no empty header, no spaces inside
 * values: see the notes at the top), the SigV4 signature (curl signs;
 * service "sns" or "sqs") and the body.  target may be NULL.
 */
void
AwsRequest(const AwsTarget *t, const char *content_type, const char *target,
		   StringInfo body, HttpRequest *req)
{
	HttpRequestAddHeader(req, content_type);
	if (target != NULL)
		HttpRequestAddHeader(req, target);
	if (t->session_token != NULL && t->session_token[0] != '\0')
	{
		char	   *line = psprintf("X-Amz-Security-Token: %s", t->session_token);

		HttpRequestAddHeader(req, line);
		pfree(line);
	}
	req->aws_sigv4 = psprintf("aws:amz:%s:%s", t->region ? t->region : "us-east-1",
							  t->service);
	req->username = t->access_key_id ? t->access_key_id : "";
	req->password = t->secret_access_key ? t->secret_access_key : "";
	req->url = t->url;
	req->body = body->data;
	req->body_len = body->len;
}
