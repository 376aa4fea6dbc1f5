/*-------------------------------------------------------------------------
 *
 * http.h
 *		  The relay's HTTP client (http.c) and its egress allow-list (egress.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/http.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_HTTP_H
#define OUTBOX_HTTP_H


#include "utils/memutils.h"

#include "outbox_pg.h"
#include "retry.h"

/* egress.c */
typedef struct EgressList EgressList;
struct sockaddr;

extern EgressList *EgressParseList(const char *value, char *errbuf,
								   size_t errlen);
extern size_t EgressListSize(const EgressList *list);
extern EgressList *EgressListCopy(const EgressList *list);
extern uint64 EgressListHash(const EgressList *list);
extern bool EgressCheckHost(const EgressList *list, const char *host, int port,
							bool *by_name, char *errbuf, size_t errlen);
extern bool EgressCheckUrl(const EgressList *list, const char *url,
						   bool *by_name, char *errbuf, size_t errlen);
extern bool EgressCheckAddress(const EgressList *list,
							   const struct sockaddr *sa, bool by_name,
							   char *errbuf, size_t errlen);

/* http.c */

/*
 * libcurl stays inside http.c: the request carries its handles as opaque
 * pointers, so nothing that includes this header compiles against curl.
 */
struct curl_slist;
#define HTTP_ERROR_SIZE			256 /* CURL_ERROR_SIZE, checked in http.c */

/* The HTTP version a request asks for (a webhook's options.http_version). */
typedef enum HttpVersion
{
	HTTP_VERSION_AUTO = 0,		/* HTTP/2 where TLS negotiates it, else 1.1 */
	HTTP_VERSION_1_1,			/* HTTP/1.1 only */
	HTTP_VERSION_2				/* HTTP/2, over plain http too (h2c with
								 * prior knowledge) */
} HttpVersion;

typedef struct HttpRequest
{
	/* set by the caller before HttpClientStart() */
	const char *url;
	HttpVersion http_version;
	struct curl_slist *headers; /* HttpRequestAddHeader() only */
	const char *body;
	size_t		body_len;
	long		timeout_ms;
	const char *username;		/* basic auth, or the AWS access key id */
	const char *password;		/* its password, or the AWS secret key */
	const char *aws_sigv4;		/* "aws:amz:REGION:SERVICE": sign with SigV4 */
	char	   *capture;		/* optional buffer for the whole response */
	size_t		capture_size;	/* its size, NUL included */
	size_t		capture_len;	/* set by http.c */

	/* set by http.c */
	void	   *easy;			/* the curl easy handle while it runs */
	MemoryContextCallback free_headers; /* frees headers with their context */
	int			status;			/* HTTP status, 0 if none */
	TransportFailure failure;	/* TRANSPORT_OK: status is the answer's */
	int			curl_code;		/* CURLcode, read by http.c only */
	bool		refused;		/* refused by the allow-list, unsent */
	bool		egress_by_name; /* host allowed as a name (egress.c) */
	bool		egress_refused; /* an address was refused at connect */
	char		egress_error[192];	/* why, for the error if none connected */
	int			retry_after_secs;	/* -1 if absent */
	bool		response_too_large;
	int64		duration_us;	/* total time of the request */
	bool		multiplexed;	/* answered over HTTP/2 */
	size_t		response_total;
	size_t		response_len;
	char		response[OUTBOX_RESPONSE_PREFIX_LEN];	/* start of the body */
	char		error[HTTP_ERROR_SIZE];
	struct HttpRequest *next_done;
} HttpRequest;

typedef struct HttpClient HttpClient;

/*
 * Requests one HTTP/2 connection carries at once: libcurl's default for
 * CURLMOPT_MAX_CONCURRENT_STREAMS (a receiver may allow fewer).
 */
#define HTTP_STREAMS_PER_CONNECTION	100

extern HttpClient *HttpClientCreate(void);
extern void HttpClientStart(HttpClient *client, HttpRequest *req);
extern void HttpClientKick(HttpClient *client);
extern HttpRequest *HttpClientWait(HttpClient *client, long timeout_ms,
								   bool *latch_set);
extern int	HttpClientRunning(HttpClient *client);
extern int	HttpClientMaxConnections(HttpClient *client);
extern void HttpRequestAddHeader(HttpRequest *req, const char *line);
extern char *HttpHeaderLine(const char *name, const char *value);
extern void HttpClientSkip(HttpClient *client, HttpRequest *req);
extern bool HttpClientWatch(HttpClient *client, pgsocket fd, uint32 events);
extern bool HttpClientHttp2(void);
extern bool HttpClientHttp2Sound(void);
extern const char *HttpClientLibcurlVersion(void);

#endif							/* OUTBOX_HTTP_H */
