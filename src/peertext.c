/*-------------------------------------------------------------------------
 *
 * peertext.c
 *		  Text that came from a destination, made safe to store and to log.
 *
 * A destination's answer (response body, AWS and RabbitMQ error strings,
 * libcurl's error buffer) is bytes the relay does not control.  Every such
 * text goes through OutboxPeerText() before it is stored (outbox.events.
 * last_error, the worker slot shown by outbox.workers()) or logged.  The
 * result:
 *
 *	- is valid in the database encoding.  The input is read as UTF-8 (what
 *	  HTTP bodies are); a byte that does not start a legal UTF-8 sequence
 *	  becomes "\xNN".  In a UTF8 database characters are kept as they are;
 *	  in LATIN1 the characters U+00A0..U+00FF are kept as their byte; in
 *	  every other encoding (SQL_ASCII included) anything outside ASCII is
 *	  written "\uXXXX" (or "\UXXXXXXXX"), so what is stored is plain ASCII
 *	  that a dump restores into any database;
 *	- has no control characters: tab and newline stay; carriage return is
 *	  written "\r" (a bare CR lets a peer overwrite a log line on a
 *	  terminal); NUL, ESC and the other C0 characters and DEL become
 *	  "\xNN"; the C1 controls (U+0080..U+009F, CSI among them), the line
 *	  and paragraph separators and the bidirectional overrides become
 *	  "\uXXXX".  A backslash of the peer's own is kept as it is;
 *	- holds none of the destination's secrets (see below): each occurrence
 *	  becomes "[redacted]";
 *	- is at most max_bytes long, cut between characters, never inside an
 *	  escape or the redaction marker.
 *
 * Redaction runs on the raw bytes, before anything is escaped or cut, so a
 * cut can never leave half a secret behind.  An input that was itself cut
 * before it got here (the relay keeps only the start of a body) may end in
 * the first part of a secret: when the caller says the input was cut, an
 * ending that is the start of a secret (PEER_PARTIAL_MIN bytes or more) is
 * redacted too.
 *
 * The secrets of a destination are collected by OutboxPeerSecrets() at
 * every configuration load (built again only when they changed): header
 * values (Authorization and any other), the bearer token, the Standard
 * Webhooks secrets, the AWS keys and session token, the RabbitMQ user's
 * password and the password of the URL's userinfo.  Each is redacted raw and in the forms a peer echoes it:
 * base64 (what "Authorization: Basic" carries), percent-encoded (upper and
 * lower case hex) and JSON-escaped (with "/" as "\/" too).  A secret
 * shorter than OUTBOX_SECRET_MIN_LEN bytes is not redacted wherever it
 * appears (a three-letter password would shred every word that contains
 * it); it is still redacted in the context that names it as a secret:
 * "Bearer x", "user:pass", the base64 of "user:pass", the URL userinfo.
 * The forms are tried longest first, so "Bearer token" is one redaction,
 * not "Bearer [redacted]".
 *
 * Never ERRORs on any input (the relay calls it while recording results,
 * outside any transaction), and never runs inside a libcurl callback: the
 * callbacks only copy bytes into fixed buffers (http.c); this runs when
 * the completed request is recorded.
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/peertext.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/base64.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "outbox_pg.h"
#include "util.h"
#include "peertext.h"
#include "destination/destination.h"

static PeerSecrets *peer_secrets_copy(const PeerSecrets *secrets);

PG_FUNCTION_INFO_V1(outbox_sanitize_peer_text);

#define PEER_REDACTED		"[redacted]"

/* Shortest start of a secret redacted at the end of a cut input. */
#define PEER_PARTIAL_MIN	3

/*
 * The redaction forms of one destination, longest first: form i is the
 * text from offsets[i] to offsets[i + 1] of the bytes after the offsets.
 * One chunk, so that every event can keep its own copy cheaply
 * (peer_secrets_copy).
 */
struct PeerSecrets
{
	Size		size;			/* of the whole struct */
	int			nforms;
	uint8		first[32];		/* bitmap of the bytes a form starts with */
	uint32		offsets[FLEXIBLE_ARRAY_MEMBER]; /* nforms + 1 */
};

#define PEER_FORMS_TEXT(s)	((const char *) &(s)->offsets[(s)->nforms + 1])

/*
 * Built secrets by their sources, so that the relay's configuration load
 * (every lease step) builds a destination's forms only when its secrets
 * changed.  Emptied when full.
 */
#define PEER_CACHE_SIZE		64

typedef struct PeerCacheEntry
{
	char	   *key;			/* the sources, serialized */
	int			keylen;
	PeerSecrets *secrets;		/* NULL: the sources hold no secret */
} PeerCacheEntry;

static MemoryContext peer_cache_context = NULL;
static PeerCacheEntry peer_cache[PEER_CACHE_SIZE];
static int	peer_cache_used = 0;

static void peer_add_form(List **forms, const char *form, size_t len);
static char *peer_base64(const char *s, size_t len);
static char *peer_percent_encoded(const char *s, bool lower);
static void peer_add_encoded(List **forms, const char *s);
static void peer_add_secret(List **forms, const char *secret);
static void peer_add_basic(List **forms, const char *user,
						   const char *password);
static void peer_add_header(List **forms, const char *line);
static void peer_percent_decode(char *s);
static void peer_add_url(List **forms, const char *url);
static int	peer_longest_first(const ListCell *a, const ListCell *b);
static PeerSecrets *peer_build_secrets(const PeerSecretSources *src);
static void peer_key_append(StringInfo key, const char *value);
static size_t peer_match_secret(const PeerSecrets *secrets, const char *data,
								size_t left, bool truncated);
static bool peer_unsafe_code_point(pg_wchar c);
static bool peer_set_source(PeerSecretSources *src, const char *key,
							const char *value);

/* ---- collecting secrets ---- */

/* Duplicates are removed once all are collected (OutboxPeerSecrets). */
static void
peer_add_form(List **forms, const char *form, size_t len)
{
	if (len == 0)
		return;
	*forms = lappend(*forms, pnstrdup(form, len));
}

static char *
peer_base64(const char *s, size_t len)
{
	int			enclen = pg_b64_enc_len((int) len);
	char	   *out = palloc(enclen + 1);
	/* void *: the source is const char * before PostgreSQL 18, uint8 * after */
	int			n = pg_b64_encode((const void *) s, (int) len, out, enclen);

	out[Max(n, 0)] = '\0';
	return out;
}

static char *
peer_percent_encoded(const char *s, bool lower)
{
	StringInfoData buf;

	initStringInfo(&buf);
	OutboxAppendPercentEncoded(&buf, s);
	if (lower)
	{
		/* only the hex digits after a '%' */
		for (int i = 0; i < buf.len; i++)
			if (buf.data[i] == '%' && i + 2 < buf.len)
			{
				buf.data[i + 1] = pg_ascii_tolower((unsigned char) buf.data[i + 1]);
				buf.data[i + 2] = pg_ascii_tolower((unsigned char) buf.data[i + 2]);
				i += 2;
			}
	}
	return buf.data;
}

/*
 * A form and every encoding of it a peer might echo.  Each encoding of a
 * form is at least as long as the form, so the length rule applies to the
 * form alone.
 */
static void
peer_add_encoded(List **forms, const char *s)
{
	size_t		len = strlen(s);
	StringInfoData json;

	peer_add_form(forms, s, len);
	{
		char	   *b64 = peer_base64(s, len);

		peer_add_form(forms, b64, strlen(b64));
	}
	{
		char	   *pct = peer_percent_encoded(s, false);

		peer_add_form(forms, pct, strlen(pct));
		pct = peer_percent_encoded(s, true);
		peer_add_form(forms, pct, strlen(pct));
	}

	/* JSON string contents (escape_json adds the quotes) */
	initStringInfo(&json);
	escape_json(&json, s);
	if (json.len >= 2)
	{
		StringInfoData slash;

		peer_add_form(forms, json.data + 1, json.len - 2);
		initStringInfo(&slash);
		for (int i = 1; i < json.len - 1; i++)
		{
			if (json.data[i] == '/')
				appendStringInfoChar(&slash, '\\');
			appendStringInfoChar(&slash, json.data[i]);
		}
		peer_add_form(forms, slash.data, slash.len);
	}
}

/* A secret on its own: redacted wherever it appears, if long enough. */
static void
peer_add_secret(List **forms, const char *secret)
{
	if (secret == NULL || strlen(secret) < OUTBOX_SECRET_MIN_LEN)
		return;
	peer_add_encoded(forms, secret);
}

/* Basic credentials: the password, "user:pass" and its base64, always. */
static void
peer_add_basic(List **forms, const char *user, const char *password)
{
	char	   *pair;

	if (password == NULL || password[0] == '\0')
		return;
	peer_add_secret(forms, password);
	pair = psprintf("%s:%s", user ? user : "", password);
	peer_add_encoded(forms, pair);
}

/* "Name: value" of a configured header. */
static void
peer_add_header(List **forms, const char *line)
{
	const char *value = strchr(line, ':');
	const char *space;

	if (value == NULL)
		return;
	value++;
	while (*value == ' ' || *value == '\t')
		value++;
	peer_add_secret(forms, value);

	/*
	 * "Scheme credentials" (an auth scheme is a token: letters, digits, '-'
	 * or '_'; "text/plain; charset=..." is no scheme): the credentials
	 * alone, and "Scheme x" always.
	 */
	space = strchr(value, ' ');
	if (space != NULL && space > value &&
		strspn(value, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") ==
		(size_t) (space - value))
	{
		const char *cred = space + 1;

		while (*cred == ' ')
			cred++;
		if (*cred == '\0')
			return;
		peer_add_encoded(forms, value);
		peer_add_secret(forms, cred);
		if (space - value == 5 && pg_strncasecmp(value, "basic", 5) == 0)
		{
			int			declen = pg_b64_dec_len(strlen(cred));
			char	   *dec = palloc(declen + 1);
			int			n = pg_b64_decode(cred, strlen(cred), (void *) dec, declen);
			char	   *colon;

			if (n > 0)
			{
				dec[n] = '\0';
				if (strlen(dec) == (size_t) n && (colon = strchr(dec, ':')) != NULL)
				{
					*colon = '\0';
					peer_add_basic(forms, dec, colon + 1);
				}
			}
		}
	}
}

/* Decode %XX in place; other bytes are kept. */
static void
peer_percent_decode(char *s)
{
	char	   *out = s;

	for (char *p = s; *p; p++)
	{
		if (p[0] == '%' && isxdigit((unsigned char) p[1]) &&
			isxdigit((unsigned char) p[2]))
		{
			char		hex[3] = {p[1], p[2], '\0'};

			*out++ = (char) strtol(hex, NULL, 16);
			p += 2;
		}
		else
			*out++ = *p;
	}
	*out = '\0';
}

/* The userinfo of scheme://user:pass@host/..., as written and decoded. */
static void
peer_add_url(List **forms, const char *url)
{
	const char *start;
	const char *end;
	const char *at = NULL;
	char	   *userinfo;
	char	   *colon;

	if (url == NULL || (start = strstr(url, "://")) == NULL)
		return;
	start += 3;
	end = start + strcspn(start, "/?#");
	for (const char *p = start; p < end; p++)
		if (*p == '@')
			at = p;				/* the last '@' ends the userinfo */
	if (at == NULL)
		return;
	userinfo = pnstrdup(start, at - start);
	if ((colon = strchr(userinfo, ':')) == NULL)
		return;					/* a user name alone is no secret */
	peer_add_form(forms, userinfo, strlen(userinfo));
	*colon = '\0';
	peer_add_secret(forms, colon + 1);	/* as written, percent-encoded */
	peer_percent_decode(userinfo);
	peer_percent_decode(colon + 1);
	peer_add_basic(forms, userinfo, colon + 1);
}

/* Longest first; equal forms next to each other. */
static int
peer_longest_first(const ListCell *a, const ListCell *b)
{
	size_t		la = strlen(lfirst(a));
	size_t		lb = strlen(lfirst(b));

	if (la != lb)
		return (la < lb) ? 1 : -1;
	return strcmp(lfirst(a), lfirst(b));
}

/* Every secret of a destination, in all its forms; NULL if none. */
static PeerSecrets *
peer_build_secrets(const PeerSecretSources *src)
{
	List	   *forms = NIL;
	List	   *unique = NIL;
	ListCell   *lc;
	PeerSecrets *secrets;
	Size		text_size = 0;
	char	   *p;
	int			i = 0;

	peer_add_url(&forms, src->url);
	foreach(lc, src->header_lines)
		peer_add_header(&forms, lfirst(lc));
	if (src->bearer_token != NULL && src->bearer_token[0] != '\0')
	{
		peer_add_secret(&forms, src->bearer_token);
		peer_add_header(&forms, psprintf("Authorization: Bearer %s",
										 src->bearer_token));
	}
	foreach(lc, src->signing_secrets)
	{
		const char *s = lfirst(lc);

		peer_add_secret(&forms, s);
		if (strncmp(s, "whsec_", 6) == 0)
			peer_add_secret(&forms, s + 6);
	}
	peer_add_secret(&forms, src->aws_access_key_id);
	peer_add_secret(&forms, src->aws_secret_access_key);
	peer_add_secret(&forms, src->aws_session_token);
	peer_add_basic(&forms, src->username, src->password);

	if (forms == NIL)
		return NULL;
	list_sort(forms, peer_longest_first);
	foreach(lc, forms)
	{
		if (unique != NIL && strcmp(lfirst(lc), llast(unique)) == 0)
			continue;
		unique = lappend(unique, lfirst(lc));
		text_size += strlen(lfirst(lc));
	}

	secrets = palloc0(offsetof(PeerSecrets, offsets) +
					  (list_length(unique) + 1) * sizeof(uint32) + text_size);
	secrets->nforms = list_length(unique);
	p = (char *) PEER_FORMS_TEXT(secrets);
	foreach(lc, unique)
	{
		const char *f = lfirst(lc);
		size_t		len = strlen(f);
		uint8		c = (uint8) f[0];

		secrets->offsets[i++] = p - PEER_FORMS_TEXT(secrets);
		secrets->first[c >> 3] |= (uint8) (1 << (c & 7));
		memcpy(p, f, len);
		p += len;
	}
	secrets->offsets[i] = p - PEER_FORMS_TEXT(secrets);
	secrets->size = p - (char *) secrets;
	list_free(unique);
	list_free_deep(forms);
	return secrets;
}

static void
peer_key_append(StringInfo key, const char *value)
{
	if (value == NULL)
		appendStringInfoString(key, "-|");
	else
		appendStringInfo(key, "%zu:%s|", strlen(value), value);
}

/*
 * Every secret of a destination, in all its forms; NULL when there is
 * none.  The result is a copy in the current memory context.
 */
PeerSecrets *
OutboxPeerSecrets(const PeerSecretSources *src)
{
	StringInfoData key;
	ListCell   *lc;
	PeerCacheEntry *entry;
	PeerSecrets *secrets;
	MemoryContext old;

	initStringInfo(&key);
	peer_key_append(&key, src->url);
	foreach(lc, src->header_lines)
		peer_key_append(&key, lfirst(lc));
	appendStringInfoChar(&key, '/');
	peer_key_append(&key, src->bearer_token);
	foreach(lc, src->signing_secrets)
		peer_key_append(&key, lfirst(lc));
	appendStringInfoChar(&key, '/');
	peer_key_append(&key, src->aws_access_key_id);
	peer_key_append(&key, src->aws_secret_access_key);
	peer_key_append(&key, src->aws_session_token);
	peer_key_append(&key, src->username);
	peer_key_append(&key, src->password);

	for (int i = 0; i < peer_cache_used; i++)
	{
		entry = &peer_cache[i];
		if (entry->keylen == key.len && memcmp(entry->key, key.data, key.len) == 0)
		{
			pfree(key.data);
			return peer_secrets_copy(entry->secrets);
		}
	}

	if (peer_cache_context == NULL)
		peer_cache_context = AllocSetContextCreate(TopMemoryContext,
												   "outbox_pg peer secrets",
												   ALLOCSET_SMALL_SIZES);
	if (peer_cache_used == PEER_CACHE_SIZE)
	{
		MemoryContextReset(peer_cache_context);
		peer_cache_used = 0;
	}
	secrets = peer_build_secrets(src);
	old = MemoryContextSwitchTo(peer_cache_context);
	entry = &peer_cache[peer_cache_used];
	entry->key = pnstrdup(key.data, key.len);
	entry->keylen = key.len;
	entry->secrets = peer_secrets_copy(secrets);
	peer_cache_used++;
	MemoryContextSwitchTo(old);
	pfree(key.data);
	return secrets;
}

/* A copy in the current memory context (NULL stays NULL). */
static PeerSecrets *
peer_secrets_copy(const PeerSecrets *secrets)
{
	PeerSecrets *copy;

	if (secrets == NULL)
		return NULL;
	copy = palloc(secrets->size);
	memcpy(copy, secrets, secrets->size);
	return copy;
}

/* ---- sanitizing ---- */

/*
 * Length of the secret form that starts at data (0 if none).  With
 * truncated, an ending of the input that is the start of a form counts as
 * that form.
 */
static size_t
peer_match_secret(const PeerSecrets *secrets, const char *data, size_t left,
				  bool truncated)
{
	const char *text = PEER_FORMS_TEXT(secrets);
	uint8		c = (uint8) data[0];

	if ((secrets->first[c >> 3] & (1 << (c & 7))) == 0)
		return 0;
	for (int i = 0; i < secrets->nforms; i++)
	{
		const char *f = text + secrets->offsets[i];
		size_t		flen = secrets->offsets[i + 1] - secrets->offsets[i];

		if (f[0] != data[0])
			continue;
		if (flen <= left)
		{
			if (memcmp(data, f, flen) == 0)
				return flen;
		}
		else if (truncated && left >= PEER_PARTIAL_MIN &&
				 memcmp(data, f, left) == 0)
			return left;
	}
	return 0;
}

/* Is this code point escaped although it is printable in Unicode terms? */
static bool
peer_unsafe_code_point(pg_wchar c)
{
	return (c >= 0x80 && c <= 0x9f) ||	/* C1 controls, CSI among them */
		c == 0x2028 || c == 0x2029 ||	/* line and paragraph separators */
		(c >= 0x202a && c <= 0x202e) || /* bidirectional embeddings */
		(c >= 0x2066 && c <= 0x2069) || /* bidirectional isolates */
		c == 0x200e || c == 0x200f || c == 0xfeff;
}

/*
 * Peer-supplied bytes as a string safe to store and log: see the notes at
 * the top of the file.  data need not be NUL-terminated and may hold
 * anything; truncated says the peer sent more than data holds.  secrets
 * may be NULL.  The result (palloc'd) is at most max_bytes long.
 */
char *
OutboxPeerText(const char *data, size_t len, bool truncated,
			   const PeerSecrets *secrets, int max_bytes)
{
	StringInfoData out;
	int			encoding = GetDatabaseEncoding();
	const unsigned char *s = (const unsigned char *) data;
	size_t		i = 0;

	initStringInfo(&out);
	if (data == NULL)
		return out.data;
	while (i < len)
	{
		char		unit[16];
		const char *u = unit;
		int			ulen;
		size_t		advance = 1;
		size_t		secret_len = 0;
		unsigned char c = s[i];

		if (secrets != NULL)
			secret_len = peer_match_secret(secrets, data + i, len - i, truncated);
		if (secret_len > 0)
		{
			u = PEER_REDACTED;
			ulen = strlen(PEER_REDACTED);
			advance = secret_len;
		}
		else if (c < 0x80)
		{
			if (c == '\t' || c == '\n' || (c >= 0x20 && c < 0x7f))
			{
				unit[0] = (char) c;
				ulen = 1;
			}
			else if (c == '\r')
				ulen = snprintf(unit, sizeof(unit), "\\r");
			else
				ulen = snprintf(unit, sizeof(unit), "\\x%02x", c);
		}
		else
		{
			int			l = pg_utf_mblen(s + i);

			if (l < 2 || (size_t) l > len - i || !pg_utf8_islegal(s + i, l))
				ulen = snprintf(unit, sizeof(unit), "\\x%02x", c);
			else
			{
				pg_wchar	cp = utf8_to_unicode(s + i);

				advance = l;
				if (peer_unsafe_code_point(cp))
					ulen = snprintf(unit, sizeof(unit), "\\u%04x", (unsigned int) cp);
				else if (encoding == PG_UTF8)
				{
					u = data + i;
					ulen = l;
				}
				else if (encoding == PG_LATIN1 && cp <= 0xff)
				{
					unit[0] = (char) cp;
					ulen = 1;
				}
				else if (cp <= 0xffff)
					ulen = snprintf(unit, sizeof(unit), "\\u%04x", (unsigned int) cp);
				else
					ulen = snprintf(unit, sizeof(unit), "\\U%08x", (unsigned int) cp);
			}
		}

		if (out.len + ulen > max_bytes)
			break;
		appendBinaryStringInfo(&out, u, ulen);
		i += advance;
	}
	return out.data;
}

/*
 * Text in the database encoding that came from outside (a message id, an
 * application's value), made safe to show as a peer's text is: at most
 * max_bytes of it taken (cut between characters), at most 4 * max_bytes
 * shown.  Never raises an error, like OutboxPeerText.  In a UTF8 database
 * the text is what OutboxPeerText reads.  In any other one its bytes are
 * shown as they are where they are printable ASCII, and escaped (\xNN,
 * "\r") otherwise: read as UTF-8, a run of them that happened to be legal
 * UTF-8 showed as another character, and an operator could not find the
 * value again.  Converted to UTF-8 first (before 0.5.1), the text raised
 * an error in SQL_ASCII (a byte that is not UTF-8), in an encoding with no
 * conversion to UTF-8 (MULE_INTERNAL) and for a byte with no UTF-8
 * equivalent (0x81 in WIN1252): emit() answered with that error instead
 * of naming the bad value, and an inbox dead letter's log line failed its
 * whole batch, at every lease.
 */
char *
OutboxServerTextForLog(const char *text, int max_bytes)
{
	size_t		len = strlen(text);
	int			clipped = pg_mbcliplen(text, len, max_bytes);
	StringInfoData out;

	if (GetDatabaseEncoding() == PG_UTF8)
		return OutboxPeerText(text, clipped, (size_t) clipped < len, NULL,
							  4 * max_bytes);
	initStringInfo(&out);
	for (int i = 0; i < clipped; i++)
	{
		unsigned char c = (unsigned char) text[i];

		if (c == '\t' || c == '\n' || (c >= 0x20 && c < 0x7f))
			appendStringInfoChar(&out, (char) c);
		else if (c == '\r')
			appendStringInfoString(&out, "\\r");
		else
			appendStringInfo(&out, "\\x%02x", c);
	}
	return out.data;
}

/* The single-valued members of PeerSecretSources, by their key in JSON. */
static const struct
{
	const char *key;
	size_t		offset;
}			peer_source_keys[] = {
	{"url", offsetof(PeerSecretSources, url)},
	{"bearer_token", offsetof(PeerSecretSources, bearer_token)},
	{"aws_access_key_id", offsetof(PeerSecretSources, aws_access_key_id)},
	{"aws_secret_access_key", offsetof(PeerSecretSources, aws_secret_access_key)},
	{"aws_session_token", offsetof(PeerSecretSources, aws_session_token)},
	{"username", offsetof(PeerSecretSources, username)},
	{"password", offsetof(PeerSecretSources, password)},
};

/* Set the member of src named key to value; false if key names none. */
static bool
peer_set_source(PeerSecretSources *src, const char *key, const char *value)
{
	for (int i = 0; i < lengthof(peer_source_keys); i++)
	{
		if (strcmp(key, peer_source_keys[i].key) == 0)
		{
			*(const char **) ((char *) src + peer_source_keys[i].offset) = value;
			return true;
		}
	}
	return false;
}

/*
 * outbox._sanitize_peer_text(body bytea, max_bytes int4, truncated bool,
 *							  secrets jsonb) returns text
 *
 * OutboxPeerText() from SQL, for the regression tests.  secrets describes
 * a destination: {"url", "headers": {name: value}, "bearer_token",
 * "signing_secrets": [...], "aws_access_key_id", "aws_secret_access_key",
 * "aws_session_token", "username", "password"}, each optional.
 */
Datum
outbox_sanitize_peer_text(PG_FUNCTION_ARGS)
{
	bytea	   *body = PG_GETARG_BYTEA_PP(0);
	int32		max_bytes = PG_GETARG_INT32(1);
	bool		truncated = PG_GETARG_BOOL(2);
	Jsonb	   *jb = PG_GETARG_JSONB_P(3);
	PeerSecretSources src;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *key = NULL;
	char	   *header = NULL;
	int			depth = 0;

	if (max_bytes < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_bytes must not be negative")));
	memset(&src, 0, sizeof(src));
	if (!JB_ROOT_IS_OBJECT(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secrets must be a JSON object")));

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		char	   *str = NULL;

		if (tok == WJB_BEGIN_OBJECT || tok == WJB_BEGIN_ARRAY)
		{
			depth++;
			continue;
		}
		if (tok == WJB_END_OBJECT || tok == WJB_END_ARRAY)
		{
			depth--;
			continue;
		}
		if (v.type == jbvString)
			str = pnstrdup(v.val.string.val, v.val.string.len);
		if (tok == WJB_KEY)
		{
			if (depth == 1)
				key = str;
			else
				header = str;
			continue;
		}
		if (str == NULL || key == NULL)
			continue;
		if (depth == 2 && strcmp(key, "headers") == 0 && header != NULL)
			src.header_lines = lappend(src.header_lines,
									   psprintf("%s: %s", header, str));
		else if (depth == 2 && strcmp(key, "signing_secrets") == 0)
			src.signing_secrets = lappend(src.signing_secrets, str);
		else if (depth != 1 || !peer_set_source(&src, key, str))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("unknown secret source \"%s\"", key),
					 errhint("The keys are url, headers, bearer_token, signing_secrets, aws_access_key_id, aws_secret_access_key, aws_session_token, username and password.")));
	}

	PG_RETURN_TEXT_P(cstring_to_text(OutboxPeerText(VARDATA_ANY(body),
													VARSIZE_ANY_EXHDR(body),
													truncated,
													OutboxPeerSecrets(&src),
													max_bytes)));
}
