/*-------------------------------------------------------------------------
 *
 * outbox_pg.h
 *		  Shared declarations of the outbox_pg extension.
 *
 * Every function that crosses a file boundary is declared here, grouped
 * by the file that defines it.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/outbox_pg.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PG_H
#define OUTBOX_PG_H

#include "utils/relcache.h"
#include "utils/timestamp.h"

/* Names of the extension's schemas and tables. */
#define OUTBOX_SCHEMA			"outbox"
#define INBOX_SCHEMA			"inbox"
#define OUTBOX_EVENTS_TABLE		"events"
#define OUTBOX_DESTINATIONS_TABLE "destinations"
#define OUTBOX_ROUTES_TABLE		"routes"

/* Limits on identifiers carried in events and claims. */
#define OUTBOX_MAX_TYPE_LEN		255
#define OUTBOX_MAX_ID_LEN		1024
#define OUTBOX_MAX_NAME_LEN		63

/* Claim retention bounds, in seconds. */
#define OUTBOX_MIN_CLAIM_TTL	1
#define OUTBOX_MAX_CLAIM_TTL	(10 * SECS_PER_YEAR)

/*
 * Columns of outbox.events, in table order.  The install and upgrade
 * scripts keep this order; config.c verifies it when it loads.
 */
typedef enum OutboxEventColumn
{
	EV_ID = 1,
	EV_TYPE,
	EV_AGGREGATE_TYPE,
	EV_AGGREGATE_ID,
	EV_PAYLOAD,
	EV_HEADERS,
	EV_TRACEPARENT,
	EV_DESTINATION,
	EV_STATUS,
	EV_ATTEMPTS,
	EV_NEXT_ATTEMPT_AT,
	EV_CREATED_AT,
	EV_PUBLISHED_AT,
	EV_LAST_STATUS,
	EV_LAST_ERROR,
	EV_NATTS = EV_LAST_ERROR
} OutboxEventColumn;

extern const char *const OutboxEventColumnNames[EV_NATTS + 1];

/* guc.c */
extern int	outbox_max_payload_size;
extern int	outbox_claim_retention;
extern int	outbox_redelivery_window;
extern char *outbox_traceparent;

extern void OutboxDefineGucs(void);

/* config.c */
typedef struct OutboxConfig
{
	Oid			events_relid;
	Oid			destinations_relid;
	Oid			routes_relid;
} OutboxConfig;

extern const OutboxConfig *OutboxGetConfig(void);
extern bool OutboxDestinationExists(const char *name);
extern const char *OutboxRouteEventType(const char *type);
extern bool OutboxPatternMatches(const char *pattern, const char *text);
extern void OutboxConfigInit(void);

/* validate.c */
extern bool OutboxTraceparentIsValid(const char *value);
extern void OutboxCheckIdentifier(const char *what, const char *value,
								  int maxlen);
extern void OutboxCheckHeaders(Datum headers);

/* emit.c */
extern void OutboxGenerateUuidV7(unsigned char *out);

#endif							/* OUTBOX_PG_H */
