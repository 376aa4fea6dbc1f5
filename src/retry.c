/*-------------------------------------------------------------------------
 *
 * retry.c
 *		  What a delivery attempt's result means, and when to try again.
 *
 * Pure functions: no clock, no randomness of their own (the caller passes
 * the jitter), so the schedule is testable from SQL without sleeping
 * (outbox.backoff_delay()).
 *
 * Classification:
 *	- 2xx is an acknowledgement;
 *	- network errors, timeouts, 408, 429 and 5xx are transient: retry;
 *	- other 4xx and 3xx (redirects are never followed) are permanent: the
 *	  message goes to the dead letters at once, with its status kept;
 *	- a request refused before sending (host not allowed) is retried, so
 *	  fixing outbox.allowed_hosts recovers it.
 *
 * Backoff: exponential from base, capped, with "equal jitter": half the
 * delay is fixed and half random, so retries of a burst spread out but
 * never come back early.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/retry.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "outbox_pg.h"
#include "retry.h"

PG_FUNCTION_INFO_V1(outbox_backoff_delay);

int64
OutboxBackoffDelayMs(int attempt, int base_ms, int cap_ms, double jitter)
{
	int64		delay = base_ms;

	if (attempt < 1)
		attempt = 1;
	for (int i = 1; i < attempt && delay < cap_ms; i++)
		delay *= 2;
	if (delay > cap_ms)
		delay = cap_ms;
	return OutboxEqualJitterMs(delay, jitter);
}

/*
 * Equal jitter: half of delay_ms, plus jitter (0..1) times the other half.
 */
int64
OutboxEqualJitterMs(int64 delay_ms, double jitter)
{
	if (jitter < 0.0)
		jitter = 0.0;
	if (jitter > 1.0)
		jitter = 1.0;
	return delay_ms / 2 + (int64) ((delay_ms - delay_ms / 2) * jitter);
}

DeliveryOutcome
OutboxClassifyResponse(int status, TransportFailure failure)
{
	if (failure != TRANSPORT_OK)
		return OUTCOME_RETRY;
	if (status >= 200 && status < 300)
		return OUTCOME_ACK;
	if (status == 408 || status == 429 || status >= 500)
		return OUTCOME_RETRY;
	if (status >= 300 && status < 500)
		return OUTCOME_DEAD;
	return OUTCOME_RETRY;
}

/*
 * Does this result count against the destination's health (circuit
 * breaker)?  A 4xx is the message's fault, not the destination's.
 */
bool
OutboxIsDestinationFailure(int status, TransportFailure failure)
{
	if (failure != TRANSPORT_OK)
		return true;
	return status == 429 || status >= 500;
}

/*
 * outbox.backoff_delay(attempt int, base_ms int, cap_ms int, jitter float8)
 * returns bigint (milliseconds)
 */
Datum
outbox_backoff_delay(PG_FUNCTION_ARGS)
{
	int32		attempt = PG_GETARG_INT32(0);
	int32		base_ms = PG_GETARG_INT32(1);
	int32		cap_ms = PG_GETARG_INT32(2);
	float8		jitter = PG_GETARG_FLOAT8(3);

	if (base_ms <= 0 || cap_ms < base_ms)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("backoff base must be positive and not above the cap")));
	if (jitter < 0.0 || jitter > 1.0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("jitter must be between 0 and 1")));
	PG_RETURN_INT64(OutboxBackoffDelayMs(attempt, base_ms, cap_ms, jitter));
}
