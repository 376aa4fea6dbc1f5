/*-------------------------------------------------------------------------
 *
 * emit_text.c
 *		  outbox.emit() with a payload of type text: the form an untyped
 *		  driver parameter resolves to, so that a payload that is not JSON
 *		  gets a hint.
 *
 * Drivers on the extended protocol mostly send their parameters untyped
 * (node-postgres always does) and leave the types to the server.  With
 * only emit(..., payload jsonb, ...) the server converts the text while it
 * binds the parameters, before emit() runs: a JavaScript array, which
 * node-postgres sends as a PostgreSQL array literal such as '{1,2}', fails
 * there with 22P02 "invalid input syntax for type json" and nothing the
 * extension could add to it.
 *
 * This second form differs only in the type of payload.  An argument of
 * unknown type prefers the string category when functions are resolved,
 * so untyped parameters and literals now reach this form, which converts
 * the text itself and adds a hint naming the usual cause; an argument of
 * type jsonb still resolves to the jsonb form, and no call that resolved
 * before is ambiguous now.  The conversion is the one the bind did
 * (jsonb_in), and the row is written by emit()'s own code.
 *
 * Privileges: EXECUTE on this form is granted to PUBLIC because it grants
 * nothing by itself: it requires EXECUTE on the jsonb form, which stays
 * the one grant an application role needs (grants made before 0.4.0 keep
 * working), and refuses with that function's own error otherwise.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/emit_text.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "outbox_pg.h"
#include "compat.h"
#include "api/api.h"

PG_FUNCTION_INFO_V1(outbox_emit_text);

#define EMIT_NARGS			8
#define EMIT_ARG_PAYLOAD	2

/*
 * The jsonb form's OID, looked up once per OID of this form: a new
 * CREATE EXTENSION gives both new OIDs.
 */
static Oid	emit_text_oid = InvalidOid;
static Oid	emit_jsonb_oid = InvalidOid;

static Oid
emit_text_jsonb_form(Oid self)
{
	if (self != emit_text_oid || !OidIsValid(emit_jsonb_oid))
	{
		Oid			argtypes[EMIT_NARGS] = {TEXTOID, TEXTOID, JSONBOID, TEXTOID,
		TEXTOID, JSONBOID, TEXTOID, TIMESTAMPTZOID};

		emit_jsonb_oid = LookupFuncName(list_make2(makeString(OUTBOX_SCHEMA),
												   makeString("emit")),
										EMIT_NARGS, argtypes, false);
		emit_text_oid = self;
	}
	return emit_jsonb_oid;
}

/*
 * The payload as jsonb.  A text that is not JSON fails with jsonb_in's own
 * error (SQLSTATE, message, detail, context) plus a hint: for text that
 * starts like an object but is not one, the array literal a driver makes
 * of a JavaScript array; else that the payload must be serialised.
 */
static Datum
emit_text_to_jsonb(text *payload)
{
	char	   *str = text_to_cstring(payload);
	MemoryContext cxt = CurrentMemoryContext;
	Datum		result = (Datum) 0;

	PG_TRY();
	{
		result = DirectFunctionCall1(jsonb_in, CStringGetDatum(str));
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		const char *p = str;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_INVALID_TEXT_REPRESENTATION ||
			edata->hint != NULL)
			PG_RE_THROW();
		FlushErrorState();

		while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
			p++;
		if (*p == '{')
			edata->hint = pstrdup("The payload must be JSON text. A driver that sends a JavaScript array "
								  "as a query parameter turns it into a PostgreSQL array literal such as "
								  "'{1,2}': serialise the payload with JSON.stringify.");
		else
			edata->hint = pstrdup("The payload must be JSON text: serialise it with JSON.stringify "
								  "(a JSON string keeps its double quotes).");
		ReThrowError(edata);
	}
	PG_END_TRY();

	return result;
}

/*
 * outbox.emit(type, aggregate_id, payload text, aggregate_type,
 *			   destination, headers, traceparent, not_before) returns uuid
 */
Datum
outbox_emit_text(PG_FUNCTION_ARGS)
{
	LOCAL_FCINFO(jsonb_fcinfo, EMIT_NARGS);
	AclResult	aclresult;
	Datum		result;

	aclresult = object_aclcheck(ProcedureRelationId,
								emit_text_jsonb_form(fcinfo->flinfo->fn_oid),
								GetUserId(), ACL_EXECUTE);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_FUNCTION, "emit");

	Assert(PG_NARGS() == EMIT_NARGS);
	InitFunctionCallInfoData(*jsonb_fcinfo, fcinfo->flinfo, EMIT_NARGS,
							 fcinfo->fncollation, fcinfo->context,
							 fcinfo->resultinfo);
	for (int i = 0; i < EMIT_NARGS; i++)
		jsonb_fcinfo->args[i] = fcinfo->args[i];
	if (!PG_ARGISNULL(EMIT_ARG_PAYLOAD))
		jsonb_fcinfo->args[EMIT_ARG_PAYLOAD].value =
			emit_text_to_jsonb(PG_GETARG_TEXT_PP(EMIT_ARG_PAYLOAD));

	result = outbox_emit(jsonb_fcinfo);
	fcinfo->isnull = jsonb_fcinfo->isnull;
	return result;
}
