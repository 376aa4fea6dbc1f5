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
	JsonbValue	k;
	JsonbValue *v;

	if (options == NULL || !JB_ROOT_IS_OBJECT(options))
		return NULL;
	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	v = findJsonbValueFromContainer(&options->root, JB_FOBJECT, &k);
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

/*
 * Append value percent-encoded as RFC 3986 wants it for a form value or a
 * path segment: everything but the unreserved characters becomes %XX.
 */
void
OutboxAppendPercentEncoded(StringInfo buf, const char *value)
{
	static const char hex[] = "0123456789ABCDEF";

	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
			(*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
			*p == '.' || *p == '~')
			appendStringInfoChar(buf, (char) *p);
		else
		{
			appendStringInfoChar(buf, '%');
			appendStringInfoChar(buf, hex[*p >> 4]);
			appendStringInfoChar(buf, hex[*p & 0x0f]);
		}
	}
}
