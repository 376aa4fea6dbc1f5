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
extern void OutboxDestStatsDetach(DestStats *ds, int slot);
extern void OutboxDestStatsRelayExit(int slot);

/*
 * A relay's request to lease events of a destination (OutboxDestAdmit):
 * its slots of the destination's concurrency and the circuit's permit.
 */
typedef struct DestAdmission
{
	/* asked */
	int			limit;			/* max_concurrency */
	int			alive;			/* its events alive (leased, not answered) */
	int			in_use;			/* ... of which started and unanswered */
	int			want;			/* more it would lease now; 0: settle only */
	int			chunk;			/* lease no fewer (while events are alive) */
	bool		circuit;		/* ask the circuit breaker too */
	TimestampTz now;
	TimestampTz probe_expires_at;	/* a probe's end, should it be one */
	/* answered */
	int			granted;		/* events it may lease (0 .. want) */
	int			held;			/* slots it holds now */
	bool		probe;			/* the one event to lease is the probe */
	TimestampTz recheck_at;		/* circuit open or probe out: ask then */
	uint64		wake;			/* relay slots to wake (slots given back) */
} DestAdmission;

typedef enum CircuitTransition
{
	CIRCUIT_UNCHANGED,
	CIRCUIT_OPENED,
	CIRCUIT_CLOSED
} CircuitTransition;

extern void OutboxDestAdmit(DestStats *ds, int slot, DestAdmission *adm);
extern void OutboxCircuitReleaseProbe(DestStats *ds);
extern bool OutboxCircuitNote(DestStats *ds, bool failed,
							  TimestampTz started_at, int threshold,
							  CircuitTransition *transition, bool *log_it,
							  int *rounds);
extern CircuitTransition OutboxCircuitHold(DestStats *ds, TimestampTz until,
										   bool *log_it);
extern void OutboxCircuitConfigure(DestStats *ds, bool disabled, bool resumed);

#endif							/* OUTBOX_DESTSTATS_H */
