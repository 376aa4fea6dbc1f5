/*-------------------------------------------------------------------------
 *
 * options.c
 *		  Helpers for the kinds' validate callbacks.
 *
 * The kinds check their values with these, so the same mistake is worded
 * the same way for every kind; like validate.c, no message shows a value.
 * Nothing here knows the registry: a kind's file uses them and
 * validate.c calls the kind, never the other way round.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/options.c
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
 * options ->> key: the value as text, NULL when the key is absent (or
 * null).  After step 3 the value has its key's type.
 */
const char *
DestinationOptionText(const DestinationDefinition *def, const char *key)
{
	return OutboxJsonbOption(def->options, key);
}

/*
 * value ~ pattern (or ~*), with PostgreSQL's regular expressions, so that a
 * check ported from SQL keeps its meaning.
 */
bool
DestinationMatches(const char *value, const char *pattern,
				   bool case_insensitive)
{
	return DatumGetBool(DirectFunctionCall2Coll(case_insensitive ?
												texticregexeq : textregexeq,
												C_COLLATION_OID,
												CStringGetTextDatum(value),
												CStringGetTextDatum(pattern)));
}

/*
 * The destination names a credentials row holding what the kind signs or
 * logs in with.  A name without a row is left to the foreign key, which
 * reports it showing only the name.
 */
void
DestinationRequireCredentials(const DestinationDefinition *def,
							  DestinationCredentialsNeed need)
{
	const DestinationCredentials *c = def->credentials;

	if (def->credentials_name == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a destination of kind %s needs credentials", def->kind),
				 errhint("Insert a row into outbox.credentials and name it in the credentials column.")));
	if (c == NULL)
		return;
	if (need == DEST_CREDENTIALS_AWS && c->aws_access_key_id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("credentials \"%s\" have no AWS access key", c->name),
				 errdetail("Destination \"%s\" of kind %s signs its requests with an AWS access key.",
						   def->name, def->kind),
				 errhint("Set aws_access_key_id and aws_secret_access_key in outbox.credentials.")));
	if (need == DEST_CREDENTIALS_BASIC && c->username == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("credentials \"%s\" have no user name and password", c->name),
				 errdetail("Destination \"%s\" of kind %s logs in with a user name and password.",
						   def->name, def->kind),
				 errhint("Set username and password in outbox.credentials.")));
}

/* The option, when set, is one of choices (a NULL-terminated list). */
void
DestinationCheckChoice(const DestinationDefinition *def, const char *key,
					   const char *const *choices)
{
	const char *value = DestinationOptionText(def, key);
	StringInfoData list;
	int			n = 0;

	if (value == NULL)
		return;
	for (const char *const *c = choices; *c; c++, n++)
		if (strcmp(value, *c) == 0)
			return;

	/* "a, b or c" */
	initStringInfo(&list);
	for (int i = 0; i < n; i++)
		appendStringInfo(&list, "%s%s",
						 i == 0 ? "" : (i == n - 1 ? " or " : ", "), choices[i]);
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("option %s must be %s", key, list.data),
			 errdetail("Destination \"%s\" sets another value.", def->name)));
}

/*
 * The option, when set, is an integer from min to max written as one (no
 * fraction, no exponent that leaves one): what the relay reads is then
 * what was meant.
 */
void
DestinationCheckInteger(const DestinationDefinition *def, const char *key,
						int min, int max, const char *hint)
{
	const char *value = DestinationOptionText(def, key);
	const char *p;
	long		n;

	if (value == NULL)
		return;
	p = value + (value[0] == '-');
	if (*p == '\0' || strspn(p, "0123456789") != strlen(p) || strlen(p) > 9 ||
		(n = strtol(value, NULL, 10)) < min || n > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option %s must be an integer from %d to %d", key, min, max),
				 errdetail("Destination \"%s\" sets another value.", def->name),
				 hint ? errhint("%s", hint) : 0));
}

/*
 * The url has no query string.  libcurl 7.88 signs a query string unsorted
 * (see aws.c), and the management API takes none: every parameter goes in
 * the body.
 */
void
DestinationCheckNoQuery(const DestinationDefinition *def, const char *hint)
{
	if (strchr(def->url, '?') != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the url of destination \"%s\" must not have a query string",
						def->name),
				 errdetail("Destinations of kind %s send every parameter in the request body.",
						   def->kind),
				 hint ? errhint("%s", hint) : 0));
}

/*
 * The AMQP routing key of a message (kinds rabbitmq and amqp): the
 * template with {type}, {aggregate_id} (empty when none) and
 * {destination} replaced, palloc'd.
 */
char *
DestinationRoutingKey(const char *template, const OutboxMessage *msg)
{
	StringInfoData out;
	const char *p = template;

	initStringInfo(&out);
	while (*p)
	{
		if (strncmp(p, "{type}", 6) == 0)
		{
			appendStringInfoString(&out, msg->type);
			p += 6;
		}
		else if (strncmp(p, "{aggregate_id}", 14) == 0)
		{
			appendStringInfoString(&out, msg->aggregate_id ? msg->aggregate_id : "");
			p += 14;
		}
		else if (strncmp(p, "{destination}", 13) == 0)
		{
			appendStringInfoString(&out, msg->destination);
			p += 13;
		}
		else
			appendStringInfoChar(&out, *p++);
	}
	return out.data;
}

/*
 * The routing options the RabbitMQ kinds share: routing_key (a template
 * of at most 255 bytes, the limit of an AMQP short string) and unroutable
 * (retry or dead).  ERROR 22023.
 */
void
DestinationCheckRouting(const DestinationDefinition *def)
{
	static const char *const unroutable_choices[] = {"retry", "dead", NULL};
	const char *routing_key = DestinationOptionText(def, "routing_key");

	DestinationCheckChoice(def, "unroutable", unroutable_choices);
	if (routing_key != NULL && strlen(routing_key) > 255)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option routing_key is longer than 255 bytes"),
				 errdetail("AMQP routing keys have at most 255 bytes.")));
}
