/*-------------------------------------------------------------------------
 *
 * compat.h
 *		  Differences between the PostgreSQL majors outbox_pg builds on.
 *
 * The rest of the code is written against the newest major's API; for
 * older majors this header maps each call onto what that major has.  Every
 * shim is guarded by the release that changed the API (16, 17 or 18; one
 * by a minor release), so majors in between (16 is not tested here) take
 * the right side too.
 *
 * Each header whose declarations are shimmed is included first: a later
 * #include of it is then a no-op, and a same-name macro below cannot
 * rewrite its prototype.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/compat.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "common/base64.h"
#include "common/jsonapi.h"
#include "executor/executor.h"
#include "parser/parse_relation.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 180000
#include "storage/waiteventset.h"
#endif

/*
 * 16 moved a range table's permission details into a separate list
 * (RTEPermissionInfo) that ExecInitRangeTable takes; 18 adds the set of
 * unpruned relations.  Before 16 the details live in the entry itself,
 * and nothing needs to be added.
 */
#if PG_VERSION_NUM < 160000
#define addRTEPermissionInfo(rteperminfos, rte) \
	((void) (rteperminfos), (void) (rte))
#define ExecInitRangeTable(estate, rangeTable, permInfos, unpruned_relids) \
	((void) (permInfos), (void) (unpruned_relids), \
	 (ExecInitRangeTable) ((estate), (rangeTable)))
#elif PG_VERSION_NUM < 180000
#define ExecInitRangeTable(estate, rangeTable, permInfos, unpruned_relids) \
	((void) (unpruned_relids), \
	 (ExecInitRangeTable) ((estate), (rangeTable), (permInfos)))
#endif

/*
 * 16 replaced the ACL checks per catalog (pg_proc_aclcheck(), ...) with
 * object_aclcheck(); only functions are checked here.
 */
#if PG_VERSION_NUM < 160000
#define object_aclcheck(classid, objectid, roleid, mode) \
	((void) (classid), pg_proc_aclcheck((objectid), (roleid), (mode)))
#endif

/*
 * 16 replaced the owner checks per catalog (pg_database_ownercheck(), ...)
 * with object_ownercheck(); only databases are checked here.
 */
#if PG_VERSION_NUM < 160000
#define object_ownercheck(classid, objectid, roleid) \
	((void) (classid), pg_database_ownercheck((objectid), (roleid)))
#endif

/* 16 added onlySummarizing (update only the summarizing indexes) */
#if PG_VERSION_NUM < 160000
#define ExecInsertIndexTuples(resultRelInfo, slot, estate, update, noDupErr, \
							  specConflict, arbiterIndexes, onlySummarizing) \
	((void) (onlySummarizing), \
	 (ExecInsertIndexTuples) ((resultRelInfo), (slot), (estate), (update), \
							  (noDupErr), (specConflict), (arbiterIndexes)))
#endif

/* 18 added the tuple to ignore (its own old version, for updates) */
#if PG_VERSION_NUM < 180000
#define ExecCheckIndexConstraints(resultRelInfo, slot, estate, conflictTid, \
								  tupleid, arbiterIndexes) \
	((void) (tupleid), \
	 (ExecCheckIndexConstraints) ((resultRelInfo), (slot), (estate), \
								  (conflictTid), (arbiterIndexes)))
#endif

/*
 * 17 added the MERGE actions to validate, 18.1 the ON CONFLICT action (a
 * minor release changed this one; 17.7 kept the old signature and added
 * CheckValidResultRelNew instead).
 */
#if PG_VERSION_NUM < 170000
#define CheckValidResultRel(resultRelInfo, operation, onConflictAction, \
							mergeActions) \
	((void) (onConflictAction), (void) (mergeActions), \
	 (CheckValidResultRel) ((resultRelInfo), (operation)))
#elif PG_VERSION_NUM < 180001
#define CheckValidResultRel(resultRelInfo, operation, onConflictAction, \
							mergeActions) \
	((void) (onConflictAction), \
	 (CheckValidResultRel) ((resultRelInfo), (operation), (mergeActions)))
#endif

/* 17 replaced PGPROC.pgprocno by MyProcNumber */
#if PG_VERSION_NUM < 170000
#define MyProcNumber (MyProc->pgprocno)
#endif

/*
 * 17 made a wait event set belong to a resource owner; NULL (no owner)
 * means it lives in TopMemoryContext until freed, as every set did before.
 */
#if PG_VERSION_NUM < 170000
#define CreateWaitEventSet(resowner, nevents) \
	((void) (resowner), (CreateWaitEventSet) (TopMemoryContext, (nevents)))
#endif

/*
 * 17 lets the caller provide the lexer's context; NULL allocates one, the
 * only way before.
 */
#if PG_VERSION_NUM < 170000
#define makeJsonLexContextCstringLen(lex, json, len, encoding, need_escapes) \
	((void) (lex), \
	 (makeJsonLexContextCstringLen) ((char *) (json), (len), (encoding), \
									 (need_escapes)))
#endif

/* 18 types the binary side of base64 as uint8 instead of char */
#if PG_VERSION_NUM < 180000
#define pg_b64_encode(src, len, dst, dstlen) \
	(pg_b64_encode) ((const char *) (src), (len), (dst), (dstlen))
#define pg_b64_decode(src, len, dst, dstlen) \
	(pg_b64_decode) ((src), (len), (char *) (dst), (dstlen))
#endif

/*
 * 16 moved GUC memory into a memory context: "extra" values must come from
 * guc_malloc, which is exported from 16 on.  Before, it was malloc.
 */
#if PG_VERSION_NUM < 160000
#define guc_malloc(elevel, size) malloc(size)
#endif

#endif							/* OUTBOX_COMPAT_H */
