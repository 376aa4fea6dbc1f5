/* outbox_pg--0.2.1--0.3.0.sql */

-- complain if script is sourced in psql rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.3.0'" to load this file. \quit

-- 0.3.0 reorganises the C library (src/api, src/worker, src/destination)
-- behind one destination interface.  What that changes in the catalog
-- follows, one section per change.

------------------------------------------------------------------------
-- Destination validation in C, one source of truth (issue #15)
------------------------------------------------------------------------

-- A destination's kind now checks its own definition: each kind's C file
-- (src/destination/) lists its options with their JSON types and has a
-- validate callback, and src/destination/validate.c checks the options
-- every kind shares, with a "Perhaps you meant" hint for a misspelt one.
-- The relay's loader calls the same code.  On outbox.destinations,
-- outbox._check_config() runs it after the NOT NULL, CHECK and header
-- checks, in the same trigger, so that the order of the checks is code
-- rather than the alphabetical order of trigger names.  On
-- outbox.credentials it checks again the destinations an updated row
-- serves.  The PL/pgSQL trigger that checked broker kinds goes, and so does
-- the CHECK constraint on kind: the kinds are those the library registers,
-- and an unknown one is reported with SQLSTATE 22023 and the list of kinds.
-- Rows written before are not checked now; each is checked when a column
-- its checks read (kind, url, options, signing_secrets, bearer_token,
-- credentials) is next written.
DROP TRIGGER destinations_check_broker ON outbox.destinations;
DROP FUNCTION outbox._check_broker_destination();
ALTER TABLE outbox.destinations DROP CONSTRAINT destinations_kind_check;

DROP TRIGGER destinations_check ON outbox.destinations;
CREATE TRIGGER destinations_check
    BEFORE INSERT OR UPDATE ON outbox.destinations
    FOR EACH ROW EXECUTE FUNCTION outbox._check_config('destination', 'name', 'destination');
DROP TRIGGER credentials_check ON outbox.credentials;
CREATE TRIGGER credentials_check
    BEFORE INSERT OR UPDATE ON outbox.credentials
    FOR EACH ROW EXECUTE FUNCTION outbox._check_config('credentials', 'name', 'credentials');

COMMENT ON COLUMN outbox.destinations.kind IS
    'webhook, sns, sqs or rabbitmq: the kinds the library registers; a destination is checked against its kind when written.';

-- The same checks on a destination as it is now: ERROR (22023) if they
-- fail.  Internal, granted to no one.
CREATE FUNCTION outbox._check_destination(name pg_catalog.text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox__check_destination'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox._check_destination(pg_catalog.text) IS
    'Internal: the checks outbox.destinations'' trigger runs on a destination when it is written, on the row as it is now; ERROR if they fail.';

REVOKE ALL ON FUNCTION outbox._check_destination(pg_catalog.text) FROM PUBLIC;

-- Say which destinations written before would not pass now (0.2.x did not
-- check webhook options, bearer tokens or the base64 of signing secrets
-- when they were written).  They keep working; a WARNING names each, as
-- it must be fixed before its next change, and before a dump of the
-- database is restored (COPY fires the trigger).
DO $$
DECLARE
    d pg_catalog.text;
    msg pg_catalog.text;
BEGIN
    FOR d IN SELECT name FROM outbox.destinations ORDER BY name LOOP
        BEGIN
            PERFORM outbox._check_destination(d);
        EXCEPTION WHEN invalid_parameter_value THEN
            GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
            RAISE WARNING '%', msg
                USING DETAIL = pg_catalog.format('Destination "%s" was written by a version that did not check this; it keeps working until it is next changed.', d),
                      HINT = 'Fix the definition; SELECT outbox._check_destination(name) checks it again.';
        END;
    END LOOP;
END
$$;
-- end of destination validation

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

-- ---------------------------------------------------------------------
-- relay configuration cache (issue #19): the relays keep the loaded
-- destinations across lease steps and reload them when a commit changed
-- outbox.destinations, outbox.credentials or outbox.routes.  The
-- statement trigger outbox._config_changed() (already on destinations and
-- routes) flags the transaction; its commit bumps the database's
-- configuration generation in shared memory and wakes the relays
-- (src/api/wake.c, src/worker/delivery.c).  Credentials get the trigger
-- too: a changed key or password must reach the relays at commit.
CREATE TRIGGER credentials_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox.credentials
    FOR EACH STATEMENT EXECUTE FUNCTION outbox._config_changed();
-- end of relay configuration cache
