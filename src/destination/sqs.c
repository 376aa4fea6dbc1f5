/*-------------------------------------------------------------------------
 *
 * sqs.c
 *		  Amazon SQS destinations: SendMessage and SendMessageBatch over
 *		  the JSON 1.0 protocol.
 *
 * Request: POST to the endpoint (the destination's url), Content-Type
 * application/x-amz-json-1.0, X-Amz-Target AmazonSQS.SendMessage (or
 * AmazonSQS.SendMessageBatch), body a JSON object with QueueUrl
 * (options.queue_url, by default the url itself).  Signed with SigV4 for
 * service "sqs" (aws.c).  Non-ASCII text travels as UTF-8 in the JSON.
 *
 * Every message carries:
 *	- MessageBody: the payload (JSON text), or with options.body =
 *	  'cloudevents' the event as a CloudEvents JSON object (aws.c);
 *	- MessageAttributes: event_type, message_id, and when present
 *	  aggregate_id and traceparent, then the per-event headers
 *	  ({"DataType": "String", "StringValue"}; aws.c says when headers make
 *	  a message unsendable);
 *	- on FIFO queues: MessageGroupId (aws.c) and MessageDeduplicationId =
 *	  message id, so SQS drops a re-send within its deduplication window.
 *
 * Size: the body as sent and the attributes (names, types, values) count against
 * SQS's 1 MiB, for one message and for a whole batch.
 *
 * Response: SendMessage answers 200 with a MessageId.  SendMessageBatch
 * answers 200 with "Successful" and "Failed" arrays: each entry (Id =
 * message id) is acknowledged, retried (SenderFault false, or a
 * throttling/configuration code) or dead-lettered (SenderFault true); an
 * entry missing from both is retried.  Errors for the whole request carry
 * "__type" ("com.amazonaws.sqs#QueueDoesNotExist": the code is after the
 * '#') and "message" (aws.c decides).  The response is checked with the
 * JSON lexer first, which reports errors instead of raising them, so a
 * broken response never aborts the relay's cycle.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/sqs.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/jsonapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "outbox_pg.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"
#include "destination/aws.h"

/* Room for the response of a batch call (ten result entries and more). */
#define SQS_CAPTURE_BATCH	65536
#define SQS_CAPTURE_SINGLE	4096
#define SQS_MAX_DEPTH		32	/* of a response's JSON (sqs_unsafe_json) */
#define SQS_MAX_NUMBER		32	/* characters of a number in it */

/* The members of one message (without braces), after "Id" if any. */
static void
sqs_append_message(StringInfo buf, const AwsTarget *t,
				   const OutboxMessage *msg)
{
	AwsAttributes attrs;

	AwsMessageAttributes(msg, &attrs);
	appendStringInfoString(buf, "\"MessageBody\":");
	escape_json(buf, AwsMessageBody(t, msg));
	appendStringInfoString(buf, ",\"MessageAttributes\":{");
	for (int i = 0; i < attrs.n; i++)
	{
		if (i > 0)
			appendStringInfoChar(buf, ',');
		escape_json(buf, attrs.names[i]);
		appendStringInfoString(buf, ":{\"DataType\":\"String\",\"StringValue\":");
		escape_json(buf, attrs.values[i]);
		appendStringInfoChar(buf, '}');
	}
	appendStringInfoChar(buf, '}');
	if (t->fifo)
	{
		appendStringInfoString(buf, ",\"MessageGroupId\":");
		escape_json(buf, AwsGroupId(t, msg));
		appendStringInfoString(buf, ",\"MessageDeduplicationId\":");
		escape_json(buf, msg->id);
	}
}

static void *
sqs_load(const DestinationConfig *config)
{
	return AwsLoadTarget(config, "sqs");
}

/* SendMessage for one message, SendMessageBatch for several. */
static int
sqs_build_request(void *target, OutboxMessage *const *msgs, int n,
				  HttpRequest *req)
{
	const AwsTarget *t = (const AwsTarget *) target;
	StringInfoData body;

	n = AwsBatchSize(t, msgs, n);
	initStringInfo(&body);
	appendStringInfoString(&body, "{\"QueueUrl\":");
	escape_json(&body, t->queue_url);
	if (n > 1)
	{
		appendStringInfoString(&body, ",\"Entries\":[");
		for (int i = 0; i < n; i++)
		{
			if (i > 0)
				appendStringInfoChar(&body, ',');
			appendStringInfoString(&body, "{\"Id\":");
			escape_json(&body, msgs[i]->id);
			appendStringInfoChar(&body, ',');
			sqs_append_message(&body, t, msgs[i]);
			appendStringInfoChar(&body, '}');
		}
		appendStringInfoChar(&body, ']');
	}
	else
	{
		appendStringInfoChar(&body, ',');
		sqs_append_message(&body, t, msgs[0]);
	}
	appendStringInfoChar(&body, '}');
	req->capture_size = (n > 1) ? SQS_CAPTURE_BATCH : SQS_CAPTURE_SINGLE;
	req->capture = palloc0(req->capture_size);
	AwsRequest(t, "Content-Type: application/x-amz-json-1.0",
			   n > 1 ? "X-Amz-Target: AmazonSQS.SendMessageBatch" :
			   "X-Amz-Target: AmazonSQS.SendMessage",
			   &body, req);
	return n;
}

/*
 * Whether a body has what would make parsing it raise an ERROR rather
 * than fail softly (the lexer's result codes): arrays and objects nested
 * deeper than SQS_MAX_DEPTH (the parser recurses per level and stops at
 * the stack's limit), a number with an exponent or longer than
 * SQS_MAX_NUMBER characters (jsonb_in makes each a numeric: 1e999999
 * overflows it), or, in a database that is not UTF-8, a \\u escape of
 * a character beyond ASCII (converted to the database's encoding, which
 * may lack it).  SQS answers nest three deep and carry strings, booleans
 * and no numbers.  Raised, such an ERROR failed the relay's whole record
 * step, and every result recorded with it was sent again, each time the
 * answer came back (a 200 of 30,000 "[").
 */
static bool
sqs_unsafe_json(const char *text, size_t len)
{
	int			depth = 0;
	int			number = 0;		/* length of the number being read */
	bool		in_string = false;
	bool		utf8 = (GetDatabaseEncoding() == PG_UTF8);

	for (size_t i = 0; i < len; i++)
	{
		char		c = text[i];

		if (in_string)
		{
			if (c == '"')
				in_string = false;
			else if (c == '\\' && i + 1 < len)
			{
				if (text[++i] == 'u' && !utf8 &&
					(i + 4 >= len || strncmp(text + i + 1, "00", 2) != 0 ||
					 strchr("01234567", text[i + 3]) == NULL))
					return true;
			}
			continue;
		}
		if (number > 0 || c == '-' || (c >= '0' && c <= '9'))
		{
			if (c == 'e' || c == 'E' || ++number > SQS_MAX_NUMBER)
				return true;
			if (c != '-' && c != '+' && c != '.' && !(c >= '0' && c <= '9'))
				number = 0;		/* the number ended before c */
			else
				continue;
		}
		if (c == '"')
			in_string = true;
		else if (c == '[' || c == '{')
		{
			if (++depth > SQS_MAX_DEPTH)
				return true;
		}
		else if (c == ']' || c == '}')
			depth--;
	}
	return false;
}

/*
 * Parse a response body as jsonb; NULL if it is not valid JSON, or has
 * what would make parsing it raise an ERROR (sqs_unsafe_json).  The lexer
 * reports problems as a result code (no ERROR), and text it accepts is
 * accepted by jsonb_in too.
 */
static Jsonb *
sqs_parse(const char *text, size_t len)
{
	JsonLexContext *lex;
	char	   *copy;

	if (len == 0 || sqs_unsafe_json(text, len))
		return NULL;
	copy = pnstrdup(text, len);
	lex = makeJsonLexContextCstringLen(NULL, copy, len, GetDatabaseEncoding(), true);
	if (pg_parse_json(lex, &nullSemAction) != JSON_SUCCESS)
		return NULL;
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(copy)));
}

static char *
json_get_text(JsonbContainer *c, const char *key)
{
	JsonbValue *v = OutboxJsonbGet(c, key);

	if (v == NULL || v->type != jbvString)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/* the entry of a result array whose "Id" is id, or NULL */
static JsonbContainer *
json_find_entry(JsonbValue *array, const char *id)
{
	JsonbContainer *c;
	uint32		n;

	if (array == NULL || array->type != jbvBinary ||
		!JsonContainerIsArray(array->val.binary.data))
		return NULL;
	c = array->val.binary.data;
	n = JsonContainerSize(c);
	for (uint32 i = 0; i < n; i++)
	{
		JsonbValue *e = getIthJsonbValueFromContainer(c, i);
		char	   *eid;

		if (e == NULL || e->type != jbvBinary)
			continue;
		eid = json_get_text(e->val.binary.data, "Id");
		if (eid && strcmp(eid, id) == 0)
			return e->val.binary.data;
	}
	return NULL;
}

/* An error answer for the whole request: "__type" and "message". */
static bool
sqs_classify_error(const HttpRequest *req, JsonbContainer *root, int n,
				   DeliveryResult *results)
{
	char	   *type = root ? json_get_text(root, "__type") : NULL;
	char	   *message = root ? json_get_text(root, "message") : NULL;
	char	   *hash;

	if (root && message == NULL)
		message = json_get_text(root, "Message");
	if (type && (hash = strrchr(type, '#')) != NULL)
		type = hash + 1;
	return AwsClassifyError(req, type,
							message ? message : (root ? "" : req->response),
							n, results);
}

/* One SendMessageBatch entry's result; one in neither array is left undecided. */
static void
sqs_classify_entry(JsonbValue *ok, JsonbValue *failed,
				   const OutboxMessage *msg, DeliveryResult *result)
{
	JsonbContainer *entry;

	if (json_find_entry(ok, msg->id) != NULL)
		DeliveryResultSet(result, OUTCOME_ACK, NULL);
	else if ((entry = json_find_entry(failed, msg->id)) != NULL)
	{
		JsonbValue *sender = OutboxJsonbGet(entry, "SenderFault");

		AwsClassifyEntry("SendMessageBatch", json_get_text(entry, "Code"),
						 json_get_text(entry, "Message"),
						 sender && sender->type == jbvBool && sender->val.boolean,
						 result);
	}
}

static bool
sqs_classify(void *target, const HttpRequest *req, OutboxMessage *const *msgs,
			 int n, DeliveryResult *results)
{
	const char *text = req->capture ? req->capture : req->response;
	size_t		len = req->capture ? req->capture_len : req->response_len;
	Jsonb	   *jb = sqs_parse(text, len);
	JsonbContainer *root = jb ? &jb->root : NULL;
	JsonbValue *ok;
	JsonbValue *failed;

	if (req->status < 200 || req->status >= 300)
		return sqs_classify_error(req, root, n, results);
	if (root == NULL)
		return AwsClassifyError(req, NULL,
								req->capture && req->capture_len + 1 >= req->capture_size ?
								"the response was too long to read" :
								"the response is not JSON",
								n, results);
	if (n == 1)
	{
		if (json_get_text(root, "MessageId") == NULL)
			return AwsClassifyError(req, NULL, "the response has no MessageId",
									n, results);
		DeliveryResultSet(&results[0], OUTCOME_ACK, NULL);
		return false;
	}

	/* SendMessageBatch: every entry on its own */
	ok = OutboxJsonbGet(root, "Successful");
	failed = OutboxJsonbGet(root, "Failed");
	for (int i = 0; i < n; i++)
		sqs_classify_entry(ok, failed, msgs[i], &results[i]);
	/* entries missing from the answer are retried by the caller */
	return false;
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption sqs_options[] =
{
	{"queue_url", DEST_OPTION_STRING, false},	/* default: url */
	{"region", DEST_OPTION_STRING, false},
	{"fifo", DEST_OPTION_BOOLEAN, false},
	{"message_group_key", DEST_OPTION_STRING, false},
	{"batch_size", DEST_OPTION_NUMBER, false},
	{"body", DEST_OPTION_STRING, false},	/* payload | cloudevents */
	{"source", DEST_OPTION_STRING, false},	/* the CloudEvent's source */
	{NULL}
};

static const char *const sqs_group_keys[] = {"aggregate_id", "type", "destination", NULL};
static const char *const sqs_bodies[] = {"payload", "cloudevents", NULL};

static void
sqs_validate(const DestinationDefinition *def)
{
	const char *queue_url = DestinationOptionText(def, "queue_url");
	const char *region = DestinationOptionText(def, "region");

	DestinationRequireCredentials(def, DEST_CREDENTIALS_AWS);
	DestinationCheckNoQuery(def, "Use the service endpoint, e.g. https://sqs.eu-west-1.amazonaws.com/.");
	if (queue_url == NULL)
		queue_url = def->url;
	if (!DestinationMatches(queue_url,
							"^https?://[^/?#[:space:]]+/[0-9A-Za-z]+/[A-Za-z0-9_-]{1,80}(\\.fifo)?$",
							true))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("destination \"%s\" has no SQS queue URL", def->name),
				 errdetail("Neither the option queue_url nor the url is one."),
				 errhint("Set the option queue_url to e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/orders.")));
	if (region == NULL)
		region = AwsRegion(NULL, def->url, NULL);
	if (region == NULL || !DestinationMatches(region, "^[a-z0-9-]{1,64}$", false))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("destination \"%s\" has no AWS region", def->name),
				 errhint("Set the option region, e.g. {\"region\": \"eu-west-1\"}; without it the region is taken from an sqs.REGION.amazonaws.com url.")));
	DestinationCheckChoice(def, "message_group_key", sqs_group_keys);
	DestinationCheckInteger(def, "batch_size", 1, AWS_MAX_BATCH,
							"SendMessageBatch takes at most 10 entries; 1 sends every message on its own.");
	DestinationCheckChoice(def, "body", sqs_bodies);
	CloudEventCheckSource(def);
}

const DestinationRoutine sqs_routine =
{
	.kind = "sqs",
	.max_batch = AWS_MAX_BATCH,
	.options = sqs_options,
	.validate = sqs_validate,
	.load = sqs_load,
	.reject = AwsReject,
	.build_request = sqs_build_request,
	.classify = sqs_classify,
};
