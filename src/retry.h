/*-------------------------------------------------------------------------
 *
 * retry.h
 *		  Retry policy: outcomes, backoff and HTTP status classes (retry.c).
 *
 * Transport-neutral: a transport (http.c, or a native broker client)
 * reports a failure to get an answer as a TransportFailure, never in its
 * library's own codes.
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

#include "outbox_pg.h"

/* retry.c */
typedef enum DeliveryOutcome
{
	OUTCOME_ACK,				/* acknowledged: mark published */
	OUTCOME_RETRY,				/* transient failure: try again later */
	OUTCOME_DEAD				/* permanent failure or out of attempts */
} DeliveryOutcome;

/* Why a request got no answer (set by the transport). */
typedef enum TransportFailure
{
	TRANSPORT_OK,				/* an answer came, whatever its status */
	TRANSPORT_REFUSED,			/* not sent: host not in outbox.allowed_hosts */
	TRANSPORT_FAILED			/* connection, TLS, timeout, oversized answer */
} TransportFailure;

extern int64 OutboxBackoffDelayMs(int attempt, int base_ms, int cap_ms,
								  double jitter);
extern int64 OutboxEqualJitterMs(int64 delay_ms, double jitter);
extern DeliveryOutcome OutboxClassifyResponse(int status,
											  TransportFailure failure);
extern bool OutboxIsDestinationFailure(int status, TransportFailure failure);

#endif							/* OUTBOX_RETRY_H */
