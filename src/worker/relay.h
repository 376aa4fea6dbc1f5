/*-------------------------------------------------------------------------
 *
 * relay.h
 *		  Inside the relay process: what relay.c (the process and its loop)
 *		  and delivery.c (the events) share, kept in relay_state.c.
 *		  Nothing outside src/worker/ includes this.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/worker/relay.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include "nodes/pg_list.h"
#include "utils/timestamp.h"

#include "shmem.h"
#include "destination/http.h"

/* relay_state.c */
extern RelaySlot *relay_slot;
extern HttpClient *relay_http;
extern MemoryContext relay_cycle_context;	/* reset every loop */
extern char *relay_database_name;
extern TimestampTz relay_lease_again_at;
extern bool relay_outdated;
extern bool relay_locked_out;	/* the extension needs an UPDATE */

/* this relay's slot number, for its cells in deststats.c */
#define RELAY_SLOT_INDEX ((int) (relay_slot - outbox_shared->slots))

/* a relay transaction: a worker step (step.c) with the relay's checks */
extern bool relay_begin(bool *missing);
extern void relay_commit(void);

/* delivery.c */
typedef struct RelayEvent RelayEvent;

extern MemoryContext relay_events_context;

extern void DeliveryInit(void);
extern int	DeliveryInFlight(void);
extern void DeliveryCheckConfig(void);
extern void DeliveryForgetConfig(void);
extern List *DeliveryLoadDestinations(void);
extern void DeliveryLease(List *dests, bool *drained, bool *claimed);
extern void DeliveryLeaseRead(void);
extern void DeliveryLeaseCommitted(void);
extern void DeliveryLeaseStart(List *dests, List **leased);
extern void DeliveryStart(RelayEvent *ev);
extern bool DeliveryWouldSend(RelayEvent *ev);
extern bool DeliveryStartOverdue(RelayEvent *ev, TimestampTz now);
extern List *DeliveryCompleted(List *pending, HttpRequest *req);
extern bool DeliveryStartable(void);
extern void DeliveryStartAnswered(List **leased);
extern bool DeliveryRecord(List *done);
extern void DeliveryFreeEvent(RelayEvent *ev);
extern void DeliveryFreeEvents(List *events);
extern void DeliveryDropWaiting(void);
extern void DeliveryWatchNative(void);
extern List *DeliveryPollNative(List *pending);
extern int	DeliveryNativeOutstanding(void);
extern TimestampTz DeliveryStop(void);

#endif							/* OUTBOX_RELAY_H */
