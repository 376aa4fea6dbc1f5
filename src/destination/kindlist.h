/*-------------------------------------------------------------------------
 *
 * kindlist.h
 *		  The destination kinds there are, one line each (the registry).
 *
 * Included by destination.c only, with DESTINATION_KIND defined, the way
 * PostgreSQL's rmgrlist.h lists resource managers.  Adding a kind is one
 * new file under src/destination/ ending in <name>_routine, and one line
 * here.  The order is the order of the hint that lists the kinds.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/kindlist.h
 *
 *-------------------------------------------------------------------------
 */

/* there is deliberately no include guard here */

DESTINATION_KIND(webhook)
DESTINATION_KIND(sns)
DESTINATION_KIND(sqs)
DESTINATION_KIND(rabbitmq)
DESTINATION_KIND(kafka)
DESTINATION_KIND(amqp)
