/*-------------------------------------------------------------------------
 *
 * kafka.c
 *		  Apache Kafka destinations through librdkafka: the first kind on
 *		  the native-client transport (destination.h).
 *
 * Definition: url is "kafka://host:port[,host:port...]", the bootstrap
 * servers (the port is required: there is no default worth guessing);
 * options.topic names the topic.  The other options are listed with
 * kafka_options below; the librdkafka properties a destination may set
 * are the short allow-list kafka_properties, each with its bounds, and
 * anything else is refused by validation (22023) like any unknown option.
 * What the relay's guarantees rest on is not configurable: acks=all,
 * enable.idempotence=true, message.timeout.ms = the destination's
 * timeout_ms, and the bootstrap servers, TLS and SASL settings.
 *
 * Message: value = the payload's JSON text; key = the aggregate id
 * (options.key = 'none': no key, so the partitioner spreads them);
 * headers message_id, type, content_type (application/json), time,
 * destination, and aggregate_id and traceparent when present, then the
 * per-event headers; a per-event header with the name of one of the
 * relay's own is left out, so consumers can trust those.  With
 * options.cloudevents = true the record is also a CloudEvents 1.0 event in
 * the Kafka protocol binding's binary mode: headers ce_specversion, ce_id,
 * ce_source (options.source, by default urn:outbox_pg:<database>, as for
 * webhooks), ce_type, ce_time, ce_subject (the aggregate id) and
 * ce_traceparent when present, and content-type (datacontenttype).
 *
 * Producers.  One per relay process and destination, kept in process
 * memory (malloc) across lease steps and found again by name and by the
 * whole configuration it was made with: load returns a target pointing at
 * the producer, and a changed configuration makes a new producer while
 * the old one lives on until the last target using it (its events still
 * in flight) is gone.  A producer that raised a fatal error (idempotence
 * lost; librdkafka refuses every later produce) is logged and not found
 * again: kafka_poll() asks the relay to load its destinations again
 * (DestinationReloadWanted), and that load, at the next lease step, makes
 * a new one; after 1 s, 2 s, ... up to a minute when producers keep going
 * fatal.  Until 0.4 the next load came with the configuration cache's
 * safety net, 10 s or more later (minutes with thousands of
 * destinations), and every retry meanwhile failed at once.
 *
 * Threads.  librdkafka's own threads never run our code, except the
 * connect callback, which checks the address against the producer's own
 * copy of outbox.allowed_hosts (EgressCheckAddress allocates nothing and
 * reads only that copy) and connects.  Delivery reports, errors and logs
 * are served on the producer's main queue by rd_kafka_poll(), called from
 * kafka_poll() in the relay's thread; their callbacks copy what they need
 * into the producer's malloc'd arrays, sized before every produce so a
 * callback never allocates, and never ereport.  The main queue writes a
 * byte to the producer's pipe when it becomes non-empty
 * (rd_kafka_queue_io_event_enable); the pipe is what wait_events() hands
 * the relay's WaitEventSet, and kafka_poll() drains it before it polls.
 *
 * Outcomes (one per message, from its delivery report, mapped back by the
 * event's token passed as the message's opaque):
 *	- no error: acknowledged.  librdkafka reports success only once the
 *	  message is in the in-sync replicas (acks=all);
 *	- a message librdkafka refused itself (invalid): dead-lettered; one
 *	  larger than message.max.bytes is dead-lettered before it is produced;
 *	- a record batch the broker refused (too large for the topic, an
 *	  invalid or corrupt record): every message of the batch has the error,
 *	  so each is retried and charged an attempt, the destination not failed
 *	  (the one at fault runs out of attempts, the others go in other
 *	  batches);
 *	- configuration (unknown or invalid topic, authorization, SASL or TLS
 *	  failures, fatal idempotence errors): retried, and the destination
 *	  failed (its circuit breaker counts it);
 *	- anything else (timeouts, brokers down, not enough replicas, a queue
 *	  purged): retried, the destination failed.
 * A produce that fails at once is reported the same way through the next
 * poll; a full local queue takes nothing (start returns 0: back-pressure).
 *
 * Ordering: one producer per destination in a relay, idempotent (so at
 * most 5 requests in flight per partition, retried in order), messages
 * produced in the order delivery hands them over, and the key puts an
 * aggregate's events on one partition.  The relay holds an ordered
 * destination's later events of an aggregate until the earlier one is
 * acknowledged (delivery.c), so reordering by a retry cannot cross them.
 *
 * Secrets: the password goes to librdkafka's configuration only; no
 * message shows a property's value, and what a broker or librdkafka says
 * is recorded by the relay through peertext.c, which redacts the
 * credentials.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/kafka.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/stringinfo.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "outbox_pg.h"
#include "guc.h"
#include "peertext.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"

#define KAFKA_URL_PREFIX		"kafka://"
#define KAFKA_MAX_BOOTSTRAP		16
#define KAFKA_ERROR_SIZE		256
#define KAFKA_LOG_INTERVAL_MS	60000
#define KAFKA_DEFAULT_MAX_BYTES 1000000
#define KAFKA_FATAL_DELAY_MAX_MS	60000	/* replacing producers that keep failing */

/* One delivery report, or an immediate failure of a produce. */
typedef struct KafkaReport
{
	void	   *token;
	rd_kafka_resp_err_t err;
	const char *text;			/* our own reason (egress refusal), or NULL */
	bool		at_produce;		/* the produce call failed: the message's own */
} KafkaReport;

/*
 * One producer: malloc'd, process lifetime (see the file header).  Only
 * the relay's thread touches it, but for the egress copy the connect
 * callback reads.
 */
typedef struct KafkaProducer
{
	struct KafkaProducer *next;
	char	   *name;			/* destination */
	char	   *fingerprint;	/* the whole configuration it was made with */
	rd_kafka_t *rk;
	rd_kafka_queue_t *mainq;
	int			pipefd[2];		/* the main queue's wake-up */
	int			users;			/* targets pointing at it */
	int			outstanding;	/* produced, not yet handed to delivery */
	bool		fatal;			/* raised a fatal error: not found again */
	bool		fatal_logged;	/* ... and it was logged, a reload asked for */
	KafkaReport *reports;		/* completed, not yet handed to delivery */
	int			nreports;
	int			capacity;		/* >= outstanding: callbacks never allocate */
	EgressList *egress;			/* copy of outbox.allowed_hosts; NULL: none */
	bool		egress_by_name; /* the bootstrap hosts were allowed by name */
	volatile bool egress_refused;	/* a connection was refused */
	char		last_error[KAFKA_ERROR_SIZE];	/* from the error callback */
	int			timeout_ms;		/* message.timeout.ms */
	TimestampTz heard_at;		/* last report, or first produce since none
								 * was outstanding: see kafka_poll() */
	TimestampTz logged_at;		/* last librdkafka line logged at LOG */
	char		log_line[KAFKA_ERROR_SIZE]; /* to log after the poll */
} KafkaProducer;

/* One Kafka destination, as load read it (in the loaded destination). */
typedef struct KafkaTarget
{
	const char *name;
	KafkaProducer *producer;
	char	   *topic;
	bool		keyed;			/* key = aggregate id */
	int			max_bytes;		/* message.max.bytes */
	const char *refused;		/* bootstrap host refused by the allow-list */
	const char *ce_source;		/* CloudEvents binary mode; NULL: off */
	MemoryContextCallback release;
} KafkaTarget;

/* A librdkafka property a destination may set, with its bounds. */
typedef struct KafkaProperty
{
	const char *option;			/* the key in options (the property's name) */
	DestinationOptionType type;
	int			min;			/* numbers */
	int			max;
	const char *const *choices; /* strings: the values allowed */
} KafkaProperty;

static const char *const compression_choices[] =
{"none", "gzip", "snappy", "lz4", "zstd", NULL};
static const char *const partitioner_choices[] =
{"consistent_random", "murmur2_random", "murmur2", "fnv1a_random", "fnv1a", "random", NULL};
static const char *const address_family_choices[] = {"any", "v4", "v6", NULL};
static const char *const key_choices[] = {"aggregate_id", "none", NULL};
static const char *const sasl_choices[] =
{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", NULL};
static const char *const endpoint_choices[] = {"https", "none", NULL};

/*
 * The allow-list: properties that tune throughput or connections, never
 * what acknowledgement or ordering means.
 */
static const KafkaProperty kafka_properties[] =
{
	{"compression.type", DEST_OPTION_STRING, 0, 0, compression_choices},
	{"linger.ms", DEST_OPTION_NUMBER, 0, 1000, NULL},
	{"batch.num.messages", DEST_OPTION_NUMBER, 1, 100000, NULL},
	{"batch.size", DEST_OPTION_NUMBER, 1000, 100000000, NULL},
	{"queue.buffering.max.messages", DEST_OPTION_NUMBER, 1, 10000000, NULL},
	{"message.max.bytes", DEST_OPTION_NUMBER, 1000, 100000000, NULL},
	{"client.id", DEST_OPTION_STRING, 0, 0, NULL},
	{"partitioner", DEST_OPTION_STRING, 0, 0, partitioner_choices},
	{"broker.address.family", DEST_OPTION_STRING, 0, 0, address_family_choices},
	{"socket.keepalive.enable", DEST_OPTION_BOOLEAN, 0, 0, NULL},
	{"reconnect.backoff.ms", DEST_OPTION_NUMBER, 0, 3600000, NULL},
	{"reconnect.backoff.max.ms", DEST_OPTION_NUMBER, 0, 3600000, NULL},
	{"retry.backoff.ms", DEST_OPTION_NUMBER, 1, 300000, NULL},
	{"topic.metadata.refresh.interval.ms", DEST_OPTION_NUMBER, 1000, 3600000, NULL},
	{"ssl.endpoint.identification.algorithm", DEST_OPTION_STRING, 0, 0, endpoint_choices},
	{NULL}
};

/* The headers the relay sets itself; a per-event header cannot replace them. */
static const char *const own_headers[] = {
	"message_id", "type", "content_type", "time", "destination",
	"aggregate_id", "traceparent", "content-type", "ce_specversion",
	"ce_id", "ce_source", "ce_type", "ce_time", "ce_subject",
	"ce_traceparent"
};

static KafkaProducer *producers = NULL;
static pthread_t relay_thread;
static bool relay_thread_known = false;

static bool kafka_in_relay_thread(void);

/* fatal errors in a row, each within twice the longest delay of the last */
static int	kafka_fatal_streak = 0;
static TimestampTz kafka_fatal_at = 0;

/* ---- parsing the url ---- */

/*
 * Split "kafka://h1:p1,h2:p2" into host and port strings (palloc'd); NULL
 * and the reason in *why when it is not a list of host:port.  IPv6
 * addresses are written in brackets ("[::1]:9092").
 */
static bool
kafka_parse_url(const char *url, char **hosts, int *ports, int *n,
				const char **why)
{
	const char *p;

	*n = 0;
	if (pg_strncasecmp(url, KAFKA_URL_PREFIX, strlen(KAFKA_URL_PREFIX)) != 0)
	{
		*why = "it does not start with kafka://";
		return false;
	}
	p = url + strlen(KAFKA_URL_PREFIX);
	for (;;)
	{
		const char *end = strchr(p, ',');
		size_t		len = end ? (size_t) (end - p) : strlen(p);
		const char *colon;
		const char *host_end;
		char	   *host;
		long		port;
		char	   *endptr;

		if (*n >= KAFKA_MAX_BOOTSTRAP)
		{
			*why = "it names more than 16 bootstrap servers";
			return false;
		}
		if (len > 0 && p[len - 1] == '/' && end == NULL)
			len--;				/* one trailing slash is harmless */
		if (len == 0)
		{
			*why = "a bootstrap server is empty";
			return false;
		}
		if (p[0] == '[')
		{
			host_end = memchr(p, ']', len);
			if (host_end == NULL || host_end + 1 >= p + len || host_end[1] != ':')
			{
				*why = "a bootstrap server is not host:port";
				return false;
			}
			host = pnstrdup(p + 1, host_end - p - 1);
			colon = host_end + 1;
		}
		else
		{
			colon = NULL;
			for (const char *c = p; c < p + len; c++)
				if (*c == ':')
					colon = c;
			if (colon == NULL || colon == p)
			{
				*why = "a bootstrap server is not host:port";
				return false;
			}
			host = pnstrdup(p, colon - p);
		}
		for (const char *c = host; *c; c++)
		{
			if (!(isalnum((unsigned char) *c) || *c == '.' || *c == '-' ||
				  *c == '_' || (*c == ':' && p[0] == '[')))
			{
				*why = "a bootstrap server's host has characters a host name cannot have";
				return false;
			}
		}
		if (host[0] == '\0')
		{
			*why = "a bootstrap server's host is empty";
			return false;
		}
		{
			char	   *portstr = pnstrdup(colon + 1, p + len - colon - 1);

			errno = 0;
			port = strtol(portstr, &endptr, 10);
			if (portstr[0] == '\0' || *endptr != '\0' || errno != 0 ||
				port < 1 || port > 65535)
			{
				*why = "a bootstrap server's port is not a number from 1 to 65535";
				return false;
			}
		}
		hosts[*n] = host;
		ports[*n] = (int) port;
		(*n)++;
		if (end == NULL)
			break;
		p = end + 1;
	}
	return true;
}

/* "h1:p1,[::1]:p2": bootstrap.servers for librdkafka */
static char *
kafka_bootstrap(char **hosts, int *ports, int n)
{
	StringInfoData buf;

	initStringInfo(&buf);
	for (int i = 0; i < n; i++)
	{
		bool		v6 = strchr(hosts[i], ':') != NULL;

		appendStringInfo(&buf, "%s%s%s%s:%d", i > 0 ? "," : "",
						 v6 ? "[" : "", hosts[i], v6 ? "]" : "", ports[i]);
	}
	return buf.data;
}

/* ---- callbacks (see "Threads" above: they never allocate or ereport) ---- */

/* Delivery report: served by rd_kafka_poll() in the relay's thread. */
static void
kafka_dr_callback(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	KafkaProducer *p = (KafkaProducer *) opaque;
	KafkaReport *r;

	if (p->nreports >= p->capacity)
		return;					/* cannot happen: capacity >= outstanding */
	r = &p->reports[p->nreports++];
	r->token = msg->_private;
	r->err = msg->err;
	r->text = NULL;
	r->at_produce = false;
}

static void
kafka_error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	KafkaProducer *p = (KafkaProducer *) opaque;

	if (!kafka_in_relay_thread())
		return;
	if (err == RD_KAFKA_RESP_ERR__FATAL)
		p->fatal = true;
	snprintf(p->last_error, sizeof(p->last_error), "%s", reason);
}

/*
 * librdkafka's log lines come through the main queue (log.queue), so in
 * the relay's thread; a line logged before the queue was set may come
 * from another thread and is dropped.  Errors and warnings are kept for
 * kafka_poll() to log at LOG, at most one a minute per producer (a broker
 * that is down logs at every reconnect); the rest are dropped (their
 * substance reaches the events' last_error through the error callback).
 */
static void
kafka_log_callback(const rd_kafka_t *rk, int level, const char *fac,
				   const char *buf)
{
	KafkaProducer *p = (KafkaProducer *) rd_kafka_opaque(rk);
	TimestampTz now;

	if (!kafka_in_relay_thread() || p == NULL || level > 4)
		return;
	now = GetCurrentTimestamp();
	if (p->logged_at != 0 &&
		!OutboxTimePassed(p->logged_at, now, KAFKA_LOG_INTERVAL_MS))
		return;
	p->logged_at = now;
	snprintf(p->log_line, sizeof(p->log_line), "%s: %s", fac, buf);
}

/*
 * Connect a producer's socket, if outbox.allowed_hosts (the producer's
 * copy) allows the address.  Runs in librdkafka's broker threads.
 */
static int
kafka_connect_callback(int sockfd, const struct sockaddr *addr, int addrlen,
					   const char *id, void *opaque)
{
	KafkaProducer *p = (KafkaProducer *) opaque;
	char		errbuf[192];

	if (!EgressCheckAddress(p->egress, addr, p->egress_by_name,
							errbuf, sizeof(errbuf)))
	{
		p->egress_refused = true;
		return EACCES;
	}
	if (connect(sockfd, addr, addrlen) == -1 && errno != EINPROGRESS)
		return errno;
	return 0;
}

static bool
kafka_in_relay_thread(void)
{
	return relay_thread_known && pthread_equal(pthread_self(), relay_thread);
}

/* ---- producers ---- */

static void
kafka_destroy(KafkaProducer *p)
{
	KafkaProducer **link;

	for (link = &producers; *link != NULL; link = &(*link)->next)
	{
		if (*link == p)
		{
			*link = p->next;
			break;
		}
	}
	if (p->mainq != NULL)
	{
		rd_kafka_queue_io_event_enable(p->mainq, -1, NULL, 0);
		rd_kafka_queue_destroy(p->mainq);
	}
	if (p->rk != NULL)
	{
		/* nothing is outstanding: nothing waits to be flushed */
		rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_destroy(p->rk);
	}
	if (p->pipefd[0] >= 0)
		close(p->pipefd[0]);
	if (p->pipefd[1] >= 0)
		close(p->pipefd[1]);
	free(p->reports);
	free(p->egress);
	free(p->name);
	free(p->fingerprint);
	free(p);
}

/* A target's memory goes: the producer loses a user. */
static void
kafka_release(void *arg)
{
	KafkaTarget *t = (KafkaTarget *) arg;
	KafkaProducer *p = t->producer;

	t->producer = NULL;
	if (p != NULL && --p->users == 0 && p->outstanding == 0)
		kafka_destroy(p);
}

/*
 * A new producer with these properties (name=value pairs) for the
 * destination; ERROR when librdkafka refuses the configuration.
 */
static KafkaProducer *
kafka_create(const char *name, const char *fingerprint, List *props,
			 bool egress_by_name)
{
	KafkaProducer *p;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char		errstr[512];
	ListCell   *lc;
	static const char wake = 'k';

	if (!relay_thread_known)
	{
		relay_thread = pthread_self();
		relay_thread_known = true;
	}
	p = calloc(1, sizeof(KafkaProducer));
	if (p == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	p->pipefd[0] = p->pipefd[1] = -1;
	p->name = strdup(name);
	p->fingerprint = strdup(fingerprint);
	p->egress = EgressListCopy(outbox_allowed_hosts_list);
	p->egress_by_name = egress_by_name;
	p->capacity = 64;
	p->reports = malloc(p->capacity * sizeof(KafkaReport));
	if (p->name == NULL || p->fingerprint == NULL || p->reports == NULL ||
		(outbox_allowed_hosts_list != NULL && p->egress == NULL))
	{
		kafka_destroy(p);
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	}
	if (pipe2(p->pipefd, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		kafka_destroy(p);
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not create a pipe for a Kafka producer: %m")));
	}

	conf = rd_kafka_conf_new();
	for (lc = list_head(props); lc != NULL; lc = lnext(props, lc))
	{
		const char *key = lfirst(lc);

		lc = lnext(props, lc);
		if (rd_kafka_conf_set(conf, key, lfirst(lc), errstr, sizeof(errstr)) !=
			RD_KAFKA_CONF_OK)
		{
			rd_kafka_conf_destroy(conf);
			kafka_destroy(p);
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("librdkafka refused property %s of destination \"%s\"",
							key, name),
					 errdetail_internal("%s", errstr)));
		}
	}
	rd_kafka_conf_set_opaque(conf, p);
	rd_kafka_conf_set_dr_msg_cb(conf, kafka_dr_callback);
	rd_kafka_conf_set_error_cb(conf, kafka_error_callback);
	rd_kafka_conf_set_log_cb(conf, kafka_log_callback);
	rd_kafka_conf_set_connect_cb(conf, kafka_connect_callback);

	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		/* conf is still ours */
		rd_kafka_conf_destroy(conf);
		kafka_destroy(p);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("could not create a Kafka producer for destination \"%s\"",
						name),
				 errdetail_internal("%s", errstr)));
	}
	p->rk = rk;
	(void) rd_kafka_set_log_queue(rk, NULL);
	p->mainq = rd_kafka_queue_get_main(rk);
	rd_kafka_queue_io_event_enable(p->mainq, p->pipefd[1], &wake, 1);
	p->next = producers;
	producers = p;
	return p;
}

/* ---- the kind's callbacks ---- */

static void
kafka_prop(List **props, StringInfo fp, const char *name, const char *value)
{
	*props = lappend(*props, pstrdup(name));
	*props = lappend(*props, pstrdup(value));
	appendStringInfo(fp, "%s=%s\n", name, value);
}

/* The destination's bootstrap servers (kafka_parse_url), or ERROR 22023. */
static void
kafka_bootstrap_servers(const DestinationDefinition *def, char **hosts,
						int *ports, int *n)
{
	const char *why;

	if (!kafka_parse_url(def->url, hosts, ports, n, &why))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the url of destination \"%s\" is not a list of Kafka bootstrap servers",
						def->name),
				 errdetail("The url must be kafka://host:port[,host:port...]; %s.", why)));
}

static void *
kafka_load(const DestinationConfig *config)
{
	const DestinationDefinition *def = config->def;
	KafkaTarget *t = palloc0(sizeof(KafkaTarget));
	char	   *hosts[KAFKA_MAX_BOOTSTRAP];
	int			ports[KAFKA_MAX_BOOTSTRAP];
	int			n;
	const char *v;
	List	   *props = NIL;
	StringInfoData fp;
	bool		by_name = true;
	int			timeout_ms = Max(config->timeout_ms, 100);	/* message.timeout.ms */
	bool		tls;
	const DestinationCredentials *cred = def->credentials;
	KafkaProducer *p;

	kafka_bootstrap_servers(def, hosts, ports, &n);
	t->name = def->name;
	t->topic = pstrdup(OutboxJsonbOption(def->options, "topic"));
	v = OutboxJsonbOption(def->options, "key");
	t->keyed = (v == NULL || strcmp(v, "aggregate_id") == 0);
	v = OutboxJsonbOption(def->options, "message.max.bytes");
	t->max_bytes = v ? atoi(v) : KAFKA_DEFAULT_MAX_BYTES;
	v = OutboxJsonbOption(def->options, "cloudevents");
	if (v != NULL && strcmp(v, "true") == 0)
	{
		const char *source = OutboxJsonbOption(def->options, "source");

		t->ce_source = source ? pstrdup(source) :
			psprintf("urn:outbox_pg:%s", config->database);
	}

	/* the bootstrap hosts against outbox.allowed_hosts (egress.c) */
	for (int i = 0; i < n && t->refused == NULL; i++)
	{
		char		errbuf[256];
		bool		host_by_name;

		if (!EgressCheckHost(outbox_allowed_hosts_list, hosts[i], ports[i], &host_by_name,
							 errbuf, sizeof(errbuf)))
			t->refused = psprintf("bootstrap server refused: %s", errbuf);
		by_name &= host_by_name;
	}

	/*
	 * Refused: nothing is produced (kafka_start), and the producer, which
	 * still looks for its bootstrap servers, may connect only to addresses
	 * the list names.
	 */
	if (t->refused != NULL)
		by_name = false;

	/* what the relay's guarantees rest on */
	initStringInfo(&fp);
	kafka_prop(&props, &fp, "bootstrap.servers", kafka_bootstrap(hosts, ports, n));
	kafka_prop(&props, &fp, "acks", "all");
	kafka_prop(&props, &fp, "enable.idempotence", "true");
	kafka_prop(&props, &fp, "message.timeout.ms",
			   psprintf("%d", timeout_ms));
	kafka_prop(&props, &fp, "log.queue", "true");
	kafka_prop(&props, &fp, "client.id", "outbox_pg");
	/*
	 * No linger by default: the relay hands over a whole claim at once, so
	 * librdkafka batches it anyway (and what queues behind the requests in
	 * flight), while a linger adds to every message's time in flight, and
	 * the relay's window of max_concurrency events makes that its rate.
	 * Against the mock cluster with max_concurrency 1,000 and two workers,
	 * 5 ms gave 46,600-55,800 events/s, none 75,900-84,300.
	 */
	kafka_prop(&props, &fp, "linger.ms", "0");

	/* the allow-list, as set (validation checked every value) */
	for (const KafkaProperty *k = kafka_properties; k->option; k++)
	{
		v = OutboxJsonbOption(def->options, k->option);
		if (v == NULL)
			continue;
		if (strcmp(k->option, "linger.ms") == 0)	/* below the timeout */
			v = psprintf("%d", Min(atoi(v), timeout_ms / 2));
		kafka_prop(&props, &fp, k->option, v);
	}

	/* TLS and SASL */
	v = OutboxJsonbOption(def->options, "tls");
	tls = (v != NULL && strcmp(v, "true") == 0);
	if (cred != NULL && cred->username != NULL)
	{
		v = OutboxJsonbOption(def->options, "sasl_mechanism");
		kafka_prop(&props, &fp, "security.protocol", tls ? "sasl_ssl" : "sasl_plaintext");
		kafka_prop(&props, &fp, "sasl.mechanisms", v ? v : "PLAIN");
		kafka_prop(&props, &fp, "sasl.username", cred->username);
		kafka_prop(&props, &fp, "sasl.password", cred->password ? cred->password : "");
	}
	else
		kafka_prop(&props, &fp, "security.protocol", tls ? "ssl" : "plaintext");
	if (tls && outbox_ca_file != NULL && outbox_ca_file[0] != '\0')
		kafka_prop(&props, &fp, "ssl.ca.location", outbox_ca_file);
	/* a change of the allow-list makes a new producer (its copy) */
	appendStringInfo(&fp, "egress=%s\n", by_name ? "name" : "address");
	appendStringInfo(&fp, "egress_list=" UINT64_FORMAT "\n",
					 EgressListHash(outbox_allowed_hosts_list));

	for (p = producers; p != NULL; p = p->next)
		if (!p->fatal && strcmp(p->name, def->name) == 0 &&
			strcmp(p->fingerprint, fp.data) == 0)
			break;
	if (p == NULL)
	{
		p = kafka_create(def->name, fp.data, props, by_name);
		p->timeout_ms = timeout_ms;
	}
	p->users++;
	t->producer = p;
	t->release.func = kafka_release;
	t->release.arg = t;
	MemoryContextRegisterResetCallback(CurrentMemoryContext, &t->release);
	return t;
}

/* Bytes the message takes on the wire, about: for the size check. */
static size_t
kafka_message_size(const KafkaTarget *t, const OutboxMessage *msg)
{
	size_t		size = strlen(msg->payload) + 200;

	if (t->keyed && msg->aggregate_id)
		size += strlen(msg->aggregate_id);
	size += strlen(msg->id) + strlen(msg->type) + strlen(t->name) + 128;
	if (t->ce_source != NULL)
		size += 2 * (strlen(msg->id) + strlen(msg->type)) + strlen(t->ce_source) + 160;
	if (msg->traceparent)
		size += strlen(msg->traceparent);
	if (msg->time)
		size += strlen(msg->time);
	for (int i = 0; i < msg->nheaders; i++)
		size += strlen(msg->headers[i].name) + strlen(msg->headers[i].value) + 8;
	return size;
}

static const char *
kafka_reject(void *target, const OutboxMessage *msg)
{
	const KafkaTarget *t = (const KafkaTarget *) target;
	size_t		size = kafka_message_size(t, msg);

	if (size > (size_t) t->max_bytes)
		return psprintf("message too large for Kafka: about %zu bytes with key and headers, above message.max.bytes (%d)",
						size, t->max_bytes);
	return NULL;
}

/* A report of our own (a produce that failed at once), with a wake-up. */
static void
kafka_report_now(KafkaProducer *p, void *token, rd_kafka_resp_err_t err,
				 const char *text)
{
	KafkaReport *r = &p->reports[p->nreports++];
	static const char wake = 'k';

	r->token = token;
	r->err = err;
	r->text = text;
	r->at_produce = true;

	/* a full pipe already wakes the relay */
	if (write(p->pipefd[1], &wake, 1) < 0 && errno != EAGAIN)
		elog(DEBUG1, "could not wake the relay for a Kafka producer: %m");
}

static bool
kafka_own_header(const char *name)
{
	for (int k = 0; k < lengthof(own_headers); k++)
		if (strcmp(name, own_headers[k]) == 0)
			return true;
	return false;
}

/*
 * Produce one message (each message is its own group: its report
 * completes it).  Returns 0, taking nothing, when the local queue is
 * full or the report array cannot grow.
 */
static int
kafka_start(void *target, OutboxMessage *const *msgs, int n, void *token)
{
	KafkaTarget *t = (KafkaTarget *) target;
	KafkaProducer *p = t->producer;
	const OutboxMessage *msg = msgs[0];
	rd_kafka_headers_t *hdrs;
	rd_kafka_resp_err_t err;

	/* room for every report that can come: callbacks never allocate */
	if (p->outstanding + 1 > p->capacity)
	{
		int			capacity = p->capacity * 2;
		KafkaReport *grown = realloc(p->reports, capacity * sizeof(KafkaReport));

		if (grown == NULL)
			return 0;
		p->reports = grown;
		p->capacity = capacity;
	}
	if (p->outstanding++ == 0)
		p->heard_at = GetCurrentTimestamp();

	if (t->refused != NULL)
	{
		kafka_report_now(p, token, RD_KAFKA_RESP_ERR__TRANSPORT, t->refused);
		return 1;
	}

	hdrs = rd_kafka_headers_new(8 + msg->nheaders);
	rd_kafka_header_add(hdrs, "message_id", -1, msg->id, -1);
	rd_kafka_header_add(hdrs, "type", -1, msg->type, -1);
	rd_kafka_header_add(hdrs, "content_type", -1, "application/json", -1);
	if (msg->time)
		rd_kafka_header_add(hdrs, "time", -1, msg->time, -1);
	rd_kafka_header_add(hdrs, "destination", -1, t->name, -1);
	if (msg->aggregate_id)
		rd_kafka_header_add(hdrs, "aggregate_id", -1, msg->aggregate_id, -1);
	if (msg->traceparent)
		rd_kafka_header_add(hdrs, "traceparent", -1, msg->traceparent, -1);
	if (t->ce_source != NULL)
	{
		rd_kafka_header_add(hdrs, "ce_specversion", -1, "1.0", -1);
		rd_kafka_header_add(hdrs, "ce_id", -1, msg->id, -1);
		rd_kafka_header_add(hdrs, "ce_source", -1, t->ce_source, -1);
		rd_kafka_header_add(hdrs, "ce_type", -1, msg->type, -1);
		if (msg->time)
			rd_kafka_header_add(hdrs, "ce_time", -1, msg->time, -1);
		if (msg->aggregate_id)
			rd_kafka_header_add(hdrs, "ce_subject", -1, msg->aggregate_id, -1);
		if (msg->traceparent)
			rd_kafka_header_add(hdrs, "ce_traceparent", -1, msg->traceparent, -1);
		rd_kafka_header_add(hdrs, "content-type", -1, "application/json", -1);
	}
	for (int i = 0; i < msg->nheaders; i++)
		if (!kafka_own_header(msg->headers[i].name))
			rd_kafka_header_add(hdrs, msg->headers[i].name, -1,
								msg->headers[i].value, -1);

	err = rd_kafka_producev(p->rk,
							RD_KAFKA_V_TOPIC(t->topic),
							RD_KAFKA_V_VALUE((void *) msg->payload,
											 strlen(msg->payload)),
							RD_KAFKA_V_KEY((void *) (t->keyed ? msg->aggregate_id : NULL),
										   (t->keyed && msg->aggregate_id) ?
										   strlen(msg->aggregate_id) : 0),
							RD_KAFKA_V_HEADERS(hdrs),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_OPAQUE(token),
							RD_KAFKA_V_END);
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return 1;				/* the message owns the headers now */
	rd_kafka_headers_destroy(hdrs);
	if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
	{
		p->outstanding--;
		return 0;
	}
	kafka_report_now(p, token, err, NULL);
	return 1;
}

static int
kafka_wait_events(void *target, pgsocket *socks, uint32 *events, int max)
{
	KafkaTarget *t = (KafkaTarget *) target;

	if (max < 1 || t->producer == NULL)
		return 0;
	socks[0] = t->producer->pipefd[0];
	events[0] = WL_SOCKET_READABLE;
	return 1;
}

/*
 * What a report means (see the file header): its outcome, whether the
 * error is the configuration's (its text says so), and whether the
 * destination failed (its circuit breaker counts it).
 */
static DeliveryOutcome
kafka_outcome(const KafkaReport *r, bool *configuration,
			  bool *destination_failed)
{
	*configuration = false;
	*destination_failed = false;
	if (r->text != NULL)		/* refused: the destination's doing */
	{
		*configuration = true;
		*destination_failed = true;
		return OUTCOME_RETRY;
	}
	switch (r->err)
	{
		case RD_KAFKA_RESP_ERR_NO_ERROR:
			return OUTCOME_ACK;
		case RD_KAFKA_RESP_ERR__BAD_MSG:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
			return OUTCOME_DEAD;
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
			/* refused by librdkafka itself (too large, say): its own */
			if (r->at_produce)
				return OUTCOME_DEAD;

			/*
			 * The broker refused the record batch the message was in, and
			 * every message of it has the error: dead-lettered, the healthy
			 * ones went with the one at fault.  Retried, charged an attempt
			 * and not counted against the destination (the broker answered):
			 * the culprit runs out of attempts, the others go in other
			 * batches.
			 */
			return OUTCOME_RETRY;
		case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR__SSL:
		case RD_KAFKA_RESP_ERR__FATAL:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
			*configuration = true;
			*destination_failed = true;
			return OUTCOME_RETRY;
		default:
			*destination_failed = true;
			return OUTCOME_RETRY;
	}
}

/* The error recorded for a report that is not an acknowledgement. */
static char *
kafka_error_text(KafkaProducer *p, const KafkaReport *r, bool configuration)
{
	StringInfoData buf;

	initStringInfo(&buf);
	if (r->text != NULL)
	{
		appendStringInfoString(&buf, r->text);
		return buf.data;
	}
	appendStringInfo(&buf, "%s%s: %s", configuration ? "configuration: " : "",
					 rd_kafka_err2name(r->err), rd_kafka_err2str(r->err));
	if (r->err == RD_KAFKA_RESP_ERR__FATAL && p->rk != NULL)
	{
		char		fatal[KAFKA_ERROR_SIZE];

		if (rd_kafka_fatal_error(p->rk, fatal, sizeof(fatal)) != RD_KAFKA_RESP_ERR_NO_ERROR)
			appendStringInfo(&buf, " (%s)", fatal);
	}
	if (p->egress_refused)
		appendStringInfoString(&buf, "; a broker address was refused by outbox.allowed_hosts");
	else if (p->last_error[0] != '\0' && !configuration)
		appendStringInfo(&buf, "; last client error: %s", p->last_error);
	return buf.data;
}

/*
 * Every message has a delivery report within message.timeout.ms.  Twice
 * seen on CI (librdkafka 2.0.2, idempotent, the mock broker down), five
 * messages had none for 290 s, until the broker came back: their events
 * stayed in flight with no error to show.  So when messages are
 * outstanding and nothing was reported for twice the timeout and a
 * second, they are purged: librdkafka reports them (ERR__PURGE_*), they
 * are retried, and the destination failed.  Where the broker may have
 * written them, the retry is a duplicate: at least once.
 */
static void
kafka_check_silence(KafkaProducer *p)
{
	TimestampTz now;

	if (p->outstanding <= p->nreports || p->fatal)
		return;
	now = GetCurrentTimestamp();
	if (now < p->heard_at)
	{
		/* the clock went back (util.h): the silence counts from now */
		p->heard_at = now;
		return;
	}
	if (!OutboxTimePassed(p->heard_at, now, 2 * p->timeout_ms + 1000))
		return;
	ereport(LOG,
			(errmsg("outbox_pg destination \"%s\": librdkafka reported none of %d messages for %d ms; purging them to retry them",
					p->name, p->outstanding - p->nreports,
					(int) ((now - p->heard_at) / 1000)),
			 errdetail("Their message.timeout.ms is %d ms.", p->timeout_ms)));
	p->heard_at = now;
	rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	(void) rd_kafka_poll(p->rk, 0);
}

/*
 * Serve the producer's queue and hand over up to max completed messages:
 * one group (one message) each, with its result and whether the
 * destination failed.  Never blocks.
 */
static int
kafka_poll(void *target, void **tokens, DeliveryResult **results,
		   bool *destination_failed, int max)
{
	KafkaTarget *t = (KafkaTarget *) target;
	KafkaProducer *p = t->producer;
	char		drain[64];
	int			k;

	if (p == NULL)
		return 0;
	/* drain first: what is enqueued after the poll writes again */
	while (read(p->pipefd[0], drain, sizeof(drain)) > 0)
		;
	(void) rd_kafka_poll(p->rk, 0);
	kafka_check_silence(p);
	if (p->fatal && p->last_error[0] == '\0')
		strlcpy(p->last_error, "fatal error", sizeof(p->last_error));
	if (p->fatal && !p->fatal_logged)
	{
		char		fatal[KAFKA_ERROR_SIZE];
		rd_kafka_resp_err_t err = rd_kafka_fatal_error(p->rk, fatal, sizeof(fatal));
		TimestampTz now = GetCurrentTimestamp();
		int			after_ms = 0;
		/* what the broker said, as the relay records peer text */
		const char *said = err != RD_KAFKA_RESP_ERR_NO_ERROR ? fatal : p->last_error;

		/*
		 * A producer that goes fatal again soon after the last one (a
		 * cluster that refuses idempotence for good: its authorization, its
		 * version) is replaced after 1 s, then 2, 4 ... up to a minute: each
		 * replacement reloads every destination and starts a librdkafka
		 * instance.
		 */
		if (kafka_fatal_at != 0 &&
			!OutboxTimePassed(kafka_fatal_at, now, 2 * KAFKA_FATAL_DELAY_MAX_MS))
			kafka_fatal_streak = Min(kafka_fatal_streak + 1, 7);
		else
			kafka_fatal_streak = 0;
		kafka_fatal_at = now;
		if (kafka_fatal_streak > 0)
			after_ms = Min(1000 << (kafka_fatal_streak - 1), KAFKA_FATAL_DELAY_MAX_MS);
		ereport(LOG,
				(errmsg("outbox_pg destination \"%s\": its Kafka producer raised a fatal error: %s: %s",
						p->name, rd_kafka_err2name(err),
						OutboxPeerText(said, strlen(said), false, NULL,
									   KAFKA_ERROR_SIZE)),
				 errdetail("A new producer takes over at the relay's first lease step after %d ms; the messages the old one had taken are retried.",
						   after_ms)));
		p->fatal_logged = true;
		DestinationReloadWanted(after_ms);
	}
	if (p->log_line[0] != '\0')
	{
		ereport(LOG,
				(errmsg("outbox_pg destination \"%s\": librdkafka says: %s",
						p->name,
						OutboxPeerText(p->log_line, strlen(p->log_line), false,
									   NULL, KAFKA_ERROR_SIZE)),
				 errdetail("Lines like this are logged at most once a minute per destination and relay.")));
		p->log_line[0] = '\0';
	}

	k = Min(max, p->nreports);
	for (int i = 0; i < k; i++)
	{
		const KafkaReport *r = &p->reports[i];
		bool		configuration;
		DeliveryOutcome outcome = kafka_outcome(r, &configuration,
												&destination_failed[i]);
		DeliveryResult *res = palloc0(sizeof(DeliveryResult));

		tokens[i] = r->token;
		DeliveryResultSet(res, outcome,
						  outcome == OUTCOME_ACK ? NULL :
						  kafka_error_text(p, r, configuration));
		results[i] = res;
	}
	if (k > 0)
	{
		p->heard_at = GetCurrentTimestamp();
		memmove(p->reports, p->reports + k,
				(p->nreports - k) * sizeof(KafkaReport));
		p->nreports -= k;
		p->outstanding -= k;
	}
	if (p->nreports == 0 && p->outstanding == 0)
		p->egress_refused = false;
	return k;
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption kafka_options[] =
{
	{"topic", DEST_OPTION_STRING, true},
	{"key", DEST_OPTION_STRING, false}, /* aggregate_id (default) or none */
	{"tls", DEST_OPTION_BOOLEAN, false},
	{"cloudevents", DEST_OPTION_BOOLEAN, false},	/* ce_ headers */
	{"source", DEST_OPTION_STRING, false},	/* ce_source */
	{"sasl_mechanism", DEST_OPTION_STRING, false},	/* with credentials */
	{"compression.type", DEST_OPTION_STRING, false},
	{"linger.ms", DEST_OPTION_NUMBER, false},
	{"batch.num.messages", DEST_OPTION_NUMBER, false},
	{"batch.size", DEST_OPTION_NUMBER, false},
	{"queue.buffering.max.messages", DEST_OPTION_NUMBER, false},
	{"message.max.bytes", DEST_OPTION_NUMBER, false},
	{"client.id", DEST_OPTION_STRING, false},
	{"partitioner", DEST_OPTION_STRING, false},
	{"broker.address.family", DEST_OPTION_STRING, false},
	{"socket.keepalive.enable", DEST_OPTION_BOOLEAN, false},
	{"reconnect.backoff.ms", DEST_OPTION_NUMBER, false},
	{"reconnect.backoff.max.ms", DEST_OPTION_NUMBER, false},
	{"retry.backoff.ms", DEST_OPTION_NUMBER, false},
	{"topic.metadata.refresh.interval.ms", DEST_OPTION_NUMBER, false},
	{"ssl.endpoint.identification.algorithm", DEST_OPTION_STRING, false},
	{NULL}
};

/* Kafka's legal topic names: 1 to 249 of [a-zA-Z0-9._-], not . or .. */
static bool
kafka_topic_valid(const char *topic)
{
	size_t		len = strlen(topic);

	if (len == 0 || len > 249 || strcmp(topic, ".") == 0 ||
		strcmp(topic, "..") == 0)
		return false;
	return strspn(topic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == len;
}

static void
kafka_validate(const DestinationDefinition *def)
{
	char	   *hosts[KAFKA_MAX_BOOTSTRAP];
	int			ports[KAFKA_MAX_BOOTSTRAP];
	int			n;
	const char *topic = DestinationOptionText(def, "topic");
	const char *key = DestinationOptionText(def, "key");
	const char *ordering = DestinationOptionText(def, "ordering");

	kafka_bootstrap_servers(def, hosts, ports, &n);
	if (topic != NULL && !kafka_topic_valid(topic))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option topic of destination \"%s\" is not a valid Kafka topic name",
						def->name),
				 errdetail("Topic names have 1 to 249 characters from a-z, A-Z, 0-9, \".\", \"_\" and \"-\".")));
	{
		const char *source = DestinationOptionText(def, "source");

		if (source != NULL && source[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option source of destination \"%s\" must not be empty",
							def->name)));
	}
	DestinationCheckChoice(def, "key", key_choices);
	if (key != NULL && strcmp(key, "none") == 0 &&
		ordering != NULL && strcmp(ordering, "aggregate") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option key none of destination \"%s\" contradicts ordering aggregate",
						def->name),
				 errdetail("Without a key an aggregate's events land on any partition, and consumers read partitions in no common order."),
				 errhint("Leave key unset: the aggregate id is the key.")));
	DestinationCheckChoice(def, "sasl_mechanism", sasl_choices);
	if (DestinationOptionText(def, "sasl_mechanism") != NULL)
		DestinationRequireCredentials(def, DEST_CREDENTIALS_BASIC);
	else if (def->credentials_name != NULL)
		DestinationRequireCredentials(def, DEST_CREDENTIALS_BASIC);
	for (const KafkaProperty *k = kafka_properties; k->option; k++)
	{
		if (k->choices != NULL)
			DestinationCheckChoice(def, k->option, k->choices);
		else if (k->type == DEST_OPTION_NUMBER)
			DestinationCheckInteger(def, k->option, k->min, k->max, NULL);
	}
	{
		/*
		 * librdkafka refuses a producer whose reconnect.backoff.max.ms is
		 * below reconnect.backoff.ms (defaults 10,000 and 100): accepted
		 * here, the destination could never be loaded.
		 */
		const char *base = DestinationOptionText(def, "reconnect.backoff.ms");
		const char *max = DestinationOptionText(def, "reconnect.backoff.max.ms");
		long		base_ms = base ? strtol(base, NULL, 10) : 100;
		long		max_ms = max ? strtol(max, NULL, 10) : 10000;

		if (max_ms < base_ms)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option reconnect.backoff.max.ms of destination \"%s\" (%ld) is less than reconnect.backoff.ms (%ld)",
							def->name, max_ms, base_ms),
					 errdetail("librdkafka's defaults are 100 for reconnect.backoff.ms and 10000 for reconnect.backoff.max.ms."),
					 errhint("Set reconnect.backoff.max.ms to at least reconnect.backoff.ms.")));
	}
	{
		const char *client_id = DestinationOptionText(def, "client.id");

		if (client_id != NULL &&
			(strlen(client_id) == 0 || strlen(client_id) > 200 ||
			 !DestinationMatches(client_id, "^[A-Za-z0-9._-]+$", false)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option client.id of destination \"%s\" must be 1 to 200 characters from A-Z, a-z, 0-9, \".\", \"_\" and \"-\"",
							def->name)));
	}
}

const DestinationRoutine kafka_routine =
{
	.kind = "kafka",
	.max_batch = 1,
	.options = kafka_options,
	.validate = kafka_validate,
	.load = kafka_load,
	.reject = kafka_reject,
	.start = kafka_start,
	.wait_events = kafka_wait_events,
	.poll = kafka_poll,
};
