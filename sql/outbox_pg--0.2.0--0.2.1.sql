/* outbox_pg--0.2.0--0.2.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.1'" to load this file. \quit

-- 0.2.1: safety fixes (stored peer text, secrets in errors, reserved header
-- aliases, a circuit shared by all relay workers) and PostgreSQL 17/18.

--
-- PostgreSQL 17/18 (issue #14): the foreign keys that keep a referenced
-- destination or credential from disappearing were ON DELETE (and for
-- routes ON UPDATE) RESTRICT.  PostgreSQL 18 reports a violated RESTRICT
-- as SQLSTATE 23001 where earlier majors say 23503; NO ACTION says 23503 on
-- every major and blocks the same changes (nothing here defers
-- constraints, so the end-of-statement check is the only difference).
--
ALTER TABLE outbox.routes
    DROP CONSTRAINT routes_destination_fkey,
    ADD CONSTRAINT routes_destination_fkey FOREIGN KEY (destination)
        REFERENCES outbox.destinations (name) ON UPDATE NO ACTION ON DELETE NO ACTION;

ALTER TABLE outbox.destinations
    DROP CONSTRAINT destinations_credentials_fkey,
    ADD CONSTRAINT destinations_credentials_fkey FOREIGN KEY (credentials)
        REFERENCES outbox.credentials (name) ON UPDATE CASCADE ON DELETE NO ACTION;
