/*-------------------------------------------------------------------------
 *
 * guc.c
 *		  Configuration parameters of outbox_pg.
 *
 * Every parameter lives under the reserved "outbox." prefix.  Limits that
 * protect the server (payload size, the retention floor) can only be
 * changed by superusers, so an application role cannot talk its way past
 * them with SET.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/guc.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#include "outbox_pg.h"
#include "util.h"
#include "guc.h"
#include "api/api.h"
#include "destination/http.h"

int			outbox_max_payload_size = 1024 * 1024;
int			outbox_claim_retention = 7 * SECS_PER_DAY;
int			outbox_redelivery_window = SECS_PER_DAY;
char	   *outbox_traceparent = NULL;
char	   *outbox_databases = NULL;
int			outbox_workers_per_database = 1;
int			outbox_max_destinations = 4096;
int			outbox_poll_interval = 1000;
int			outbox_batch_size = 200;
int			outbox_max_response_size = 64 * 1024;
int			outbox_max_connections_per_worker = 512;
EgressList *outbox_allowed_hosts_list = NULL;
char	   *outbox_ca_file = NULL;
int			outbox_discovery_interval = 10;
int			outbox_lease_margin = 10000;
int			outbox_circuit_max_pause = 2000;
int			outbox_retention = 3600;
int			outbox_retention_batch = 5000;

/* operability thresholds (see ops.c and outbox.health()) */
int			outbox_pending_age_warning = 300;
int			outbox_inbox_retention = 7 * SECS_PER_DAY;
int			outbox_inbox_handler_timeout = 60000;

/*
 * Read through the GUC machinery only: outbox.health() reads the
 * thresholds with current_setting(), the relay the parsed allow-list.
 */
static char *outbox_allowed_hosts = NULL;
static int	outbox_pending_age_critical = 1800;
static int	outbox_dead_letters_warning = 1;
static int	outbox_dead_letters_critical = 0;

static bool guc_check_traceparent(char **newval, void **extra, GucSource source);
static bool guc_check_databases(char **newval, void **extra, GucSource source);
static bool guc_check_allowed_hosts(char **newval, void **extra, GucSource source);
static void guc_assign_allowed_hosts(const char *newval, void *extra);
static void define_backend_gucs(void);
static void define_relay_gucs(void);
static void define_transport_gucs(void);
static void define_timing_gucs(void);
static void define_retention_gucs(void);
static void define_health_gucs(void);
static void define_inbox_gucs(void);

static bool
guc_check_traceparent(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (!OutboxTraceparentIsValid(*newval))
	{
		GUC_check_errdetail("A traceparent has the form \"00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>\" in lower case.");
		return false;
	}
	return true;
}

/*
 * outbox.databases is checked here, so a value the launcher could not split
 * into names is refused when it is set (ALTER SYSTEM, SET in a session, a
 * reload) and the relayed databases stay as they were.  Not at server
 * start: refusing it there would put the default, "*", in its place and
 * relay every database the operator meant to exclude; the launcher relays
 * none instead and says why (launcher.c).
 */
static bool
guc_check_databases(char **newval, void **extra, GucSource source)
{
	char	   *raw;
	List	   *names = NIL;
	bool		ok;

	if (*newval == NULL || strcmp(*newval, "*") == 0)
		return true;
	if (process_shared_preload_libraries_in_progress)
		return true;
	raw = pstrdup(*newval);
	ok = SplitIdentifierString(raw, ',', &names);
	list_free(names);
	pfree(raw);
	if (!ok)
	{
		GUC_check_errmsg("invalid list syntax in outbox.databases");
		GUC_check_errhint("Use a comma-separated list of database names, or *.");
	}
	return ok;
}

/*
 * outbox.allowed_hosts is parsed here, once per change, so a bad entry is
 * refused when it is set and the relay (and curl's open-socket callback,
 * which may not allocate) only reads the parsed list.  The list is the
 * GUC's "extra": malloc'd, and freed by the GUC machinery.
 */
static bool
guc_check_allowed_hosts(char **newval, void **extra, GucSource source)
{
	char		errbuf[512];
	EgressList *list = EgressParseList(*newval, errbuf, sizeof(errbuf));

	if (list == NULL)
	{
		if (errbuf[0] == '\0')
		{
			GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
			GUC_check_errmsg("out of memory");
		}
		else
		{
			GUC_check_errdetail("%s.", errbuf);
			GUC_check_errhint("Entries are host names, \"*.\" followed by a domain, \"*\", IP addresses or CIDR blocks; names and addresses may end in \":port\" (IPv6 addresses in brackets then).");
		}
		return false;
	}

	/*
	 * The GUC machinery frees "extra" with guc_free: from PostgreSQL 16 on
	 * that is pfree of GUC memory, so the list moves into guc_malloc'd
	 * memory (plain malloc before 16, see compat.h).
	 */
	*extra = guc_malloc(LOG, EgressListSize(list));
	if (*extra != NULL)
		memcpy(*extra, list, EgressListSize(list));
	free(list);
	if (*extra == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		GUC_check_errmsg("out of memory");
		return false;
	}
	return true;
}

static void
guc_assign_allowed_hosts(const char *newval, void *extra)
{
	outbox_allowed_hosts_list = (EgressList *) extra;
}

/*
 * Define every parameter, group by group, then reserve the prefix.  Called
 * from _PG_init.
 */
void
OutboxDefineGucs(void)
{
	define_backend_gucs();
	define_relay_gucs();
	define_transport_gucs();
	define_timing_gucs();
	define_retention_gucs();
	define_health_gucs();
	define_inbox_gucs();

	MarkGUCPrefixReserved("outbox");
}

/* Settings read in application backends: outbox.emit() and inbox.claim(). */
static void
define_backend_gucs(void)
{
	DefineCustomIntVariable("outbox.max_payload_size",
							"Largest payload accepted by outbox.emit().",
							"Measured as the size of the jsonb value.",
							&outbox_max_payload_size,
							1024 * 1024,
							1024,
							MaxAllocSize / 2,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.claim_retention",
							"How long inbox.claim() remembers a message id when no ttl is given.",
							"Must not be shorter than outbox.redelivery_window.",
							&outbox_claim_retention,
							7 * SECS_PER_DAY,
							OUTBOX_MIN_CLAIM_TTL,
							OUTBOX_MAX_CLAIM_TTL,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.redelivery_window",
							"Longest time after which a broker or relay may still redeliver a message.",
							"inbox.claim() refuses retentions shorter than this; 0 disables the check.",
							&outbox_redelivery_window,
							SECS_PER_DAY,
							0,
							OUTBOX_MAX_CLAIM_TTL,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.traceparent",
							   "W3C traceparent recorded by outbox.emit() when no traceparent argument is given.",
							   "Meant to be set with SET LOCAL by tracing middleware.",
							   &outbox_traceparent,
							   "",
							   PGC_USERSET,
							   0,
							   guc_check_traceparent, NULL, NULL);
}

/*
 * Which databases are relayed, by how many workers, for how many
 * destinations, how often and in what batches (launcher.c, relay.c,
 * deststats.c).
 */
static void
define_relay_gucs(void)
{
	DefineCustomStringVariable("outbox.databases",
							   "Databases whose outbox is relayed.",
							   "A comma-separated list of database names, or * for every database that allows connections and has the extension.",
							   &outbox_databases,
							   "*",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   guc_check_databases, NULL, NULL);

	DefineCustomIntVariable("outbox.workers_per_database",
							"Relay workers started for each relayed database.",
							"They share the work through FOR UPDATE SKIP LOCKED.",
							&outbox_workers_per_database,
							1, 1, 16,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	/*
	 * Sizes shared memory at server start, so only the preloaded library
	 * may define it (PostgreSQL refuses PGC_POSTMASTER settings later);
	 * loaded on demand there are no relays and no such memory anyway.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("outbox.max_destinations",
								"Most destinations, of all databases together, whose runtime state shared memory holds.",
								"Each has its circuit breaker, its shared max_concurrency and its statistics there; a destination beyond this goes without them.",
								&outbox_max_destinations,
								4096, 64, 1000000,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.poll_interval",
							"Longest time a relay waits before looking for due events without being woken.",
							"Commits of outbox.emit() wake the relay at once; the poll is the safety net.",
							&outbox_poll_interval,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_size",
							"Most events one relay worker keeps in flight, over all destinations.",
							NULL,
							&outbox_batch_size,
							200, 1, 10000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/* What the relay may send to and read back (http.c, egress.c). */
static void
define_transport_gucs(void)
{
	DefineCustomIntVariable("outbox.max_response_size",
							"Largest response body the relay reads from a destination.",
							"A webhook's longer answer is read to its end and counts by its status; SNS, SQS and RabbitMQ's API fail the attempt.",
							&outbox_max_response_size,
							64 * 1024, 1024, 64 * 1024 * 1024,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_connections_per_worker",
							"Most HTTP connections one relay worker keeps open, in use or idle.",
							"Connections to a host follow the concurrency of its destinations up to this; each is a file descriptor of the worker.",
							&outbox_max_connections_per_worker,
							512, 1, 65536,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.allowed_hosts",
							   "Destination hosts the relay may connect to.",
							   "A comma-separated list of host names, *.domain wildcards, addresses and CIDR blocks, each with an optional port; empty allows any host. Link-local and cloud metadata addresses are refused unless listed as addresses.",
							   &outbox_allowed_hosts,
							   "",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   guc_check_allowed_hosts, guc_assign_allowed_hosts, NULL);

	DefineCustomStringVariable("outbox.ca_file",
							   "CA bundle used to verify destinations' TLS certificates.",
							   "Empty uses the system's default bundle.",
							   &outbox_ca_file,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);
}

/*
 * The launcher's discovery, the lease beyond a destination's timeout and
 * the shared circuit breaker of each destination (deststats.c).
 */
static void
define_timing_gucs(void)
{
	DefineCustomIntVariable("outbox.discovery_interval",
							"How often the launcher looks for databases to relay.",
							NULL,
							&outbox_discovery_interval,
							10, 1, 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.lease_margin",
							"Time a lease lasts beyond the destination's timeout.",
							"Events of a relay that died are sent again after timeout plus this margin.",
							&outbox_lease_margin,
							10000, 1000, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.circuit_max_pause",
							"Longest pause of an open circuit before the next probe of the destination.",
							"An open circuit pauses 1 s, doubling with every failed probe up to this; it also bounds how long a recovered destination waits for its first delivery.",
							&outbox_circuit_max_pause,
							2000, 100, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/*
 * Retention of published outbox events and processed inbox messages
 * (retention.c, inbox_process.c).
 */
static void
define_retention_gucs(void)
{
	DefineCustomIntVariable("outbox.retention",
							"How long acknowledged outbox events are kept: relay worker 0 of each database rotates the event log every half of it.",
							"-1 never rotates. Pending, retried and dead events are never removed by retention.",
							&outbox_retention,
							3600, -1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.inbox_retention",
							"How long processed inbox messages are kept before the worker deletes them.",
							"A redelivered message is recognised as a duplicate only while it is kept, so the worker never deletes before outbox.redelivery_window has passed, whatever this says.",
							&outbox_inbox_retention,
							7 * SECS_PER_DAY,
							OUTBOX_MIN_CLAIM_TTL,
							OUTBOX_MAX_CLAIM_TTL,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retention_batch",
							"Most published outbox events deleted in one retention transaction.",
							NULL,
							&outbox_retention_batch,
							5000, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/*
 * Operability: thresholds of outbox.health() and the relay's warnings
 * (ops.c).
 */
static void
define_health_gucs(void)
{
	DefineCustomIntVariable("outbox.pending_age_warning",
							"Age of the oldest pending event at which outbox.health() warns and the relay logs a WARNING.",
							"0 disables the check.",
							&outbox_pending_age_warning,
							300, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.pending_age_critical",
							"Age of the oldest pending event at which outbox.health() reports critical.",
							"0 disables the check.",
							&outbox_pending_age_critical,
							1800, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.dead_letters_warning",
							"Dead letters in the database at which outbox.health() warns.",
							"0 disables the check.",
							&outbox_dead_letters_warning,
							1, 0, INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.dead_letters_critical",
							"Dead letters in the database at which outbox.health() reports critical.",
							"0 disables the check.",
							&outbox_dead_letters_critical,
							0, 0, INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/* The worker's run of inbox handlers (inbox_process.c). */
static void
define_inbox_gucs(void)
{
	DefineCustomIntVariable("outbox.inbox_handler_timeout",
							"Longest time one inbox handler call may run.",
							"A call that runs longer is cancelled and counts as a failed attempt; 0 disables the limit.",
							&outbox_inbox_handler_timeout,
							60000, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}
