/*-------------------------------------------------------------------------
 *
 * routing.c
 *		  Per-backend cache of the outbox tables and the routing configuration.
 *
 * outbox.emit() must cost about as much as a plain INSERT, so it cannot
 * look up its tables by name or scan outbox.routes on every call.  This
 * file keeps, per backend, the OIDs of the extension's tables, the sorted
 * list of destination names and the routes in match order.
 *
 * Cache invalidation: DML does not send relcache invalidations by itself,
 * so outbox.destinations and outbox.routes carry a statement-level trigger
 * (outbox._config_changed) that sends one for the modified table.  The
 * message is transactional: other backends see it once the change commits,
 * the modifying backend at its next command.  Our relcache callback marks
 * the cache stale when it hears about any of our tables (or a full reset);
 * DROP EXTENSION and re-creation are covered the same way, since dropping
 * a table invalidates its relcache entry.  A generation counter makes a
 * reload that raced with an invalidation count as stale.
 *
 * Routing: a route maps an event-type pattern to a destination.  Patterns
 * are literal text where '*' matches any run of characters (dots
 * included).  Routes are tried by ascending priority, then longest pattern
 * first, then by pattern text; the first match wins.  An event whose type
 * matches nothing is stored without a destination and reported as
 * unrouted; it is never dropped.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/api/routing.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "outbox_pg.h"
#include "util.h"
#include "api/api.h"

typedef struct OutboxRoute
{
	char	   *pattern;
	char	   *destination;
	int			priority;
} OutboxRoute;

static MemoryContext config_context = NULL;
static OutboxConfig config;
static bool config_valid = false;
static uint64 config_generation = 0;

static const char *const event_column_names[EV_NATTS + 1] = {
	NULL,
	"id",
	"type",
	"aggregate_type",
	"aggregate_id",
	"payload",
	"headers",
	"traceparent",
	"destination",
	"status",
	"attempts",
	"next_attempt_at",
	"created_at",
	"published_at",
	"last_status",
	"last_error",
	"leased_until",
	"ordering_key"
};

const char *const OutboxLogColumnNames[LOG_NATTS + 1] = {
	NULL,
	"id",
	"xid",
	"type",
	"aggregate_type",
	"aggregate_id",
	"payload",
	"headers",
	"traceparent",
	"destination",
	"ordering_key",
	"not_before",
	"created_at"
};

static OutboxRoute *routes = NULL;
static int	nroutes = 0;
static char **destination_names = NULL;
static int	ndestinations = 0;
/* destinations with options.ordering = 'aggregate' (see ordering.c) */
static char **ordered_names = NULL;
static int	nordered = 0;

static void config_invalidate_callback(Datum arg, Oid relid);
static Oid	config_relid(Oid nspid, const char *relname);
static bool config_has_live_column(Oid relid, AttrNumber attnum);
static AttrNumber config_attnum(Relation rel, const char *attname);
static int	route_compare(const void *a, const void *b);
static int	name_compare(const void *a, const void *b);
static bool config_option_is(Datum options, bool isnull, const char *key,
							 const char *value);
static void config_load(void);
static void config_reset(void);
static void config_find_tables(void);
static void config_check_event_columns(void);
static void config_load_destinations(Snapshot snapshot);
static void config_load_routes(Snapshot snapshot);
static void config_load_rotation(Snapshot snapshot);

PG_FUNCTION_INFO_V1(outbox_config_changed);
PG_FUNCTION_INFO_V1(outbox_route);

static void
config_invalidate_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) ||
		relid == config.events_relid ||
		relid == config.destinations_relid ||
		relid == config.routes_relid ||
		relid == config.claims_relid ||
		relid == config.messages_relid ||
		relid == config.messages_seq_relid ||
		(OidIsValid(relid) && relid == config.rotation_relid) ||
		(OidIsValid(relid) && (relid == config.log_relids[0] ||
							   relid == config.log_relids[1] ||
							   relid == config.log_relids[2])))
	{
		config_valid = false;
		config_generation++;
	}
}

void
OutboxConfigInit(void)
{
	CacheRegisterRelcacheCallback(config_invalidate_callback, (Datum) 0);
}

static Oid
config_relid(Oid nspid, const char *relname)
{
	Oid			relid = get_relname_relid(relname, nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" does not exist", OUTBOX_SCHEMA, relname),
				 errhint("Run CREATE EXTENSION outbox_pg in this database.")));
	return relid;
}

/* Has the table a column, not dropped, at attnum or after it? */
static bool
config_has_live_column(Oid relid, AttrNumber attnum)
{
	for (;; attnum++)
	{
		HeapTuple	tup = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relid),
										  Int16GetDatum(attnum));
		bool		dropped;

		if (!HeapTupleIsValid(tup))
			return false;
		dropped = ((Form_pg_attribute) GETSTRUCT(tup))->attisdropped;
		ReleaseSysCache(tup);
		if (!dropped)
			return true;
	}
}

static AttrNumber
config_attnum(Relation rel, const char *attname)
{
	AttrNumber	attnum = get_attnum(RelationGetRelid(rel), attname);

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of table \"%s\" does not exist",
						attname, RelationGetRelationName(rel)),
				 errhint("The outbox_pg library and its SQL objects do not match; run ALTER EXTENSION outbox_pg UPDATE.")));
	return attnum;
}

static int
route_compare(const void *a, const void *b)
{
	const OutboxRoute *ra = (const OutboxRoute *) a;
	const OutboxRoute *rb = (const OutboxRoute *) b;
	size_t		la = strlen(ra->pattern);
	size_t		lb = strlen(rb->pattern);

	if (ra->priority != rb->priority)
		return ra->priority < rb->priority ? -1 : 1;
	if (la != lb)
		return la > lb ? -1 : 1;
	return strcmp(ra->pattern, rb->pattern);
}

static int
name_compare(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Does the jsonb object options have the string value for key? */
static bool
config_option_is(Datum options, bool isnull, const char *key, const char *value)
{
	JsonbValue *v;

	if (isnull)
		return false;
	v = OutboxJsonbGet(&DatumGetJsonbP(options)->root, key);
	return v != NULL && v->type == jbvString &&
		v->val.string.len == strlen(value) &&
		memcmp(v->val.string.val, value, v->val.string.len) == 0;
}

/*
 * Read outbox.destinations and outbox.routes with the latest snapshot,
 * like a catalog, into config_context.  Runs with the caller's privileges
 * but reads the tables directly, so application roles need no SELECT on
 * them.
 */
static void
config_load(void)
{
	uint64		generation = config_generation;
	Snapshot	snapshot;

	config_reset();
	config_find_tables();
	config_check_event_columns();

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	config_load_destinations(snapshot);
	config_load_routes(snapshot);
	if (OidIsValid(config.rotation_relid))
		config_load_rotation(snapshot);
	UnregisterSnapshot(snapshot);

	/* an invalidation that arrived while we were reading wins */
	config_valid = (generation == config_generation);
}

/* Forget the cached configuration; config_context is emptied. */
static void
config_reset(void)
{
	if (config_context == NULL)
		config_context = AllocSetContextCreate(TopMemoryContext,
											   "outbox_pg configuration",
											   ALLOCSET_SMALL_SIZES);
	MemoryContextReset(config_context);
	routes = NULL;
	nroutes = 0;
	destination_names = NULL;
	ndestinations = 0;
	ordered_names = NULL;
	nordered = 0;
	memset(&config, 0, sizeof(config));
}

/*
 * The OIDs of the extension's tables.  inbox.messages and its sequence
 * came with 0.2.0 and may be missing (InvalidOid) until the extension is
 * updated; the update alters outbox.events, whose invalidation makes every
 * backend look again.
 */
static void
config_find_tables(void)
{
	Oid			nspid;

	nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
	if (!OidIsValid(nspid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("schema \"%s\" does not exist", OUTBOX_SCHEMA),
				 errhint("Run CREATE EXTENSION outbox_pg in this database.")));
	config.events_relid = config_relid(nspid, OUTBOX_EVENTS_TABLE);
	config.destinations_relid = config_relid(nspid, OUTBOX_DESTINATIONS_TABLE);
	config.routes_relid = config_relid(nspid, OUTBOX_ROUTES_TABLE);
	config.rotation_relid = get_relname_relid(OUTBOX_ROTATION_TABLE, nspid);
	for (int i = 0; i < OUTBOX_LOG_SLOTS; i++)
	{
		char		name[NAMEDATALEN];

		snprintf(name, sizeof(name), OUTBOX_LOG_SLOT_FORMAT, i);
		config.log_relids[i] = get_relname_relid(name, nspid);
	}
	nspid = get_namespace_oid(INBOX_SCHEMA, true);
	if (OidIsValid(nspid))
	{
		config.claims_relid = get_relname_relid(INBOX_CLAIMS_TABLE, nspid);
		config.messages_relid = get_relname_relid(INBOX_MESSAGES_TABLE, nspid);
		config.messages_seq_relid = get_relname_relid(INBOX_MESSAGES_SEQ, nspid);
		/* before ALTER EXTENSION UPDATE to 0.5.1 the table ends with seq */
		config.messages_natts =
			OidIsValid(config.messages_relid) &&
			get_attnum(config.messages_relid, "finished_attempts") == IM_FINISHED_ATTEMPTS ?
			IM_NATTS : IM_NATTS_0_5_0;
	}
	if (!OidIsValid(config.claims_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" does not exist", INBOX_SCHEMA, INBOX_CLAIMS_TABLE),
				 errhint("Run CREATE EXTENSION outbox_pg in this database.")));
}

/*
 * The columns must match the EV_* enum by position.  Between a library
 * upgrade and ALTER EXTENSION UPDATE the table may lack columns that
 * later versions appended; it is then a prefix of the enum, and emit()
 * writes only the columns it has (see worker/version.c).  The columns of
 * 0.1.0 are always there.
 */
static void
config_check_event_columns(void)
{
	for (int i = 1; i <= EV_NATTS; i++)
	{
		AttrNumber	attnum = get_attnum(config.events_relid,
										event_column_names[i]);

		if (attnum == InvalidAttrNumber && i > EV_LAST_ERROR &&
			!config_has_live_column(config.events_relid, i))
			break;
		config.events_natts = i;
		if (attnum != i)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" does not have the expected columns",
							OUTBOX_SCHEMA, OUTBOX_EVENTS_TABLE),
					 errdetail("Column %d should be \"%s\".",
							   i, event_column_names[i]),
					 errhint("The outbox_pg library and its SQL objects do not match; run ALTER EXTENSION outbox_pg UPDATE.")));
	}
}

/* destinations: sorted names, for bsearch, and the ordered ones apart */
static void
config_load_destinations(Snapshot snapshot)
{
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	att_name,
				att_options;
	int			allocated = 16;

	rel = table_open(config.destinations_relid, AccessShareLock);
	att_name = config_attnum(rel, "name");
	att_options = config_attnum(rel, "options");
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	destination_names = MemoryContextAlloc(config_context,
										   allocated * sizeof(char *));
	ordered_names = MemoryContextAlloc(config_context,
									   allocated * sizeof(char *));
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, att_name, &isnull);
		MemoryContext oldcxt;

		if (isnull)
			continue;
		if (ndestinations == allocated)
		{
			allocated *= 2;
			destination_names = repalloc(destination_names,
										 allocated * sizeof(char *));
			ordered_names = repalloc(ordered_names,
									 allocated * sizeof(char *));
		}
		oldcxt = MemoryContextSwitchTo(config_context);
		destination_names[ndestinations++] = TextDatumGetCString(d);
		MemoryContextSwitchTo(oldcxt);
		d = slot_getattr(slot, att_options, &isnull);
		if (config_option_is(d, isnull, "ordering", "aggregate"))
			ordered_names[nordered++] = destination_names[ndestinations - 1];
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, AccessShareLock);
	qsort(destination_names, ndestinations, sizeof(char *), name_compare);
	qsort(ordered_names, nordered, sizeof(char *), name_compare);
}

/* routes: in match order */
static void
config_load_routes(Snapshot snapshot)
{
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	att_pattern,
				att_destination,
				att_priority;
	int			allocated = 16;

	rel = table_open(config.routes_relid, AccessShareLock);
	att_pattern = config_attnum(rel, "pattern");
	att_destination = config_attnum(rel, "destination");
	att_priority = config_attnum(rel, "priority");
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	routes = MemoryContextAlloc(config_context,
								allocated * sizeof(OutboxRoute));
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		null1,
					null2,
					null3;
		Datum		pattern = slot_getattr(slot, att_pattern, &null1);
		Datum		dest = slot_getattr(slot, att_destination, &null2);
		Datum		prio = slot_getattr(slot, att_priority, &null3);
		MemoryContext oldcxt;

		if (null1 || null2)
			continue;
		if (nroutes == allocated)
		{
			allocated *= 2;
			routes = repalloc(routes, allocated * sizeof(OutboxRoute));
		}
		oldcxt = MemoryContextSwitchTo(config_context);
		routes[nroutes].pattern = TextDatumGetCString(pattern);
		routes[nroutes].destination = TextDatumGetCString(dest);
		routes[nroutes].priority = null3 ? 0 : DatumGetInt32(prio);
		MemoryContextSwitchTo(oldcxt);
		nroutes++;
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, AccessShareLock);
	qsort(routes, nroutes, sizeof(OutboxRoute), route_compare);
}

const OutboxConfig *
OutboxGetConfig(void)
{
	if (!config_valid)
		config_load();
	return &config;
}

bool
OutboxDestinationExists(const char *name)
{
	OutboxGetConfig();
	return bsearch(&name, destination_names, ndestinations,
				   sizeof(char *), name_compare) != NULL;
}

/* Is the destination ordered per aggregate (options.ordering)? */
bool
OutboxDestinationIsOrdered(const char *name)
{
	OutboxGetConfig();
	return bsearch(&name, ordered_names, nordered,
				   sizeof(char *), name_compare) != NULL;
}

/*
 * Glob match where '*' matches any run of characters, iteratively with a
 * single backtrack point (linear in practice, no recursion).
 */
bool
OutboxPatternMatches(const char *pattern, const char *text)
{
	const char *p = pattern;
	const char *t = text;
	const char *star = NULL;
	const char *resume = NULL;

	while (*t)
	{
		if (*p == '*')
		{
			star = p++;
			resume = t;
		}
		else if (*p == *t)
		{
			p++;
			t++;
		}
		else if (star)
		{
			p = star + 1;
			t = ++resume;
		}
		else
			return false;
	}
	while (*p == '*')
		p++;
	return *p == '\0';
}

const char *
OutboxRouteEventType(const char *type)
{
	OutboxGetConfig();
	for (int i = 0; i < nroutes; i++)
	{
		if (OutboxPatternMatches(routes[i].pattern, type))
			return routes[i].destination;
	}
	return NULL;
}

/*
 * The insert-only store (issue #21): the slot of outbox.log_N that emit()
 * inserts into, from outbox.rotation (one row; its statement trigger
 * invalidates this cache when the rotation switches).  Every slot must
 * have the LOG_* columns in order.  A backend that has not yet seen a
 * switch keeps inserting into the slot before it; that is harmless: the
 * claims read every slot, and retention truncates a slot only under its
 * ACCESS EXCLUSIVE lock after checking that every row in it is
 * acknowledged (see README.store, section 3.1, retention).
 */
static void
config_load_rotation(Snapshot snapshot)
{
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	att_slot;
	int			current = -1;

	for (int s = 0; s < OUTBOX_LOG_SLOTS; s++)
	{
		if (!OidIsValid(config.log_relids[s]))
			return;
		for (int i = 1; i <= LOG_NATTS; i++)
			if (get_attnum(config.log_relids[s], OutboxLogColumnNames[i]) != i)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("table \"%s.%s\" does not have the expected columns",
								OUTBOX_SCHEMA, get_rel_name(config.log_relids[s])),
						 errdetail("Column %d should be \"%s\".",
								   i, OutboxLogColumnNames[i]),
						 errhint("The outbox_pg library and its SQL objects do not match; run ALTER EXTENSION outbox_pg UPDATE.")));
	}

	rel = table_open(config.rotation_relid, AccessShareLock);
	att_slot = config_attnum(rel, "slot");
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	if (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		value = slot_getattr(slot, att_slot, &isnull);

		if (!isnull)
			current = DatumGetInt16(value);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, AccessShareLock);
	if (current >= 0 && current < OUTBOX_LOG_SLOTS)
		config.log_relid = config.log_relids[current];
}

/*
 * outbox._config_changed() — statement trigger on the configuration tables.
 */
Datum
outbox_config_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox._config_changed() must be called as a trigger")));

	/*
	 * The 0.4.0 objects delete a destination's stream with the destination
	 * (a foreign key): its pending events would show as published if the
	 * name were created again, and never be sent.  This library keeps the
	 * stream once the 0.5.0 objects are installed; until then (the window
	 * between a new library and ALTER EXTENSION ... UPDATE) such a delete
	 * is refused.  After the foreign key's cascade, before the commit.
	 */
	if ((TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) ||
		 TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event)) &&
		strcmp(RelationGetRelationName(trigdata->tg_relation), "destinations") == 0)
	{
		char	   *version = OutboxInstalledVersion();

		if (version != NULL && strcmp(version, "0.4.0") == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot delete destinations while extension outbox_pg is at version 0.4.0"),
					 errdetail("Version 0.4.0 deletes a destination's claim position with it, and the pending events of a destination created again under the same name would never be sent."),
					 errhint("Run ALTER EXTENSION outbox_pg UPDATE first.")));
	}

	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	/* and the relays reload their destinations once this commits (wake.c) */
	OutboxConfigChangedAtCommit();
	PG_RETURN_POINTER(NULL);
}

/*
 * outbox.route(type text) returns text — the destination an event of this
 * type would be routed to, or NULL.
 */
Datum
outbox_route(PG_FUNCTION_ARGS)
{
	char	   *type = text_to_cstring(PG_GETARG_TEXT_PP(0));
	const char *dest = OutboxRouteEventType(type);

	if (dest == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(dest));
}
