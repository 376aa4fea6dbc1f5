/*-------------------------------------------------------------------------
 *
 * validate.c
 *		  Checking a destination's definition against its kind.
 *
 * One source of truth: the trigger on outbox.destinations (and on
 * outbox.credentials, for the destinations a credentials row serves) and
 * the relay's loader both call DestinationValidate().  It checks, in this
 * order, and raises ERRCODE_INVALID_PARAMETER_VALUE at the first mistake:
 *
 *	1. the kind exists (GetDestinationRoutine lists the kinds), and the
 *	   url of an HTTP kind is http or https (the table allows kafka:// and amqp[s]://);
 *	2. every key of options is the kind's own or common to all kinds, the
 *	   way PostgreSQL's option validators do it: a misspelt key gets a
 *	   "Perhaps you meant" hint, any other unknown key the list of keys;
 *	3. every value has its key's JSON type (null is no type: a key is set
 *	   or absent), and the kind's required keys are present;
 *	4. the values of the common keys (below);
 *	5. the kind's validate callback: its values, URL and credentials.
 *
 * The kinds check their values with the helpers of options.c, so the
 * same mistake is worded the same way for every kind.  Messages name
 * the destination, the option and the credentials row, never a value: the
 * row holds secrets (signing secrets, tokens, URLs with a password,
 * credentials) and, like outbox._check_config(), validation shows none of
 * its values, options included.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/validate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/varlena.h"

#include "outbox_pg.h"
#include "util.h"
#include "destination/destination.h"

/*
 * Keys every kind accepts; the relay reads them whatever the kind
 * (delivery.c: circuit_threshold; store.c and the ordering views:
 * ordering, on_dead).
 */
static const DestinationOption common_options[] =
{
	{"circuit_threshold", DEST_OPTION_NUMBER, false},
	{"ordering", DEST_OPTION_STRING, false},
	{"on_dead", DEST_OPTION_STRING, false},
	{NULL}
};

static const char *const ordering_choices[] = {"none", "aggregate", NULL};
static const char *const on_dead_choices[] = {"block", "skip", NULL};

/* the largest circuit_threshold the relay reads (six digits) */
#define MAX_CIRCUIT_THRESHOLD	999999

static const DestinationOption *
option_find(const DestinationOption *options, const char *key, int keylen)
{
	for (const DestinationOption *o = options; o != NULL && o->name; o++)
		if ((int) strlen(o->name) == keylen && strncmp(o->name, key, keylen) == 0)
			return o;
	return NULL;
}

static const char *
option_type_name(DestinationOptionType type)
{
	switch (type)
	{
		case DEST_OPTION_STRING:
			return "string";
		case DEST_OPTION_NUMBER:
			return "number";
		case DEST_OPTION_BOOLEAN:
			return "boolean";
	}
	return "?";					/* keep compiler quiet */
}

/* The JSON type of a value as jsonb_typeof() names it. */
static const char *
jsonb_type_name(const JsonbValue *v)
{
	switch (v->type)
	{
		case jbvString:
			return "string";
		case jbvNumeric:
			return "number";
		case jbvBool:
			return "boolean";
		case jbvNull:
			return "null";
		case jbvBinary:
			return JsonContainerIsArray(v->val.binary.data) ? "array" : "object";
		default:
			return "object";
	}
}

static bool
option_type_matches(DestinationOptionType type, const JsonbValue *v)
{
	switch (type)
	{
		case DEST_OPTION_STRING:
			return v->type == jbvString;
		case DEST_OPTION_NUMBER:
			return v->type == jbvNumeric;
		case DEST_OPTION_BOOLEAN:
			return v->type == jbvBool;
	}
	return false;
}

/*
 * The accepted key closest to a misspelt one, or NULL when none is close:
 * at most half of the key's characters edited (at least one), as
 * PostgreSQL's own option validators judge "close".
 */
static const char *
option_closest(const DestinationRoutine *routine, const char *key, int keylen)
{
	const DestinationOption *lists[2] = {routine->options, common_options};
	const char *best = NULL;
	int			best_distance = Max(1, keylen / 2) + 1;

	for (int l = 0; l < lengthof(lists); l++)
	{
		for (const DestinationOption *o = lists[l]; o != NULL && o->name; o++)
		{
			int			d = varstr_levenshtein_less_equal(key, keylen,
														  o->name, strlen(o->name),
														  1, 1, 1,
														  best_distance, true);

			if (d < best_distance)
			{
				best_distance = d;
				best = o->name;
			}
		}
	}
	return best;
}

/* "topic_arn, region, ..., on_dead": the kind's keys, then the common ones */
static char *
option_list(const DestinationRoutine *routine)
{
	const DestinationOption *lists[2] = {routine->options, common_options};
	StringInfoData buf;

	initStringInfo(&buf);
	for (int l = 0; l < lengthof(lists); l++)
		for (const DestinationOption *o = lists[l]; o != NULL && o->name; o++)
			appendStringInfo(&buf, "%s%s", buf.len > 0 ? ", " : "", o->name);
	return buf.data;
}

/* Step 2 and 3 for one key of options. */
static void
option_check_key(const DestinationDefinition *def,
				 const DestinationRoutine *routine,
				 const JsonbValue *key, const JsonbValue *value)
{
	const char *k = key->val.string.val;
	int			klen = key->val.string.len;
	const DestinationOption *opt;

	opt = option_find(routine->options, k, klen);
	if (opt == NULL)
		opt = option_find(common_options, k, klen);
	if (opt == NULL)
	{
		const char *closest = option_closest(routine, k, klen);

		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown option \"%.*s\" for a destination of kind %s",
						klen, k, def->kind),
				 closest ?
				 errhint("Perhaps you meant \"%s\".", closest) :
				 errhint("The options of kind %s are: %s.",
						 def->kind, option_list(routine))));
	}
	if (!option_type_matches(opt->type, value))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" of destination \"%s\" must be a %s",
						opt->name, def->name, option_type_name(opt->type)),
				 errdetail("The value is a JSON %s.", jsonb_type_name(value)),
				 (value->type == jbvString && opt->type != DEST_OPTION_STRING) ?
				 errhint("JSON numbers and booleans are written without quotes.") : 0));
}

/* Steps 2 and 3: the keys of options, their types, the required ones. */
static void
options_check_keys(const DestinationDefinition *def,
				   const DestinationRoutine *routine)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	JsonbValue	key;

	if (def->options == NULL || !JB_ROOT_IS_OBJECT(def->options) ||
		JB_ROOT_IS_SCALAR(def->options))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("options of destination \"%s\" must be a JSON object",
						def->name)));

	memset(&key, 0, sizeof(key));
	it = JsonbIteratorInit(&def->options->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			key = v;
		else if (tok == WJB_VALUE)
			option_check_key(def, routine, &key, &v);
	}

	for (const DestinationOption *o = routine->options; o != NULL && o->name; o++)
		if (o->required && DestinationOptionText(def, o->name) == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a destination of kind %s needs the option %s",
							def->kind, o->name)));
}

/*
 * ERROR (22023) unless the definition is usable by its kind.
 */
void
DestinationValidate(const DestinationDefinition *def)
{
	const DestinationRoutine *routine = GetDestinationRoutine(def->kind);

	/* the table allows kafka://, amqp:// and amqps:// too (their kinds check) */
	if (routine->build_request != NULL &&
		!DestinationMatches(def->url, "^https?://", true))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the url of destination \"%s\" must be an http:// or https:// URL",
						def->name),
				 errdetail("Destinations of kind %s are sent over HTTP.", def->kind)));
	options_check_keys(def, routine);

	DestinationCheckInteger(def, "circuit_threshold", 0, MAX_CIRCUIT_THRESHOLD,
							"0 turns the circuit breaker off.");
	DestinationCheckChoice(def, "ordering", ordering_choices);
	DestinationCheckChoice(def, "on_dead", on_dead_choices);

	if (routine->validate != NULL)
		routine->validate(def);
}
