/*-------------------------------------------------------------------------
 *
 * destination.c
 *		  The registry of destination kinds.
 *
 * Adding a kind is one new file ending in its DestinationRoutine and one
 * line in the array below.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/destination.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"

#include "outbox_pg.h"
#include "destination/destination.h"

static const DestinationRoutine *const routines[] =
{
	&webhook_routine,
	&sns_routine,
	&sqs_routine,
	&rabbitmq_routine,
};

/* Every kind, in registry order; *n is set to their number. */
const DestinationRoutine *const *
DestinationRoutines(int *n)
{
	*n = lengthof(routines);
	return routines;
}

/* "webhook, sns, sqs, rabbitmq": for hints. */
const char *
DestinationKindList(void)
{
	StringInfoData buf;

	initStringInfo(&buf);
	for (int i = 0; i < lengthof(routines); i++)
		appendStringInfo(&buf, "%s%s", i > 0 ? ", " : "", routines[i]->kind);
	return buf.data;
}

/*
 * The routine of a kind; an unknown kind is the caller's mistake (a
 * destination row or an argument), reported with the kinds there are.
 */
const DestinationRoutine *
GetDestinationRoutine(const char *kind)
{
	for (int i = 0; i < lengthof(routines); i++)
	{
		if (strcmp(routines[i]->kind, kind) == 0)
		{
			Assert(routines[i]->max_batch >= 1);
			return routines[i];
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown destination kind \"%s\"", kind),
			 errhint("The kinds are: %s.", DestinationKindList())));
	return NULL;				/* keep compiler quiet */
}
