/*-------------------------------------------------------------------------
 *
 * api.h
 *		  Functions that run in application backends, inside the caller's transaction.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/api.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_API_H
#define OUTBOX_API_H

#include "fmgr.h"
#include "utils/relcache.h"
#include "utils/uuid.h"

#include "outbox_pg.h"

/* routing.c */
typedef struct OutboxConfig
{
	Oid			events_relid;
	Oid			destinations_relid;
	Oid			routes_relid;
	Oid			claims_relid;
	Oid			messages_relid; /* InvalidOid before 0.2.0 */
	Oid			messages_seq_relid;	/* likewise */
	int			messages_natts; /* IM_* columns present: IM_NATTS_0_5_0 before
								 * 0.5.1's update */
	int			events_natts;	/* EV_* columns present (worker/version.c) */
	/* the insert-only store (issue #21); InvalidOid before its update */
	Oid			rotation_relid;
	Oid			log_relids[OUTBOX_LOG_SLOTS];
	Oid			log_relid;		/* the current slot: emit() inserts here */
} OutboxConfig;

extern const OutboxConfig *OutboxGetConfig(void);
extern bool OutboxDestinationExists(const char *name);
extern const char *OutboxRouteEventType(const char *type);
extern bool OutboxDestinationIsOrdered(const char *name);
extern bool OutboxPatternMatches(const char *pattern, const char *text);
extern void OutboxConfigInit(void);

/* wake.c */
extern void OutboxWakeAtCommit(void);
extern void OutboxWakeDestinationAtCommit(const char *destination);
extern void OutboxConfigChangedAtCommit(void);

/* validate.c */
extern void OutboxCheckIdentifier(const char *what, const char *value,
								  int maxlen);
extern void OutboxCheckHeaders(Datum headers);

/* insert.c */
typedef struct OutboxInsertState
{
	Relation	rel;
	struct EState *estate;
	struct ResultRelInfo *rri;
	struct TupleTableSlot *slot;
} OutboxInsertState;

extern void OutboxBeginInsert(OutboxInsertState *st, Oid relid, bool speculative);
extern void OutboxEndInsert(OutboxInsertState *st);

/* ordering.c */
extern void OutboxLockAggregate(const char *destination,
								const char *aggregate_id);
extern void OutboxLockEventId(const pg_uuid_t *id);

/* inbox.c */
extern Datum inbox_receive(PG_FUNCTION_ARGS);

/* database_ddl.c */
extern void OutboxDatabaseDdlInit(void);

/* emit.c */
extern Datum outbox_emit(PG_FUNCTION_ARGS);
extern Datum OutboxPayloadArg(FunctionCallInfo fcinfo, int argno, bool event);

#endif							/* OUTBOX_API_H */
