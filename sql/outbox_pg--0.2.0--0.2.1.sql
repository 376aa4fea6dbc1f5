/* outbox_pg--0.2.0--0.2.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.1'" to load this file. \quit

-- 0.2.1: safety fixes (stored peer text, secrets in errors, reserved header
-- aliases, a circuit shared by all relay workers) and PostgreSQL 17/18.
