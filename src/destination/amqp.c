/*-------------------------------------------------------------------------
 *
 * amqp.c
 *		  AMQP 0-9-1 destinations (RabbitMQ) through rabbitmq-c, with
 *		  publisher confirms: the second kind on the native-client
 *		  transport (destination.h).
 *
 * Definition: url is "amqp://host[:port][/vhost]" (port 5672) or
 * "amqps://..." (TLS, port 5671, the server's certificate verified against
 * outbox.ca_file or the system's bundle, and its name against the host);
 * the vhost is percent-encoded ("%2F" is "/"), and an empty one is "/".
 * A user name or password in the url is refused: they come from the
 * credentials row the destination names (required).  Options: exchange
 * (default "", the default exchange, where the routing key names the
 * queue), routing_key (a template with {type}, {aggregate_id} and
 * {destination}; default "{type}"), unroutable (retry, the default, or
 * dead) as for kind rabbitmq, and heartbeat (seconds, 0 to 3600, default
 * 30; 0 turns heartbeats off).
 *
 * Message: body = the payload's JSON text; properties content_type
 * application/json, delivery_mode 2 (persistent), message_id = the event
 * id, type = the event type, timestamp = the event's time (seconds),
 * app_id outbox_pg, and headers destination, aggregate_id, traceparent and
 * time (as strings, when present), then the per-event headers; a per-event
 * header with the name of one of the relay's own is left out, so consumers
 * can trust those.  Published with mandatory set.
 *
 * Connections.  One per relay process and destination, kept in process
 * memory (malloc) across lease steps and found again by name and the whole
 * configuration it was made with, as kafka.c keeps its producers: load
 * returns a target pointing at it, a changed configuration makes a new one
 * while the old one lives until its last target is gone and nothing it
 * published is unconfirmed.  Connecting (TCP, TLS, the AMQP handshake,
 * channel.open, confirm.select) is the one thing that blocks: it is done
 * by start() when the connection is down, bounded by the destination's
 * timeout_ms (at most 10 s), and not tried again within a second of a
 * failure.  Everything after it never blocks the relay:
 *	- the socket joins the relay's WaitEventSet (wait_events), and poll()
 *	  reads every frame already buffered or readable
 *	  (amqp_simple_wait_frame_noblock with a zero timeout, until it says
 *	  there is nothing more), so nothing waits in rabbitmq-c's buffer
 *	  while the relay sleeps.  Heartbeats are sent from there when due;
 *	  the broker's own (every heartbeat/2) wake the relay often enough;
 *	- amqp_basic_publish() writes inline, and would wait for as long as
 *	  the broker does not read.  So start() publishes only while the
 *	  broker has not blocked the connection (the client advertises the
 *	  connection.blocked capability; RabbitMQ blocks publishers during a
 *	  memory or disk alarm) and only while the socket's send queue
 *	  (SIOCOUTQ) has room for the message within half the send buffer;
 *	  else it takes nothing (back-pressure);
 *	- start() corks the socket (TCP_CORK) before it publishes, and
 *	  wait_events(), which the relay calls before every wait, uncorks it:
 *	  the publishes of one lease step leave in as few segments as the
 *	  kernel makes of them, instead of one or more per message (each
 *	  publish is three frames, the last one pushed at once because
 *	  rabbitmq-c sets TCP_NODELAY), and nothing stays corked while the
 *	  relay sleeps.  The broker, the bound here, reads the same bytes in
 *	  fewer pieces.  TCP_USER_TIMEOUT, set to the
 *	  timeout, ends a connection whose peer stopped acknowledging.
 *
 * Confirms.  The channel is in confirm mode: the broker confirms every
 * publish by its delivery tag (1, 2, ... per channel), one at a time or
 * "multiple" up to a tag.  Each publish's tag and token wait in a ring
 * (in tag order), so a confirm completes them in O(1) each.  The window of
 * unconfirmed publishes is the destination's max_concurrency (events in
 * flight, the relay's own bound).  Outcomes:
 *	- basic.ack: acknowledged (persisted by every queue it was routed to),
 *	  unless a basic.return came for it first: unroutable (mandatory, and
 *	  no queue bound for the key), retried or dead-lettered by options.
 *	  The return names the message by its message_id property;
 *	- basic.nack: the broker could not take it: retried, the destination
 *	  failed;
 *	- the channel or connection closed by the broker (a missing exchange
 *	  is 404 NOT_FOUND, a refused login or vhost 403 or 530), a lost
 *	  connection, a missed heartbeat: every unconfirmed publish is
 *	  retried (some may have arrived: at-least-once), the destination
 *	  failed, and the next start() connects again;
 *	- no confirm within the destination's timeout_ms for the oldest
 *	  unconfirmed publish (rmq_check_confirms): the same as a lost
 *	  connection;
 *	- connection.blocked: nothing more is published until
 *	  connection.unblocked, and what is unconfirmed is retried at once
 *	  (the broker confirms nothing while it does not read; a worker
 *	  told to stop then has nothing to wait for).  Events started while
 *	  blocked fail at once with the reason, the destination failed, so
 *	  its circuit breaker holds them back instead of a busy loop.
 *
 * Ordering: one channel per destination in a relay, published in the
 * order delivery hands events over; the relay holds an ordered
 * destination's later events of an aggregate until the earlier one is
 * confirmed (delivery.c).
 *
 * Secrets: the password goes to rabbitmq-c's login only; no message shows
 * it, and what a broker says is recorded through peertext.c, which redacts
 * the credentials.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/amqp.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#if defined(__has_include) && __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/framing.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

#include <ctype.h>
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "outbox_pg.h"
#include "guc.h"
#include "util.h"
#include "retry.h"
#include "destination/http.h"
#include "destination/destination.h"

#define AMQP_URL_PREFIX			"amqp://"
#define AMQPS_URL_PREFIX		"amqps://"
#define AMQP_TEXT_SIZE			256
#define AMQP_CONNECT_MAX_MS		10000
#define AMQP_RECONNECT_MS		1000
#define AMQP_RECONNECT_MAX_MS	30000
#define AMQP_FRAME_MAX			131072
#define AMQP_MAX_MESSAGE		(128 * 1024 * 1024)	/* RabbitMQ's default */
#define AMQP_PROPERTIES_MAX		1024	/* the relay's own, headers and all */
#define AMQP_CHANNEL			1
#define AMQP_SYSTEM_CA			"/etc/ssl/certs/ca-certificates.crt"

/* One completed publish (or one that failed at once), for poll(). */
typedef struct AmqpReport
{
	void	   *token;
	DeliveryOutcome outcome;
	bool		destination_failed;
	char		text[AMQP_TEXT_SIZE];	/* empty when acknowledged */
} AmqpReport;

/* One unconfirmed publish, in the ring. */
typedef struct AmqpPending
{
	uint64		tag;
	void	   *token;			/* NULL: completed out of order */
	TimestampTz published_at;
	bool		returned;		/* basic.return came for it */
	char		message_id[40];
} AmqpPending;

/*
 * One connection with its channel: malloc'd, process lifetime (see the
 * file header).
 */
typedef struct AmqpClient
{
	struct AmqpClient *next;
	char	   *name;			/* destination */
	char	   *fingerprint;	/* the whole configuration it was made with */
	char	   *host;
	int			port;
	char	   *vhost;
	bool		tls;
	char	   *username;
	char	   *password;
	int			heartbeat;
	int			timeout_ms;
	bool		unroutable_dead;	/* options.unroutable = 'dead' */
	EgressList *egress;			/* copy of outbox.allowed_hosts; NULL: none */
	bool		egress_by_name;

	amqp_connection_state_t conn;	/* NULL while down */
	int			fd;
	TimestampTz tried_at;		/* last connection attempt (its end if failed) */
	int			reconnect_ms;	/* after a failed one: the next not before */
	char		down_reason[AMQP_TEXT_SIZE];	/* why the last one failed */
	bool		corked;			/* TCP_CORK set since the last wait */
	int			sndbuf;			/* SO_SNDBUF as last read; it only grows */
	bool		blocked;		/* connection.blocked */
	char		blocked_reason[AMQP_TEXT_SIZE];
	uint64		next_tag;		/* the tag of the next publish */

	/* a basic.return being read: its header frame names the message */
	bool		returning;
	uint64		return_body_left;
	int			return_code;
	char		return_text[128];

	AmqpPending *ring;			/* unconfirmed publishes, in tag order */
	int			ring_head;
	int			ring_count;
	int			ring_size;

	int			users;			/* targets pointing at it */
	int			outstanding;	/* started, not yet handed to delivery */
	AmqpReport *reports;		/* completed, not yet handed to delivery */
	int			nreports;
	int			capacity;		/* >= outstanding */
} AmqpClient;

/* One AMQP destination, as load read it (in the loaded destination). */
typedef struct AmqpTarget
{
	const char *name;
	AmqpClient *client;
	const char *exchange;
	const char *routing_key;	/* template */
	const char *refused;		/* host refused by the allow-list */
	MemoryContextCallback release;
} AmqpTarget;

/* The headers the relay sets itself; a per-event header cannot replace them. */
static const char *const own_headers[] = {
	"destination", "aggregate_id", "traceparent", "time"
};

static AmqpClient *clients = NULL;

/* ---- parsing the url ---- */

/*
 * Split "amqp[s]://host[:port][/vhost]" (palloc'd parts); false and the
 * reason in *why when it is not that.  IPv6 addresses are written in
 * brackets.
 */
static bool
rmq_parse_url(const char *url, char **host, int *port, char **vhost,
			   bool *tls, const char **why)
{
	const char *p;
	const char *slash;
	const char *hostpart_end;
	const char *colon = NULL;
	size_t		len;

	if (pg_strncasecmp(url, AMQPS_URL_PREFIX, strlen(AMQPS_URL_PREFIX)) == 0)
	{
		*tls = true;
		p = url + strlen(AMQPS_URL_PREFIX);
	}
	else if (pg_strncasecmp(url, AMQP_URL_PREFIX, strlen(AMQP_URL_PREFIX)) == 0)
	{
		*tls = false;
		p = url + strlen(AMQP_URL_PREFIX);
	}
	else
	{
		*why = "it does not start with amqp:// or amqps://";
		return false;
	}
	*port = *tls ? 5671 : 5672;
	slash = strchr(p, '/');
	hostpart_end = slash ? slash : p + strlen(p);
	len = hostpart_end - p;
	if (memchr(p, '@', len) != NULL)
	{
		*why = "it contains a user name or password: name a row of outbox.credentials instead";
		return false;
	}
	if (memchr(p, '?', strlen(p)) != NULL || memchr(p, '#', strlen(p)) != NULL)
	{
		*why = "it has a query or fragment";
		return false;
	}
	if (len > 0 && p[0] == '[')
	{
		const char *close = memchr(p, ']', len);

		if (close == NULL || (close + 1 < hostpart_end && close[1] != ':'))
		{
			*why = "its host is not a name, an IPv4 address or a bracketed IPv6 address";
			return false;
		}
		*host = pnstrdup(p + 1, close - p - 1);
		if (close + 1 < hostpart_end)
			colon = close + 1;
	}
	else
	{
		colon = memchr(p, ':', len);
		*host = pnstrdup(p, colon ? (size_t) (colon - p) : len);
	}
	if ((*host)[0] == '\0')
	{
		*why = "its host is empty";
		return false;
	}
	for (const char *c = *host; *c; c++)
	{
		if (!(isalnum((unsigned char) *c) || *c == '.' || *c == '-' ||
			  *c == '_' || (*c == ':' && p[0] == '[')))
		{
			*why = "its host has characters a host name cannot have";
			return false;
		}
	}
	if (colon != NULL)
	{
		char	   *portstr = pnstrdup(colon + 1, hostpart_end - colon - 1);
		char	   *end;
		long		v;

		errno = 0;
		v = strtol(portstr, &end, 10);
		if (portstr[0] == '\0' || *end != '\0' || errno != 0 || v < 1 || v > 65535)
		{
			*why = "its port is not a number from 1 to 65535";
			return false;
		}
		*port = (int) v;
	}

	/* the vhost: percent-decoded; none (or "/" alone) is "/" */
	if (slash == NULL || slash[1] == '\0')
		*vhost = pstrdup("/");
	else
	{
		StringInfoData buf;

		initStringInfo(&buf);
		for (const char *c = slash + 1; *c; c++)
		{
			if (*c == '%')
			{
				int			hi,
							lo;

				if (!isxdigit((unsigned char) c[1]) || !isxdigit((unsigned char) c[2]))
				{
					*why = "its vhost has a bad percent-encoding";
					return false;
				}
				hi = isdigit((unsigned char) c[1]) ? c[1] - '0' : (tolower((unsigned char) c[1]) - 'a' + 10);
				lo = isdigit((unsigned char) c[2]) ? c[2] - '0' : (tolower((unsigned char) c[2]) - 'a' + 10);
				if (hi == 0 && lo == 0)
				{
					*why = "its vhost contains a NUL byte";
					return false;
				}
				appendStringInfoChar(&buf, (char) (hi * 16 + lo));
				c += 2;
			}
			else if (*c == '/')
			{
				*why = "its vhost contains \"/\": write it as %2F";
				return false;
			}
			else
				appendStringInfoChar(&buf, *c);
		}
		if (buf.len > 255)
		{
			*why = "its vhost is longer than 255 bytes";
			return false;
		}
		*vhost = buf.data;
	}
	return true;
}

/* The destination's url parts (rmq_parse_url), or ERROR 22023. */
static void
rmq_url_parts(const DestinationDefinition *def, char **host, int *port,
			   char **vhost, bool *tls)
{
	const char *why;

	if (!rmq_parse_url(def->url, host, port, vhost, tls, &why))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the url of destination \"%s\" is not an AMQP url",
						def->name),
				 errdetail("The url must be amqp://host[:port][/vhost] or amqps://...; %s.", why)));
}

/* ---- reports and the ring ---- */

/* Room for one more report: false when it cannot grow. */
static bool
rmq_reserve(AmqpClient *c)
{
	if (c->outstanding + 1 > c->capacity)
	{
		int			capacity = c->capacity * 2;
		AmqpReport *grown = realloc(c->reports, capacity * sizeof(AmqpReport));

		if (grown == NULL)
			return false;
		c->reports = grown;
		c->capacity = capacity;
	}
	if (c->ring_count + 1 > c->ring_size)
	{
		int			size = c->ring_size * 2;
		AmqpPending *ring = malloc(size * sizeof(AmqpPending));

		if (ring == NULL)
			return false;
		for (int i = 0; i < c->ring_count; i++)
			ring[i] = c->ring[(c->ring_head + i) % c->ring_size];
		free(c->ring);
		c->ring = ring;
		c->ring_head = 0;
		c->ring_size = size;
	}
	return true;
}

static void
rmq_report(AmqpClient *c, void *token, DeliveryOutcome outcome,
			bool destination_failed, const char *text)
{
	AmqpReport *r = &c->reports[c->nreports++];

	Assert(c->nreports <= c->capacity);
	r->token = token;
	r->outcome = outcome;
	r->destination_failed = destination_failed;
	strlcpy(r->text, text ? text : "", sizeof(r->text));
}

/* Pop what is done from the ring's head. */
static void
rmq_ring_trim(AmqpClient *c)
{
	while (c->ring_count > 0 && c->ring[c->ring_head].token == NULL)
	{
		c->ring_head = (c->ring_head + 1) % c->ring_size;
		c->ring_count--;
	}
}

/* A confirm for one pending publish. */
static void
rmq_complete(AmqpClient *c, AmqpPending *p, bool ack)
{
	if (ack && p->returned)
	{
		char		text[AMQP_TEXT_SIZE];
		snprintf(text, sizeof(text),
				 "unroutable: the exchange routed the message to no queue (%d %s); bind a queue for its routing key",
				 c->return_code, c->return_text);
		rmq_report(c, p->token, c->unroutable_dead ? OUTCOME_DEAD : OUTCOME_RETRY,
					false, text);
	}
	else if (ack)
		rmq_report(c, p->token, OUTCOME_ACK, false, NULL);
	else
		rmq_report(c, p->token, OUTCOME_RETRY, true,
					"nacked: the broker could not take the message (basic.nack)");
	p->token = NULL;
}

/* basic.ack or basic.nack for tag (and every earlier one when multiple). */
static void
rmq_confirm(AmqpClient *c, uint64 tag, bool multiple, bool ack)
{
	for (int i = 0; i < c->ring_count; i++)
	{
		AmqpPending *p = &c->ring[(c->ring_head + i) % c->ring_size];

		if (p->tag > tag)
			break;
		if (p->token == NULL)
			continue;
		if (p->tag == tag || multiple)
			rmq_complete(c, p, ack);
	}
	rmq_ring_trim(c);
}

/* Every unconfirmed publish fails (retried; the destination failed). */
static void
rmq_fail_pending(AmqpClient *c, const char *why)
{
	for (int i = 0; i < c->ring_count; i++)
	{
		AmqpPending *p = &c->ring[(c->ring_head + i) % c->ring_size];

		if (p->token != NULL)
			rmq_report(c, p->token, OUTCOME_RETRY, true, why);
		p->token = NULL;
	}
	c->ring_count = 0;
	c->ring_head = 0;
}

/* ---- connections ---- */

/* Close the connection (without waiting for the broker's close-ok). */
static void
rmq_disconnect(AmqpClient *c, const char *why)
{
	if (why != NULL)
	{
		strlcpy(c->down_reason, why, sizeof(c->down_reason));
		rmq_fail_pending(c, why);
	}
	if (c->conn != NULL)
	{
		amqp_destroy_connection(c->conn);
		c->conn = NULL;
	}
	c->fd = -1;
	c->corked = false;
	c->sndbuf = 0;
	c->blocked = false;
	c->returning = false;
}

static void
rmq_destroy(AmqpClient *c)
{
	AmqpClient **link;

	for (link = &clients; *link != NULL; link = &(*link)->next)
	{
		if (*link == c)
		{
			*link = c->next;
			break;
		}
	}
	if (c->conn != NULL)
	{
		/* tell the broker, without waiting for its answer */
		if (c->fd >= 0)
		{
			amqp_connection_close_t m = {0};

			m.reply_code = AMQP_REPLY_SUCCESS;
			m.reply_text = amqp_cstring_bytes("outbox_pg relay done");
			(void) amqp_send_method(c->conn, 0, AMQP_CONNECTION_CLOSE_METHOD, &m);
		}
		amqp_destroy_connection(c->conn);
	}
	free(c->ring);
	free(c->reports);
	free(c->egress);
	free(c->name);
	free(c->fingerprint);
	free(c->host);
	free(c->vhost);
	free(c->username);
	if (c->password != NULL)
		explicit_bzero(c->password, strlen(c->password));
	free(c->password);
	free(c);
}

static void
rmq_release(void *arg)
{
	AmqpTarget *t = (AmqpTarget *) arg;
	AmqpClient *c = t->client;

	t->client = NULL;
	if (c != NULL && --c->users == 0 && c->outstanding == 0)
		rmq_destroy(c);
}

/* What a failed rabbitmq-c call or RPC says, in buf. */
static void
rmq_reply_text(amqp_rpc_reply_t reply, const char *what, char *buf, size_t len)
{
	switch (reply.reply_type)
	{
		case AMQP_RESPONSE_NORMAL:
			snprintf(buf, len, "%s: no error", what);
			break;
		case AMQP_RESPONSE_NONE:
			snprintf(buf, len, "%s: no answer from the broker", what);
			break;
		case AMQP_RESPONSE_LIBRARY_EXCEPTION:
			snprintf(buf, len, "%s: %s", what, amqp_error_string2(reply.library_error));
			break;
		case AMQP_RESPONSE_SERVER_EXCEPTION:
			if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
			{
				amqp_connection_close_t *m = reply.reply.decoded;

				snprintf(buf, len, "%s: the broker closed the connection: %u %.*s",
						 what, m->reply_code, (int) Min(m->reply_text.len, 160),
						 (char *) m->reply_text.bytes);
			}
			else if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			{
				amqp_channel_close_t *m = reply.reply.decoded;

				snprintf(buf, len, "%s: the broker closed the channel: %u %.*s",
						 what, m->reply_code, (int) Min(m->reply_text.len, 160),
						 (char *) m->reply_text.bytes);
			}
			else
				snprintf(buf, len, "%s: the broker answered method 0x%08X",
						 what, reply.reply.id);
			break;
	}
}

/*
 * Connect, log in, open the channel in confirm mode; false and the reason
 * in c->down_reason when any step fails.  Blocks, bounded by the timeout
 * (see the file header).
 */
static bool
rmq_connect(AmqpClient *c)
{
	amqp_socket_t *sock;
	struct timeval tv;
	int			timeout_ms = Min(c->timeout_ms, AMQP_CONNECT_MAX_MS);
	int			st;
	amqp_rpc_reply_t reply;
	amqp_table_entry_t caps[3];
	amqp_table_entry_t props[4];
	amqp_table_t props_table;
	char		name[200];

	c->tried_at = GetCurrentTimestamp();
	c->conn = amqp_new_connection();
	if (c->conn == NULL)
	{
		strlcpy(c->down_reason, "connect: out of memory", sizeof(c->down_reason));
		return false;
	}
	sock = c->tls ? amqp_ssl_socket_new(c->conn) : amqp_tcp_socket_new(c->conn);
	if (sock == NULL)
	{
		rmq_disconnect(c, NULL);
		strlcpy(c->down_reason, "connect: could not create a socket", sizeof(c->down_reason));
		return false;
	}
	if (c->tls)
	{
		const char *ca = (outbox_ca_file != NULL && outbox_ca_file[0] != '\0') ?
			outbox_ca_file : AMQP_SYSTEM_CA;

		amqp_ssl_socket_set_verify_peer(sock, 1);
		amqp_ssl_socket_set_verify_hostname(sock, 1);
		if (amqp_ssl_socket_set_cacert(sock, ca) != AMQP_STATUS_OK)
		{
			rmq_disconnect(c, NULL);
			snprintf(c->down_reason, sizeof(c->down_reason),
					 "connect: could not read the CA bundle %s", ca);
			return false;
		}
	}
	tv.tv_sec = timeout_ms / 1000;
	tv.tv_usec = (timeout_ms % 1000) * 1000;
	st = amqp_socket_open_noblock(sock, c->host, c->port, &tv);
	if (st != AMQP_STATUS_OK)
	{
		rmq_disconnect(c, NULL);
		snprintf(c->down_reason, sizeof(c->down_reason), "connect to %s:%d: %s",
				 c->host, c->port, amqp_error_string2(st));
		return false;
	}
	c->fd = amqp_socket_get_sockfd(sock);

	/* the address it connected to, against outbox.allowed_hosts */
	if (c->egress != NULL)
	{
		struct sockaddr_storage ss;
		socklen_t	sslen = sizeof(ss);
		char		errbuf[192];

		if (getpeername(c->fd, (struct sockaddr *) &ss, &sslen) != 0 ||
			!EgressCheckAddress(c->egress, (struct sockaddr *) &ss,
								c->egress_by_name, errbuf, sizeof(errbuf)))
		{
			rmq_disconnect(c, NULL);
			snprintf(c->down_reason, sizeof(c->down_reason),
					 "connect to %s:%d: refused by outbox.allowed_hosts", c->host, c->port);
			return false;
		}
	}
	{
		unsigned int user_timeout = (unsigned int) c->timeout_ms;

		(void) setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout,
						  sizeof(user_timeout));
	}
	amqp_set_handshake_timeout(c->conn, &tv);
	amqp_set_rpc_timeout(c->conn, &tv);

	/* what the client can do, and a name for the broker's connection list */
	caps[0].key = amqp_cstring_bytes("publisher_confirms");
	caps[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[0].value.value.boolean = 1;
	caps[1].key = amqp_cstring_bytes("connection.blocked");
	caps[1].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[1].value.value.boolean = 1;
	caps[2].key = amqp_cstring_bytes("basic.nack");
	caps[2].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[2].value.value.boolean = 1;
	snprintf(name, sizeof(name), "outbox_pg relay %d: %s", MyProcPid, c->name);
	props[0].key = amqp_cstring_bytes("product");
	props[0].value.kind = AMQP_FIELD_KIND_UTF8;
	props[0].value.value.bytes = amqp_cstring_bytes("outbox_pg");
	props[1].key = amqp_cstring_bytes("connection_name");
	props[1].value.kind = AMQP_FIELD_KIND_UTF8;
	props[1].value.value.bytes = amqp_cstring_bytes(name);
	props[2].key = amqp_cstring_bytes("capabilities");
	props[2].value.kind = AMQP_FIELD_KIND_TABLE;
	props[2].value.value.table.num_entries = lengthof(caps);
	props[2].value.value.table.entries = caps;
	props[3].key = amqp_cstring_bytes("version");
	props[3].value.kind = AMQP_FIELD_KIND_UTF8;
	props[3].value.value.bytes = amqp_cstring_bytes(OUTBOX_VERSION);
	props_table.num_entries = lengthof(props);
	props_table.entries = props;

	reply = amqp_login_with_properties(c->conn, c->vhost, 1, AMQP_FRAME_MAX,
									   c->heartbeat, &props_table,
									   AMQP_SASL_METHOD_PLAIN,
									   c->username, c->password);
	if (reply.reply_type != AMQP_RESPONSE_NORMAL)
	{
		char		why[AMQP_TEXT_SIZE];

		rmq_reply_text(reply, "login", why, sizeof(why));
		rmq_disconnect(c, NULL);
		strlcpy(c->down_reason, why, sizeof(c->down_reason));
		return false;
	}
	amqp_channel_open(c->conn, AMQP_CHANNEL);
	reply = amqp_get_rpc_reply(c->conn);
	if (reply.reply_type == AMQP_RESPONSE_NORMAL)
	{
		amqp_confirm_select(c->conn, AMQP_CHANNEL);
		reply = amqp_get_rpc_reply(c->conn);
	}
	if (reply.reply_type != AMQP_RESPONSE_NORMAL)
	{
		char		why[AMQP_TEXT_SIZE];

		rmq_reply_text(reply, "channel", why, sizeof(why));
		rmq_disconnect(c, NULL);
		strlcpy(c->down_reason, why, sizeof(c->down_reason));
		return false;
	}
	c->next_tag = 1;
	c->blocked = false;
	c->returning = false;
	c->down_reason[0] = '\0';
	amqp_maybe_release_buffers(c->conn);
	return true;
}

/* ---- the kind's callbacks ---- */

static void *
rmq_load(const DestinationConfig *config)
{
	const DestinationDefinition *def = config->def;
	const DestinationCredentials *cred = def->credentials;
	AmqpTarget *t = palloc0(sizeof(AmqpTarget));
	char	   *host;
	int			port;
	char	   *vhost;
	bool		tls;
	bool		by_name = true;
	const char *v;
	int			heartbeat;
	bool		unroutable_dead;
	StringInfoData fp;
	AmqpClient *c;

	rmq_url_parts(def, &host, &port, &vhost, &tls);
	t->name = def->name;
	t->exchange = OutboxJsonbOption(def->options, "exchange");
	if (t->exchange == NULL)
		t->exchange = "";
	t->routing_key = OutboxJsonbOption(def->options, "routing_key");
	if (t->routing_key == NULL)
		t->routing_key = "{type}";
	v = OutboxJsonbOption(def->options, "unroutable");
	unroutable_dead = (v != NULL && strcmp(v, "dead") == 0);
	v = OutboxJsonbOption(def->options, "heartbeat");
	heartbeat = v ? atoi(v) : 30;

	/* the host against outbox.allowed_hosts (egress.c) */
	{
		char		errbuf[256];

		if (!EgressCheckHost(outbox_allowed_hosts_list, host, port, &by_name,
							 errbuf, sizeof(errbuf)))
		{
			t->refused = psprintf("broker refused: %s", errbuf);
			by_name = false;
		}
	}

	initStringInfo(&fp);
	appendStringInfo(&fp, "url=%s\nheartbeat=%d\nunroutable=%d\ntimeout=%d\nuser=%s\npassword_hash=%u\negress=%s\n",
					 def->url, heartbeat, (int) unroutable_dead, config->timeout_ms,
					 cred && cred->username ? cred->username : "",
					 cred && cred->password ?
					 hash_bytes((const unsigned char *) cred->password, strlen(cred->password)) : 0,
					 by_name ? "name" : "address");
	appendStringInfo(&fp, "egress_list=" UINT64_FORMAT "\n",
					 EgressListHash(outbox_allowed_hosts_list));

	for (c = clients; c != NULL; c = c->next)
		if (strcmp(c->name, def->name) == 0 && strcmp(c->fingerprint, fp.data) == 0)
			break;
	if (c == NULL)
	{
		c = calloc(1, sizeof(AmqpClient));
		if (c == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		c->fd = -1;
		c->reconnect_ms = AMQP_RECONNECT_MS;
		c->port = port;
		c->tls = tls;
		c->heartbeat = heartbeat;
		c->unroutable_dead = unroutable_dead;
		c->timeout_ms = config->timeout_ms;
		c->egress_by_name = by_name;
		c->name = strdup(def->name);
		c->fingerprint = strdup(fp.data);
		c->host = strdup(host);
		c->vhost = strdup(vhost);
		c->username = strdup(cred && cred->username ? cred->username : "");
		c->password = strdup(cred && cred->password ? cred->password : "");
		c->capacity = 64;
		c->reports = malloc(c->capacity * sizeof(AmqpReport));
		c->ring_size = 64;
		c->ring = malloc(c->ring_size * sizeof(AmqpPending));
		c->egress = EgressListCopy(outbox_allowed_hosts_list);
		c->next = clients;
		clients = c;
		if (c->name == NULL || c->fingerprint == NULL || c->host == NULL ||
			c->vhost == NULL || c->username == NULL || c->password == NULL ||
			c->reports == NULL || c->ring == NULL ||
			(outbox_allowed_hosts_list != NULL && c->egress == NULL))
		{
			rmq_destroy(c);
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		}
	}
	c->users++;
	t->client = c;
	t->release.func = rmq_release;
	t->release.arg = t;
	MemoryContextRegisterResetCallback(CurrentMemoryContext, &t->release);
	return t;
}

static const char *
rmq_reject(void *target, const OutboxMessage *msg)
{
	const AmqpTarget *t = (const AmqpTarget *) target;
	char	   *key = DestinationRoutingKey(t->routing_key, msg);
	size_t		size = strlen(msg->payload);

	if (strlen(key) > 255)
		return psprintf("routing key too long: %zu bytes from template \"%s\", above AMQP's 255",
						strlen(key), t->routing_key);
	if (size > AMQP_MAX_MESSAGE)
		return psprintf("message too large for RabbitMQ: %zu bytes, above its default max_message_size (%d)",
						size, AMQP_MAX_MESSAGE);

	/*
	 * The properties go in one frame of at most AMQP_FRAME_MAX bytes, and a
	 * header's name is a short string (255 bytes at most: rabbitmq-c wrote
	 * a longer one's length modulo 256, a table the broker refused).  Sent
	 * all the same, such a message failed its publish or made the broker
	 * close the connection, and was retried for ever as a failure of the
	 * destination, every other unconfirmed message with it.  Estimated
	 * from above: each header costs its name and value and 7 bytes, and
	 * the relay's own headers and properties fit in AMQP_PROPERTIES_MAX.
	 */
	size = AMQP_PROPERTIES_MAX + strlen(msg->type) + strlen(t->name) +
		(msg->aggregate_id ? strlen(msg->aggregate_id) : 0);
	for (int i = 0; i < msg->nheaders; i++)
	{
		size_t		name_len = strlen(msg->headers[i].name);

		if (name_len > 255)
			return psprintf("header name too long for AMQP: %zu bytes, above 255",
							name_len);
		size += name_len + strlen(msg->headers[i].value) + 7;
	}
	if (size > AMQP_FRAME_MAX - 8)
		return psprintf("headers too large for AMQP: about %zu bytes of properties, above the frame size (%d)",
						size, AMQP_FRAME_MAX);
	return NULL;
}

/* The event's time (RFC 3339, UTC) in seconds since 1970; 0 if unreadable. */
static uint64
rmq_timestamp(const char *time_text)
{
	struct tm	tm = {0};

	if (time_text == NULL ||
		sscanf(time_text, "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon,
			   &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
		return 0;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (uint64) timegm(&tm);
}

static bool
rmq_own_header(const char *name)
{
	for (int k = 0; k < lengthof(own_headers); k++)
		if (strcmp(name, own_headers[k]) == 0)
			return true;
	return false;
}

/*
 * Would a publish of about size bytes fit in the socket's send buffer?
 * The buffer's size is read again only when the last size read says no:
 * the kernel grows it as the connection runs, so an old, smaller figure
 * only errs on the safe side.
 */
static bool
rmq_room(AmqpClient *c, size_t size)
{
	int			queued = 0;
	size_t		need;

	if (ioctl(c->fd, SIOCOUTQ, &queued) != 0)
		return true;			/* cannot tell: the timeouts still bound it */
	if (queued == 0)
		return true;			/* one message goes out whatever its size */
	need = (size_t) queued + size + 1024;
	if (need > (size_t) c->sndbuf / 2)
	{
		socklen_t	len = sizeof(c->sndbuf);

		if (getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &c->sndbuf, &len) != 0)
			return true;
	}
	return need <= (size_t) c->sndbuf / 2;
}

/* Set or clear TCP_CORK (see the file header); a failure only costs speed. */
static void
rmq_cork(AmqpClient *c, bool on)
{
	int			value = on ? 1 : 0;

	if (c->fd >= 0)
		(void) setsockopt(c->fd, IPPROTO_TCP, TCP_CORK, &value, sizeof(value));
	c->corked = on;
}

/*
 * Publish one message (each message is its own group: its confirm
 * completes it).  Returns 0, taking nothing, for back-pressure.
 */
static int
rmq_start(void *target, OutboxMessage *const *msgs, int n, void *token)
{
	AmqpTarget *t = (AmqpTarget *) target;
	AmqpClient *c = t->client;
	const OutboxMessage *msg = msgs[0];
	amqp_basic_properties_t props;
	amqp_table_entry_t *entries;
	int			nentries = 0;
	size_t		size;
	int			st;
	AmqpPending *p;

	if (!rmq_reserve(c))
		return 0;
	c->outstanding++;

	if (t->refused != NULL)
	{
		rmq_report(c, token, OUTCOME_RETRY, true, t->refused);
		return 1;
	}
	if (c->conn == NULL)
	{
		if (c->tried_at != 0 &&
			!OutboxTimePassed(c->tried_at, GetCurrentTimestamp(),
							  c->reconnect_ms))
		{
			rmq_report(c, token, OUTCOME_RETRY, true,
						c->down_reason[0] ? c->down_reason : "not connected");
			return 1;
		}
		if (!rmq_connect(c))
		{
			TimestampTz failed_at = GetCurrentTimestamp();
			int64		took_ms = (failed_at - c->tried_at) / 1000;

			/*
			 * The connection is made in line: a broker that accepts and
			 * never answers (or drops the SYN) holds the relay for the
			 * whole timeout.  The next attempt waits from this one's end,
			 * ten times what it took: counted from its start, the wait had
			 * run out by then, and every event started tried again, each
			 * holding the relay for the timeout.
			 */
			c->tried_at = failed_at;
			c->reconnect_ms = (int) Min(Max(10 * took_ms, AMQP_RECONNECT_MS),
										AMQP_RECONNECT_MAX_MS);
			rmq_report(c, token, OUTCOME_RETRY, true, c->down_reason);
			return 1;
		}
		c->reconnect_ms = AMQP_RECONNECT_MS;
	}
	if (c->blocked)
	{
		char		text[AMQP_TEXT_SIZE];

		snprintf(text, sizeof(text),
				 "the broker blocked publishing (%s); sent again when it unblocks",
				 c->blocked_reason);
		rmq_report(c, token, OUTCOME_RETRY, true, text);
		return 1;
	}
	size = strlen(msg->payload) + 512;
	if (!rmq_room(c, size))
	{
		c->outstanding--;
		return 0;
	}

	entries = palloc((4 + msg->nheaders) * sizeof(amqp_table_entry_t));
#define AMQP_HEADER(k, v) \
	do { \
		entries[nentries].key = amqp_cstring_bytes(k); \
		entries[nentries].value.kind = AMQP_FIELD_KIND_UTF8; \
		entries[nentries].value.value.bytes = amqp_cstring_bytes(v); \
		nentries++; \
	} while (0)
	AMQP_HEADER("destination", t->name);
	if (msg->aggregate_id)
		AMQP_HEADER("aggregate_id", msg->aggregate_id);
	if (msg->traceparent)
		AMQP_HEADER("traceparent", msg->traceparent);
	if (msg->time)
		AMQP_HEADER("time", msg->time);
	for (int i = 0; i < msg->nheaders; i++)
		if (!rmq_own_header(msg->headers[i].name))
			AMQP_HEADER(msg->headers[i].name, msg->headers[i].value);
#undef AMQP_HEADER

	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG |
		AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes("application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.message_id = amqp_cstring_bytes(msg->id);
	props.type = amqp_cstring_bytes(msg->type);
	props.app_id = amqp_cstring_bytes("outbox_pg");
	props.headers.num_entries = nentries;
	props.headers.entries = entries;
	props.timestamp = rmq_timestamp(msg->time);
	if (props.timestamp != 0)
		props._flags |= AMQP_BASIC_TIMESTAMP_FLAG;

	if (!c->corked)
		rmq_cork(c, true);

	st = amqp_basic_publish(c->conn, AMQP_CHANNEL,
							amqp_cstring_bytes(t->exchange),
							amqp_cstring_bytes(DestinationRoutingKey(t->routing_key, msg)),
							1, 0, &props, amqp_cstring_bytes(msg->payload));
	pfree(entries);
	if (st != AMQP_STATUS_OK)
	{
		char		text[AMQP_TEXT_SIZE];

		snprintf(text, sizeof(text), "publish: %s", amqp_error_string2(st));
		rmq_report(c, token, OUTCOME_RETRY, true, text);
		rmq_disconnect(c, text);
		return 1;
	}
	p = &c->ring[(c->ring_head + c->ring_count) % c->ring_size];
	c->ring_count++;
	p->tag = c->next_tag++;
	p->token = token;
	p->published_at = GetCurrentTimestamp();
	p->returned = false;
	strlcpy(p->message_id, msg->id, sizeof(p->message_id));
	return 1;
}

static int
rmq_wait_events(void *target, pgsocket *socks, uint32 *events, int max)
{
	AmqpTarget *t = (AmqpTarget *) target;

	if (t->client != NULL && t->client->corked)
		rmq_cork(t->client, false);
	if (max < 1 || t->client == NULL || t->client->conn == NULL ||
		t->client->fd < 0)
		return 0;
	socks[0] = t->client->fd;
	events[0] = WL_SOCKET_READABLE;
	return 1;
}

/* A basic.return's header frame: mark the message it names. */
static void
rmq_returned(AmqpClient *c, const amqp_basic_properties_t *props)
{
	if (props == NULL || !(props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG))
		return;
	for (int i = 0; i < c->ring_count; i++)
	{
		AmqpPending *p = &c->ring[(c->ring_head + i) % c->ring_size];

		if (p->token != NULL && !p->returned &&
			props->message_id.len == strlen(p->message_id) &&
			memcmp(props->message_id.bytes, p->message_id, props->message_id.len) == 0)
		{
			p->returned = true;
			return;
		}
	}
}

/* One frame from the broker; false when the connection is done. */
static bool
rmq_frame(AmqpClient *c, const amqp_frame_t *frame)
{
	char		text[AMQP_TEXT_SIZE];

	if (frame->frame_type == AMQP_FRAME_HEADER)
	{
		if (c->returning)
		{
			rmq_returned(c, (const amqp_basic_properties_t *) frame->payload.properties.decoded);
			c->return_body_left = frame->payload.properties.body_size;
			c->returning = (c->return_body_left > 0);
		}
		return true;
	}
	if (frame->frame_type == AMQP_FRAME_BODY)
	{
		if (c->returning)
		{
			size_t		len = frame->payload.body_fragment.len;

			c->return_body_left -= Min(len, c->return_body_left);
			c->returning = (c->return_body_left > 0);
		}
		return true;
	}
	if (frame->frame_type != AMQP_FRAME_METHOD)
		return true;			/* heartbeats: rabbitmq-c saw them */

	switch (frame->payload.method.id)
	{
		case AMQP_BASIC_ACK_METHOD:
			{
				amqp_basic_ack_t *m = frame->payload.method.decoded;

				rmq_confirm(c, m->delivery_tag, m->multiple, true);
				return true;
			}
		case AMQP_BASIC_NACK_METHOD:
			{
				amqp_basic_nack_t *m = frame->payload.method.decoded;

				rmq_confirm(c, m->delivery_tag, m->multiple, false);
				return true;
			}
		case AMQP_BASIC_RETURN_METHOD:
			{
				amqp_basic_return_t *m = frame->payload.method.decoded;

				c->returning = true;
				c->return_body_left = 0;
				c->return_code = m->reply_code;
				snprintf(c->return_text, sizeof(c->return_text), "%.*s",
						 (int) Min(m->reply_text.len, 100), (char *) m->reply_text.bytes);
				return true;
			}
		case AMQP_CONNECTION_BLOCKED_METHOD:
			{
				amqp_connection_blocked_t *m = frame->payload.method.decoded;

				c->blocked = true;
				snprintf(c->blocked_reason, sizeof(c->blocked_reason), "%.*s",
						 (int) Min(m->reason.len, 160), (char *) m->reason.bytes);
				snprintf(text, sizeof(text),
						 "the broker blocked publishing (%s) before confirming; sent again when it unblocks",
						 c->blocked_reason);
				rmq_fail_pending(c, text);
				return true;
			}
		case AMQP_CONNECTION_UNBLOCKED_METHOD:
			c->blocked = false;
			return true;
		case AMQP_CHANNEL_CLOSE_METHOD:
			{
				amqp_channel_close_t *m = frame->payload.method.decoded;
				amqp_channel_close_ok_t ok = {0};

				snprintf(text, sizeof(text), "the broker closed the channel: %u %.*s",
						 m->reply_code, (int) Min(m->reply_text.len, 180),
						 (char *) m->reply_text.bytes);
				(void) amqp_send_method(c->conn, AMQP_CHANNEL,
										AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
				rmq_disconnect(c, text);
				return false;
			}
		case AMQP_CONNECTION_CLOSE_METHOD:
			{
				amqp_connection_close_t *m = frame->payload.method.decoded;
				amqp_connection_close_ok_t ok = {0};

				snprintf(text, sizeof(text), "the broker closed the connection: %u %.*s",
						 m->reply_code, (int) Min(m->reply_text.len, 180),
						 (char *) m->reply_text.bytes);
				(void) amqp_send_method(c->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
				rmq_disconnect(c, text);
				return false;
			}
		default:
			return true;
	}
}

/*
 * Every publish is confirmed within the destination's timeout, or the
 * connection is closed and what it did not confirm is retried: a broker
 * that reads and answers heartbeats but confirms nothing (a queue that
 * lost its quorum, a stopped node whose kernel still takes the bytes with
 * heartbeats off) held its publishes in flight for as long as the
 * connection lived, and with them the window and the events' leases; at
 * SIGTERM nothing was confirmed to wait for.  Checked after the frames
 * already there are read, so a confirm that came while the relay was busy
 * counts.  While blocked, nothing is unconfirmed (see the file header).
 */
static void
rmq_check_confirms(AmqpClient *c)
{
	AmqpPending *oldest;
	TimestampTz now;
	char		text[AMQP_TEXT_SIZE];

	rmq_ring_trim(c);
	if (c->conn == NULL || c->ring_count == 0)
		return;
	oldest = &c->ring[c->ring_head];
	now = GetCurrentTimestamp();
	if (now < oldest->published_at)
	{
		/* the clock went back (util.h): its wait counts from now */
		oldest->published_at = now;
		return;
	}
	if (!OutboxTimePassed(oldest->published_at, now, c->timeout_ms))
		return;
	snprintf(text, sizeof(text),
			 "no confirm from the broker within %d ms (timeout_ms): connection closed, unconfirmed publishes retried",
			 c->timeout_ms);
	rmq_disconnect(c, text);
}

/*
 * Read every frame there is, then hand over up to max completed messages:
 * one group (one message) each.  Never blocks.
 */
static int
rmq_poll(void *target, void **tokens, DeliveryResult **results,
		  bool *destination_failed, int max)
{
	AmqpTarget *t = (AmqpTarget *) target;
	AmqpClient *c = t->client;
	int			k;

	if (c == NULL)
		return 0;
	while (c->conn != NULL)
	{
		amqp_frame_t frame;
		struct timeval zero = {0, 0};
		int			st = amqp_simple_wait_frame_noblock(c->conn, &frame, &zero);

		if (st == AMQP_STATUS_TIMEOUT)
		{
			amqp_maybe_release_buffers(c->conn);
			break;
		}
		if (st != AMQP_STATUS_OK)
		{
			char		text[AMQP_TEXT_SIZE];

			snprintf(text, sizeof(text), "connection lost: %s", amqp_error_string2(st));
			rmq_disconnect(c, text);
			break;
		}
		if (!rmq_frame(c, &frame))
			break;
	}
	rmq_check_confirms(c);

	k = Min(max, c->nreports);
	for (int i = 0; i < k; i++)
	{
		const AmqpReport *r = &c->reports[i];
		DeliveryResult *res = palloc0(sizeof(DeliveryResult));

		tokens[i] = r->token;
		DeliveryResultSet(res, r->outcome,
						  r->outcome == OUTCOME_ACK ? NULL : r->text);
		results[i] = res;
		destination_failed[i] = r->destination_failed;
	}
	if (k > 0)
	{
		memmove(c->reports, c->reports + k,
				(c->nreports - k) * sizeof(AmqpReport));
		c->nreports -= k;
		c->outstanding -= k;
	}
	return k;
}

/* ---- Validation (destination/validate.c calls it) ---- */

static const DestinationOption rmq_options[] =
{
	{"exchange", DEST_OPTION_STRING, false},	/* default "" */
	{"routing_key", DEST_OPTION_STRING, false}, /* default "{type}" */
	{"unroutable", DEST_OPTION_STRING, false},	/* retry (default) or dead */
	{"heartbeat", DEST_OPTION_NUMBER, false},	/* seconds, default 30 */
	{NULL}
};

static void
rmq_validate(const DestinationDefinition *def)
{
	char	   *host;
	int			port;
	char	   *vhost;
	bool		tls;
	const char *exchange = DestinationOptionText(def, "exchange");

	rmq_url_parts(def, &host, &port, &vhost, &tls);
	DestinationRequireCredentials(def, DEST_CREDENTIALS_BASIC);
	DestinationCheckRouting(def);
	DestinationCheckInteger(def, "heartbeat", 0, 3600,
							"0 turns heartbeats off.");
	if (exchange != NULL &&
		(strlen(exchange) > 127 ||
		 !DestinationMatches(exchange, "^[A-Za-z0-9._:-]*$", false)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option exchange of destination \"%s\" is not a valid exchange name",
						def->name),
				 errdetail("Exchange names have at most 127 characters from A-Z, a-z, 0-9, \"-\", \"_\", \".\" and \":\"; \"\" is the default exchange.")));
}

const DestinationRoutine amqp_routine =
{
	.kind = "amqp",
	.max_batch = 1,
	.options = rmq_options,
	.validate = rmq_validate,
	.load = rmq_load,
	.reject = rmq_reject,
	.start = rmq_start,
	.wait_events = rmq_wait_events,
	.poll = rmq_poll,
};
