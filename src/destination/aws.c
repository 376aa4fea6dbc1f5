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
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/aws.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/builtins.h"

#include "outbox_pg.h"
#include "retry.h"
#include "deststats.h"
#include "destination/http.h"
#include "destination/destination.h"

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

bool
OutboxAwsErrorIsTransient(const char *code)
{
	return code_in(code, transient_codes, lengthof(transient_codes));
}

bool
OutboxAwsErrorIsConfig(const char *code)
{
	return code_in(code, config_codes, lengthof(config_codes));
}

/*
 * Have curl sign the request: service "sns" or "sqs".  Adds the session
 * token header when there is one.
 */
void
OutboxAwsSign(const BrokerTarget *t, const char *service, HttpRequest *req,
			  struct curl_slist **headers)
{
	req->aws_sigv4 = psprintf("aws:amz:%s:%s", t->region ? t->region : "us-east-1",
							  service);
	req->username = t->access_key_id ? t->access_key_id : "";
	req->password = t->secret_access_key ? t->secret_access_key : "";
	if (t->session_token != NULL && t->session_token[0] != '\0')
	{
		char	   *line = psprintf("X-Amz-Security-Token: %s", t->session_token);

		*headers = OutboxAddHeader(*headers, line);
		pfree(line);
	}
}

/*
 * The region: the option if given, else the region of an ARN
 * (arn:PARTITION:SERVICE:REGION:...), else the one in an AWS host name
 * (SERVICE.REGION.amazonaws.com).  NULL if none.
 */
const char *
OutboxAwsRegion(const char *region, const char *url, const char *arn)
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
bool
OutboxAwsGroupIdValid(const char *value)
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
OutboxAwsGroupId(const BrokerTarget *t, const BrokerMessage *msg)
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

	if (OutboxAwsGroupIdValid(value))
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
 * An error answer for the whole request: decide every message of the
 * batch by the status and the AWS error code.
 */
void
OutboxAwsClassifyError(BrokerBatch *batch, HttpRequest *req,
					   const char *code, const char *message)
{
	DeliveryOutcome outcome;
	char	   *error;
	int			status = req->status;

	if (status >= 500 || status == 408 || status == 429 ||
		OutboxAwsErrorIsTransient(code))
	{
		outcome = OUTCOME_RETRY;
		batch->destination_failure = true;
	}
	else if (OutboxAwsErrorIsConfig(code) || status == 401 || status == 403)
	{
		outcome = OUTCOME_RETRY;
		batch->destination_failure = true;
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
	for (int i = 0; i < batch->nmsgs; i++)
		OutboxBrokerDecide(batch->msgs[i], outcome, status, error);
}

/*
 * The String message attributes of a message, as (name, value) pairs, the
 * same for SNS and SQS: event type, message id, and the aggregate id and
 * trace context when present.  Returns how many there are (at most
 * AWS_MAX_ATTRIBUTES).
 */
int
OutboxAwsAttributes(const BrokerMessage *msg,
					const char *names[AWS_MAX_ATTRIBUTES],
					const char *values[AWS_MAX_ATTRIBUTES])
{
	int			n = 0;

	names[n] = "event_type";
	values[n++] = msg->type;
	names[n] = "message_id";
	values[n++] = msg->id;
	if (msg->aggregate_id && msg->aggregate_id[0])
	{
		names[n] = "aggregate_id";
		values[n++] = msg->aggregate_id;
	}
	if (msg->traceparent && msg->traceparent[0])
	{
		names[n] = "traceparent";
		values[n++] = msg->traceparent;
	}
	return n;
}

/*
 * The size AWS counts against its message limit: the body plus every
 * attribute's name, type ("String") and value.
 */
size_t
OutboxAwsMessageSize(const BrokerMessage *msg)
{
	const char *names[AWS_MAX_ATTRIBUTES];
	const char *values[AWS_MAX_ATTRIBUTES];
	int			n = OutboxAwsAttributes(msg, names, values);
	size_t		size = strlen(msg->payload);

	for (int i = 0; i < n; i++)
		size += strlen(names[i]) + strlen("String") + strlen(values[i]);
	return size;
}

/*
 * Finish an AWS request: its headers (no empty header, no spaces inside
 * values: see the notes at the top), the SigV4 signature and the body.
 * target may be NULL.  The header list is freed on error.
 */
void
OutboxAwsRequest(const BrokerTarget *t, const char *service,
				 const char *content_type, const char *target,
				 StringInfo body, HttpRequest *req)
{
	struct curl_slist *volatile h = NULL;

	PG_TRY();
	{
		h = OutboxAddHeader(h, content_type);
		if (target != NULL)
			h = OutboxAddHeader(h, target);
		OutboxAwsSign(t, service, req, (struct curl_slist **) &h);
	}
	PG_CATCH();
	{
		if (h)
			curl_slist_free_all(h);
		PG_RE_THROW();
	}
	PG_END_TRY();

	req->url = t->url;
	req->headers = h;
	req->body = body->data;
	req->body_len = body->len;
}
