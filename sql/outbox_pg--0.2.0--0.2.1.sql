/* outbox_pg--0.2.0--0.2.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.1'" to load this file. \quit

-- 0.2.1: safety fixes (stored peer text, secrets in errors, reserved header
-- aliases, a circuit shared by all relay workers) and PostgreSQL 17/18.

-- ---------------------------------------------------------------------
-- circuit: one circuit breaker per destination, shared by all relay
-- workers of the database (src/deststats.c).  The circuit itself lives in
-- shared memory and outbox.destination_runtime() already reads it; the
-- SQL side only gains the relay's requeue statement (src/store.c): a
-- retry that gives back the attempt the lease counted, for failures that
-- were the destination's (its circuit is open), not the event's.
-- Internal, like outbox._retry(): granted to no one.
CREATE FUNCTION outbox._requeue(ids pg_catalog.uuid[], next_at pg_catalog.timestamptz[],
                                statuses pg_catalog.int4[], errors pg_catalog.text[])
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_requeue'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._requeue(pg_catalog.uuid[], pg_catalog.timestamptz[],
                                       pg_catalog.int4[], pg_catalog.text[]) FROM PUBLIC;
-- end of circuit
