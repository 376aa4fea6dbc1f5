/*-------------------------------------------------------------------------
 *
 * outbox_pg.c
 *		  Module entry point: _PG_init dispatches to each part's init.
 *
 * The library may be loaded two ways.  Through shared_preload_libraries it
 * also registers the relay workers and their shared memory; loaded on
 * demand by a backend (the first call of outbox.emit(), say) it only
 * defines its settings and per-backend caches.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/outbox_pg.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"

#include "outbox_pg.h"
#include "guc.h"
#include "shmem.h"
#include "api/api.h"
#include "worker/worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	OutboxDefineGucs();
	OutboxConfigInit();

	if (!process_shared_preload_libraries_in_progress)
		return;

	OutboxShmemInit();
	OutboxRegisterLauncher();
	OutboxDatabaseDdlInit();
}
