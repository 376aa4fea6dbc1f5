/* outbox_pg--0.2.0--0.2.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.1'" to load this file. \quit

-- 0.2.1: safety fixes (stored peer text, secrets in errors, reserved header
-- aliases, a circuit shared by all relay workers) and PostgreSQL 17/18.

------------------------------------------------------------------------
-- Peer text (peertext.c): what a destination says is stored and logged
-- only after it is made valid in the database encoding, stripped of
-- control characters, redacted of the destination's secrets and cut on a
-- character boundary.  This wrapper lets the regression tests call the
-- same code; it is internal and granted to no one.
------------------------------------------------------------------------

CREATE FUNCTION outbox._sanitize_peer_text(body pg_catalog.bytea,
                                           max_bytes pg_catalog.int4,
                                           truncated pg_catalog.bool DEFAULT false,
                                           secrets pg_catalog.jsonb DEFAULT '{}')
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'outbox_sanitize_peer_text'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION outbox._sanitize_peer_text(pg_catalog.bytea, pg_catalog.int4, pg_catalog.bool, pg_catalog.jsonb) IS
    'Internal: a destination''s answer as the relay stores it (encoding, control characters, redaction, byte bound).';

REVOKE ALL ON FUNCTION outbox._sanitize_peer_text(pg_catalog.bytea, pg_catalog.int4, pg_catalog.bool, pg_catalog.jsonb) FROM PUBLIC;
