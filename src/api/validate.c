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
 * The configuration tables are checked here too (outbox._check_config()):
 * their rows hold secrets, and a constraint violation would print the
 * whole row.  On outbox.destinations the same trigger then hands the row
 * to DestinationValidate() (src/destination/validate.c), the checks of its
 * kind; on outbox.credentials it revalidates the destinations a changed
 * row serves.  No message of this file shows a header value, a URL or a
 * secret; names and keys only.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/validate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/sysattr.h"
#include "catalog/pg_constraint.h"
#include "catalog/pg_type.h"
#include "commands/comment.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "outbox_pg.h"
#include "api/api.h"
#include "destination/destination.h"

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

/*
 * The name a proxy may deliver a header under: lower case, with '_' taken
 * for '-' (nginx with underscores_in_headers, CGI-style gateways and
 * several web frameworks fold the two), so that "CE_ID" is "ce-id".
 */
static void
header_canonical_name(const char *name, int len, char *out)
{
	for (int i = 0; i < len; i++)
	{
		char		c = pg_ascii_tolower((unsigned char) name[i]);

		out[i] = (c == '_') ? '-' : c;
	}
	out[len] = '\0';
}

/*
 * A header name: an HTTP token, and none that the relay or the wire format
 * owns under any spelling.  scope says where the header was to be set
 * ("per event", "on destination \"x\"").  A destination may set its own
 * Authorization when allow_authorization (a webhook without bearer_token).
 */
static void
check_header_name(const char *name, int len, const char *scope,
				  bool allow_authorization)
{
	char		canon[MAX_HEADER_NAME_LEN + 1];

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
	}
	header_canonical_name(name, len, canon);

	for (int i = 0; reserved_headers[i] != NULL; i++)
	{
		if (strcmp(canon, reserved_headers[i]) != 0)
			continue;
		if (allow_authorization && strcmp(canon, "authorization") == 0)
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header \"%.*s\" cannot be set %s", len, name, scope),
				 errdetail("The relay sets this header itself."),
				 errhint("Header names compare case-insensitively and with \"_\" equal to \"-\", so this is the reserved header \"%s\".",
						 canon)));
	}
	for (int i = 0; reserved_prefixes[i] != NULL; i++)
		if (strncmp(canon, reserved_prefixes[i],
					strlen(reserved_prefixes[i])) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header \"%.*s\" cannot be set %s", len, name, scope),
					 errdetail("Headers starting with \"%s\" are reserved for the wire format.",
							   reserved_prefixes[i]),
					 errhint("Header names compare case-insensitively and with \"_\" equal to \"-\", so this is the reserved header \"%s\".",
							 canon)));
}

/*
 * Extra headers, per event or per destination: a JSON object whose keys
 * are HTTP field names and whose values are strings that fit on one
 * header line.  No message shows a header value: it may be a secret.
 */
static void
check_headers(Datum headers, const char *scope, bool allow_authorization)
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
						 errdetail("At most %d headers can be set %s.",
								   MAX_EXTRA_HEADERS, scope)));
			check_header_name(v.val.string.val, v.val.string.len, scope,
							  allow_authorization);
		}
		else if (tok == WJB_VALUE)
		{
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
			for (int i = 0; i < v.val.string.len; i++)
			{
				unsigned char c = (unsigned char) v.val.string.val[i];

				if ((c < 0x20 && c != '\t') || c == 0x7f)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("header values must not contain control characters")));
			}
		}
	}
}

/*
 * Per-event headers (outbox.emit()).
 */
void
OutboxCheckHeaders(Datum headers)
{
	check_headers(headers, "per event", false);
}

/*
 * Has the column a different value in the new row than in the old one?
 * Compares the detoasted bytes: an UPDATE that leaves the column alone
 * changes nothing.
 */
static bool
config_column_changed(Relation rel, HeapTuple oldtup, HeapTuple newtup,
					  AttrNumber attnum)
{
	TupleDesc	desc = RelationGetDescr(rel);
	Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
	bool		oldnull,
				newnull;
	Datum		olddat = heap_getattr(oldtup, attnum, desc, &oldnull);
	Datum		newdat = heap_getattr(newtup, attnum, desc, &newnull);

	if (oldnull || newnull)
		return oldnull != newnull;
	if (att->attlen == -1)
	{
		struct varlena *a = PG_DETOAST_DATUM_PACKED(olddat);
		struct varlena *b = PG_DETOAST_DATUM_PACKED(newdat);

		return VARSIZE_ANY_EXHDR(a) != VARSIZE_ANY_EXHDR(b) ||
			memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) != 0;
	}
	return !datumIsEqual(olddat, newdat, att->attbyval, att->attlen);
}

/* A column of the row by name; *isnull also when the table has none. */
static Datum
config_column(Relation rel, HeapTuple tup, const char *attname, bool *isnull)
{
	AttrNumber	attnum = get_attnum(RelationGetRelid(rel), attname);

	*isnull = true;
	if (attnum == InvalidAttrNumber)
		return (Datum) 0;
	return heap_getattr(tup, attnum, RelationGetDescr(rel), isnull);
}

/* A text column of the row as a C string, or NULL. */
static char *
config_text_column(Relation rel, HeapTuple tup, const char *attname)
{
	bool		isnull;
	Datum		d = config_column(rel, tup, attname, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * A destination's own headers: the same rules as per-event headers, except
 * that a webhook without bearer_token may send its own Authorization.
 * Checked when written; an UPDATE that changes neither the headers nor
 * what they are checked against leaves rows of older versions alone.
 */
static void
config_check_destination_headers(Relation rel, HeapTuple oldtup,
								 HeapTuple newtup, const char *name)
{
	AttrNumber	att_headers = get_attnum(RelationGetRelid(rel), "headers");
	AttrNumber	att_kind = get_attnum(RelationGetRelid(rel), "kind");
	AttrNumber	att_bearer = get_attnum(RelationGetRelid(rel), "bearer_token");
	char	   *kind;
	bool		isnull;
	Datum		headers;

	if (att_headers == InvalidAttrNumber || att_kind == InvalidAttrNumber ||
		att_bearer == InvalidAttrNumber)
		return;
	if (oldtup != NULL &&
		!config_column_changed(rel, oldtup, newtup, att_headers) &&
		!config_column_changed(rel, oldtup, newtup, att_kind) &&
		!config_column_changed(rel, oldtup, newtup, att_bearer))
		return;

	headers = heap_getattr(newtup, att_headers, RelationGetDescr(rel), &isnull);
	if (isnull)
		return;
	kind = config_text_column(rel, newtup, "kind");
	(void) heap_getattr(newtup, att_bearer, RelationGetDescr(rel), &isnull);
	check_headers(headers, psprintf("on destination \"%s\"", name),
				  kind != NULL && strcmp(kind, "webhook") == 0 && isnull);
}

/* A text[] as a List of C strings (NULL for a null element). */
static List *
config_text_array_list(Datum array)
{
	List	   *result = NIL;
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	deconstruct_array(DatumGetArrayTypeP(array), TEXTOID, -1, false,
					  TYPALIGN_INT, &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
		result = lappend(result, nulls[i] ? NULL : TextDatumGetCString(elems[i]));
	return result;
}

/*
 * Has any of the columns validation reads a different value in the new
 * row?  An UPDATE that leaves them alone (outbox.pause(), a timeout) is not
 * refused for a definition an older version accepted.
 */
static bool
config_destination_changed(Relation rel, HeapTuple oldtup, HeapTuple newtup)
{
	static const char *const columns[] = {
		"kind", "url", "options", "signing_secrets", "bearer_token",
		"credentials", NULL
	};

	if (oldtup == NULL)
		return true;
	for (int i = 0; columns[i] != NULL; i++)
	{
		AttrNumber	attnum = get_attnum(RelationGetRelid(rel), columns[i]);

		if (attnum != InvalidAttrNumber &&
			config_column_changed(rel, oldtup, newtup, attnum))
			return true;
	}
	return false;
}

/* The destination of a row of outbox.destinations, without credentials. */
static DestinationDefinition *
config_destination_definition(Relation rel, HeapTuple tup)
{
	DestinationDefinition *def = palloc0(sizeof(DestinationDefinition));
	bool		isnull;
	Datum		d;

	def->name = config_text_column(rel, tup, "name");
	def->kind = config_text_column(rel, tup, "kind");
	def->url = config_text_column(rel, tup, "url");
	d = config_column(rel, tup, "options", &isnull);
	def->options = isnull ? NULL : DatumGetJsonbP(d);	/* NOT NULL */
	d = config_column(rel, tup, "signing_secrets", &isnull);
	def->signing_secrets = isnull ? NIL : config_text_array_list(d);
	def->bearer_token = config_text_column(rel, tup, "bearer_token");
	def->credentials_name = config_text_column(rel, tup, "credentials");
	return def;
}

/* The credentials of a row of outbox.credentials. */
static DestinationCredentials *
config_credentials_of(Relation rel, HeapTuple tup)
{
	DestinationCredentials *c = palloc0(sizeof(DestinationCredentials));

	c->name = config_text_column(rel, tup, "name");
	c->aws_access_key_id = config_text_column(rel, tup, "aws_access_key_id");
	c->aws_secret_access_key = config_text_column(rel, tup, "aws_secret_access_key");
	c->aws_session_token = config_text_column(rel, tup, "aws_session_token");
	c->username = config_text_column(rel, tup, "username");
	c->password = config_text_column(rel, tup, "password");
	return c;
}

/*
 * Run a query over the configuration tables with one text parameter (SPI
 * connected).  With a valid owner, as that role (the owner of the table the
 * trigger fired on: the extension's owner), the way PostgreSQL's own
 * referential integrity checks run: a credentials row a writer of
 * destinations may name, the trigger may read, whatever SELECT the writer
 * holds.  Returns SPI_tuptable; its rows last until SPI_finish().
 */
static SPITupleTable *
config_spi_query(Oid owner, const char *sql, const char *arg)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(arg)};
	Oid			save_userid;
	int			save_sec_context;
	int			rc;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	if (OidIsValid(owner))
		SetUserIdAndSecContext(owner,
							   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
							   SECURITY_NOFORCE_RLS);
	rc = SPI_execute_with_args(sql, 1, argtypes, values, NULL, false, 0);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	return SPI_tuptable;
}

/* The credentials row of that name, or NULL (SPI connected). */
static DestinationCredentials *
config_read_credentials(Oid owner, const char *name)
{
	SPITupleTable *tt;
	DestinationCredentials *c;

	tt = config_spi_query(owner,
						  "SELECT name, aws_access_key_id, aws_secret_access_key,"
						  " aws_session_token, username, password"
						  " FROM outbox.credentials"
						  " WHERE name OPERATOR(pg_catalog.=) $1",
						  name);
	if (tt->numvals != 1)
		return NULL;
	c = palloc0(sizeof(DestinationCredentials));
	c->name = SPI_getvalue(tt->vals[0], tt->tupdesc, 1);
	c->aws_access_key_id = SPI_getvalue(tt->vals[0], tt->tupdesc, 2);
	c->aws_secret_access_key = SPI_getvalue(tt->vals[0], tt->tupdesc, 3);
	c->aws_session_token = SPI_getvalue(tt->vals[0], tt->tupdesc, 4);
	c->username = SPI_getvalue(tt->vals[0], tt->tupdesc, 5);
	c->password = SPI_getvalue(tt->vals[0], tt->tupdesc, 6);
	return c;
}

/* What the queries below read of outbox.destinations, in this order. */
#define DESTINATION_COLUMNS \
	"name, kind, url, options, signing_secrets, bearer_token, credentials"

/* The destination of row i of a query of DESTINATION_COLUMNS. */
static DestinationDefinition *
config_definition_of_spi_row(SPITupleTable *tt, uint64 i)
{
	DestinationDefinition *def = palloc0(sizeof(DestinationDefinition));
	HeapTuple	tup = tt->vals[i];
	TupleDesc	desc = tt->tupdesc;
	Datum		secrets;
	bool		isnull;

	def->name = SPI_getvalue(tup, desc, 1);
	def->kind = SPI_getvalue(tup, desc, 2);
	def->url = SPI_getvalue(tup, desc, 3);
	def->options = DatumGetJsonbP(SPI_getbinval(tup, desc, 4, &isnull));
	secrets = SPI_getbinval(tup, desc, 5, &isnull);
	if (!isnull)
		def->signing_secrets = config_text_array_list(secrets);
	def->bearer_token = SPI_getvalue(tup, desc, 6);
	def->credentials_name = SPI_getvalue(tup, desc, 7);
	return def;
}

/*
 * outbox.destinations: the row's kind checks it (DestinationValidate()),
 * with the credentials row it names.  On UPDATE only when a column the
 * checks read changed.
 */
static void
config_validate_destination(Relation rel, HeapTuple oldtup, HeapTuple newtup)
{
	DestinationDefinition *def;

	if (!config_destination_changed(rel, oldtup, newtup))
		return;
	def = config_destination_definition(rel, newtup);
	if (def->kind == NULL || def->url == NULL || def->name == NULL)
		return;					/* NOT NULL columns: reported above */

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (def->credentials_name != NULL)
		def->credentials = config_read_credentials(rel->rd_rel->relowner,
												   def->credentials_name);
	DestinationValidate(def);
	SPI_finish();
}

/*
 * outbox.credentials, on UPDATE: every destination that names the row
 * (by its old name: a rename cascades to them afterwards) is checked again
 * with the new values, so that taking the AWS key off a row an SQS
 * destination signs with fails here and not at the next delivery.
 */
static void
config_validate_credentials_users(Relation rel, HeapTuple oldtup,
								  HeapTuple newtup)
{
	char	   *oldname = config_text_column(rel, oldtup, "name");
	DestinationCredentials *c = config_credentials_of(rel, newtup);
	SPITupleTable *tt;

	if (oldname == NULL)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	tt = config_spi_query(rel->rd_rel->relowner,
						  "SELECT " DESTINATION_COLUMNS
						  " FROM outbox.destinations"
						  " WHERE credentials OPERATOR(pg_catalog.=) $1"
						  " ORDER BY name",
						  oldname);
	for (uint64 i = 0; i < tt->numvals; i++)
	{
		DestinationDefinition *def = config_definition_of_spi_row(tt, i);

		def->credentials_name = c->name;
		def->credentials = c;
		DestinationValidate(def);
	}
	SPI_finish();
}

PG_FUNCTION_INFO_V1(outbox__check_destination);

/*
 * outbox._check_destination(name) — the checks the trigger runs when the
 * destination is written, on the row as it is now: for rows written by an
 * older version, which the trigger checks only when a column its checks
 * read is written again (the 0.3.0 update script warns about each one that
 * fails).  ERROR if it fails.
 */
Datum
outbox__check_destination(PG_FUNCTION_ARGS)
{
	char	   *name;
	SPITupleTable *tt;
	DestinationDefinition *def;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("destination name must not be null")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	tt = config_spi_query(InvalidOid,
						  "SELECT " DESTINATION_COLUMNS
						  " FROM outbox.destinations"
						  " WHERE name OPERATOR(pg_catalog.=) $1",
						  name);
	if (tt->numvals != 1)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("destination \"%s\" does not exist", name),
				 errhint("See outbox.destinations for the defined destinations.")));
	def = config_definition_of_spi_row(tt, 0);
	if (def->credentials_name != NULL)
		def->credentials = config_read_credentials(InvalidOid,
												   def->credentials_name);
	DestinationValidate(def);
	SPI_finish();
	PG_RETURN_VOID();
}

/* "destination \"orders\"", or the table when the key is unknown or bad */
static char *
config_row_name(Relation rel, const char *noun, const char *key)
{
	if (key == NULL)
		return psprintf("a row of table \"%s\"", RelationGetRelationName(rel));
	return psprintf("%s \"%s\"", noun, key);
}

/* The comment on a constraint of the table (what it allows), or NULL. */
static char *
config_constraint_comment(Relation rel, const char *conname)
{
	Oid			conoid = get_relation_constraint_oid(RelationGetRelid(rel),
													 conname, true);

	return OidIsValid(conoid) ? GetComment(conoid, ConstraintRelationId, 0) : NULL;
}

/*
 * Report a failed CHECK constraint: the columns it reads, the row by its
 * key (not when the key is among those columns: it is what is wrong), and
 * the constraint's comment as the detail.  Never a value.
 */
static void
config_report_check(Relation rel, const char *conname, Node *expr,
					const char *noun, const char *key, AttrNumber key_attnum)
{
	TupleDesc	desc = RelationGetDescr(rel);
	Bitmapset  *attrs = NULL;
	StringInfoData cols;
	int			ncols = 0;
	int			k = -1;
	char	   *row;
	char	   *comment;

	pull_varattnos(expr, 1, &attrs);
	initStringInfo(&cols);
	while ((k = bms_next_member(attrs, k)) >= 0)
	{
		AttrNumber	attnum = k + FirstLowInvalidHeapAttributeNumber;

		if (attnum <= 0)
			continue;
		if (attnum == key_attnum)
			key = NULL;
		appendStringInfo(&cols, "%s\"%s\"", ncols > 0 ? ", " : "",
						 NameStr(TupleDescAttr(desc, attnum - 1)->attname));
		ncols++;
	}
	row = config_row_name(rel, noun, key);
	comment = config_constraint_comment(rel, conname);
	ereport(ERROR,
			(errcode(ERRCODE_CHECK_VIOLATION),
			 ncols == 0 ?
			 errmsg("%s violates check constraint \"%s\"", row, conname) :
			 ncols == 1 ?
			 errmsg("column %s of %s violates check constraint \"%s\"",
					cols.data, row, conname) :
			 errmsg("columns %s of %s violate check constraint \"%s\"",
					cols.data, row, conname),
			 comment ? errdetail("%s", comment) : 0,
			 errtableconstraint(rel, conname)));
}

/*
 * A destination keeps its name once the event log exists (0.4.0).  Log rows
 * are never changed, so they keep the name they were emitted with, while
 * the destination's position in the log (outbox.streams and its batches)
 * followed a rename: its batch in flight could no longer be acknowledged
 * or recovered (an ordered destination stopped for good, and no log slot
 * could be truncated again), and its events not claimed yet were left
 * behind under the old name.  Before the log, the 0.3 table had no
 * position to lose.
 */
static void
config_refuse_rename(TupleDesc desc, AttrNumber key_attnum, HeapTuple oldtup,
					 const char *newname)
{
	bool		isnull;
	Datum		d;
	char	   *oldname;

	if (key_attnum == InvalidAttrNumber || newname == NULL ||
		!OidIsValid(OutboxGetConfig()->log_relid))
		return;
	d = heap_getattr(oldtup, key_attnum, desc, &isnull);
	if (isnull)
		return;
	oldname = TextDatumGetCString(d);
	if (strcmp(oldname, newname) == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("destination \"%s\" cannot be renamed", oldname),
			 errdetail("Events in the outbox log keep the destination name they were emitted with, and those of \"%s\" not delivered yet would be left behind by a new name.",
					   oldname),
			 errhint("Create destination \"%s\", point the routes and emit() calls at it, and keep \"%s\" until its events are delivered.",
					 newname, oldname)));
}

PG_FUNCTION_INFO_V1(outbox_check_config);

/*
 * outbox._check_config(noun, key_column) — BEFORE INSERT OR UPDATE row
 * trigger on the configuration tables (destinations, routes, credentials,
 * inbox handlers), named to fire before their other triggers.
 *
 * A NOT NULL or CHECK violation reports the whole row in its detail
 * ("Failing row contains (...)"), to the client and into the server log,
 * and these rows hold secrets: signing secrets, bearer tokens, AWS keys,
 * passwords, header values, URLs with a user name and password.  So this
 * trigger first checks what the constraints would check — every NOT NULL
 * column, then every CHECK constraint of the table, evaluated from the
 * catalog so that the two never disagree — and reports a violation with
 * the constraint's own SQLSTATE, naming the row by its key (noun and
 * key_column: 'destination', 'name'), the columns and the constraint, with
 * the constraint's comment as the detail; never a value.  The constraints
 * stay as the backstop.  Foreign key and unique violations are left to
 * PostgreSQL: their detail shows the key only, and every key here is a
 * name.
 *
 * A third argument adds the checks of one table, after those above (so
 * they see a row the constraints accept, in an order no trigger name
 * decides): 'destination' checks the headers like per-event headers, then
 * the definition against its kind (DestinationValidate(), the checks the
 * relay's loader runs too); 'credentials' checks again, on UPDATE, every
 * destination the row serves.  'headers' (the 0.2.1 catalog, until ALTER
 * EXTENSION UPDATE) checks the headers only.
 */
Datum
outbox_check_config(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;
	HeapTuple	newtup;
	HeapTuple	oldtup = NULL;
	TupleConstr *constr;
	const char *noun;
	AttrNumber	key_attnum;
	char	   *key = NULL;
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) ||
		trigdata->tg_trigger->tgnargs < 2)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox._check_config() must be called as a BEFORE INSERT OR UPDATE row trigger with two arguments")));

	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		oldtup = trigdata->tg_trigtuple;
		newtup = trigdata->tg_newtuple;
	}
	else
		newtup = trigdata->tg_trigtuple;
	noun = trigdata->tg_trigger->tgargs[0];
	key_attnum = get_attnum(RelationGetRelid(rel),
							trigdata->tg_trigger->tgargs[1]);
	if (key_attnum != InvalidAttrNumber)
	{
		Datum		d = heap_getattr(newtup, key_attnum, desc, &isnull);

		if (!isnull)
			key = TextDatumGetCString(d);
	}

	/* NOT NULL, in column order, as the executor checks them */
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || !att->attnotnull)
			continue;
		(void) heap_getattr(newtup, att->attnum, desc, &isnull);
		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_NOT_NULL_VIOLATION),
					 errmsg("column \"%s\" of %s must not be null",
							NameStr(att->attname),
							config_row_name(rel, noun, key)),
					 errtablecol(rel, att->attnum)));
	}

	/* CHECK constraints, in the order the executor evaluates them */
	constr = desc->constr;
	if (constr != NULL && constr->num_check > 0)
	{
		EState	   *estate = CreateExecutorState();
		ExprContext *econtext = GetPerTupleExprContext(estate);
		TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);

		ExecStoreHeapTuple(newtup, slot, false);
		econtext->ecxt_scantuple = slot;
		for (int i = 0; i < constr->num_check; i++)
		{
			ConstrCheck *check = &constr->check[i];
			Expr	   *expr = stringToNode(check->ccbin);
			ExprState  *state = ExecPrepareExpr(expr, estate);

			if (!ExecCheck(state, econtext))
				config_report_check(rel, check->ccname, (Node *) expr,
									noun, key, key_attnum);
		}
		ExecDropSingleTupleTableSlot(slot);
		FreeExecutorState(estate);
	}

	if (trigdata->tg_trigger->tgnargs >= 3)
	{
		const char *what = trigdata->tg_trigger->tgargs[2];

		if (strcmp(what, "destination") == 0 && oldtup != NULL)
			config_refuse_rename(desc, key_attnum, oldtup, key);
		/* "headers": the 0.2.1 catalog, until ALTER EXTENSION UPDATE */
		if (strcmp(what, "destination") == 0 || strcmp(what, "headers") == 0)
			config_check_destination_headers(rel, oldtup, newtup, key);
		if (strcmp(what, "destination") == 0)
			config_validate_destination(rel, oldtup, newtup);
		else if (strcmp(what, "credentials") == 0 && oldtup != NULL)
			config_validate_credentials_users(rel, oldtup, newtup);
	}

	return PointerGetDatum(newtup);
}
