/*-------------------------------------------------------------------------
 *
 * sns.c
 *		  Amazon SNS destinations: Publish and PublishBatch over the Query
 *		  protocol.
 *
 * Request: POST to the endpoint (the destination's url, path as given, no
 * query string), Content-Type application/x-www-form-urlencoded, body
 * "Action=Publish&Version=2010-03-31&TopicArn=...&Message=..." with every
 * value percent-encoded as RFC 3986 asks (unreserved characters only are
 * left alone, so the body is ASCII whatever the payload holds).  Signed
 * with SigV4 for service "sns" (aws.c).
 *
 * Several messages for one topic go out as one PublishBatch with
 * "PublishBatchRequestEntries.member.N.*" entries; each entry's Id is the
 * message id (a UUID: letters, digits and hyphens, as Ids must be).
 *
 * Every message carries:
 *	- Message: the payload (JSON text), or with options.body =
 *	  'cloudevents' the event as a CloudEvents JSON object (aws.c);
 *	- MessageAttributes: event_type, message_id, and when present
 *	  aggregate_id and traceparent, then the per-event headers (String
 *	  attributes; aws.c says when headers make a message unsendable);
 *	- on FIFO topics: MessageGroupId (aws.c: aggregate id by default) and
 *	  MessageDeduplicationId = message id, so a re-send within SNS's
 *	  deduplication window is not delivered twice.
 *
 * Size: SNS counts the message as sent and its attributes (names, types and
 * values) against 256 KiB, for one message and for a whole batch.
 *
 * Response: Publish answers 200 with a PublishResult; PublishBatch
 * answers 200 with <Successful> and <Failed> member lists, so every entry
 * is checked: successful ones are acknowledged, failed ones retried
 * (SenderFault false, or a throttling/configuration code) or
 * dead-lettered (SenderFault true), and an entry missing from the answer
 * is retried.  Errors for the whole request are an <ErrorResponse> with
 * <Code> and <Message> (aws.c decides).  The XML is AWS's fixed shape;
 * it is read by looking for its elements, not by a general XML parser.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/sns.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"

#include "outbox_pg.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"
#include "destination/aws.h"

#define SNS_API_VERSION "2010-03-31"

static void
append_param(StringInfo buf, const char *prefix, const char *name,
			 const char *value)
{
	appendStringInfo(buf, "&%s%s=", prefix, name);
	OutboxAppendPercentEncoded(buf, value);
}

/* Room for the response of a batch call (ten result entries and more). */
#define SNS_CAPTURE_BATCH	65536
#define SNS_CAPTURE_SINGLE	4096

static void
sns_append_entry(StringInfo buf, const AwsTarget *t,
				 const OutboxMessage *msg, const char *prefix)
{
	AwsAttributes attrs;

	AwsMessageAttributes(msg, &attrs);
	append_param(buf, prefix, "Message", AwsMessageBody(t, msg));
	for (int i = 0; i < attrs.n; i++)
	{
		char	   *attr = psprintf("%sMessageAttributes.entry.%d.", prefix, i + 1);

		append_param(buf, attr, "Name", attrs.names[i]);
		append_param(buf, attr, "Value.DataType", "String");
		append_param(buf, attr, "Value.StringValue", attrs.values[i]);
		pfree(attr);
	}
	if (t->fifo)
	{
		append_param(buf, prefix, "MessageGroupId", AwsGroupId(t, msg));
		append_param(buf, prefix, "MessageDeduplicationId", msg->id);
	}
}

static void *
sns_load(const DestinationConfig *config)
{
	return AwsLoadTarget(config, "sns");
}

/* Publish for one message, PublishBatch for several. */
static int
sns_build_request(void *target, OutboxMessage *const *msgs, int n,
				  HttpRequest *req)
{
	const AwsTarget *t = (const AwsTarget *) target;
	StringInfoData body;

	n = AwsBatchSize(t, msgs, n);
	initStringInfo(&body);
	appendStringInfoString(&body, n > 1 ? "Action=PublishBatch" : "Action=Publish");
	append_param(&body, "", "Version", SNS_API_VERSION);
	append_param(&body, "", "TopicArn", t->topic_arn ? t->topic_arn : "");
	for (int i = 0; i < n; i++)
	{
		if (n > 1)
		{
			char	   *prefix = psprintf("PublishBatchRequestEntries.member.%d.", i + 1);

			append_param(&body, prefix, "Id", msgs[i]->id);
			sns_append_entry(&body, t, msgs[i], prefix);
			pfree(prefix);
		}
		else
			sns_append_entry(&body, t, msgs[i], "");
	}
	req->capture_size = (n > 1) ? SNS_CAPTURE_BATCH : SNS_CAPTURE_SINGLE;
	req->capture = palloc0(req->capture_size);
	AwsRequest(t, "Content-Type: application/x-www-form-urlencoded", NULL,
			   &body, req);
	return n;
}

/*
 * The text of the first <tag>...</tag> between start and end, with the
 * five predefined XML entities decoded; NULL if absent.
 */
static char *
xml_element(const char *start, const char *end, const char *tag)
{
	char	   *open = psprintf("<%s>", tag);
	char	   *close = psprintf("</%s>", tag);
	const char *p;
	const char *q;
	StringInfoData out;

	p = strstr(start, open);
	if (p == NULL || p >= end)
		return NULL;
	p += strlen(open);
	q = strstr(p, close);
	if (q == NULL || q > end)
		return NULL;
	initStringInfo(&out);
	while (p < q)
	{
		if (*p == '&')
		{
			static const struct
			{
				const char *entity;
				char		c;
			}			entities[] = {
				{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'},
				{"&quot;", '"'}, {"&apos;", '\''}
			};
			bool		done = false;

			for (int i = 0; i < lengthof(entities); i++)
			{
				size_t		len = strlen(entities[i].entity);

				if (q - p >= len && strncmp(p, entities[i].entity, len) == 0)
				{
					appendStringInfoChar(&out, entities[i].c);
					p += len;
					done = true;
					break;
				}
			}
			if (done)
				continue;
		}
		appendStringInfoChar(&out, *p++);
	}
	return out.data;
}

/* Find the member of a result list whose <Id> is id; NULL if none. */
static const char *
xml_find_member(const char *list, const char *list_end, const char *id,
				const char **member_end)
{
	const char *p = list;

	while ((p = strstr(p, "<member>")) != NULL && p < list_end)
	{
		const char *end = strstr(p, "</member>");
		char	   *mid;

		if (end == NULL || end > list_end)
			return NULL;
		mid = xml_element(p, end, "Id");
		if (mid && strcmp(mid, id) == 0)
		{
			*member_end = end;
			return p;
		}
		p = end;
	}
	return NULL;
}

/* One PublishBatch entry's result; a message missing from both lists is left undecided. */
static void
sns_classify_entry(const char *ok_list, const char *ok_end,
				   const char *failed_list, const char *failed_end,
				   const OutboxMessage *msg, DeliveryResult *result)
{
	const char *member;
	const char *member_end;

	if (ok_end && xml_find_member(ok_list, ok_end, msg->id, &member_end))
		DeliveryResultSet(result, OUTCOME_ACK, NULL);
	else if (failed_end &&
			 (member = xml_find_member(failed_list, failed_end, msg->id,
									   &member_end)) != NULL)
	{
		char	   *sender = xml_element(member, member_end, "SenderFault");

		AwsClassifyEntry("PublishBatch", xml_element(member, member_end, "Code"),
						 xml_element(member, member_end, "Message"),
						 sender && strcmp(sender, "true") == 0, result);
	}
}

static bool
sns_classify(void *target, const HttpRequest *req, OutboxMessage *const *msgs,
			 int n, DeliveryResult *results)
{
	const char *xml = req->capture ? req->capture : req->response;
	const char *xml_end = xml + strlen(xml);
	const char *ok_list;
	const char *ok_end;
	const char *failed_list;
	const char *failed_end;

	if (req->status < 200 || req->status >= 300)
		return AwsClassifyError(req, xml_element(xml, xml_end, "Code"),
								xml_element(xml, xml_end, "Message"),
								n, results);
	if (n == 1)
	{
		if (strstr(xml, "<PublishResult>") == NULL && strstr(xml, "<MessageId>") == NULL)
			return AwsClassifyError(req, NULL, "the response is not a PublishResult",
									n, results);
		DeliveryResultSet(&results[0], OUTCOME_ACK, NULL);
		return false;
	}

	/* PublishBatch: every entry on its own */
	ok_list = strstr(xml, "<Successful>");
	ok_end = ok_list ? strstr(ok_list, "</Successful>") : NULL;
	failed_list = strstr(xml, "<Failed>");
	failed_end = failed_list ? strstr(failed_list, "</Failed>") : NULL;
	if (ok_list == NULL && failed_list == NULL)
		return AwsClassifyError(req, NULL,
								req->capture_len + 1 >= req->capture_size ?
								"the PublishBatch response was too long to read" :
								"the response is not a PublishBatchResult",
								n, results);
	for (int i = 0; i < n; i++)
		sns_classify_entry(ok_list, ok_end, failed_list, failed_end, msgs[i],
						   &results[i]);
	/* entries missing from the answer are retried by the caller */
	return false;
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption sns_options[] =
{
	{"topic_arn", DEST_OPTION_STRING, true},
	{"region", DEST_OPTION_STRING, false},
	{"fifo", DEST_OPTION_BOOLEAN, false},
	{"message_group_key", DEST_OPTION_STRING, false},
	{"batch_size", DEST_OPTION_NUMBER, false},
	{"body", DEST_OPTION_STRING, false},	/* payload | cloudevents */
	{"source", DEST_OPTION_STRING, false},	/* the CloudEvent's source */
	{NULL}
};

static const char *const sns_group_keys[] = {"aggregate_id", "type", "destination", NULL};
static const char *const sns_bodies[] = {"payload", "cloudevents", NULL};

static void
sns_validate(const DestinationDefinition *def)
{
	const char *arn = DestinationOptionText(def, "topic_arn");
	const char *region = DestinationOptionText(def, "region");

	DestinationRequireCredentials(def, DEST_CREDENTIALS_AWS);
	DestinationCheckNoQuery(def, "Use the service endpoint, e.g. https://sns.eu-west-1.amazonaws.com/.");
	if (!DestinationMatches(arn, "^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]+(\\.fifo)?$",
							false))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option topic_arn of destination \"%s\" is not an SNS topic ARN",
						def->name),
				 errhint("A topic ARN looks like arn:aws:sns:REGION:ACCOUNT:NAME (NAME ending in .fifo for a FIFO topic).")));
	if (region == NULL)
		region = AwsRegion(NULL, def->url, arn);
	if (region == NULL || !DestinationMatches(region, "^[a-z0-9-]{1,64}$", false))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("destination \"%s\" has no AWS region", def->name),
				 errhint("Set the option region, e.g. {\"region\": \"eu-west-1\"}; without it the region is taken from the topic ARN.")));
	DestinationCheckChoice(def, "message_group_key", sns_group_keys);
	DestinationCheckInteger(def, "batch_size", 1, AWS_MAX_BATCH,
							"PublishBatch takes at most 10 entries; 1 sends every message on its own.");
	DestinationCheckChoice(def, "body", sns_bodies);
	CloudEventCheckSource(def);
}

const DestinationRoutine sns_routine =
{
	.kind = "sns",
	.max_batch = AWS_MAX_BATCH,
	.options = sns_options,
	.validate = sns_validate,
	.load = sns_load,
	.reject = AwsReject,
	.build_request = sns_build_request,
	.classify = sns_classify,
};
