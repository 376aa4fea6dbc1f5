/*-------------------------------------------------------------------------
 *
 * http.c
 *		  Concurrent HTTP requests with libcurl's multi interface, driven
 *		  from a WaitEventSet.
 *
 * The relay must stay responsive while requests hang: SIGTERM, SIGHUP,
 * ProcSignalBarriers (DROP DATABASE elsewhere in the cluster) and
 * postmaster death all arrive through the latch.  So curl never blocks:
 * its socket callback tells us which sockets it wants watched, and we
 * register them in an epoll set of our own; its timer callback says when
 * it wants to be called back.  HttpClientWait() waits on one WaitEventSet,
 * built once, that holds the latch, postmaster death and our epoll fd
 * (readable when any curl socket is ready); then it collects the ready
 * sockets with a non-blocking epoll_wait() and hands them to
 * curl_multi_socket_action().  No per-wait set-up, one epoll_ctl per
 * socket state change.  Connections are reused across requests
 * (keep-alive) through the multi handle's connection cache, and finished
 * easy handles are reused too.
 *
 * Connections: no limit per host.  The requests in flight to a host are
 * already bounded by the slots the relay holds of its destinations'
 * concurrency (deststats.c), so each can have a connection of its own;
 * a fixed limit per host (64 until 0.4) made the requests beyond it wait
 * inside curl, however high max_concurrency was.  What bounds them is
 * outbox.max_connections_per_worker, used twice: as
 * CURLMOPT_MAX_TOTAL_CONNECTIONS (connections open at once, busy or idle;
 * when a new one is needed at the limit, curl closes the oldest idle one,
 * and with none idle the request waits for one, its timeout running)
 * and as CURLMOPT_MAXCONNECTS, the size of the cache of idle connections.
 * The cache counts the connections in use too: one smaller than the
 * requests in flight closes a connection at almost every answer, and
 * keep-alive is lost.  Delivery shares the limit among the destinations
 * that have work (HttpClientMaxConnections, delivery.c), so that no
 * request waits for a connection.  Each connection is a file descriptor
 * of the relay: the soft limit of open files is raised for them
 * (http_set_limits).  A change of the setting applies at the next
 * request.
 *
 * HTTP/2: where the receiver offers it in the TLS handshake (ALPN), or
 * over plain http when the destination asks for it (h2c, prior
 * knowledge), and libcurl's HTTP/2 is sound (HttpClientHttp2Sound), requests
 * to one host are multiplexed on its connections:
 * up to 100 streams each (libcurl's CURLMOPT_MAX_CONCURRENT_STREAMS, or
 * fewer if the receiver says so), a new connection only when those are
 * full.  A destination may insist on HTTP/1.1.
 *
 * Rules for the callbacks: they run inside curl, so they never palloc,
 * never ereport and never longjmp.  The socket callback only calls
 * epoll_ctl(); the response body goes into a fixed buffer inside the
 * request.  Past outbox.max_response_size a kind that parses the whole
 * body (capture) gets no answer (the transfer is aborted); for one that
 * only shows the body's start (a webhook) the rest is read and thrown
 * away, so the answer counts by its status once it has ended (within the
 * request's timeout).  Aborting it there would count a 2xx the receiver
 * may not have finished, and a receiver that commits after its answer
 * could see the client go away and roll back.
 *
 * Safety of every transfer: only http and https (redirects included),
 * redirects not followed, no proxy (the environment is ignored), connect
 * and total timeouts, TLS verification on, optional CA bundle, optional
 * host allow-list, checked on the URL before the transfer and on every
 * address curl opens a socket for (egress.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/http.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <curl/curl.h>

#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "outbox_pg.h"
#include "guc.h"
#include "destination/http.h"
#include "util.h"

/*
 * libcurl 8.6 reports data that outgrew a limit (a response header line
 * longer than CURL_MAX_HTTP_HEADER) as CURLE_TOO_LARGE; older versions
 * call it CURLE_OUT_OF_MEMORY.  (The only libcurl difference the code
 * knows about, so it lives here rather than in compat.h.)
 */
#if LIBCURL_VERSION_NUM < 0x080600
#define CURLE_TOO_LARGE CURLE_OUT_OF_MEMORY
#endif

/* Finished easy handles kept for reuse (curl_easy_reset keeps their buffers). */
#define HTTP_POOL_SIZE	256

#define HTTP_MAX_READY	256

/*
 * Descriptors watched for another client (HttpClientWatch) carry this bit
 * above the descriptor in their epoll data (u64); curl's carry the bare
 * descriptor (HTTP_EPOLL_FD reads it back).
 */
#define HTTP_FOREIGN_TAG	(UINT64CONST(1) << 32)
#define HTTP_EPOLL_FD(ev)	((int) ((ev).data.u64 & UINT64CONST(0xFFFFFFFF)))

struct HttpClient
{
	CURLM	   *multi;
	int			epfd;			/* epoll set of curl's sockets */
	WaitEventSet *wait_set;		/* latch, postmaster death, epfd */
	long		timer_ms;		/* -1: no timer */
	TimestampTz timer_deadline; /* when curl wants its timeout action */
	int			running;
	HttpRequest *done_head;		/* completed, not yet taken */
	HttpRequest *done_tail;
	CURL	   *pool[HTTP_POOL_SIZE];	/* finished handles, for reuse */
	int			npool;
	int			max_connections;	/* as last set on multi */
	int			configured;		/* outbox.max_connections_per_worker then */
};

static void http_set_limits(HttpClient *client);

static int
http_socket_callback(CURL *easy, curl_socket_t fd, int what, void *userp,
					 void *socketp)
{
	HttpClient *client = (HttpClient *) userp;
	struct epoll_event ev;

	if (what == CURL_POLL_REMOVE)
	{
		/* the socket may already be closed; nothing to do then */
		(void) epoll_ctl(client->epfd, EPOLL_CTL_DEL, fd, NULL);
		curl_multi_assign(client->multi, fd, NULL);
		return 0;
	}

	memset(&ev, 0, sizeof(ev));
	ev.data.u64 = (uint64) (uint32) fd;
	if (what & CURL_POLL_IN)
		ev.events |= EPOLLIN;
	if (what & CURL_POLL_OUT)
		ev.events |= EPOLLOUT;

	if (socketp == NULL)
	{
		if (epoll_ctl(client->epfd, EPOLL_CTL_ADD, fd, &ev) != 0 &&
			!(errno == EEXIST && epoll_ctl(client->epfd, EPOLL_CTL_MOD, fd, &ev) == 0))
			return -1;
		curl_multi_assign(client->multi, fd, client);
	}
	else if (epoll_ctl(client->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)
		return -1;
	return 0;
}

static int
http_timer_callback(CURLM *multi, long timeout_ms, void *userp)
{
	HttpClient *client = (HttpClient *) userp;

	client->timer_ms = timeout_ms;
	if (timeout_ms >= 0)
		client->timer_deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															 timeout_ms);
	return 0;
}

static size_t
http_write_callback(char *data, size_t size, size_t nmemb, void *userp)
{
	HttpRequest *req = (HttpRequest *) userp;
	size_t		len = size * nmemb;
	size_t		room = sizeof(req->response) - 1 - req->response_len;

	req->response_total += len;
	if (req->response_total > (size_t) outbox_max_response_size)
	{
		req->response_too_large = true;
		if (req->capture != NULL)
			return 0;			/* aborts with CURLE_WRITE_ERROR */
		return len;				/* read to its end, not kept */
	}
	if (room > 0)
	{
		size_t		n = Min(room, len);

		memcpy(req->response + req->response_len, data, n);
		req->response_len += n;
		req->response[req->response_len] = '\0';
	}
	/* the caller's buffer for the whole body (brokers parse it) */
	if (req->capture != NULL && req->capture_len + 1 < req->capture_size)
	{
		size_t		n = Min(req->capture_size - 1 - req->capture_len, len);

		memcpy(req->capture + req->capture_len, data, n);
		req->capture_len += n;
		req->capture[req->capture_len] = '\0';
	}
	return len;
}

/*
 * The header line "Name: value" (palloc'd), or "Name;" for an empty or
 * blank value: curl leaves out a header with nothing after its colon, and
 * sends "Name;" as the header with an empty value.
 */
char *
HttpHeaderLine(const char *name, const char *value)
{
	if (value[strspn(value, " \t")] == '\0')
		return psprintf("%s;", name);
	return psprintf("%s: %s", name, value);
}

/*
 * Looks only for Retry-After: delay-seconds, or an HTTP-date (RFC 9110:
 * IMF-fixdate, or the obsolete RFC 850 and asctime forms), which becomes
 * the seconds from now to then (0 if past).  Anything else is ignored.
 * Runs inside curl: no palloc (curl_getdate() allocates nothing).
 */
static size_t
http_header_callback(char *data, size_t size, size_t nitems, void *userp)
{
	HttpRequest *req = (HttpRequest *) userp;
	size_t		len = size * nitems;
	static const char name[] = "retry-after:";
	char		value[64];
	size_t		start = sizeof(name) - 1;
	size_t		end = len;
	long		secs = 0;
	bool		digits = true;

	if (len <= start || pg_strncasecmp(data, name, start) != 0)
		return len;
	while (start < end && (data[start] == ' ' || data[start] == '\t'))
		start++;
	while (end > start && (data[end - 1] == ' ' || data[end - 1] == '\t' ||
						   data[end - 1] == '\r' || data[end - 1] == '\n'))
		end--;
	if (end == start || end - start >= sizeof(value))
		return len;
	memcpy(value, data + start, end - start);
	value[end - start] = '\0';

	for (const char *c = value; *c; c++)
	{
		if (*c < '0' || *c > '9')
		{
			digits = false;
			break;
		}
		if (secs < 1000000)
			secs = secs * 10 + (*c - '0');
	}
	if (!digits)
	{
		time_t		at;

		/* every HTTP-date form names its month and has a time of day */
		if (strchr(value, ':') == NULL || strpbrk(value, "JFMASOND") == NULL)
			return len;
		at = curl_getdate(value, NULL);
		if (at == (time_t) -1)
			return len;
		secs = Min(Max((long) (at - time(NULL)), 0L), 1000000L);
	}
	req->retry_after_secs = (int) secs;
	return len;
}

HttpClient *
HttpClientCreate(void)
{
	static bool curl_ready = false;
	HttpClient *client;

	StaticAssertStmt(HTTP_ERROR_SIZE >= CURL_ERROR_SIZE,
					 "HttpRequest.error must hold a curl error");
	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
			ereport(ERROR,
					(errcode(ERRCODE_SYSTEM_ERROR),
					 errmsg("could not initialize libcurl")));
		curl_ready = true;
	}
	/* kept for the life of the process, whatever context is current */
	client = MemoryContextAllocZero(TopMemoryContext, sizeof(HttpClient));

	client->multi = curl_multi_init();
	if (client->multi == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not create a libcurl multi handle")));
	client->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (client->epfd < 0)
		ereport(ERROR,
				(errcode_for_socket_access(),
				 errmsg("could not create an epoll set for HTTP requests: %m")));
	client->wait_set = CreateWaitEventSet(NULL, 3);
	AddWaitEventToSet(client->wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(client->wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	AddWaitEventToSet(client->wait_set, WL_SOCKET_READABLE, client->epfd, NULL, NULL);
	client->timer_ms = -1;
	curl_multi_setopt(client->multi, CURLMOPT_SOCKETFUNCTION, http_socket_callback);
	curl_multi_setopt(client->multi, CURLMOPT_SOCKETDATA, client);
	curl_multi_setopt(client->multi, CURLMOPT_TIMERFUNCTION, http_timer_callback);
	curl_multi_setopt(client->multi, CURLMOPT_TIMERDATA, client);
	http_set_limits(client);
	return client;
}

/*
 * Descriptors the relay needs besides its connections: PostgreSQL's own
 * (max_safe_fds, fd.c, and the few it keeps in reserve) and some for the
 * rest (epoll sets, native clients' sockets and pipes).
 */
#define HTTP_FD_MARGIN	64

/*
 * Connections open at once and kept idle: see the top of the file.  Each
 * is a descriptor, and PostgreSQL counts on max_safe_fds of its own, so
 * the process's soft limit of open files (often 1,024) is raised toward
 * its hard limit to make room for the setting.  Where the hard limit does
 * not allow it, the worker uses what it does allow and says so once per
 * value of the setting.
 */
static void
http_set_limits(HttpClient *client)
{
	struct rlimit rl;
	int			wanted = outbox_max_connections_per_worker;
	int			usable = wanted;

	client->configured = wanted;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
	{
		rlim_t		need = (rlim_t) wanted + max_safe_fds + HTTP_FD_MARGIN;

		if (rl.rlim_cur < need)
		{
			rlim_t		old = rl.rlim_cur;

			rl.rlim_cur = (rl.rlim_max == RLIM_INFINITY) ? need : Min(need, rl.rlim_max);
			if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
				rl.rlim_cur = old;
		}
		if (rl.rlim_cur < need)
		{
			usable = Max((int) rl.rlim_cur - max_safe_fds - HTTP_FD_MARGIN, 16);
			usable = Min(usable, wanted);
			ereport(WARNING,
					(errmsg("outbox.max_connections_per_worker is %d, but this relay worker can open only %d connections",
							wanted, usable),
					 errdetail("Its hard limit of open files (RLIMIT_NOFILE) is %lu, and %d of them are kept for PostgreSQL's own files and the worker's other descriptors.",
							   (unsigned long) rl.rlim_max, max_safe_fds + HTTP_FD_MARGIN),
					 errhint("Raise the server's open-files limit (LimitNOFILE in its systemd unit, or ulimit -n where it starts) or lower outbox.max_connections_per_worker.")));
		}
	}
	client->max_connections = usable;
	curl_multi_setopt(client->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS,
					  (long) client->max_connections);
	curl_multi_setopt(client->multi, CURLMOPT_MAXCONNECTS,
					  (long) client->max_connections);
}

/*
 * Connections this worker may have open at once: the setting, or less
 * where the open-files limit does not allow it (http_set_limits).
 */
int
HttpClientMaxConnections(HttpClient *client)
{
	if (client->configured != outbox_max_connections_per_worker)
		http_set_limits(client);	/* reloaded */
	return client->max_connections;
}

int
HttpClientRunning(HttpClient *client)
{
	return client->running;
}

/*
 * Open a socket for curl, after checking the address it is for against
 * outbox.allowed_hosts (egress.c): a name on the list may resolve to any
 * address, and an address literal may be resolved in ways the URL check
 * did not foresee.  A refused address fails that connection attempt only;
 * curl tries the host's other addresses, and the request fails with our
 * reason if none was allowed.
 */
static curl_socket_t
http_open_socket(void *clientp, curlsocktype purpose,
				 struct curl_sockaddr *address)
{
	HttpRequest *req = (HttpRequest *) clientp;

	if (!EgressCheckAddress(outbox_allowed_hosts_list, &address->addr,
							req->egress_by_name, req->egress_error,
							sizeof(req->egress_error)))
	{
		req->egress_refused = true;
		return CURL_SOCKET_BAD;
	}
	return socket(address->family, address->socktype, address->protocol);
}

/*
 * HTTP/2 (see the top of the file): asked for over TLS unless the request
 * wants HTTP/1.1, and over plain http when it wants HTTP/2.  Where HTTP/2
 * may be spoken, a request waits for a connection being opened to the same
 * host rather than opening one of its own, so that a burst of requests is
 * multiplexed over few connections instead of one each.
 */
static void
http_set_version(CURL *easy, const HttpRequest *req)
{
	bool		may_multiplex = false;

	switch (req->http_version)
	{
		case HTTP_VERSION_AUTO:
			if (HttpClientHttp2Sound())
			{
				curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, (long) CURL_HTTP_VERSION_2TLS);
				may_multiplex = (pg_strncasecmp(req->url, "https:", 6) == 0);
				break;
			}
			/* FALLTHROUGH */
		case HTTP_VERSION_1_1:
			curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, (long) CURL_HTTP_VERSION_1_1);
			break;
		case HTTP_VERSION_2:
			curl_easy_setopt(easy, CURLOPT_HTTP_VERSION,
							 (long) CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
			may_multiplex = true;
			break;
	}
	curl_easy_setopt(easy, CURLOPT_PIPEWAIT, may_multiplex ? 1L : 0L);
}

/*
 * Whether this libcurl's HTTP/2 is sound enough to be the default: it has
 * HTTP/2 (nghttp2) and is 8.0 or later.  7.88 (Debian 12) failed requests
 * that a receiver answered before reading their whole body, with "Stream
 * error in the HTTP/2 framing layer" after the 2xx (70 of 600 against
 * nginx's "return 204"; the event is sent again), and could not reuse a
 * connection without TLS (fixed in curl 8.0.0).  With an older libcurl,
 * http_version auto means HTTP/1.1; 2 is honoured over TLS.
 */
bool
HttpClientHttp2Sound(void)
{
	static int	sound = -1;

	if (sound < 0)
	{
		curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);

		sound = (HttpClientHttp2() && v->version_num >= 0x080000) ? 1 : 0;
	}
	return sound == 1;
}

/* Whether this libcurl speaks HTTP/2 at all. */
bool
HttpClientHttp2(void)
{
	return (curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_HTTP2) != 0;
}

/* The libcurl the server runs with, e.g. "7.88.1" (for messages). */
const char *
HttpClientLibcurlVersion(void)
{
	return curl_version_info(CURLVERSION_NOW)->version;
}

/* Every option of a transfer: the safety rules at the top, and the request. */
static void
http_configure(CURL *easy, HttpRequest *req)
{
	curl_easy_setopt(easy, CURLOPT_URL, req->url);
	curl_easy_setopt(easy, CURLOPT_PRIVATE, req);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, req->error);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);

	/*
	 * A request that ends while its name is still being resolved leaves
	 * the resolver's thread to finish alone: without this, its cleanup
	 * waited for getaddrinfo(), and a DNS server that is down held the
	 * relay and every destination with it for the lookup's whole time,
	 * again at every retry (test/t/074).
	 */
	curl_easy_setopt(easy, CURLOPT_QUICK_EXIT, 1L);
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(easy, CURLOPT_PROXY, "");
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, http_open_socket);
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, req);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, req->timeout_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, Min(req->timeout_ms, 10000L));
	curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
	if (outbox_ca_file && outbox_ca_file[0] != '\0')
		curl_easy_setopt(easy, CURLOPT_CAINFO, outbox_ca_file);
	curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
	http_set_version(easy, req);
	curl_easy_setopt(easy, CURLOPT_USERAGENT, "outbox_pg/" OUTBOX_VERSION);
	curl_easy_setopt(easy, CURLOPT_POST, 1L);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDS, req->body);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) req->body_len);
	if (req->headers)
		curl_easy_setopt(easy, CURLOPT_HTTPHEADER, req->headers);
	/* credentials: curl copies them; they never reach a log */
	if (req->username != NULL)
	{
		curl_easy_setopt(easy, CURLOPT_USERNAME, req->username);
		curl_easy_setopt(easy, CURLOPT_PASSWORD, req->password ? req->password : "");
	}
	if (req->aws_sigv4 != NULL)
		curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, req->aws_sigv4);
	else if (req->username != NULL)
		curl_easy_setopt(easy, CURLOPT_HTTPAUTH, (long) CURLAUTH_BASIC);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, http_write_callback);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, req);
	curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, http_header_callback);
	curl_easy_setopt(easy, CURLOPT_HEADERDATA, req);
}

/*
 * Start a request.  On a setup failure the request completes at once with
 * curl_code set and no HTTP status.
 */
void
HttpClientStart(HttpClient *client, HttpRequest *req)
{
	CURL	   *easy;

	req->status = 0;
	req->duration_us = 0;
	req->multiplexed = false;
	req->failure = TRANSPORT_OK;
	req->curl_code = CURLE_OK;
	req->error[0] = '\0';
	req->response[0] = '\0';
	req->response_len = 0;
	req->response_total = 0;
	req->response_too_large = false;
	req->retry_after_secs = -1;
	req->next_done = NULL;
	req->easy = NULL;
	req->capture_len = 0;
	if (req->capture != NULL && req->capture_size > 0)
		req->capture[0] = '\0';

	req->refused = false;
	req->egress_refused = false;
	req->egress_error[0] = '\0';
	(void) HttpClientMaxConnections(client);	/* the setting may be reloaded */
	if (!EgressCheckUrl(outbox_allowed_hosts_list, req->url, &req->egress_by_name,
						req->error, sizeof(req->error)))
	{
		req->curl_code = CURLE_COULDNT_CONNECT;
		req->failure = TRANSPORT_REFUSED;
		req->refused = true;
		goto done;
	}

	if (client->npool > 0)
	{
		easy = client->pool[--client->npool];
		curl_easy_reset(easy);
	}
	else
		easy = curl_easy_init();
	if (easy == NULL)
	{
		req->curl_code = CURLE_OUT_OF_MEMORY;
		req->failure = TRANSPORT_FAILED;
		snprintf(req->error, sizeof(req->error), "out of memory");
		goto done;
	}
	req->easy = easy;

	http_configure(easy, req);

	if (curl_multi_add_handle(client->multi, easy) != CURLM_OK)
	{
		curl_easy_cleanup(easy);
		req->easy = NULL;
		req->curl_code = CURLE_OUT_OF_MEMORY;
		req->failure = TRANSPORT_FAILED;
		snprintf(req->error, sizeof(req->error), "could not add request");
		goto done;
	}
	client->running++;
	return;

done:
	if (client->done_tail)
		client->done_tail->next_done = req;
	else
		client->done_head = req;
	client->done_tail = req;
}

/*
 * Complete a request without sending it: the caller decided its outcome
 * before sending (a message too large to send, for instance).  It comes
 * back from the next HttpClientWait() like any other.
 */
void
HttpClientSkip(HttpClient *client, HttpRequest *req)
{
	req->status = 0;
	req->failure = TRANSPORT_OK;
	req->curl_code = CURLE_OK;
	req->easy = NULL;
	req->next_done = NULL;
	if (client->done_tail)
		client->done_tail->next_done = req;
	else
		client->done_head = req;
	client->done_tail = req;
}

/*
 * What a finished transfer means to the retry policy: an answer (any
 * status) or none.  An answer cut short (too large for a kind that parses
 * it, a header line over curl's limit, a body that did not end) is no
 * answer to classify.
 */
static TransportFailure
http_failure(const HttpRequest *req)
{
	if (req->refused)
		return TRANSPORT_REFUSED;
	if (req->curl_code != CURLE_OK || req->status == 0)
		return TRANSPORT_FAILED;
	return TRANSPORT_OK;
}

static void
http_collect(HttpClient *client)
{
	CURLMsg    *msg;
	int			left;

	while ((msg = curl_multi_info_read(client->multi, &left)) != NULL)
	{
		HttpRequest *req;
		CURL	   *easy = msg->easy_handle;
		long		status = 0;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **) &req);
		req->curl_code = msg->data.result;
		Assert(req->easy == easy);
		curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
		req->status = (int) status;
		{
			curl_off_t	total_us = 0;
			long		version = 0;

			curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME_T, &total_us);
			req->duration_us = (int64) total_us;
			curl_easy_getinfo(easy, CURLINFO_HTTP_VERSION, &version);
			req->multiplexed = (version >= CURL_HTTP_VERSION_2_0);
		}
		if (req->egress_refused && req->status == 0 &&
			req->curl_code == CURLE_COULDNT_CONNECT)
		{
			/* no address of the host was allowed (see http_open_socket) */
			strlcpy(req->error, req->egress_error, sizeof(req->error));
			req->refused = true;
		}
		else if (req->response_too_large && req->capture != NULL)
			snprintf(req->error, sizeof(req->error),
					 "response body larger than outbox.max_response_size (%d bytes)",
					 outbox_max_response_size);
		else if (req->response_too_large && req->curl_code != CURLE_OK)
		{
			/* read past the cap (a webhook's), and it did not end */
			char		why[HTTP_ERROR_SIZE];

			strlcpy(why, req->error[0] ? req->error :
					curl_easy_strerror(req->curl_code), sizeof(why));
			snprintf(req->error, sizeof(req->error),
					 "response body larger than outbox.max_response_size (%d bytes) did not end: %s",
					 outbox_max_response_size, why);
		}
		else if ((req->curl_code == CURLE_OUT_OF_MEMORY ||
				  req->curl_code == CURLE_TOO_LARGE) && req->status != 0)

			/*
			 * libcurl 7.88 reports a response header line longer than its
			 * limit (CURL_MAX_HTTP_HEADER) as "Out of memory", 8.6 and
			 * later as CURLE_TOO_LARGE; after a status line that is what
			 * happened, and saying so tells the operator it is the
			 * destination's doing.
			 */
			snprintf(req->error, sizeof(req->error),
					 "response header line longer than libcurl's limit (%d bytes)",
					 CURL_MAX_HTTP_HEADER);
		else if (req->curl_code != CURLE_OK && req->error[0] == '\0')
			strlcpy(req->error, curl_easy_strerror(req->curl_code), sizeof(req->error));
		req->failure = http_failure(req);
		curl_multi_remove_handle(client->multi, easy);
		if (client->npool < HTTP_POOL_SIZE)
			client->pool[client->npool++] = easy;
		else
			curl_easy_cleanup(easy);
		req->easy = NULL;
		client->running--;

		if (client->done_tail)
			client->done_tail->next_done = req;
		else
			client->done_head = req;
		client->done_tail = req;
	}
}

/* curl's timer ran out (or it asked to be called right away): its action */
static void
http_timer_action(HttpClient *client)
{
	int			still_running;

	if (client->running > 0 && client->timer_ms >= 0 &&
		OutboxDeadlineReached(client->timer_deadline, client->timer_ms,
							  GetCurrentTimestamp()))
		curl_multi_socket_action(client->multi, CURL_SOCKET_TIMEOUT, 0,
								 &still_running);
}

/*
 * Let curl start the requests added since the last wait now, rather than
 * at the next wait; what completes meanwhile comes back from that wait.
 */
void
HttpClientKick(HttpClient *client)
{
	http_timer_action(client);
	http_collect(client);
}

/*
 * Wait up to timeout_ms for socket activity, curl's timer or the latch,
 * and let curl make progress.  Returns the completed requests as a list
 * linked through next_done (NULL if none).  Interrupts are the caller's
 * to check afterwards; the latch is reset here.
 */
HttpRequest *
HttpClientWait(HttpClient *client, long timeout_ms, bool *latch_set)
{
	WaitEvent	events[3];
	struct epoll_event ready[HTTP_MAX_READY];
	int			n;
	int			nready;
	long		wait_ms = timeout_ms;
	int			still_running;
	HttpRequest *done;

	*latch_set = false;
	if (client->done_head != NULL)
		wait_ms = 0;
	if (client->running > 0 && client->timer_ms >= 0)
	{
		long		left = (long) ((client->timer_deadline - GetCurrentTimestamp()) / 1000);

		/* more than curl asked for: the clock went back (util.h) */
		wait_ms = Min(wait_ms, Min(Max(left, 0), client->timer_ms));
	}

	n = WaitEventSetWait(client->wait_set, wait_ms, events, lengthof(events),
						 PG_WAIT_EXTENSION);
	for (int i = 0; i < n; i++)
	{
		if (events[i].events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			*latch_set = true;
		}
	}

	/* every ready curl socket, without blocking */
	nready = epoll_wait(client->epfd, ready, HTTP_MAX_READY, 0);
	for (int i = 0; i < nready; i++)
	{
		int			flags = 0;

		/* another client's descriptor: its readiness only ends the wait */
		if (ready[i].data.u64 & HTTP_FOREIGN_TAG)
			continue;

		if (ready[i].events & EPOLLIN)
			flags |= CURL_CSELECT_IN;
		if (ready[i].events & EPOLLOUT)
			flags |= CURL_CSELECT_OUT;
		if (ready[i].events & (EPOLLERR | EPOLLHUP))
			flags |= CURL_CSELECT_ERR;
		curl_multi_socket_action(client->multi, HTTP_EPOLL_FD(ready[i]), flags,
								 &still_running);
	}

	http_timer_action(client);
	http_collect(client);
	done = client->done_head;
	client->done_head = client->done_tail = NULL;
	return done;
}

/*
 * Have the next waits end when fd (a native broker client's wake-up
 * descriptor, destination.h) is ready too: it joins the epoll set that is
 * in the WaitEventSet with the latch.  Called before every wait for each
 * descriptor wanted (already there is fine); a descriptor leaves the set
 * when it is closed, so one that is no longer wanted must be closed, not
 * left open and ready.  false, with errno, if epoll refused it.
 */
bool
HttpClientWatch(HttpClient *client, pgsocket fd, uint32 events)
{
	struct epoll_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.data.u64 = HTTP_FOREIGN_TAG | (uint64) (uint32) fd;
	if (events & WL_SOCKET_READABLE)
		ev.events |= EPOLLIN;
	if (events & WL_SOCKET_WRITEABLE)
		ev.events |= EPOLLOUT;
	if (epoll_ctl(client->epfd, EPOLL_CTL_ADD, fd, &ev) == 0 || errno == EEXIST)
		return true;
	return false;
}

static void
http_free_headers(void *arg)
{
	HttpRequest *req = (HttpRequest *) arg;

	Assert(req->easy == NULL);	/* never while curl still uses it */
	if (req->headers != NULL)
		curl_slist_free_all(req->headers);
	req->headers = NULL;
}

/*
 * Append a "Name: value" line (curl copies it) to the request's header
 * list.  The list is malloc'd by curl; the first line registers a reset
 * callback on the current memory context, which must be the one the
 * request lives in, so the list goes when that context is reset or
 * deleted, on error paths too.
 */
void
HttpRequestAddHeader(HttpRequest *req, const char *line)
{
	struct curl_slist *grown;

	if (req->free_headers.func == NULL)
	{
		req->free_headers.func = http_free_headers;
		req->free_headers.arg = req;
		MemoryContextRegisterResetCallback(CurrentMemoryContext,
										   &req->free_headers);
	}
	grown = curl_slist_append(req->headers, line);
	if (grown == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	req->headers = grown;
}
