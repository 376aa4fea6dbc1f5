/* outbox_pg--0.2.1--0.3.0.sql */

-- complain if script is sourced in psql rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.3.0'" to load this file. \quit

-- 0.3.0 reorganises the C library (src/api, src/worker, src/destination)
-- behind one destination interface.  What that changes in the catalog
-- follows, one section per change.
