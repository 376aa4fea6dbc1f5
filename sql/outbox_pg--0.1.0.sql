/* outbox_pg--0.1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION outbox_pg" to load this file. \quit

-- Everything below is schema-qualified, operators included, so the script
-- means the same under any search_path.

CREATE SCHEMA outbox;
CREATE SCHEMA inbox;

COMMENT ON SCHEMA outbox IS 'outbox_pg: transactional outbox and its relay';
COMMENT ON SCHEMA inbox IS 'outbox_pg: idempotent consumption';

------------------------------------------------------------------------
-- Configuration (privileged roles only; kept by pg_dump)
------------------------------------------------------------------------

CREATE TABLE outbox.destinations (
    name            pg_catalog.text PRIMARY KEY
                    CONSTRAINT destinations_name_check
                    CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.-]{1,63}$'),
    kind            pg_catalog.text NOT NULL DEFAULT 'webhook'
                    CONSTRAINT destinations_kind_check
                    CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['webhook', 'sns', 'sqs', 'rabbitmq'])),
    url             pg_catalog.text NOT NULL
                    CONSTRAINT destinations_url_check
                    CHECK (url OPERATOR(pg_catalog.~*) '^https?://[^[:space:][:cntrl:]]+$'),
    format          pg_catalog.text NOT NULL DEFAULT 'binary'
                    CONSTRAINT destinations_format_check
                    CHECK (format OPERATOR(pg_catalog.=) ANY (ARRAY['binary', 'structured'])),
    headers         pg_catalog.jsonb NOT NULL DEFAULT '{}'
                    CONSTRAINT destinations_headers_check
                    CHECK (pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.=) 'object'),
    timeout_ms      pg_catalog.int4 NOT NULL DEFAULT 10000
                    CONSTRAINT destinations_timeout_check
                    CHECK (timeout_ms OPERATOR(pg_catalog.>=) 100 AND timeout_ms OPERATOR(pg_catalog.<=) 600000),
    max_concurrency pg_catalog.int4 NOT NULL DEFAULT 16
                    CONSTRAINT destinations_concurrency_check
                    CHECK (max_concurrency OPERATOR(pg_catalog.>=) 1 AND max_concurrency OPERATOR(pg_catalog.<=) 1000),
    max_attempts    pg_catalog.int4 NOT NULL DEFAULT 12
                    CONSTRAINT destinations_attempts_check
                    CHECK (max_attempts OPERATOR(pg_catalog.>=) 1 AND max_attempts OPERATOR(pg_catalog.<=) 1000),
    backoff_base_ms pg_catalog.int4 NOT NULL DEFAULT 1000
                    CONSTRAINT destinations_backoff_base_check
                    CHECK (backoff_base_ms OPERATOR(pg_catalog.>=) 10),
    backoff_max_ms  pg_catalog.int4 NOT NULL DEFAULT 600000
                    CONSTRAINT destinations_backoff_max_check
                    CHECK (backoff_max_ms OPERATOR(pg_catalog.>=) backoff_base_ms),
    max_age         pg_catalog.interval NOT NULL DEFAULT '3 days'
                    CONSTRAINT destinations_max_age_check
                    CHECK (max_age OPERATOR(pg_catalog.>) '0'::pg_catalog.interval),
    signing_secrets pg_catalog.text[],
    bearer_token    pg_catalog.text,
    options         pg_catalog.jsonb NOT NULL DEFAULT '{}'
                    CONSTRAINT destinations_options_check
                    CHECK (pg_catalog.jsonb_typeof(options) OPERATOR(pg_catalog.=) 'object'),
    paused          pg_catalog.bool NOT NULL DEFAULT false,
    CONSTRAINT destinations_secrets_check
        CHECK (signing_secrets IS NULL
               OR pg_catalog.array_to_string(signing_secrets, ' ') OPERATOR(pg_catalog.~)
                  '^(whsec_)?[A-Za-z0-9+/]+={0,2}( (whsec_)?[A-Za-z0-9+/]+={0,2})*$'),
    created_at      pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);

COMMENT ON TABLE outbox.destinations IS
    'Named delivery endpoints. signing_secrets and bearer_token are secrets: never grant SELECT on this table to application or monitoring roles.';

CREATE TABLE outbox.routes (
    pattern     pg_catalog.text PRIMARY KEY
                CONSTRAINT routes_pattern_check
                CHECK (pg_catalog.length(pattern) OPERATOR(pg_catalog.>) 0
                       AND pg_catalog.length(pattern) OPERATOR(pg_catalog.<=) 255),
    destination pg_catalog.text NOT NULL
                REFERENCES outbox.destinations (name) ON UPDATE RESTRICT ON DELETE RESTRICT,
    priority    pg_catalog.int4 NOT NULL DEFAULT 100
);

COMMENT ON TABLE outbox.routes IS
    'Maps event types to destinations. ''*'' in a pattern matches any text; the lowest priority, then the longest pattern, wins.';

------------------------------------------------------------------------
-- The outbox
------------------------------------------------------------------------

-- Column order is part of the C contract (see OutboxEventColumn in
-- src/outbox_pg.h): new columns are only ever appended.
CREATE TABLE outbox.events (
    id              pg_catalog.uuid PRIMARY KEY,
    type            pg_catalog.text NOT NULL,
    aggregate_type  pg_catalog.text,
    aggregate_id    pg_catalog.text,
    payload         pg_catalog.jsonb NOT NULL,
    headers         pg_catalog.jsonb,
    traceparent     pg_catalog.text,
    destination     pg_catalog.text,
    status          pg_catalog.text NOT NULL DEFAULT 'pending'
                    CONSTRAINT events_status_check
                    CHECK (status OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'published', 'dead'])),
    attempts        pg_catalog.int4 NOT NULL DEFAULT 0,
    next_attempt_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    created_at      pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    published_at    pg_catalog.timestamptz,
    last_status     pg_catalog.int4,
    last_error      pg_catalog.text
);

COMMENT ON TABLE outbox.events IS
    'Events written by outbox.emit(); a row is published only after its destination acknowledged it.';

-- The relay leases per destination, by due time, then id (UUIDv7: emit
-- order), among pending rows only: the partial index returns exactly the
-- rows of one lease in order, and stays as small as the backlog.
CREATE INDEX events_pending_idx ON outbox.events (destination, next_attempt_at, id)
    WHERE status OPERATOR(pg_catalog.=) 'pending';

------------------------------------------------------------------------
-- The inbox
------------------------------------------------------------------------

CREATE TABLE inbox.claims (
    consumer    pg_catalog.text NOT NULL,
    message_id  pg_catalog.text NOT NULL,
    claimed_at  pg_catalog.timestamptz NOT NULL,
    expires_at  pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

COMMENT ON TABLE inbox.claims IS
    'Message ids already consumed, per consumer; written by inbox.claim().';

------------------------------------------------------------------------
-- pg_dump keeps configuration, undelivered events and claims
------------------------------------------------------------------------

SELECT pg_catalog.pg_extension_config_dump('outbox.destinations', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.routes', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.events',
    'WHERE status OPERATOR(pg_catalog.<>) ''published''');
SELECT pg_catalog.pg_extension_config_dump('inbox.claims', '');

------------------------------------------------------------------------
-- Functions
------------------------------------------------------------------------

CREATE FUNCTION outbox.emit(
    type            pg_catalog.text,
    aggregate_id    pg_catalog.text,
    payload         pg_catalog.jsonb,
    aggregate_type  pg_catalog.text DEFAULT NULL,
    destination     pg_catalog.text DEFAULT NULL,
    headers         pg_catalog.jsonb DEFAULT NULL,
    traceparent     pg_catalog.text DEFAULT NULL,
    not_before      pg_catalog.timestamptz DEFAULT NULL)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'outbox_emit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION outbox.emit(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.timestamptz) IS
    'Write an event into the outbox in the current transaction; returns its message id.';

-- Like emit(), claim() writes through the executor directly (no SQL, no
-- search_path, no table privilege checks): EXECUTE is the whole grant.
CREATE FUNCTION inbox.claim(
    message_id  pg_catalog.text,
    consumer    pg_catalog.text DEFAULT 'default',
    ttl         pg_catalog.interval DEFAULT NULL)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'inbox_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION inbox.claim(pg_catalog.text, pg_catalog.text, pg_catalog.interval) IS
    'Claim a message id for a consumer in the current transaction; true the first time only.';

CREATE FUNCTION outbox.route(type pg_catalog.text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'outbox_route'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION outbox.route(pg_catalog.text) IS
    'The destination an event of this type is routed to, or NULL when no route matches.';

CREATE FUNCTION outbox._config_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_config_changed'
LANGUAGE C;

CREATE TRIGGER destinations_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox.destinations
    FOR EACH STATEMENT EXECUTE FUNCTION outbox._config_changed();
CREATE TRIGGER routes_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox.routes
    FOR EACH STATEMENT EXECUTE FUNCTION outbox._config_changed();

-- The relay's steps (see src/relay.c).  Internal: not granted to anyone.

-- Lease up to batch_size due events of one destination (see src/store.c:
-- the same statement the relay runs).  Each lease counts as an attempt;
-- a leased row is due again when the lease runs out.
CREATE FUNCTION outbox._lease(batch_size pg_catalog.int4, lease pg_catalog.interval,
                              destination pg_catalog.text)
RETURNS TABLE (id pg_catalog.uuid, type pg_catalog.text, aggregate_id pg_catalog.text,
               payload pg_catalog.text, headers pg_catalog.jsonb, traceparent pg_catalog.text,
               "time" pg_catalog.text, attempts pg_catalog.int4, age pg_catalog.float8)
AS 'MODULE_PATHNAME', 'outbox_lease'
LANGUAGE C VOLATILE;

-- Acknowledged: published.  Only pending rows change.
CREATE FUNCTION outbox._ack(ids pg_catalog.uuid[], statuses pg_catalog.int4[])
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_ack'
LANGUAGE C VOLATILE;

-- Transient failure: due again at next_at.
CREATE FUNCTION outbox._retry(ids pg_catalog.uuid[], next_at pg_catalog.timestamptz[],
                              statuses pg_catalog.int4[], errors pg_catalog.text[])
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_retry'
LANGUAGE C VOLATILE;

-- Permanent failure or out of attempts: dead letter, error kept.
CREATE FUNCTION outbox._dead(ids pg_catalog.uuid[], statuses pg_catalog.int4[],
                             errors pg_catalog.text[])
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_dead'
LANGUAGE C VOLATILE;

-- Give unrouted pending events the destination their type routes to now.
CREATE FUNCTION outbox._route_pending()
RETURNS pg_catalog.int8
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH routed AS (
        UPDATE outbox.events AS e
           SET destination = outbox.route(e.type)
         WHERE e.status OPERATOR(pg_catalog.=) 'pending'
           AND e.destination IS NULL
           AND outbox.route(e.type) IS NOT NULL
        RETURNING 1)
    SELECT pg_catalog.count(*) FROM routed;
$$;

-- The retry schedule, exposed for inspection and tests: the delay in
-- milliseconds before attempt+1, for a jitter in [0, 1].
CREATE FUNCTION outbox.backoff_delay(attempt pg_catalog.int4, base_ms pg_catalog.int4,
                                     cap_ms pg_catalog.int4, jitter pg_catalog.float8)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_backoff_delay'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

------------------------------------------------------------------------
-- Monitoring
------------------------------------------------------------------------

CREATE FUNCTION outbox.workers(
    OUT pid pg_catalog.int4,
    OUT database pg_catalog.text,
    OUT worker pg_catalog.int4,
    OUT state pg_catalog.text,
    OUT in_flight pg_catalog.int4,
    OUT published pg_catalog.int8,
    OUT failed pg_catalog.int8,
    OUT started_at pg_catalog.timestamptz,
    OUT last_cycle_at pg_catalog.timestamptz,
    OUT last_error pg_catalog.text,
    OUT last_error_at pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_workers'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION outbox.workers() IS
    'Relay workers of the whole cluster, from shared memory: state, in-flight requests, counters since start, last error.';

-- Per destination: what waits, how old the oldest waiting event is, what
-- was published and what is dead.  No payloads.
CREATE VIEW outbox.destination_stats AS
SELECT coalesce(e.destination, '(unrouted)') AS destination,
       pg_catalog.count(*) FILTER (WHERE e.status OPERATOR(pg_catalog.=) 'pending') AS pending,
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(e.created_at) FILTER (WHERE e.status OPERATOR(pg_catalog.=) 'pending') AS oldest_pending_age,
       pg_catalog.count(*) FILTER (WHERE e.status OPERATOR(pg_catalog.=) 'published') AS published,
       pg_catalog.max(e.published_at) AS last_published_at,
       pg_catalog.count(*) FILTER (WHERE e.status OPERATOR(pg_catalog.=) 'dead') AS dead
  FROM outbox.events AS e
 GROUP BY e.destination;

------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC; grant EXECUTE on emit/claim to
-- application roles (see README, "Roles").
------------------------------------------------------------------------

REVOKE ALL ON SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM PUBLIC;
