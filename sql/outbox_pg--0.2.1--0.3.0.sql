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
-- end of destination validation
