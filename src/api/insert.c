/*-------------------------------------------------------------------------
 *
 * direct.c
 *		  Inserting one row through the executor without a plan.
 *
 * emit() and claim() must cost about what a plain INSERT costs, so they
 * skip parsing, planning and ModifyTable and drive the executor's
 * insertion pieces directly, the way logical replication's apply worker
 * does: an EState with a one-entry range table, a ResultRelInfo with the
 * relation's indexes open, and a virtual slot for the new row.  Constraint
 * checks and index maintenance are the executor's own.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/direct.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "utils/rel.h"

#include "outbox_pg.h"
#include "api/api.h"

/*
 * Open relid for one insert.  speculative: prepare the unique indexes for
 * ON CONFLICT-style checks.  The caller fills st->slot's values (all NULL
 * to start with) and stores the tuple.
 */
void
OutboxBeginInsert(OutboxInsertState *st, Oid relid, bool speculative)
{
	RangeTblEntry *rte;
	List	   *perminfos = NIL;
	TupleDesc	tupdesc;

	st->rel = table_open(relid, RowExclusiveLock);
	tupdesc = RelationGetDescr(st->rel);

	st->estate = CreateExecutorState();
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = relid;
	rte->relkind = RELKIND_RELATION;
	rte->rellockmode = RowExclusiveLock;
	/* no permission to check; ExecConstraints' messages look the entry up */
	addRTEPermissionInfo(&perminfos, rte);
	ExecInitRangeTable(st->estate, list_make1(rte), perminfos,
					   bms_make_singleton(1));

	st->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(st->rri, st->rel, 1, NULL, 0);
	CheckValidResultRel(st->rri, CMD_INSERT,
						speculative ? ONCONFLICT_NOTHING : ONCONFLICT_NONE, NIL);
	st->estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(st->rri, speculative);

	st->slot = ExecInitExtraTupleSlot(st->estate, tupdesc, &TTSOpsVirtual);
	ExecClearTuple(st->slot);
	for (int i = 0; i < tupdesc->natts; i++)
	{
		st->slot->tts_values[i] = (Datum) 0;
		st->slot->tts_isnull[i] = true;
	}
}

void
OutboxEndInsert(OutboxInsertState *st)
{
	ExecCloseIndices(st->rri);
	ExecResetTupleTable(st->estate->es_tupleTable, false);
	FreeExecutorState(st->estate);
	table_close(st->rel, NoLock);
}
