/*-------------------------------------------------------------------------
 *
 * util.h
 *		  Small helpers more than one subsystem needs (util.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/util.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_UTIL_H
#define OUTBOX_UTIL_H

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

extern const char *OutboxJsonbOption(Jsonb *options, const char *key);
extern void OutboxAppendPercentEncodedKeeping(StringInfo buf, const char *value,
											  bool (*keep) (unsigned char c));
extern void OutboxAppendPercentEncoded(StringInfo buf, const char *value);
extern JsonbValue *OutboxJsonbGet(JsonbContainer *container, const char *key);
extern int64 OutboxUnixMicros(TimestampTz ts);
extern void OutboxUuidV7SetTime(unsigned char *uuid, int64 unix_ms);

extern bool OutboxTraceparentIsValid(const char *value);

/*
 * The workers' timers read the wall clock (GetCurrentTimestamp()), which
 * an operator or NTP may step back.  A time this process read earlier that
 * lies ahead of now means the clock went back since: how much time passed
 * is unknown, and waiting for the old reading to come round again would
 * add the whole step (an hour's step stopped a quiet destination's claims
 * for that hour).  Such a timer counts as run out.
 *
 * OutboxTimePassed: at least msec since `since`, or the clock went back.
 * OutboxDeadlineReached: a deadline set wait_ms after a reading has come,
 * or lies further ahead than wait_ms (the clock went back).
 */
static inline bool
OutboxTimePassed(TimestampTz since, TimestampTz now, int64 msec)
{
	return now < since || now - since >= msec * 1000;
}

static inline bool
OutboxDeadlineReached(TimestampTz deadline, int64 wait_ms, TimestampTz now)
{
	return now >= deadline || deadline - now > wait_ms * 1000;
}

#endif							/* OUTBOX_UTIL_H */
