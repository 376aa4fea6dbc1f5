/* outbox_pg--0.2.0--0.2.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.1'" to load this file. \quit

-- 0.2.1: safety fixes (stored peer text, secrets in errors, reserved header
-- aliases, a circuit shared by all relay workers) and PostgreSQL 17/18.

------------------------------------------------------------------------
-- Lease fencing (issue #13): a late retry or dead letter from a relay
-- that stalled past its lease must not change a row another relay has
-- leased since (see src/store.c).  The lease returns the leased_until it
-- set; retry and dead take it back and change a row only while its
-- leased_until is still that value.  The functions are internal and
-- granted to no one, so they are simply replaced.
------------------------------------------------------------------------

DROP FUNCTION outbox._lease(pg_catalog.int4, pg_catalog.interval, pg_catalog.text);
DROP FUNCTION outbox._retry(pg_catalog.uuid[], pg_catalog.timestamptz[],
                            pg_catalog.int4[], pg_catalog.text[]);
DROP FUNCTION outbox._dead(pg_catalog.uuid[], pg_catalog.int4[], pg_catalog.text[]);

-- Lease up to batch_size due events of one destination (see src/store.c:
-- the same statement the relay runs).  Each lease counts as an attempt;
-- a leased row is due again when the lease runs out.  leased_until
-- identifies this lease: pass it to _retry and _dead.
CREATE FUNCTION outbox._lease(batch_size pg_catalog.int4, lease pg_catalog.interval,
                              destination pg_catalog.text)
RETURNS TABLE (id pg_catalog.uuid, type pg_catalog.text, aggregate_id pg_catalog.text,
               payload pg_catalog.text, headers pg_catalog.jsonb, traceparent pg_catalog.text,
               "time" pg_catalog.text, attempts pg_catalog.int4, age pg_catalog.float8,
               leased_until pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'outbox_lease'
LANGUAGE C VOLATILE;

-- Transient failure: due again at next_at.  With leases (the
-- leased_until each event's lease returned), a row leased again since is
-- left alone; without (null), any pending row changes.
CREATE FUNCTION outbox._retry(ids pg_catalog.uuid[], next_at pg_catalog.timestamptz[],
                              statuses pg_catalog.int4[], errors pg_catalog.text[],
                              leases pg_catalog.timestamptz[] DEFAULT NULL)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_retry'
LANGUAGE C VOLATILE;

-- Permanent failure or out of attempts: dead letter, error kept.  leases
-- as for _retry.
CREATE FUNCTION outbox._dead(ids pg_catalog.uuid[], statuses pg_catalog.int4[],
                             errors pg_catalog.text[],
                             leases pg_catalog.timestamptz[] DEFAULT NULL)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_dead'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._lease(pg_catalog.int4, pg_catalog.interval, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._retry(pg_catalog.uuid[], pg_catalog.timestamptz[], pg_catalog.int4[],
                                     pg_catalog.text[], pg_catalog.timestamptz[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._dead(pg_catalog.uuid[], pg_catalog.int4[], pg_catalog.text[],
                                   pg_catalog.timestamptz[]) FROM PUBLIC;
