/*-------------------------------------------------------------------------
 *
 * validate.c
 *		  Checks of the values that outbox.emit() and inbox.claim() accept.
 *
 * Everything an event carries may end up in an HTTP header line, so the
 * checks here are what keeps a caller from smuggling a CR/LF into a
 * request or overriding a header the relay owns.  All failures are
 * ERRCODE_INVALID_PARAMETER_VALUE unless a more specific code fits.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/validate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/jsonb.h"

#include "outbox_pg.h"

#define MAX_EXTRA_HEADERS		64
#define MAX_HEADER_NAME_LEN		256
#define MAX_HEADER_VALUE_LEN	8192

/* Headers that only the relay or libcurl may set. */
static const char *const reserved_headers[] = {
	"authorization",
	"connection",
	"content-length",
	"content-type",
	"expect",
	"host",
	"idempotency-key",
	"keep-alive",
	"te",
	"trailer",
	"traceparent",
	"tracestate",
	"transfer-encoding",
	"upgrade",
	NULL
};

/* Header name prefixes owned by the wire formats the relay speaks. */
static const char *const reserved_prefixes[] = {
	"ce-",
	"webhook-",
	"x-amz-",
	"proxy-",
	NULL
};

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
 * has exactly four fields.  Later versions may append fields after a dash.
 */
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
	return len == 55 || value[55] == '-';
}

static bool
has_control_chars(const char *s, bool allow_tab)
{
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
	{
		if ((*p < 0x20 && !(allow_tab && *p == '\t')) || *p == 0x7f)
			return true;
	}
	return false;
}

/*
 * An event type, aggregate id, destination or consumer name: non-empty,
 * bounded, and free of control characters.  The caller checks for NULL.
 */
void
OutboxCheckIdentifier(const char *what, const char *value, int maxlen)
{
	int			len = strlen(value);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (len > maxlen)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errdetail("The value has %d bytes; the maximum is %d.",
						   len, maxlen)));
	if (has_control_chars(value, false))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not contain control characters", what)));
}

static bool
is_token_char(char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9'))
		return true;
	return strchr("!#$%&'*+-.^_`|~", c) != NULL && c != '\0';
}

static void
check_header_name(const char *name, int len)
{
	char		lower[MAX_HEADER_NAME_LEN + 1];

	if (len == 0 || len > MAX_HEADER_NAME_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header names must have between 1 and %d characters",
						MAX_HEADER_NAME_LEN)));
	for (int i = 0; i < len; i++)
	{
		if (!is_token_char(name[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid header name \"%.*s\"", len, name),
					 errdetail("Header names may contain only letters, digits and !#$%%&'*+-.^_`|~.")));
		lower[i] = pg_ascii_tolower((unsigned char) name[i]);
	}
	lower[len] = '\0';

	for (int i = 0; reserved_headers[i] != NULL; i++)
		if (strcmp(lower, reserved_headers[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" cannot be set per event", lower),
					 errdetail("The relay sets this header itself.")));
	for (int i = 0; reserved_prefixes[i] != NULL; i++)
		if (strncmp(lower, reserved_prefixes[i],
					strlen(reserved_prefixes[i])) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%s\" cannot be set per event", lower),
					 errdetail("Headers starting with \"%s\" are reserved for the wire format.",
							   reserved_prefixes[i])));
}

/*
 * Per-event headers: a JSON object whose keys are HTTP field names and
 * whose values are strings that fit on one header line.
 */
void
OutboxCheckHeaders(Datum headers)
{
	Jsonb	   *jb = DatumGetJsonbP(headers);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			count = 0;

	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errhint("Pass headers as {\"name\": \"value\", ...}.")));

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			if (++count > MAX_EXTRA_HEADERS)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("too many headers"),
						 errdetail("At most %d headers can be set per event.",
								   MAX_EXTRA_HEADERS)));
			check_header_name(v.val.string.val, v.val.string.len);
		}
		else if (tok == WJB_VALUE)
		{
			char	   *value;

			if (v.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("header values must be JSON strings")));
			if (v.val.string.len > MAX_HEADER_VALUE_LEN)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("header value is too long"),
						 errdetail("The maximum is %d bytes.",
								   MAX_HEADER_VALUE_LEN)));
			value = pnstrdup(v.val.string.val, v.val.string.len);
			if (has_control_chars(value, true) ||
				strlen(value) != (size_t) v.val.string.len)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("header values must not contain control characters")));
			pfree(value);
		}
	}
}
