/*-------------------------------------------------------------------------
 *
 * payload_text.c
 *		  outbox.emit() and inbox.receive() with a payload of type text: the
 *		  forms an untyped driver parameter resolves to, so that a payload
 *		  that is not JSON gets a hint.
 *
 * Drivers on the extended protocol mostly send their parameters untyped
 * (node-postgres always does) and leave the types to the server.  With
 * only emit(..., payload jsonb, ...) the server converts the text while it
 * binds the parameters, before emit() runs: a JavaScript array, which
 * node-postgres sends as a PostgreSQL array literal such as '{1,2}', fails
 * there with 22P02 "invalid input syntax for type json" and nothing the
 * extension could add to it.
 *
 * The second forms differ only in the type of payload.  An argument of
 * unknown type prefers the string category when functions are resolved,
 * so untyped parameters and literals now reach them; they convert the
 * text themselves and add a hint naming the usual cause.  An argument of
 * type jsonb still resolves to the jsonb form, and no call that resolved
 * before is ambiguous now.  The conversion is the one the bind did
 * (jsonb_in), and then the jsonb form's own C function runs.
 *
 * Privileges: EXECUTE on the text forms is granted to PUBLIC because it
 * grants nothing by itself: each requires EXECUTE on its jsonb form, which
 * stays the one grant an application role needs (grants made before 0.4.0
 * keep working), and refuses with that function's own error otherwise.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/payload_text.c
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
PG_FUNCTION_INFO_V1(inbox_receive_text);

/* the payload is the third argument of both functions */
#define PAYLOAD_ARG			2
#define MAX_NARGS			8

/*
 * A text form and its jsonb form: the jsonb form's OID is looked up once
 * per OID of the text form (a new CREATE EXTENSION gives both new OIDs).
 */
typedef struct PayloadTextForm
{
	const char *schema;
	const char *name;
	int			nargs;
	Oid			argtypes[MAX_NARGS];	/* of the jsonb form */
	PGFunction	jsonb_form;
	Oid			text_oid;
	Oid			jsonb_oid;
} PayloadTextForm;

static PayloadTextForm emit_form = {
	OUTBOX_SCHEMA, "emit", 8,
	{TEXTOID, TEXTOID, JSONBOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID,
	TIMESTAMPTZOID},
	outbox_emit, InvalidOid, InvalidOid
};

static PayloadTextForm receive_form = {
	INBOX_SCHEMA, "receive", 6,
	{TEXTOID, TEXTOID, JSONBOID, TEXTOID, JSONBOID, TEXTOID},
	inbox_receive, InvalidOid, InvalidOid
};

/*
 * The payload as jsonb.  A text that is not JSON fails with jsonb_in's own
 * error (SQLSTATE, message, detail, context) plus a hint: for text that
 * starts like an object but is not one, the array literal a driver makes
 * of a JavaScript array; else that the payload must be serialised.
 */
static Datum
payload_text_to_jsonb(text *payload)
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
			edata->hint = pstrdup("The payload must be JSON text. A driver that sends a JavaScript array as a query parameter turns it into a PostgreSQL array literal such as '{1,2}': serialise the payload with JSON.stringify.");
		else
			edata->hint = pstrdup("The payload must be JSON text: serialise it with JSON.stringify (a JSON string keeps its double quotes).");
		ReThrowError(edata);
	}
	PG_END_TRY();

	return result;
}

/*
 * Check EXECUTE on the jsonb form, convert the payload and call the jsonb
 * form's C function with the same arguments otherwise.
 */
static Datum
payload_text_call(FunctionCallInfo fcinfo, PayloadTextForm *form)
{
	LOCAL_FCINFO(jsonb_fcinfo, MAX_NARGS);
	AclResult	aclresult;
	Datum		result;

	if (fcinfo->flinfo->fn_oid != form->text_oid ||
		!OidIsValid(form->jsonb_oid))
	{
		List	   *name = list_make2(makeString(pstrdup(form->schema)),
									  makeString(pstrdup(form->name)));

		form->jsonb_oid = LookupFuncName(name, form->nargs, form->argtypes,
										 false);
		form->text_oid = fcinfo->flinfo->fn_oid;
	}
	aclresult = object_aclcheck(ProcedureRelationId, form->jsonb_oid,
								GetUserId(), ACL_EXECUTE);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_FUNCTION, form->name);

	Assert(PG_NARGS() == form->nargs);
	InitFunctionCallInfoData(*jsonb_fcinfo, fcinfo->flinfo, form->nargs,
							 fcinfo->fncollation, fcinfo->context,
							 fcinfo->resultinfo);
	for (int i = 0; i < form->nargs; i++)
		jsonb_fcinfo->args[i] = fcinfo->args[i];
	if (!PG_ARGISNULL(PAYLOAD_ARG))
		jsonb_fcinfo->args[PAYLOAD_ARG].value =
			payload_text_to_jsonb(PG_GETARG_TEXT_PP(PAYLOAD_ARG));

	result = form->jsonb_form(jsonb_fcinfo);
	fcinfo->isnull = jsonb_fcinfo->isnull;
	return result;
}

/*
 * outbox.emit(type, aggregate_id, payload text, aggregate_type,
 *			   destination, headers, traceparent, not_before) returns uuid
 */
Datum
outbox_emit_text(PG_FUNCTION_ARGS)
{
	return payload_text_call(fcinfo, &emit_form);
}

/*
 * inbox.receive(message_id, type, payload text, aggregate_id, headers,
 *				 source) returns boolean
 */
Datum
inbox_receive_text(PG_FUNCTION_ARGS)
{
	return payload_text_call(fcinfo, &receive_form);
}
