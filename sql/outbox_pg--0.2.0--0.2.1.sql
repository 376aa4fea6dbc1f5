/* outbox_pg--0.2.0--0.2.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.1'" to load this file. \quit

-- 0.2.1: safety fixes (stored peer text, secrets in errors, reserved header
-- aliases, a circuit shared by all relay workers) and PostgreSQL 17/18.

-- ---------------------------------------------------------------------
-- egress (issue #13): the relay's outbox.allowed_hosts check as a
-- function, for tests and for trying a list before setting it.  NULL
-- means the relay would send to url (and connect to resolved, the
-- address its host resolved to, if given) with outbox.allowed_hosts =
-- allowed; otherwise the reason it would refuse.  Superusers only.
-- ---------------------------------------------------------------------
CREATE FUNCTION outbox._host_allowed(
    url         pg_catalog.text,
    allowed     pg_catalog.text,
    resolved    pg_catalog.inet DEFAULT NULL)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'outbox__host_allowed'
LANGUAGE C STABLE PARALLEL SAFE;

REVOKE ALL ON FUNCTION outbox._host_allowed(pg_catalog.text, pg_catalog.text, pg_catalog.inet) FROM PUBLIC;
