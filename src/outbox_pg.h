/*-------------------------------------------------------------------------
 *
 * outbox_pg.h
 *		  Shared declarations of the outbox_pg extension.
 *
 * Names, column numbers and limits every subsystem shares.  Nothing here
 * needs libcurl or SPI: each subsystem has its own header (guc.h,
 * shmem.h, retry.h, deststats.h, peertext.h, api/api.h, worker/worker.h,
 * destination/destination.h, destination/http.h).
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

#include "utils/timestamp.h"

#include "compat.h"

#define OUTBOX_VERSION			"0.5.2"

/* Names of the extension's schemas and tables. */
#define OUTBOX_SCHEMA			"outbox"
#define INBOX_SCHEMA			"inbox"
#define OUTBOX_EVENTS_TABLE		"events"
#define OUTBOX_DESTINATIONS_TABLE "destinations"
#define OUTBOX_ROUTES_TABLE		"routes"
#define INBOX_CLAIMS_TABLE		"claims"
#define INBOX_MESSAGES_TABLE	"messages"
#define INBOX_MESSAGES_SEQ		"messages_seq"
#define INBOX_HANDLERS_TABLE	"handlers"
#define OUTBOX_CREDENTIALS_TABLE "credentials"
#define OUTBOX_ROTATION_TABLE	"rotation"
#define OUTBOX_LOG_SLOT_FORMAT	"log_%d"
#define OUTBOX_LOG_SLOTS		3

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
	EV_LEASED_UNTIL,			/* 0.2.0 */
	EV_ORDERING_KEY,			/* 0.2.0 */
	EV_NATTS = EV_ORDERING_KEY
} OutboxEventColumn;


/*
 * Columns of the insert-only store's log slots outbox.log_0..2 (issue #21,
 * src/worker/README.store), in table order; routing.c checks them.
 */
typedef enum OutboxLogColumn
{
	LOG_ID = 1,
	LOG_XID,
	LOG_TYPE,
	LOG_AGGREGATE_TYPE,
	LOG_AGGREGATE_ID,
	LOG_PAYLOAD,
	LOG_HEADERS,
	LOG_TRACEPARENT,
	LOG_DESTINATION,
	LOG_ORDERING_KEY,
	LOG_NOT_BEFORE,
	LOG_CREATED_AT,
	LOG_NATTS = LOG_CREATED_AT
} OutboxLogColumn;

extern const char *const OutboxLogColumnNames[LOG_NATTS + 1];

/* the version of the extension installed in this database, or NULL (version.c) */
extern char *OutboxInstalledVersion(void);

/*
 * Columns of inbox.messages, in table order (inbox.receive() fills them
 * positionally; columns are only ever appended).
 */
typedef enum InboxMessageColumn
{
	IM_ID = 1,
	IM_TYPE,
	IM_AGGREGATE_ID,
	IM_PAYLOAD,
	IM_HEADERS,
	IM_SOURCE,
	IM_STATUS,
	IM_ATTEMPTS,
	IM_NEXT_ATTEMPT_AT,
	IM_RECEIVED_AT,
	IM_PROCESSED_AT,
	IM_LAST_ERROR,
	IM_SEQ,
	IM_FINISHED_ATTEMPTS,		/* 0.5.1 */
	IM_NATTS = IM_FINISHED_ATTEMPTS
} InboxMessageColumn;

/* inbox.messages before 0.5.1 (the library before ALTER EXTENSION UPDATE) */
#define IM_NATTS_0_5_0			IM_SEQ

/* Most relay workers in one cluster (all databases together). */
#define OUTBOX_MAX_RELAYS		64

/*
 * Stored error texts (outbox.events.last_error, a worker slot's last
 * error) hold at most OUTBOX_ERROR_LEN - 1 bytes (peertext.c cuts them).
 * The relay reads twice that much of a response body, so that a secret
 * across the stored limit is still seen whole and redacted.
 */
#define OUTBOX_ERROR_LEN		256
#define OUTBOX_RESPONSE_PREFIX_LEN (2 * OUTBOX_ERROR_LEN)

#endif							/* OUTBOX_PG_H */
