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

#endif							/* OUTBOX_UTIL_H */
