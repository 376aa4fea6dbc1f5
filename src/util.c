/*-------------------------------------------------------------------------
 *
 * util.c
 *		  Small helpers more than one subsystem needs.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/util.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "outbox_pg.h"
#include "util.h"

/*
 * options ->> key: a string, number or boolean of a jsonb object as text
 * (palloc'd or constant); NULL when absent, null or of another type.
 */
const char *
OutboxJsonbOption(Jsonb *options, const char *key)
{
	JsonbValue *v;

	if (options == NULL)
		return NULL;
	v = OutboxJsonbGet(&options->root, key);
	if (v == NULL || v->type == jbvNull)
		return NULL;
	if (v->type == jbvString)
		return pnstrdup(v->val.string.val, v->val.string.len);
	if (v->type == jbvBool)
		return v->val.boolean ? "true" : "false";
	if (v->type == jbvNumeric)
		return DatumGetCString(DirectFunctionCall1(numeric_out,
												   NumericGetDatum(v->val.numeric)));
	return NULL;
}

/* RFC 3986's unreserved characters: what a form value or path keeps. */
static bool
is_unreserved(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
}

/*
 * Append value with every byte keep() refuses written as %XX (upper-case
 * hex).  Each wire format says which bytes it keeps.
 */
void
OutboxAppendPercentEncodedKeeping(StringInfo buf, const char *value,
								  bool (*keep) (unsigned char c))
{
	static const char hex[] = "0123456789ABCDEF";

	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		if (keep(*p))
			appendStringInfoChar(buf, (char) *p);
		else
		{
			appendStringInfoChar(buf, '%');
			appendStringInfoChar(buf, hex[*p >> 4]);
			appendStringInfoChar(buf, hex[*p & 0x0f]);
		}
	}
}

/*
 * Append value percent-encoded as RFC 3986 wants it for a form value or a
 * path segment: everything but the unreserved characters becomes %XX.
 */
void
OutboxAppendPercentEncoded(StringInfo buf, const char *value)
{
	OutboxAppendPercentEncodedKeeping(buf, value, is_unreserved);
}

/*
 * The value of key in a jsonb object container; NULL when the key is
 * absent or the container is not an object.  The one lookup primitive:
 * OutboxJsonbOption and the option checks of the configuration build on it.
 */
JsonbValue *
OutboxJsonbGet(JsonbContainer *container, const char *key)
{
	JsonbValue	k;

	if (container == NULL || !JsonContainerIsObject(container))
		return NULL;
	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	return findJsonbValueFromContainer(container, JB_FOBJECT, &k);
}

/* Microseconds since the Unix epoch of a timestamp. */
int64
OutboxUnixMicros(TimestampTz ts)
{
	return ts + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

/*
 * Write the time field of a UUIDv7 (RFC 9562): its first 48 bits are Unix
 * milliseconds, big-endian.  The one place that layout is encoded; emit.c
 * generates ids with it, and a time's lower bound among ids (retention)
 * is that field followed by zeros.
 */
void
OutboxUuidV7SetTime(unsigned char *uuid, int64 unix_ms)
{
	for (int i = 0; i < 6; i++)
		uuid[i] = (unsigned char) (unix_ms >> (40 - 8 * i));
}

static bool
is_lower_hex(const char *s, int len, bool *all_zero)
{
	*all_zero = true;
	for (int i = 0; i < len; i++)
	{
		char		c = s[i];

		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false;
		if (c != '0')
			*all_zero = false;
	}
	return true;
}

/*
 * W3C Trace Context, level 1: version-traceid-parentid-flags, lower-case
 * hex.  Version ff is invalid, all-zero ids are invalid, and version 00
 * has exactly four fields.  Later versions may append fields after a dash,
 * which are not parsed (W3C: a parser must not assume anything about
 * them): any visible ASCII, up to TRACEPARENT_MAX_LEN in all.  The
 * value becomes an HTTP header line as it is, so nothing else may pass
 * (a line break in an appended field split the request on the wire).
 */
#define TRACEPARENT_MAX_LEN 512

bool
OutboxTraceparentIsValid(const char *value)
{
	size_t		len = strlen(value);
	bool		zero;

	if (len < 55)
		return false;
	if (!is_lower_hex(value, 2, &zero) || strncmp(value, "ff", 2) == 0)
		return false;
	if (value[2] != '-' || value[35] != '-' || value[52] != '-')
		return false;
	if (!is_lower_hex(value + 3, 32, &zero) || zero)
		return false;
	if (!is_lower_hex(value + 36, 16, &zero) || zero)
		return false;
	if (!is_lower_hex(value + 53, 2, &zero))
		return false;
	if (strncmp(value, "00", 2) == 0)
		return len == 55;
	if (len == 55)
		return true;
	if (len > TRACEPARENT_MAX_LEN || value[55] != '-')
		return false;
	for (size_t i = 56; i < len; i++)
	{
		char		c = value[i];

		if (c < 0x21 || c > 0x7e)
			return false;
	}
	return true;
}
