/*-------------------------------------------------------------------------
 *
 * validate.c
 *		  Checking a destination's definition against its kind.
 *
 * One source of truth: the trigger on outbox.destinations and the relay's
 * loader both call DestinationValidate().
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/validate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/jsonb.h"

#include "outbox_pg.h"
#include "destination/destination.h"

/*
 * ERROR (22023) unless the definition is usable by its kind.
 */
void
DestinationValidate(const DestinationDefinition *def)
{
	const DestinationRoutine *routine = GetDestinationRoutine(def->kind);

	if (routine->validate != NULL)
		routine->validate(def);
}
