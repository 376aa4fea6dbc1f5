/*-------------------------------------------------------------------------
 *
 * peertext.h
 *		  Text received from peers, made safe to store and log (peertext.c).
 *
 * Copyright (c) 2026, outbox_pg developers
 *
 * IDENTIFICATION
 *		  src/peertext.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PEERTEXT_H
#define OUTBOX_PEERTEXT_H

#include "nodes/pg_list.h"

#include "outbox_pg.h"

/* peertext.c */
/* Secrets shorter than this are redacted only where their context names them. */
#define OUTBOX_SECRET_MIN_LEN	6

typedef struct PeerSecrets PeerSecrets;

/* Where a destination keeps secrets (each member optional). */
typedef struct PeerSecretSources
{
	const char *url;			/* its userinfo */
	List	   *header_lines;	/* "Name: value" */
	const char *bearer_token;
	List	   *signing_secrets;	/* "whsec_..." as configured */
	const char *aws_access_key_id;
	const char *aws_secret_access_key;
	const char *aws_session_token;
	const char *username;
	const char *password;
} PeerSecretSources;

extern PeerSecrets *OutboxPeerSecrets(const PeerSecretSources *src);
extern char *OutboxPeerText(const char *data, size_t len, bool truncated,
							const PeerSecrets *secrets, int max_bytes);
extern char *OutboxServerTextForLog(const char *text, int max_bytes);

#endif							/* OUTBOX_PEERTEXT_H */
