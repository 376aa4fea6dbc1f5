/* outbox_pg--0.2.1--0.3.0.sql */

-- complain if script is sourced in psql rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.3.0'" to load this file. \quit

-- 0.3.0 reorganises the C library (src/api, src/worker, src/destination)
-- behind one destination interface.  What that changes in the catalog
-- follows, one section per change.

-- ---------------------------------------------------------------------
-- destination kinds: outbox._classify() (src/destination/destination.c)
-- runs a kind's response parser on a synthetic answer (status 0: no
-- answer at all) for messages with the given ids, so the regression tests
-- check every kind's reading of statuses and bodies the way
-- outbox.backoff_delay() checks the retry schedule.  The relay's retry
-- statement now also gives attempts back (per row), so outbox._requeue()
-- runs the same statement as outbox._retry(); their SQL does not change.
-- Internal: granted to no one.
CREATE FUNCTION outbox._classify(kind pg_catalog.text, status pg_catalog.int4,
                                 body pg_catalog.text,
                                 ids pg_catalog.text[] DEFAULT NULL)
RETURNS TABLE (message_id pg_catalog.text, outcome pg_catalog.text,
               error pg_catalog.text, destination_failed pg_catalog.bool)
AS 'MODULE_PATHNAME', 'outbox_classify'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._classify(pg_catalog.text, pg_catalog.int4,
                                        pg_catalog.text, pg_catalog.text[]) FROM PUBLIC;
-- end of destination kinds
