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
                                statuses pg_catalog.int4[], errors pg_catalog.text[],
                                leases pg_catalog.timestamptz[] DEFAULT NULL)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_requeue'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._requeue(pg_catalog.uuid[], pg_catalog.timestamptz[],
                                       pg_catalog.int4[], pg_catalog.text[],
                                       pg_catalog.timestamptz[]) FROM PUBLIC;
-- end of circuit

------------------------------------------------------------------------
-- Secrets never in error details (issue #13)
------------------------------------------------------------------------

-- A NOT NULL or CHECK violation prints the failing row, secrets included,
-- into the client's error and the server log.  outbox._check_config()
-- (src/validate.c) runs before the other triggers of each configuration
-- table and checks the same NOT NULL columns and CHECK constraints (read
-- from the catalog, so the two cannot drift apart), raising the
-- constraint's own SQLSTATE with a message that names the row by its key,
-- the columns and the constraint: never a value.  The comment on a
-- constraint is the detail of its error, so it says what is allowed.  The
-- constraints stay as the backstop.  Foreign key and unique violations
-- show only a key, and every key here is a name.  On destinations the
-- trigger also checks the headers like emit() does (a webhook without
-- bearer_token may still set Authorization), when they are written.
CREATE FUNCTION outbox._check_config()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_check_config'
LANGUAGE C;

-- Row triggers fire in name order: "x_check" before "x_check_broker".
ALTER TRIGGER handlers_check ON inbox.handlers RENAME TO handlers_check_function;

CREATE TRIGGER destinations_check
    BEFORE INSERT OR UPDATE ON outbox.destinations
    FOR EACH ROW EXECUTE FUNCTION outbox._check_config('destination', 'name', 'headers');
CREATE TRIGGER routes_check
    BEFORE INSERT OR UPDATE ON outbox.routes
    FOR EACH ROW EXECUTE FUNCTION outbox._check_config('route', 'pattern');
CREATE TRIGGER credentials_check
    BEFORE INSERT OR UPDATE ON outbox.credentials
    FOR EACH ROW EXECUTE FUNCTION outbox._check_config('credentials', 'name');
CREATE TRIGGER handlers_check
    BEFORE INSERT OR UPDATE ON inbox.handlers
    FOR EACH ROW EXECUTE FUNCTION outbox._check_config('inbox handler', 'pattern');

COMMENT ON CONSTRAINT destinations_name_check ON outbox.destinations IS
    'A destination name has 1 to 63 letters, digits, "_", "." or "-".';
COMMENT ON CONSTRAINT destinations_kind_check ON outbox.destinations IS
    'The kind is webhook, sns, sqs or rabbitmq.';
COMMENT ON CONSTRAINT destinations_url_check ON outbox.destinations IS
    'The url is an http:// or https:// URL without spaces or control characters.';
COMMENT ON CONSTRAINT destinations_format_check ON outbox.destinations IS
    'The format is binary or structured.';
COMMENT ON CONSTRAINT destinations_headers_check ON outbox.destinations IS
    'The headers are a JSON object of header names and string values.';
COMMENT ON CONSTRAINT destinations_timeout_check ON outbox.destinations IS
    'timeout_ms is between 100 and 600000.';
COMMENT ON CONSTRAINT destinations_concurrency_check ON outbox.destinations IS
    'max_concurrency is between 1 and 1000.';
COMMENT ON CONSTRAINT destinations_attempts_check ON outbox.destinations IS
    'max_attempts is between 1 and 1000.';
COMMENT ON CONSTRAINT destinations_backoff_base_check ON outbox.destinations IS
    'backoff_base_ms is at least 10.';
COMMENT ON CONSTRAINT destinations_backoff_max_check ON outbox.destinations IS
    'backoff_max_ms is at least backoff_base_ms.';
COMMENT ON CONSTRAINT destinations_max_age_check ON outbox.destinations IS
    'max_age is a positive interval.';
COMMENT ON CONSTRAINT destinations_options_check ON outbox.destinations IS
    'The options are a JSON object.';
COMMENT ON CONSTRAINT destinations_secrets_check ON outbox.destinations IS
    'Each signing secret is base64, optionally prefixed with whsec_.';
COMMENT ON CONSTRAINT destinations_ordering_check ON outbox.destinations IS
    'Option ordering is none or aggregate; option on_dead is block or skip.';
COMMENT ON CONSTRAINT routes_pattern_check ON outbox.routes IS
    'A route pattern has 1 to 255 characters.';
COMMENT ON CONSTRAINT credentials_name_check ON outbox.credentials IS
    'A credentials name has 1 to 63 letters, digits, "_", "." or "-".';
COMMENT ON CONSTRAINT credentials_access_key_check ON outbox.credentials IS
    'An AWS access key id has 1 to 128 letters and digits.';
COMMENT ON CONSTRAINT credentials_secret_check ON outbox.credentials IS
    'An AWS secret access key is not empty and has no spaces or control characters.';
COMMENT ON CONSTRAINT credentials_session_token_check ON outbox.credentials IS
    'An AWS session token is not empty and has no spaces or control characters.';
COMMENT ON CONSTRAINT credentials_username_check ON outbox.credentials IS
    'A user name has 1 to 255 characters, none of them a colon or a control character.';
COMMENT ON CONSTRAINT credentials_password_check ON outbox.credentials IS
    'A password has no control characters.';
COMMENT ON CONSTRAINT credentials_aws_pair_check ON outbox.credentials IS
    'aws_access_key_id and aws_secret_access_key are set together.';
COMMENT ON CONSTRAINT credentials_token_check ON outbox.credentials IS
    'An AWS session token needs an access key id and secret access key.';
COMMENT ON CONSTRAINT credentials_basic_pair_check ON outbox.credentials IS
    'username and password are set together.';
COMMENT ON CONSTRAINT credentials_not_empty_check ON outbox.credentials IS
    'Credentials hold an AWS key pair or a user name and password.';
COMMENT ON CONSTRAINT handlers_pattern_check ON inbox.handlers IS
    'A handler pattern has 1 to 255 characters.';
COMMENT ON CONSTRAINT handlers_attempts_check ON inbox.handlers IS
    'max_attempts is between 1 and 1000.';
COMMENT ON CONSTRAINT handlers_backoff_base_check ON inbox.handlers IS
    'backoff_base_ms is at least 10.';
COMMENT ON CONSTRAINT handlers_backoff_max_check ON inbox.handlers IS
    'backoff_max_ms is at least backoff_base_ms.';

-- Headers of destinations written by an older version are checked when
-- they are next written (an UPDATE of other columns leaves them alone).
REVOKE ALL ON FUNCTION outbox._check_config() FROM PUBLIC;

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
