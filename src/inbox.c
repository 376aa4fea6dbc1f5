/*-------------------------------------------------------------------------
 *
 * inbox.c
 *		  inbox.claim(): idempotent consumption in the consumer's transaction.
 *
 * A claim is one row in inbox.claims keyed by (consumer, message_id),
 * inserted with ON CONFLICT DO NOTHING in the caller's transaction:
 *
 *	- the first claim of an id inserts the row and returns true;
 *	- a later claim finds the committed row and returns false;
 *	- a concurrent claim waits on the first transaction's speculative
 *	  insertion and then returns false if it committed, or inserts and
 *	  returns true if it rolled back.  Nobody sees a unique violation;
 *	- a rollback of the claiming transaction removes the claim together
 *	  with the business write it protected.
 *
 * ON CONFLICT needs the executor's speculative-insertion protocol, so this
 * goes through SPI with one kept plan per backend.  The statement text is
 * schema-qualified and contains no operator or function call (the
 * timestamps are computed here), so the search_path of a caller cannot
 * redirect anything even though the function is SECURITY DEFINER.
 *
 * Retention: a claim must outlive every possible redelivery of its
 * message, or a late duplicate is processed twice.  Retentions shorter
 * than outbox.redelivery_window are refused.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/inbox.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "outbox_pg.h"

PG_FUNCTION_INFO_V1(inbox_claim);

static SPIPlanPtr claim_plan = NULL;

static const char *claim_sql =
"INSERT INTO inbox.claims (consumer, message_id, claimed_at, expires_at) "
"VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/* Seconds spanned by an interval, months counted as 30 days. */
static double
interval_seconds(const Interval *span)
{
	return (double) span->time / USECS_PER_SEC +
		(double) span->day * SECS_PER_DAY +
		(double) span->month * DAYS_PER_MONTH * SECS_PER_DAY;
}

static char *
seconds_to_text(int64 secs)
{
	if (secs % SECS_PER_DAY == 0)
		return psprintf(INT64_FORMAT " days", secs / SECS_PER_DAY);
	if (secs % SECS_PER_HOUR == 0)
		return psprintf(INT64_FORMAT " hours", secs / SECS_PER_HOUR);
	return psprintf(INT64_FORMAT " seconds", secs);
}

/*
 * inbox.claim(message_id text, consumer text, ttl interval) returns boolean
 */
Datum
inbox_claim(PG_FUNCTION_ARGS)
{
	char	   *message_id;
	char	   *consumer;
	TimestampTz now;
	TimestampTz expires_at;
	double		ttl_secs;
	Datum		values[4];
	int			ret;
	bool		claimed;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message id must not be null")));
	message_id = text_to_cstring(PG_GETARG_TEXT_PP(0));
	OutboxCheckIdentifier("message id", message_id, OUTBOX_MAX_ID_LEN);

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer must not be null"),
				 errhint("Omit the argument to use the consumer \"default\".")));
	consumer = text_to_cstring(PG_GETARG_TEXT_PP(1));
	OutboxCheckIdentifier("consumer", consumer, OUTBOX_MAX_NAME_LEN);

	now = GetCurrentTransactionStartTimestamp();
	if (PG_ARGISNULL(2))
	{
		ttl_secs = outbox_claim_retention;
		expires_at = now + (int64) outbox_claim_retention * USECS_PER_SEC;
	}
	else
	{
		Interval   *ttl = PG_GETARG_INTERVAL_P(2);

		ttl_secs = interval_seconds(ttl);
		if (ttl_secs < OUTBOX_MIN_CLAIM_TTL || ttl_secs > OUTBOX_MAX_CLAIM_TTL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("claim ttl must be between 1 second and 10 years")));
		expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															 TimestampTzGetDatum(now),
															 PointerGetDatum(ttl)));
	}

	if (ttl_secs < outbox_redelivery_window)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("claim retention is shorter than outbox.redelivery_window"),
				 errdetail("The claim would be kept for %s, but a message may be redelivered up to %s after its first delivery.",
						   seconds_to_text((int64) ttl_secs),
						   seconds_to_text(outbox_redelivery_window)),
				 errhint("Use a longer ttl, or lower outbox.redelivery_window if no broker or relay can redeliver that late.")));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (claim_plan == NULL)
	{
		Oid			argtypes[4] = {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
		SPIPlanPtr	plan = SPI_prepare(claim_sql, 4, argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		claim_plan = plan;
	}

	values[0] = PG_GETARG_DATUM(1);
	values[1] = PG_GETARG_DATUM(0);
	values[2] = TimestampTzGetDatum(now);
	values[3] = TimestampTzGetDatum(expires_at);

	ret = SPI_execute_plan(claim_plan, values, NULL, false, 0);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "unexpected result of claim insert: %s",
			 SPI_result_code_string(ret));
	claimed = (SPI_processed == 1);

	SPI_finish();

	PG_RETURN_BOOL(claimed);
}
