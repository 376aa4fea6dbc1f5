/*-------------------------------------------------------------------------
 *
 * deststats.h
 *		  Per-destination statistics and circuit breaker in shared memory.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/deststats.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_DESTSTATS_H
#define OUTBOX_DESTSTATS_H

#include "retry.h"

/* deststats.c */
typedef struct DestStats DestStats;

extern void OutboxDestStatsShmemRequest(void);
extern void OutboxDestStatsShmemStartup(void);
extern DestStats *OutboxDestStatsAttach(int slot, const char *name);
extern void OutboxDestStatsSetInFlight(DestStats *ds, int slot, int n);
extern void OutboxDestStatsRecordResult(DestStats *ds, TimestampTz now,
										int status, DeliveryOutcome outcome,
										int64 duration_us);
extern void OutboxDestStatsRelayExit(int slot);

typedef enum CircuitPermit
{
	CIRCUIT_PASS,				/* closed: lease as usual */
	CIRCUIT_PROBE,				/* half-open: the caller sends the one probe */
	CIRCUIT_WAIT				/* open, or another relay's probe is out */
} CircuitPermit;

typedef enum CircuitTransition
{
	CIRCUIT_UNCHANGED,
	CIRCUIT_OPENED,
	CIRCUIT_CLOSED
} CircuitTransition;

extern CircuitPermit OutboxCircuitPermit(DestStats *ds, TimestampTz now,
										 TimestampTz probe_expires_at,
										 TimestampTz *recheck_at);
extern void OutboxCircuitReleaseProbe(DestStats *ds);
extern bool OutboxCircuitNote(DestStats *ds, bool failed,
							  TimestampTz started_at, int threshold,
							  CircuitTransition *transition, bool *log_it,
							  int *rounds);
extern void OutboxCircuitConfigure(DestStats *ds, bool disabled, bool resumed);

#endif							/* OUTBOX_DESTSTATS_H */
