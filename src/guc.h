/*-------------------------------------------------------------------------
 *
 * guc.h
 *		  Settings of outbox_pg (guc.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/guc.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_GUC_H
#define OUTBOX_GUC_H

#include "outbox_pg.h"

struct EgressList;

/* guc.c */
extern int	outbox_max_payload_size;
extern int	outbox_claim_retention;
extern int	outbox_redelivery_window;
extern char *outbox_traceparent;
extern char *outbox_databases;
extern int	outbox_workers_per_database;
extern int	outbox_max_destinations;
extern int	outbox_poll_interval;
extern int	outbox_batch_size;
extern int	outbox_max_response_size;
extern int	outbox_max_connections_per_worker;
extern struct EgressList *outbox_allowed_hosts_list;	/* parsed form */
extern char *outbox_ca_file;
extern int	outbox_discovery_interval;
extern int	outbox_lease_margin;
extern int	outbox_circuit_max_pause;
extern int	outbox_retention;
extern int	outbox_retention_batch;
extern int	outbox_pending_age_warning;
extern int	outbox_inbox_retention;
extern int	outbox_inbox_handler_timeout;

extern void OutboxDefineGucs(void);

#endif							/* OUTBOX_GUC_H */
