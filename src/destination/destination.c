/*-------------------------------------------------------------------------
 *
 * destination.c
 *		  The registry of destination kinds.
 *
 * Adding a kind is one new file ending in its DestinationRoutine and one
 * line in kindlist.h.
 *
 * Also here, because delivery and the tests share them: what an answer
 * means for the messages a request carried (DestinationClassify), and
 * outbox._classify(), which runs a kind's classify on a synthetic answer
 * so pg_regress can test every kind's response parser.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/destination.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "outbox_pg.h"
#include "destination/destination.h"

PG_FUNCTION_INFO_V1(outbox_classify);

static const char *destination_kind_list(void);

static const DestinationRoutine *const routines[] =
{
#define DESTINATION_KIND(name) &name##_routine,
#include "destination/kindlist.h"
#undef DESTINATION_KIND
};

/*
 * When a kind whose client was lost for good wants the destinations loaded
 * again (0: not wanted); delivery.c clears it when it loads them.
 */
TimestampTz destination_reload_at = 0;

/* A client can never deliver again: load the destinations again after_ms. */
void
DestinationReloadWanted(int after_ms)
{
	TimestampTz at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), after_ms);

	if (destination_reload_at == 0 || at < destination_reload_at)
		destination_reload_at = at;
}

/* "webhook, sns, sqs, rabbitmq": for hints. */
static const char *
destination_kind_list(void)
{
	StringInfoData buf;

	initStringInfo(&buf);
	for (int i = 0; i < lengthof(routines); i++)
		appendStringInfo(&buf, "%s%s", i > 0 ? ", " : "", routines[i]->kind);
	return buf.data;
}

/*
 * The routine of a kind; an unknown kind is the caller's mistake (a
 * destination row or an argument), reported with the kinds there are.
 */
const DestinationRoutine *
GetDestinationRoutine(const char *kind)
{
	for (int i = 0; i < lengthof(routines); i++)
	{
		if (strcmp(routines[i]->kind, kind) == 0)
		{
			const DestinationRoutine *r = routines[i];

			/* either HTTP (build and classify) or a native client */
			Assert(r->max_batch >= 1 && r->load != NULL);
			Assert((r->build_request != NULL && r->classify != NULL) !=
				   (r->start != NULL && r->poll != NULL && r->wait_events != NULL));
			return r;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown destination kind \"%s\"", kind),
			 errhint("The kinds are: %s.", destination_kind_list())));
	return NULL;				/* keep compiler quiet */
}

/*
 * The result of every message a request carried, from its answer or the
 * lack of one; returns whether the destination itself failed (for its
 * circuit breaker).  No answer retries every message with the transport's
 * reason; an answer goes to the kind, and a message the kind left
 * undecided is retried rather than guessed at.
 */
bool
DestinationClassify(const DestinationRoutine *routine, void *target,
					const HttpRequest *req, OutboxMessage *const *msgs, int n,
					DeliveryResult *results)
{
	bool		failed;

	if (req->failure != TRANSPORT_OK)
	{
		for (int i = 0; i < n; i++)
			DeliveryResultSet(&results[i], OUTCOME_RETRY,
							  req->error[0] ? req->error : "request failed");
		return true;
	}
	failed = routine->classify(target, req, msgs, n, results);
	for (int i = 0; i < n; i++)
		DeliveryResultSet(&results[i], OUTCOME_RETRY,
						  "the response gave no result for this message");
	return failed;
}

/*
 * The answer outbox._classify() hands to classify: status and body as if
 * a request for the given messages had come back with them (status 0: no
 * answer at all).
 */
static HttpRequest *
classify_answer(int status, const char *body)
{
	HttpRequest *req = palloc0(sizeof(HttpRequest));
	size_t		len = strlen(body);

	req->status = status;
	req->failure = status == 0 ? TRANSPORT_FAILED : TRANSPORT_OK;
	if (status == 0)
		strlcpy(req->error, "connection refused", sizeof(req->error));
	req->response_total = len;
	req->response_len = Min(len, sizeof(req->response) - 1);
	memcpy(req->response, body, req->response_len);
	req->response[req->response_len] = '\0';
	/* a byte to spare: the body was read whole */
	req->capture_size = len + 2;
	req->capture = palloc0(req->capture_size);
	memcpy(req->capture, body, len);
	req->capture_len = len;
	return req;
}

/*
 * outbox._classify(kind text, status int, body text, ids text[])
 * returns setof (message_id text, outcome text, error text,
 *                destination_failed bool)
 *
 * Runs the kind's classify, with the destination's defaults, on an answer
 * with this status and body for messages with these ids (default: one
 * message "m1"); a batch kind sees a batch call when there are several.
 * The errors are shown as the kind wrote them, before the relay bounds
 * and redacts them.  Internal: for tests.
 */
Datum
outbox_classify(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	const DestinationRoutine *routine;
	DestinationDefinition def;
	DestinationConfig config;
	void	   *target;
	HttpRequest *req;
	Datum	   *ids = NULL;
	int			n = 1;
	OutboxMessage **msgs;
	DeliveryResult *results;
	bool		failed;
	static const char *const outcomes[] = {"ack", "retry", "dead"};

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("kind, status and body must not be null")));
	InitMaterializedSRF(fcinfo, 0);
	routine = GetDestinationRoutine(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	if (routine->classify == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("destination kind \"%s\" does not classify HTTP answers",
						routine->kind)));
	if (!PG_ARGISNULL(3))
		deconstruct_array(PG_GETARG_ARRAYTYPE_P(3), TEXTOID, -1, false,
						  TYPALIGN_INT, &ids, NULL, &n);
	if (n < 1 || n > routine->max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a request of kind \"%s\" carries 1 to %d messages",
						routine->kind, routine->max_batch)));

	memset(&def, 0, sizeof(def));
	def.name = "classify";
	def.kind = routine->kind;
	def.url = "http://127.0.0.1/";
	def.options = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
													 CStringGetDatum("{}")));
	memset(&config, 0, sizeof(config));
	config.def = &def;
	config.database = "classify";
	target = routine->load(&config);

	msgs = palloc(n * sizeof(OutboxMessage *));
	results = palloc0(n * sizeof(DeliveryResult));
	for (int i = 0; i < n; i++)
	{
		msgs[i] = palloc0(sizeof(OutboxMessage));
		msgs[i]->id = ids ? TextDatumGetCString(ids[i]) : "m1";
		msgs[i]->type = "classify.test";
		msgs[i]->payload = "{}";
		msgs[i]->time = "2026-01-01T00:00:00.000000Z";
		msgs[i]->destination = def.name;
	}
	req = classify_answer(PG_GETARG_INT32(1),
						  text_to_cstring(PG_GETARG_TEXT_PP(2)));
	failed = DestinationClassify(routine, target, req, msgs, n, results);

	for (int i = 0; i < n; i++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		values[0] = CStringGetTextDatum(msgs[i]->id);
		values[1] = CStringGetTextDatum(outcomes[results[i].outcome]);
		if (results[i].error != NULL)
			values[2] = CStringGetTextDatum(results[i].error);
		else
			nulls[2] = true;
		values[3] = BoolGetDatum(failed);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
