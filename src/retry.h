/*-------------------------------------------------------------------------
 *
 * retry.h
 *		  Retry policy: outcomes, backoff and HTTP status classes (retry.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/retry.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RETRY_H
#define OUTBOX_RETRY_H

#include <curl/curl.h>

#include "outbox_pg.h"

/* retry.c */
typedef enum DeliveryOutcome
{
	OUTCOME_ACK,				/* acknowledged: mark published */
	OUTCOME_RETRY,				/* transient failure: try again later */
	OUTCOME_DEAD				/* permanent failure or out of attempts */
} DeliveryOutcome;

extern int64 OutboxBackoffDelayMs(int attempt, int base_ms, int cap_ms,
								  double jitter);
extern DeliveryOutcome OutboxClassifyResponse(int status, CURLcode code,
											  bool refused);
extern bool OutboxIsDestinationFailure(int status, CURLcode code);

#endif							/* OUTBOX_RETRY_H */
