/*-------------------------------------------------------------------------
 *
 * cloudevents.c
 *		  The CloudEvents 1.0 JSON event format, shared by the kinds that
 *		  send it: webhooks in structured mode, and SNS and SQS with
 *		  options.body = 'cloudevents'.
 *
 * One event is one JSON object: specversion "1.0", id (the message id),
 * source (the destination's options.source, by default
 * "urn:outbox_pg:DATABASE"), type, subject (the aggregate id, when there
 * is one), time (RFC 3339, UTC, when the event was emitted), traceparent
 * (the trace context captured at emit time, when there is one: the
 * distributed-tracing extension), datacontenttype "application/json" and
 * data, the payload as JSON (not a string holding JSON).  Attribute values
 * are JSON strings in UTF-8: nothing is percent-encoded, so every consumer
 * reads the exact text.
 *
 * Like aws.c this is a library for the kinds; it knows nothing of
 * delivery or the registry.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/cloudevents.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/json.h"

#include "outbox_pg.h"
#include "destination/destination.h"

/*
 * The ce-source of a destination: its option source, or
 * urn:outbox_pg:DATABASE.
 */
const char *
CloudEventSource(const DestinationConfig *config)
{
	const char *source = DestinationOptionText(config->def, "source");

	return source ? source : psprintf("urn:outbox_pg:%s", config->database);
}

/* Append msg as one structured-mode CloudEvent (a JSON object). */
void
CloudEventAppendJson(StringInfo buf, const OutboxMessage *msg,
					 const char *source)
{
	appendStringInfoString(buf, "{\"specversion\":\"1.0\",\"id\":");
	escape_json(buf, msg->id);
	appendStringInfoString(buf, ",\"source\":");
	escape_json(buf, source);
	appendStringInfoString(buf, ",\"type\":");
	escape_json(buf, msg->type);
	if (msg->aggregate_id)
	{
		appendStringInfoString(buf, ",\"subject\":");
		escape_json(buf, msg->aggregate_id);
	}
	if (msg->time)				/* NULL: an infinite created_at */
	{
		appendStringInfoString(buf, ",\"time\":");
		escape_json(buf, msg->time);
	}
	if (msg->traceparent)
	{
		appendStringInfoString(buf, ",\"traceparent\":");
		escape_json(buf, msg->traceparent);
	}
	appendStringInfoString(buf, ",\"datacontenttype\":\"application/json\",\"data\":");
	appendStringInfoString(buf, msg->payload);
	appendStringInfoChar(buf, '}');
}

/*
 * The option source, when set, is not empty (a CloudEvent's source is a
 * non-empty URI-reference).
 */
void
CloudEventCheckSource(const DestinationDefinition *def)
{
	const char *source = DestinationOptionText(def, "source");

	if (source != NULL && source[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option source of destination \"%s\" must not be empty",
						def->name),
				 errhint("Remove the option to send the default, urn:outbox_pg:DATABASE.")));
}
