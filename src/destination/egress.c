/*-------------------------------------------------------------------------
 *
 * egress.c
 *		  The destination allow-list: outbox.allowed_hosts, checked against
 *		  the URL and again against every address the relay connects to.
 *
 * Design notes:
 *
 *	- The list is parsed once, by the GUC check hook, into an EgressList
 *	  kept in malloc'd memory (the GUC machinery owns and frees it).  A bad
 *	  entry is refused when it is set (ALTER SYSTEM, reload, start) with a
 *	  detail that names it, instead of failing every request later.
 *	- An entry is "*" (any host), "*.example.com" (any name below it), a
 *	  host name, an IPv4 or IPv6 address, or a CIDR block; names and
 *	  addresses may carry a port ("example.com:8443", "[::1]:8080"), which
 *	  then must match too.  Entries are lower-cased and lose one trailing
 *	  dot; IPv4 addresses may be written in any form the C library's
 *	  resolver accepts (0x7f.1 is 127.0.0.1) and are stored as 4 bytes;
 *	  IPv6 addresses as 16 bytes, IPv4-mapped ones (::ffff:a.b.c.d) as the
 *	  IPv4 address they are.
 *	- The URL is parsed with libcurl's own URL parser, the one the transfer
 *	  uses, so the host we check is the host curl connects to: userinfo
 *	  ("allowed@other") is not part of it, and percent-encoding is already
 *	  decoded.  Its host is canonicalised like an entry.  A host that is an
 *	  address is matched against address entries only; a name against name
 *	  entries only ("localhost" does not allow 127.0.0.1 nor the reverse).
 *	- The address the socket is opened for is checked again, from curl's
 *	  open-socket callback (EgressCheckAddress must therefore not palloc,
 *	  ereport or longjmp).  If the URL was allowed as an address, the
 *	  connected address must be allowed by an address entry: this holds
 *	  whatever the resolver makes of the host (curl resolves "127.0.0.1."
 *	  through DNS, for instance).  If it was allowed as a name, any address
 *	  is accepted except link-local and cloud metadata addresses, which
 *	  must be named by an address or CIDR entry: a name on the list may
 *	  resolve anywhere, and the metadata service is what a forged name
 *	  would aim at.  The same holds with an empty list.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/destination/egress.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <curl/curl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/hashfn.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/inet.h"

#include "outbox_pg.h"
#include "guc.h"
#include "destination/http.h"

typedef enum EgressKind
{
	EGRESS_ANY,					/* "*" */
	EGRESS_SUFFIX,				/* "*.example.com": names below it */
	EGRESS_NAME,				/* a host name */
	EGRESS_ADDRESS				/* an address or CIDR block */
} EgressKind;

typedef struct EgressEntry
{
	EgressKind	kind;
	int			family;			/* AF_INET or AF_INET6 (addresses) */
	unsigned char addr[16];		/* 4 bytes for AF_INET */
	int			bits;			/* prefix length */
	int			port;			/* 0: any port */
	char		name[256];		/* names and suffixes, canonical */
} EgressEntry;

struct EgressList
{
	int			nentries;
	EgressEntry entries[FLEXIBLE_ARRAY_MEMBER];
};

/* The host of a URL being checked (EgressCheckUrl). */
typedef struct EgressUrlHost
{
	char		raw[300];		/* as libcurl parsed it, for messages */
	char		host[300];		/* canonical: an address, or a name */
	int			port;			/* the URL's port, or its scheme's default */
	int			family;			/* AF_INET or AF_INET6 if an address, else 0 */
	unsigned char addr[16];
} EgressUrlHost;

/* Link-local and cloud metadata addresses, refused unless listed. */
typedef struct EgressBlock
{
	int			family;
	unsigned char addr[16];
	int			bits;
} EgressBlock;

static const EgressBlock sensitive_blocks[] = {
	/* IPv4 link-local, 169.254.169.254 (AWS, GCP, Azure, ...) among them */
	{AF_INET, {169, 254}, 16},
	/* Alibaba Cloud's metadata service */
	{AF_INET, {100, 100, 100, 200}, 32},
	/* IPv6 link-local */
	{AF_INET6, {0xfe, 0x80}, 10},
	/* AWS's IPv6 metadata service, fd00:ec2::254 */
	{AF_INET6, {0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x54}, 128},
};

static bool egress_prefix_match(const unsigned char *a, const unsigned char *b,
								int bits);
static bool egress_parse_ipv4(const char *s, unsigned char *out);
static void egress_set_ipv6(const unsigned char *in6, int *family,
							unsigned char *out);
static bool egress_parse_ipv6(const char *s, int *family, unsigned char *out);
static bool egress_canonical_name(char *name);
static bool egress_parse_port(const char *s, int *port);
static bool egress_entry_invalid(const char *orig, char *errbuf, size_t errlen);
static bool egress_entry_bad_port(const char *orig, char *errbuf, size_t errlen);
static bool egress_parse_entry(char *s, EgressEntry *e, char *errbuf,
							   size_t errlen);
static bool egress_parse_cidr(char *s, EgressEntry *e, const char *orig,
							  char *errbuf, size_t errlen);
static bool egress_parse_bracketed(char *s, EgressEntry *e, const char *orig,
								   char *errbuf, size_t errlen);
static bool egress_parse_ipv6_entry(const char *addr, EgressEntry *e,
									const char *orig, char *errbuf,
									size_t errlen);
static bool egress_parse_host_entry(char *s, EgressEntry *e, const char *orig,
									char *errbuf, size_t errlen);
static bool egress_address_listed(const EgressList *list, int family,
								  const unsigned char *addr, int port);
static bool egress_sensitive(int family, const unsigned char *addr);
static bool egress_url_host(const char *url, EgressUrlHost *h, char *errbuf,
							size_t errlen);
static bool egress_canonical_host(const EgressList *list, EgressUrlHost *h,
								  char *errbuf, size_t errlen);
static bool egress_host_listed(const EgressList *list, const EgressUrlHost *h,
							   bool *by_name, bool *port_mismatch);
static bool egress_address_refused(int family, const unsigned char *addr,
								   char *errbuf, size_t errlen);
static int	egress_url_port(const char *url);

static const unsigned char v4mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
static const unsigned char nat64_prefix[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};

static bool
egress_prefix_match(const unsigned char *a, const unsigned char *b, int bits)
{
	int			bytes = bits / 8;
	int			rest = bits % 8;

	if (memcmp(a, b, bytes) != 0)
		return false;
	if (rest != 0)
	{
		unsigned char mask = (unsigned char) (0xff << (8 - rest));

		if ((a[bytes] & mask) != (b[bytes] & mask))
			return false;
	}
	return true;
}

/*
 * IPv4 in any form the resolver accepts for a numeric host (1 to 4 parts,
 * each decimal, octal or hex), nothing else: inet_aton() alone would
 * accept trailing junk after a space.
 */
static bool
egress_parse_ipv4(const char *s, unsigned char *out)
{
	struct in_addr in;

	if (*s == '\0')
		return false;
	for (const char *p = s; *p; p++)
	{
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
			  (*p >= 'A' && *p <= 'F') || *p == 'x' || *p == 'X' || *p == '.'))
			return false;
	}
	if (inet_aton(s, &in) == 0)
		return false;
	memcpy(out, &in.s_addr, 4);
	return true;
}

/* A 16-byte IPv6 address; IPv4-mapped ones come back as IPv4. */
static void
egress_set_ipv6(const unsigned char *in6, int *family, unsigned char *out)
{
	if (memcmp(in6, v4mapped_prefix, 12) == 0)
	{
		*family = AF_INET;
		memcpy(out, in6 + 12, 4);
	}
	else
	{
		*family = AF_INET6;
		memcpy(out, in6, 16);
	}
}

/* An IPv6 address in text; IPv4-mapped ones come back as IPv4. */
static bool
egress_parse_ipv6(const char *s, int *family, unsigned char *out)
{
	struct in6_addr in6;

	if (inet_pton(AF_INET6, s, &in6) != 1)
		return false;
	egress_set_ipv6(in6.s6_addr, family, out);
	return true;
}

/*
 * Lower-case a host name and drop one trailing dot, in place.  Returns
 * false for what cannot be a DNS name: empty labels, characters outside
 * letters, digits, '-' and '_' (non-ASCII names must be written in their
 * punycode form, xn--...).
 */
static bool
egress_canonical_name(char *name)
{
	size_t		len = strlen(name);

	if (len > 0 && name[len - 1] == '.')
		name[--len] = '\0';
	if (len == 0 || len > 253 || name[0] == '.' || strstr(name, "..") != NULL)
		return false;
	for (char *p = name; *p; p++)
	{
		if (*p >= 'A' && *p <= 'Z')
			*p += 'a' - 'A';
		else if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
				   *p == '-' || *p == '_' || *p == '.'))
			return false;
	}
	return true;
}

static bool
egress_parse_port(const char *s, int *port)
{
	long		v = 0;

	if (*s == '\0')
		return false;
	for (const char *p = s; *p; p++)
	{
		if (*p < '0' || *p > '9')
			return false;
		v = v * 10 + (*p - '0');
		if (v > 65535)
			return false;
	}
	if (v == 0)
		return false;
	*port = (int) v;
	return true;
}

/* The reasons an entry is refused, shared by the parsers below. */
static bool
egress_entry_invalid(const char *orig, char *errbuf, size_t errlen)
{
	snprintf(errbuf, errlen, "Entry \"%s\" is not a host name, an IP address or a CIDR block", orig);
	return false;
}

static bool
egress_entry_bad_port(const char *orig, char *errbuf, size_t errlen)
{
	snprintf(errbuf, errlen, "Entry \"%s\" has an invalid port", orig);
	return false;
}

/* Parse one entry (trimmed, NUL-terminated, writable). */
static bool
egress_parse_entry(char *s, EgressEntry *e, char *errbuf, size_t errlen)
{
	char	   *colon;
	char		orig[300];

	strlcpy(orig, s, sizeof(orig));
	memset(e, 0, sizeof(*e));

	if (strchr(s, '/') != NULL && strstr(s, "//") != NULL)
	{
		snprintf(errbuf, errlen, "Entry \"%s\" is a URL; list its host name or address only", orig);
		return false;
	}
	if (strcmp(s, "*") == 0)
	{
		e->kind = EGRESS_ANY;
		return true;
	}

	/* a CIDR block: address/bits, no port */
	if (strchr(s, '/') != NULL)
		return egress_parse_cidr(s, e, orig, errbuf, errlen);

	/* [IPv6] or [IPv6]:port */
	if (s[0] == '[')
		return egress_parse_bracketed(s, e, orig, errbuf, errlen);

	/* a bare IPv6 address (two colons or more), no port */
	colon = strchr(s, ':');
	if (colon != NULL && strchr(colon + 1, ':') != NULL)
		return egress_parse_ipv6_entry(s, e, orig, errbuf, errlen);

	/* name, IPv4 address or wildcard, with an optional port */
	return egress_parse_host_entry(s, e, orig, errbuf, errlen);
}

/* "address/bits": an IPv4 or IPv6 block, the address optionally in brackets */
static bool
egress_parse_cidr(char *s, EgressEntry *e, const char *orig,
				  char *errbuf, size_t errlen)
{
	char	   *slash = strchr(s, '/');
	char	   *addr = s;
	int			maxbits;
	long		bits;
	char	   *end;

	*slash = '\0';
	if (addr[0] == '[')
	{
		size_t		len = strlen(addr);

		if (len < 2 || addr[len - 1] != ']')
			return egress_entry_invalid(orig, errbuf, errlen);
		addr[len - 1] = '\0';
		addr++;
	}
	if (inet_pton(AF_INET, addr, e->addr) == 1)
		e->family = AF_INET;
	else if (inet_pton(AF_INET6, addr, e->addr) == 1)
		e->family = AF_INET6;
	else
		return egress_entry_invalid(orig, errbuf, errlen);
	maxbits = e->family == AF_INET ? 32 : 128;
	errno = 0;
	bits = strtol(slash + 1, &end, 10);
	if (slash[1] == '\0' || *end != '\0' || errno != 0 || bits < 0 || bits > maxbits)
	{
		snprintf(errbuf, errlen, "Entry \"%s\" has an invalid prefix length", orig);
		return false;
	}
	e->bits = (int) bits;
	for (int i = 0; i < maxbits / 8; i++)
	{
		int			keep = Min(Max(e->bits - i * 8, 0), 8);
		unsigned char mask = keep == 0 ? 0 : (unsigned char) (0xff << (8 - keep));

		if ((e->addr[i] & ~mask) != 0)
		{
			snprintf(errbuf, errlen, "Entry \"%s\" has bits set to the right of its prefix length", orig);
			return false;
		}
	}
	e->kind = EGRESS_ADDRESS;
	return true;
}

/* "[IPv6]" or "[IPv6]:port" */
static bool
egress_parse_bracketed(char *s, EgressEntry *e, const char *orig,
					   char *errbuf, size_t errlen)
{
	char	   *close = strchr(s, ']');

	if (close == NULL)
		return egress_entry_invalid(orig, errbuf, errlen);
	*close = '\0';
	if (close[1] == ':')
	{
		if (!egress_parse_port(close + 2, &e->port))
			return egress_entry_bad_port(orig, errbuf, errlen);
	}
	else if (close[1] != '\0')
		return egress_entry_invalid(orig, errbuf, errlen);
	return egress_parse_ipv6_entry(s + 1, e, orig, errbuf, errlen);
}

/* an IPv6 address (no brackets, no port): one address entry */
static bool
egress_parse_ipv6_entry(const char *addr, EgressEntry *e, const char *orig,
						char *errbuf, size_t errlen)
{
	if (strchr(addr, '%') != NULL)
	{
		snprintf(errbuf, errlen, "Entry \"%s\" has an IPv6 zone id, which is not supported", orig);
		return false;
	}
	if (!egress_parse_ipv6(addr, &e->family, e->addr))
		return egress_entry_invalid(orig, errbuf, errlen);
	e->bits = e->family == AF_INET ? 32 : 128;
	e->kind = EGRESS_ADDRESS;
	return true;
}

/* a host name, an IPv4 address or "*.domain", each with an optional port */
static bool
egress_parse_host_entry(char *s, EgressEntry *e, const char *orig,
						char *errbuf, size_t errlen)
{
	char	   *colon = strchr(s, ':');

	if (colon != NULL)
	{
		*colon = '\0';
		if (!egress_parse_port(colon + 1, &e->port))
			return egress_entry_bad_port(orig, errbuf, errlen);
	}
	if (egress_parse_ipv4(s, e->addr))
	{
		e->family = AF_INET;
		e->bits = 32;
		e->kind = EGRESS_ADDRESS;
		return true;
	}
	if (s[0] == '*')
	{
		if (s[1] != '.' || !egress_canonical_name(s + 2))
			return egress_entry_invalid(orig, errbuf, errlen);
		e->kind = EGRESS_SUFFIX;
		strlcpy(e->name, s + 2, sizeof(e->name));
		return true;
	}
	if (!egress_canonical_name(s))
		return egress_entry_invalid(orig, errbuf, errlen);
	e->kind = EGRESS_NAME;
	strlcpy(e->name, s, sizeof(e->name));
	return true;
}

/*
 * Bytes of a parsed list: one flat block, so a GUC check hook can copy it
 * into memory the GUC machinery allocates and frees (guc_malloc).
 */
size_t
EgressListSize(const EgressList *list)
{
	return offsetof(EgressList, entries) + list->nentries * sizeof(EgressEntry);
}

/*
 * A malloc'd copy of the list, for a native client that checks addresses
 * from a thread of its library (EgressCheckAddress); NULL when list is
 * NULL or memory ran out (the caller tells them apart).
 */
EgressList *
EgressListCopy(const EgressList *list)
{
	EgressList *copy;

	if (list == NULL)
		return NULL;
	copy = malloc(EgressListSize(list));
	if (copy != NULL)
		memcpy(copy, list, EgressListSize(list));
	return copy;
}

/*
 * A hash of the list's contents (0 for none), for the fingerprint by which
 * a native client notices that outbox.allowed_hosts changed.
 */
uint64
EgressListHash(const EgressList *list)
{
	if (list == NULL)
		return 0;
	return hash_bytes_extended((const unsigned char *) list, EgressListSize(list), 0);
}

/*
 * Parse a value of outbox.allowed_hosts.  Returns a malloc'd list (no
 * entries for an empty value), or NULL with the reason in errbuf (empty
 * for out of memory).  Allocates nothing else, so a check hook can use it.
 */
EgressList *
EgressParseList(const char *value, char *errbuf, size_t errlen)
{
	EgressList *list;
	const char *p;
	int			max = 1;

	errbuf[0] = '\0';
	if (value == NULL)
		value = "";
	for (p = value; *p; p++)
		if (*p == ',')
			max++;
	list = malloc(offsetof(EgressList, entries) + max * sizeof(EgressEntry));
	if (list == NULL)
		return NULL;
	list->nentries = 0;

	p = value;
	for (;;)
	{
		const char *start = p;
		const char *end;
		char		item[300];
		size_t		len;

		while (*p && *p != ',')
			p++;
		end = p;
		while (start < end && isspace((unsigned char) *start))
			start++;
		while (end > start && isspace((unsigned char) end[-1]))
			end--;
		len = end - start;
		if (len == 0)
		{
			/* an empty value is an empty list; an empty entry is a typo */
			if (*p != '\0' || list->nentries > 0)
			{
				snprintf(errbuf, errlen, "The list has an empty entry");
				free(list);
				return NULL;
			}
		}
		else if (len >= sizeof(item))
		{
			snprintf(errbuf, errlen, "Entry \"%.40s...\" is too long", start);
			free(list);
			return NULL;
		}
		else
		{
			memcpy(item, start, len);
			item[len] = '\0';
			if (!egress_parse_entry(item, &list->entries[list->nentries], errbuf, errlen))
			{
				free(list);
				return NULL;
			}
			list->nentries++;
		}
		if (*p == '\0')
			break;
		p++;
	}
	return list;
}

/* Is the address covered by an address or CIDR entry?  port -1: any. */
static bool
egress_address_listed(const EgressList *list, int family,
					   const unsigned char *addr, int port)
{
	if (list == NULL)
		return false;
	for (int i = 0; i < list->nentries; i++)
	{
		const EgressEntry *e = &list->entries[i];

		if (e->kind == EGRESS_ADDRESS && e->family == family &&
			(e->port == 0 || port < 0 || e->port == port) &&
			egress_prefix_match(addr, e->addr, e->bits))
			return true;
	}
	return false;
}

static bool
egress_sensitive(int family, const unsigned char *addr)
{
	unsigned char v4[4];

	/* an IPv4 address reached through the NAT64 well-known prefix */
	if (family == AF_INET6 && memcmp(addr, nat64_prefix, 12) == 0)
	{
		memcpy(v4, addr + 12, 4);
		family = AF_INET;
		addr = v4;
	}
	for (int i = 0; i < lengthof(sensitive_blocks); i++)
	{
		const EgressBlock *b = &sensitive_blocks[i];

		if (b->family == family && egress_prefix_match(addr, b->addr, b->bits))
			return true;
	}
	return false;
}

/*
 * EgressCheckUrl for a broker's host and port, which are not a URL (an
 * IPv6 address is bracketed as in one).
 */
bool
EgressCheckHost(const EgressList *list, const char *host, int port,
				bool *by_name, char *errbuf, size_t errlen)
{
	bool		v6 = (strchr(host, ':') != NULL);
	char	   *url = psprintf("http://%s%s%s:%d/", v6 ? "[" : "", host, v6 ? "]" : "", port);
	bool		ok = EgressCheckUrl(list, url, by_name, errbuf, errlen);

	pfree(url);
	return ok;
}

/*
 * May the relay send to this URL?  On success *by_name says whether the
 * host was allowed as a name (or by an empty list or "*") rather than as
 * an address; EgressCheckAddress needs it.  On refusal the reason is in
 * errbuf.  Uses libcurl's URL API, so malloc only.
 */
bool
EgressCheckUrl(const EgressList *list, const char *url, bool *by_name,
			   char *errbuf, size_t errlen)
{
	EgressUrlHost h;
	bool		allowed;
	bool		port_mismatch = false;

	*by_name = true;
	errbuf[0] = '\0';
	if (!egress_url_host(url, &h, errbuf, errlen) ||
		!egress_canonical_host(list, &h, errbuf, errlen))
		return false;

	/*
	 * An address that is link-local or a metadata service's is refused
	 * here already unless an entry names it, whatever else the list says;
	 * the open-socket check would refuse it anyway, but this way without
	 * a connection attempt.
	 */
	if (h.family != 0 && egress_sensitive(h.family, h.addr) &&
		!egress_address_listed(list, h.family, h.addr, h.port))
		return egress_address_refused(h.family, h.addr, errbuf, errlen);

	/* an empty list allows any host (the address check still applies) */
	if (list == NULL || list->nentries == 0)
		return true;

	allowed = egress_host_listed(list, &h, by_name, &port_mismatch);
	if (!allowed)
	{
		if (port_mismatch)
			snprintf(errbuf, errlen, "port %d of host \"%s\" is not in outbox.allowed_hosts", h.port, h.raw);
		else
			snprintf(errbuf, errlen, "host \"%s\" is not in outbox.allowed_hosts", h.raw);
	}
	return allowed;
}

/*
 * The host and port of an http or https URL, as libcurl parses it; false
 * with the reason in errbuf if the URL cannot be sent to at all.
 */
static bool
egress_url_host(const char *url, EgressUrlHost *h, char *errbuf, size_t errlen)
{
	CURLU	   *u;
	CURLUcode	rc;
	char	   *scheme = NULL;
	char	   *rawhost = NULL;
	char	   *zone = NULL;
	char	   *portstr = NULL;
	bool		ok = false;

	memset(h, 0, sizeof(*h));
	u = curl_url();
	if (u == NULL)
	{
		snprintf(errbuf, errlen, "out of memory");
		return false;
	}
	rc = curl_url_set(u, CURLUPART_URL, url, 0);
	if (rc == CURLUE_OK)
		rc = curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
	if (rc == CURLUE_OK)
		rc = curl_url_get(u, CURLUPART_HOST, &rawhost, 0);
	if (rc == CURLUE_OK)
		rc = curl_url_get(u, CURLUPART_PORT, &portstr, CURLU_DEFAULT_PORT);
	if (rc != CURLUE_OK)
		snprintf(errbuf, errlen, "could not parse destination URL: %s",
				 curl_url_strerror(rc));
	else if (pg_strcasecmp(scheme, "http") != 0 && pg_strcasecmp(scheme, "https") != 0)
		snprintf(errbuf, errlen, "scheme \"%s\" is not allowed; only http and https are", scheme);
	else if (curl_url_get(u, CURLUPART_ZONEID, &zone, 0) == CURLUE_OK && zone != NULL)
		snprintf(errbuf, errlen, "host \"%s\" has an IPv6 zone id, which is not allowed", rawhost);
	else if (strlen(rawhost) >= sizeof(h->raw))
		snprintf(errbuf, errlen, "host name is too long");
	else
	{
		(void) egress_parse_port(portstr, &h->port);
		strlcpy(h->raw, rawhost, sizeof(h->raw));
		strlcpy(h->host, rawhost, sizeof(h->host));
		ok = true;
	}

	curl_free(scheme);
	curl_free(rawhost);
	curl_free(zone);
	curl_free(portstr);
	curl_url_cleanup(u);
	return ok;
}

/*
 * Canonical form of the URL's host: an address (family and addr set), or
 * a lower-case name without final dot.  A name that cannot be a DNS name
 * is refused when a list is in force.
 */
static bool
egress_canonical_host(const EgressList *list, EgressUrlHost *h,
					  char *errbuf, size_t errlen)
{
	char	   *host = h->host;
	size_t		len = strlen(host);

	if (host[0] == '[')
	{
		if (len < 2 || host[len - 1] != ']')
		{
			snprintf(errbuf, errlen, "host \"%s\" is not a valid IPv6 address", h->raw);
			return false;
		}
		host[len - 1] = '\0';
		if (!egress_parse_ipv6(host + 1, &h->family, h->addr))
		{
			snprintf(errbuf, errlen, "host \"%s\" is not a valid IPv6 address", h->raw);
			return false;
		}
		return true;
	}

	if (len > 0 && host[len - 1] == '.')
		host[len - 1] = '\0';
	if (egress_parse_ipv4(host, h->addr))
	{
		h->family = AF_INET;
		return true;
	}
	/* put the dot back for the name check, which removes it */
	if (len > 0 && h->raw[len - 1] == '.')
		host[len - 1] = '.';
	if (!egress_canonical_name(host) && list != NULL && list->nentries > 0)
	{
		bool		ascii = true;

		for (const char *p = h->raw; *p; p++)
			if ((unsigned char) *p >= 0x80)
				ascii = false;
		if (ascii)
			snprintf(errbuf, errlen, "host \"%s\" is not a valid host name", h->raw);
		else
			snprintf(errbuf, errlen, "host \"%s\" is not ASCII; write it in its punycode (xn--) form", h->raw);
		return false;
	}
	return true;
}

/*
 * Is the canonical host on the (non-empty) list?  An address is matched
 * against address entries, a name against name entries, "*" matches both.
 * Sets *by_name as EgressCheckUrl documents, and *port_mismatch when an
 * entry would match but for its port.
 */
static bool
egress_host_listed(const EgressList *list, const EgressUrlHost *h,
				   bool *by_name, bool *port_mismatch)
{
	size_t		hl = strlen(h->host);
	bool		allowed = false;

	if (h->family != 0)
	{
		*by_name = false;
		allowed = egress_address_listed(list, h->family, h->addr, h->port);
		if (!allowed)
			*port_mismatch = egress_address_listed(list, h->family, h->addr, -1);
	}
	for (int i = 0; i < list->nentries && !allowed; i++)
	{
		const EgressEntry *e = &list->entries[i];
		size_t		sl = strlen(e->name);
		bool		match = false;

		if (e->kind == EGRESS_ANY)
		{
			/* any host, but its addresses get the name-level check */
			*by_name = true;
			return true;
		}
		if (h->family != 0)
			continue;
		if (e->kind == EGRESS_NAME)
			match = strcmp(h->host, e->name) == 0;
		else if (e->kind == EGRESS_SUFFIX)
			match = hl > sl + 1 && h->host[hl - sl - 1] == '.' &&
				strcmp(h->host + hl - sl, e->name) == 0;
		if (match && e->port != 0 && e->port != h->port)
		{
			*port_mismatch = true;
			match = false;
		}
		allowed = match;
	}
	return allowed;
}

/* The reason an address is refused, in errbuf; returns false. */
static bool
egress_address_refused(int family, const unsigned char *addr,
					   char *errbuf, size_t errlen)
{
	char		text[INET6_ADDRSTRLEN];

	if (inet_ntop(family, addr, text, sizeof(text)) == NULL)
		strlcpy(text, "?", sizeof(text));
	if (egress_sensitive(family, addr))
		snprintf(errbuf, errlen, "address %s is link-local or a cloud metadata address and is not named in outbox.allowed_hosts", text);
	else
		snprintf(errbuf, errlen, "address %s is not in outbox.allowed_hosts", text);
	return false;
}

/*
 * May the relay connect to this address?  Runs inside curl's open-socket
 * callback: no palloc, no ereport.  by_name comes from EgressCheckUrl.
 */
bool
EgressCheckAddress(const EgressList *list, const struct sockaddr *sa,
				   bool by_name, char *errbuf, size_t errlen)
{
	int			family;
	int			port;
	unsigned char addr[16];

	errbuf[0] = '\0';
	if (sa->sa_family == AF_INET)
	{
		const struct sockaddr_in *sin = (const struct sockaddr_in *) sa;

		family = AF_INET;
		memcpy(addr, &sin->sin_addr, 4);
		port = ntohs(sin->sin_port);
	}
	else if (sa->sa_family == AF_INET6)
	{
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *) sa;

		port = ntohs(sin6->sin6_port);
		egress_set_ipv6(sin6->sin6_addr.s6_addr, &family, addr);
	}
	else
	{
		snprintf(errbuf, errlen, "address family %d is not allowed", (int) sa->sa_family);
		return false;
	}

	if (egress_address_listed(list, family, addr, port))
		return true;
	if (!egress_sensitive(family, addr) && by_name)
		return true;
	return egress_address_refused(family, addr, errbuf, errlen);
}

/*
 * outbox._host_allowed(url text, allowed text, resolved inet DEFAULT NULL)
 *		returns text
 *
 * The relay's check, for tests and for an operator trying a list: NULL if
 * the URL (and, if given, the address it resolved to) may be sent to with
 * outbox.allowed_hosts = allowed, else the reason.
 */
PG_FUNCTION_INFO_V1(outbox__host_allowed);

Datum
outbox__host_allowed(PG_FUNCTION_ARGS)
{
	char	   *url;
	char	   *allowed;
	char		errbuf[512];
	EgressList *list;
	bool		by_name;
	bool		ok;

	/* not STRICT, for the optional address; NULL must not mean allowed */
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("url and allowed must not be null")));
	url = text_to_cstring(PG_GETARG_TEXT_PP(0));
	allowed = text_to_cstring(PG_GETARG_TEXT_PP(1));
	list = EgressParseList(allowed, errbuf, sizeof(errbuf));
	if (list == NULL)
	{
		if (errbuf[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid allowed hosts list"),
				 errdetail("%s.", errbuf)));
	}

	ok = EgressCheckUrl(list, url, &by_name, errbuf, sizeof(errbuf));
	if (ok && !PG_ARGISNULL(2))
	{
		inet	   *ip = PG_GETARG_INET_PP(2);
		struct sockaddr_storage ss;

		memset(&ss, 0, sizeof(ss));
		if (ip_family(ip) == PGSQL_AF_INET)
		{
			struct sockaddr_in *sin = (struct sockaddr_in *) &ss;

			sin->sin_family = AF_INET;
			memcpy(&sin->sin_addr, ip_addr(ip), 4);
		}
		else
		{
			struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) &ss;

			sin6->sin6_family = AF_INET6;
			memcpy(&sin6->sin6_addr, ip_addr(ip), 16);
		}
		/* the port the URL names, as curl would connect to it */
		if (ss.ss_family == AF_INET)
			((struct sockaddr_in *) &ss)->sin_port = htons(egress_url_port(url));
		else
			((struct sockaddr_in6 *) &ss)->sin6_port = htons(egress_url_port(url));
		ok = EgressCheckAddress(list, (struct sockaddr *) &ss, by_name,
								errbuf, sizeof(errbuf));
	}
	free(list);

	if (ok)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(errbuf));
}

/* The port a URL names, or its scheme's default; 0 if it has none. */
static int
egress_url_port(const char *url)
{
	CURLU	   *u = curl_url();
	char	   *portstr = NULL;
	int			port = 0;

	if (u != NULL && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
		curl_url_get(u, CURLUPART_PORT, &portstr, CURLU_DEFAULT_PORT) == CURLUE_OK)
		(void) egress_parse_port(portstr, &port);
	curl_free(portstr);
	if (u != NULL)
		curl_url_cleanup(u);
	return port;
}
