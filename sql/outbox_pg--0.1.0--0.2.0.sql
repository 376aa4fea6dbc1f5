/* outbox_pg--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.0'" to load this file. \quit

-- A fresh CREATE EXTENSION runs outbox_pg--0.1.0.sql and then this script,
-- so a new install and an upgraded one are the same by construction.
-- Like the install script, everything is schema-qualified, operators
-- included.  Sections are kept apart so each stays readable on its own.

------------------------------------------------------------------------
-- Ordering, gap safety and retention of the outbox
------------------------------------------------------------------------

-- Storage (see README, "Storage design", for the measurements).  A lease
-- no longer touches next_attempt_at: it sets leased_until, a column in no
-- index, so with room left on the page (fillfactor) the lease UPDATE is
-- HOT: no new entry in any index.  Acknowledging stays a status change
-- (one new primary-key entry; the row leaves the pending index).
-- Claimable now: status = 'pending' AND next_attempt_at <= now()
--                AND (leased_until IS NULL OR leased_until <= now()).
-- In flight:     status = 'pending' AND leased_until > now().
ALTER TABLE outbox.events ADD COLUMN leased_until pg_catalog.timestamptz;

COMMENT ON COLUMN outbox.events.leased_until IS
    'While in the future, a relay worker is sending this event; it is due again once this passes.';

-- Half of every page is left free at insert, so each row of a page can be
-- leased (HOT) before the page is full; published rows are deleted by the
-- retention step, so the table is as large as the working set, not the
-- history.  Autovacuum visits the table after 1,000 + 1% dead rows instead
-- of the default 20%.
ALTER TABLE outbox.events SET (fillfactor = 50,
                               autovacuum_vacuum_scale_factor = 0.01,
                               autovacuum_vacuum_threshold = 1000,
                               autovacuum_vacuum_insert_scale_factor = 0.05);

-- Per-aggregate ordering (see src/ordering.c).  emit() copies the
-- aggregate id into ordering_key when the destination is ordered, so only
-- those events are ordered and only they enter the index below: events
-- of unordered destinations (the default) pay nothing for ordering.
ALTER TABLE outbox.events ADD COLUMN ordering_key pg_catalog.text;

COMMENT ON COLUMN outbox.events.ordering_key IS
    'The aggregate id when the event was emitted to a destination ordered per aggregate, else NULL; only such events are ordered.';

-- The head of an aggregate is its earliest pending event; the ordered
-- lease takes heads only, and a dead letter of the aggregate before the
-- head blocks it under the 'block' policy.  Both checks probe this index.
CREATE INDEX events_ordering_idx ON outbox.events (destination, ordering_key, id)
    WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'dead'])
      AND ordering_key IS NOT NULL;

-- options.ordering: 'none' (default) or 'aggregate';
-- options.on_dead:  what a dead-lettered event does to the later events of
--                   its aggregate on an ordered destination: 'block'
--                   (default; see outbox.blocked_aggregates and
--                   outbox.release_aggregate()) or 'skip'.
ALTER TABLE outbox.destinations ADD CONSTRAINT destinations_ordering_check
    CHECK (COALESCE(options OPERATOR(pg_catalog.->>) 'ordering', 'none')
               OPERATOR(pg_catalog.=) ANY (ARRAY['none', 'aggregate'])
           AND COALESCE(options OPERATOR(pg_catalog.->>) 'on_dead', 'block')
               OPERATOR(pg_catalog.=) ANY (ARRAY['block', 'skip']));

-- Aggregates released past their dead letters: dead events of the
-- aggregate up to released_through no longer block it.
CREATE TABLE outbox.aggregate_releases (
    destination      pg_catalog.text NOT NULL
                     REFERENCES outbox.destinations (name) ON UPDATE CASCADE ON DELETE CASCADE,
    aggregate_id     pg_catalog.text NOT NULL,
    released_through pg_catalog.uuid NOT NULL,
    released_at      pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    released_by      pg_catalog.text NOT NULL DEFAULT CURRENT_USER,
    PRIMARY KEY (destination, aggregate_id)
);

COMMENT ON TABLE outbox.aggregate_releases IS
    'Written by outbox.release_aggregate(): dead events of the aggregate up to released_through no longer block it.';

SELECT pg_catalog.pg_extension_config_dump('outbox.aggregate_releases', '');

-- Aggregates of ordered destinations (policy 'block') that wait behind a
-- dead letter: what blocks them and how much waits behind it.
CREATE VIEW outbox.blocked_aggregates AS
SELECT d.destination, d.aggregate_id,
       d.id AS dead_event_id, d.type AS dead_event_type,
       d.created_at AS dead_event_created_at,
       d.last_status, d.last_error,
       (SELECT pg_catalog.count(*) FROM outbox.events AS p
         WHERE p.destination OPERATOR(pg_catalog.=) d.destination
           AND p.ordering_key OPERATOR(pg_catalog.=) d.ordering_key
           AND p.status OPERATOR(pg_catalog.=) 'pending'
           AND p.id OPERATOR(pg_catalog.>) d.id) AS waiting
  FROM outbox.destinations AS dst
  JOIN LATERAL (
        SELECT e.* FROM outbox.events AS e
         WHERE e.destination OPERATOR(pg_catalog.=) dst.name
           AND e.status OPERATOR(pg_catalog.=) 'dead'
           AND e.ordering_key IS NOT NULL
           AND e.id OPERATOR(pg_catalog.>) COALESCE(
                 (SELECT r.released_through FROM outbox.aggregate_releases AS r
                   WHERE r.destination OPERATOR(pg_catalog.=) e.destination
                     AND r.aggregate_id OPERATOR(pg_catalog.=) e.ordering_key),
                 '00000000-0000-0000-0000-000000000000'::pg_catalog.uuid)
           AND NOT EXISTS (
                 SELECT 1 FROM outbox.events AS x
                  WHERE x.destination OPERATOR(pg_catalog.=) e.destination
                    AND x.ordering_key OPERATOR(pg_catalog.=) e.ordering_key
                    AND x.status OPERATOR(pg_catalog.=) 'dead'
                    AND x.id OPERATOR(pg_catalog.<) e.id
                    AND x.id OPERATOR(pg_catalog.>) COALESCE(
                          (SELECT r.released_through FROM outbox.aggregate_releases AS r
                            WHERE r.destination OPERATOR(pg_catalog.=) x.destination
                              AND r.aggregate_id OPERATOR(pg_catalog.=) x.ordering_key),
                          '00000000-0000-0000-0000-000000000000'::pg_catalog.uuid))
       ) AS d ON true
 WHERE dst.options OPERATOR(pg_catalog.->>) 'ordering' OPERATOR(pg_catalog.=) 'aggregate'
   AND COALESCE(dst.options OPERATOR(pg_catalog.->>) 'on_dead', 'block')
       OPERATOR(pg_catalog.=) 'block';

COMMENT ON VIEW outbox.blocked_aggregates IS
    'Aggregates of ordered destinations held back by a dead letter (policy ''block''); release them with outbox.release_aggregate().';

-- Let a blocked aggregate continue: its current dead letters stay dead
-- (redrive or purge them separately) but no longer hold back later events.
CREATE FUNCTION outbox.release_aggregate(destination pg_catalog.text,
                                         aggregate_id pg_catalog.text)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    previous pg_catalog.uuid;
    through  pg_catalog.uuid;
    released pg_catalog.int8;
BEGIN
    PERFORM 1 FROM outbox.destinations AS d
      WHERE d.name OPERATOR(pg_catalog.=) release_aggregate.destination;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'destination "%" does not exist', release_aggregate.destination
            USING ERRCODE = 'undefined_object',
                  HINT = 'Blocked aggregates are listed in outbox.blocked_aggregates.';
    END IF;
    SELECT r.released_through INTO previous FROM outbox.aggregate_releases AS r
     WHERE r.destination OPERATOR(pg_catalog.=) release_aggregate.destination
       AND r.aggregate_id OPERATOR(pg_catalog.=) release_aggregate.aggregate_id
       FOR UPDATE;
    previous := COALESCE(previous, '00000000-0000-0000-0000-000000000000');
    SELECT e.id INTO through FROM outbox.events AS e
     WHERE e.destination OPERATOR(pg_catalog.=) release_aggregate.destination
       AND e.ordering_key OPERATOR(pg_catalog.=) release_aggregate.aggregate_id
       AND e.status OPERATOR(pg_catalog.=) 'dead'
     ORDER BY e.id DESC LIMIT 1;
    IF through IS NULL OR through OPERATOR(pg_catalog.<=) previous THEN
        RETURN 0;
    END IF;
    SELECT pg_catalog.count(*) INTO released FROM outbox.events AS e
     WHERE e.destination OPERATOR(pg_catalog.=) release_aggregate.destination
       AND e.ordering_key OPERATOR(pg_catalog.=) release_aggregate.aggregate_id
       AND e.status OPERATOR(pg_catalog.=) 'dead'
       AND e.id OPERATOR(pg_catalog.>) previous
       AND e.id OPERATOR(pg_catalog.<=) through;
    -- SECURITY DEFINER: record who asked (session_user), not the owner
    INSERT INTO outbox.aggregate_releases AS r (destination, aggregate_id, released_through, released_by)
    VALUES (release_aggregate.destination, release_aggregate.aggregate_id, through, SESSION_USER)
    ON CONFLICT ON CONSTRAINT aggregate_releases_pkey
    DO UPDATE SET released_through = excluded.released_through,
                  released_at = pg_catalog.now(), released_by = SESSION_USER;
    PERFORM outbox._wake();
    RETURN released;
END
$$;

COMMENT ON FUNCTION outbox.release_aggregate(pg_catalog.text, pg_catalog.text) IS
    'Let an aggregate of an ordered destination continue past its dead letters; returns how many dead events were released.';

-- Retention: delete up to batch_size published rows older than retention
-- (see src/retention.c: the statement the relay runs).
CREATE FUNCTION outbox._expire_published(retention pg_catalog.interval,
                                         batch_size pg_catalog.int4)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox_expire_published'
LANGUAGE C VOLATILE;



------------------------------------------------------------------------
-- The full inbox: messages and handlers
------------------------------------------------------------------------

-- Received messages (inbox.receive()) run through their handlers by the
-- relay workers (src/inbox_worker.c).  Column order is a C contract
-- (InboxMessageColumn in src/outbox_pg.h): columns are only appended.
CREATE SEQUENCE inbox.messages_seq;

CREATE TABLE inbox.messages (
    id              pg_catalog.text PRIMARY KEY,
    type            pg_catalog.text NOT NULL,
    aggregate_id    pg_catalog.text,
    payload         pg_catalog.jsonb NOT NULL,
    headers         pg_catalog.jsonb,
    source          pg_catalog.text,
    status          pg_catalog.text NOT NULL DEFAULT 'pending'
                    CONSTRAINT messages_status_check
                    CHECK (status OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'processed', 'dead'])),
    attempts        pg_catalog.int4 NOT NULL DEFAULT 0,
    next_attempt_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    received_at     pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    processed_at    pg_catalog.timestamptz,
    last_error      pg_catalog.text,
    seq             pg_catalog.int8 NOT NULL
                    DEFAULT pg_catalog.nextval('inbox.messages_seq'::pg_catalog.regclass)
);

ALTER SEQUENCE inbox.messages_seq OWNED BY inbox.messages.seq;

COMMENT ON TABLE inbox.messages IS
    'Messages written by inbox.receive(); the relay workers run each pending one through its handler (inbox.handlers) and mark it processed in the same transaction.';

-- The worker leases due pending messages in received order; ordered
-- handlers look for an earlier pending message of the same aggregate;
-- retention looks for old processed ones.  All three are partial indexes,
-- as small as what they serve.
CREATE INDEX messages_pending_idx ON inbox.messages (next_attempt_at, seq)
    WHERE status OPERATOR(pg_catalog.=) 'pending';
CREATE INDEX messages_aggregate_idx ON inbox.messages (aggregate_id, seq)
    WHERE status OPERATOR(pg_catalog.=) 'pending' AND aggregate_id IS NOT NULL;
CREATE INDEX messages_processed_idx ON inbox.messages (processed_at)
    WHERE status OPERATOR(pg_catalog.=) 'processed';

-- Claims are removed by the worker once expired.
CREATE INDEX claims_expires_idx ON inbox.claims (expires_at);

CREATE TABLE inbox.handlers (
    pattern         pg_catalog.text PRIMARY KEY
                    CONSTRAINT handlers_pattern_check
                    CHECK (pg_catalog.length(pattern) OPERATOR(pg_catalog.>) 0
                           AND pg_catalog.length(pattern) OPERATOR(pg_catalog.<=) 255),
    function        pg_catalog.regprocedure NOT NULL,
    priority        pg_catalog.int4 NOT NULL DEFAULT 100,
    max_attempts    pg_catalog.int4 NOT NULL DEFAULT 10
                    CONSTRAINT handlers_attempts_check
                    CHECK (max_attempts OPERATOR(pg_catalog.>=) 1 AND max_attempts OPERATOR(pg_catalog.<=) 1000),
    backoff_base_ms pg_catalog.int4 NOT NULL DEFAULT 1000
                    CONSTRAINT handlers_backoff_base_check
                    CHECK (backoff_base_ms OPERATOR(pg_catalog.>=) 10),
    backoff_max_ms  pg_catalog.int4 NOT NULL DEFAULT 600000
                    CONSTRAINT handlers_backoff_max_check
                    CHECK (backoff_max_ms OPERATOR(pg_catalog.>=) backoff_base_ms),
    ordered         pg_catalog.bool NOT NULL DEFAULT false
);

COMMENT ON TABLE inbox.handlers IS
    'Maps message types (patterns, ''*'' matches any text) to handler functions taking one inbox.messages argument; the lowest priority, then the longest pattern, wins. A handler runs as the owner of its function.';

-- Direct writes to the table get the same checks as register_handler().
CREATE FUNCTION inbox._check_handler()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p pg_catalog.pg_proc%ROWTYPE;
BEGIN
    SELECT * INTO p FROM pg_catalog.pg_proc WHERE oid OPERATOR(pg_catalog.=) NEW.function::pg_catalog.oid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'function % does not exist', NEW.function::pg_catalog.oid
            USING ERRCODE = '42883';
    END IF;
    IF p.prokind OPERATOR(pg_catalog.<>) 'f' OR p.proretset
       OR p.pronargs OPERATOR(pg_catalog.<>) 1
       OR p.proargtypes[0] OPERATOR(pg_catalog.<>) 'inbox.messages'::pg_catalog.regtype THEN
        RAISE EXCEPTION 'function % cannot be an inbox handler', NEW.function
            USING ERRCODE = '42P13',
                  DETAIL = 'A handler is a function (not a procedure, not returning a set) with exactly one argument of type inbox.messages.',
                  HINT = 'Declare it as CREATE FUNCTION name(message inbox.messages) RETURNS void ...';
    END IF;
    -- the worker runs a handler as its function's owner: only that owner
    -- (or a member of its role) may have it run on received messages
    IF NOT pg_catalog.pg_has_role(CURRENT_USER, p.proowner, 'USAGE') THEN
        RAISE EXCEPTION 'permission denied to register function % as an inbox handler', NEW.function
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('A handler runs as the owner of its function, %s.',
                                             pg_catalog.pg_get_userbyid(p.proowner)),
                  HINT = 'Register functions owned by your role, or ask a member of the owning role.';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER handlers_check
    BEFORE INSERT OR UPDATE ON inbox.handlers
    FOR EACH ROW EXECUTE FUNCTION inbox._check_handler();

-- pg_dump keeps the handlers and every message, processed ones included:
-- until retention removes them they are the record that makes a broker's
-- redelivery after a restore a duplicate (like inbox.claims).
SELECT pg_catalog.pg_extension_config_dump('inbox.handlers', '');
SELECT pg_catalog.pg_extension_config_dump('inbox.messages', '');
SELECT pg_catalog.pg_extension_config_dump('inbox.messages_seq', '');

-- Receive a message in the caller's transaction; true when new, false for
-- a duplicate id.  Like claim(), it writes through the executor directly:
-- EXECUTE is the whole grant.
CREATE FUNCTION inbox.receive(
    message_id      pg_catalog.text,
    type            pg_catalog.text,
    payload         pg_catalog.jsonb,
    aggregate_id    pg_catalog.text DEFAULT NULL,
    headers         pg_catalog.jsonb DEFAULT NULL,
    source          pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'inbox_receive'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION inbox.receive(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text) IS
    'Store a received message in the inbox in the current transaction; true when new, false when its id was already received.';

CREATE FUNCTION inbox._pattern_matches(pattern pg_catalog.text, value pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'inbox_pattern_matches'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- The handler a message type is run through, or NULL.
CREATE FUNCTION inbox.handler_for(message_type pg_catalog.text)
RETURNS inbox.handlers
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT h.*
      FROM inbox.handlers AS h
     WHERE inbox._pattern_matches(h.pattern, $1)
     ORDER BY h.priority, pg_catalog.length(h.pattern) DESC, h.pattern COLLATE "C"
     LIMIT 1;
$$;

COMMENT ON FUNCTION inbox.handler_for(pg_catalog.text) IS
    'The handler messages of this type are run through, or NULL when no pattern matches.';

CREATE FUNCTION inbox.register_handler(
    pattern         pg_catalog.text,
    handler         pg_catalog.regprocedure,
    max_attempts    pg_catalog.int4 DEFAULT 10,
    backoff_base_ms pg_catalog.int4 DEFAULT 1000,
    backoff_max_ms  pg_catalog.int4 DEFAULT 600000,
    ordered         pg_catalog.bool DEFAULT false,
    priority        pg_catalog.int4 DEFAULT 100)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL OR $4 IS NULL OR $5 IS NULL
       OR $6 IS NULL OR $7 IS NULL THEN
        RAISE EXCEPTION 'arguments of inbox.register_handler() must not be null'
            USING ERRCODE = '22004';
    END IF;
    IF $3 OPERATOR(pg_catalog.<) 1 OR $3 OPERATOR(pg_catalog.>) 1000 THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000' USING ERRCODE = '22023';
    END IF;
    IF $4 OPERATOR(pg_catalog.<) 10 OR $5 OPERATOR(pg_catalog.<) $4 THEN
        RAISE EXCEPTION 'invalid backoff % ms to % ms', $4, $5
            USING ERRCODE = '22023',
                  HINT = 'backoff_base_ms must be at least 10 and backoff_max_ms at least backoff_base_ms.';
    END IF;
    IF pg_catalog.length($1) OPERATOR(pg_catalog.<) 1 OR pg_catalog.length($1) OPERATOR(pg_catalog.>) 255 THEN
        RAISE EXCEPTION 'handler pattern must have between 1 and 255 characters' USING ERRCODE = '22023';
    END IF;
    INSERT INTO inbox.handlers AS h (pattern, function, max_attempts, backoff_base_ms,
                                     backoff_max_ms, ordered, priority)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT ON CONSTRAINT handlers_pkey DO UPDATE
       SET function = EXCLUDED.function, max_attempts = EXCLUDED.max_attempts,
           backoff_base_ms = EXCLUDED.backoff_base_ms,
           backoff_max_ms = EXCLUDED.backoff_max_ms,
           ordered = EXCLUDED.ordered, priority = EXCLUDED.priority;
END
$$;

COMMENT ON FUNCTION inbox.register_handler(pg_catalog.text, pg_catalog.regprocedure, pg_catalog.int4, pg_catalog.int4, pg_catalog.int4, pg_catalog.bool, pg_catalog.int4) IS
    'Run messages whose type matches pattern through handler (which then runs as its owner); replaces an existing registration of the same pattern.';

CREATE FUNCTION inbox.unregister_handler(pattern pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM inbox.handlers AS h WHERE h.pattern OPERATOR(pg_catalog.=) $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no inbox handler is registered for pattern "%"', $1
            USING ERRCODE = '42704';
    END IF;
END
$$;

-- Dead letters: make one pending again with fresh attempts, or delete it.
-- Unknown ids are 42704; messages that are not dead are 55000.
CREATE FUNCTION inbox._lock_dead(message_id pg_catalog.text, hint pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    st pg_catalog.text;
BEGIN
    SELECT m.status INTO st FROM inbox.messages AS m
     WHERE m.id OPERATOR(pg_catalog.=) $1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inbox message "%" does not exist', $1 USING ERRCODE = '42704';
    END IF;
    IF st OPERATOR(pg_catalog.<>) 'dead' THEN
        RAISE EXCEPTION 'inbox message "%" is not dead', $1
            USING ERRCODE = '55000', DETAIL = pg_catalog.format('Its status is %s.', st),
                  HINT = $2;
    END IF;
END
$$;

CREATE FUNCTION inbox.redrive(message_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM inbox._lock_dead($1, 'Only dead letters are redriven; pending messages are retried by the worker.');
    UPDATE inbox.messages AS m
       SET status = 'pending', attempts = 0, next_attempt_at = pg_catalog.now()
     WHERE m.id OPERATOR(pg_catalog.=) $1;
END
$$;

CREATE FUNCTION inbox.purge(message_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM inbox._lock_dead($1, 'Only dead letters are purged; processed messages go by retention.');
    DELETE FROM inbox.messages AS m WHERE m.id OPERATOR(pg_catalog.=) $1;
END
$$;

COMMENT ON FUNCTION inbox.redrive(pg_catalog.text) IS
    'Make a dead inbox message pending again, with its attempts reset.';
COMMENT ON FUNCTION inbox.purge(pg_catalog.text) IS
    'Delete a dead inbox message.';

-- The worker's lease (see src/inbox_worker.c): due pending messages in
-- received order, skipping rows other workers hold and, for ordered
-- handlers, messages with an earlier pending message of the same
-- aggregate.  Each lease counts as an attempt and pushes next_attempt_at
-- out, so a message that kills the worker still runs out of attempts.
CREATE FUNCTION inbox._lease(batch_size pg_catalog.int4, lease pg_catalog.interval)
RETURNS TABLE (id pg_catalog.text, attempts pg_catalog.int4)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH due AS (
        SELECT m.id AS due_id
          FROM inbox.messages AS m
         WHERE m.status OPERATOR(pg_catalog.=) 'pending'
           AND m.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND (m.aggregate_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM inbox.messages AS p
                                WHERE p.aggregate_id OPERATOR(pg_catalog.=) m.aggregate_id
                                  AND p.status OPERATOR(pg_catalog.=) 'pending'
                                  AND p.seq OPERATOR(pg_catalog.<) m.seq)
                OR NOT coalesce((inbox.handler_for(m.type)).ordered, false))
         ORDER BY m.next_attempt_at, m.seq
         LIMIT $1
         FOR UPDATE OF m SKIP LOCKED)
    UPDATE inbox.messages AS m
       SET attempts = m.attempts OPERATOR(pg_catalog.+) 1,
           next_attempt_at = pg_catalog.now() OPERATOR(pg_catalog.+) $2
      FROM due
     WHERE m.id OPERATOR(pg_catalog.=) due.due_id
    RETURNING m.id, m.attempts;
$$;

-- Per type and status: what waits, how old the oldest waiting message is,
-- what is dead.  No payloads.
CREATE VIEW inbox.message_stats AS
SELECT m.type,
       pg_catalog.count(*) FILTER (WHERE m.status OPERATOR(pg_catalog.=) 'pending') AS pending,
       pg_catalog.now() OPERATOR(pg_catalog.-)
           pg_catalog.min(m.received_at) FILTER (WHERE m.status OPERATOR(pg_catalog.=) 'pending') AS oldest_pending_age,
       pg_catalog.count(*) FILTER (WHERE m.status OPERATOR(pg_catalog.=) 'processed') AS processed,
       pg_catalog.count(*) FILTER (WHERE m.status OPERATOR(pg_catalog.=) 'dead') AS dead
  FROM inbox.messages AS m
 GROUP BY m.type;



------------------------------------------------------------------------
-- Operability: monitoring, health, metrics, admin functions
------------------------------------------------------------------------

-- Statements and view definitions are schema-qualified like the rest of
-- the script.  Function bodies run with search_path pinned to
-- pg_catalog, pg_temp (every function below sets it), where an
-- unqualified operator or function can only be pg_catalog's; they stay
-- readable that way.  SECURITY DEFINER functions take no SQL text from
-- their callers.

-- Dead letters are few: a partial index keeps their listing and the
-- dead-letter statistics cheap without touching the hot path (rows only
-- enter it when they die).
CREATE INDEX events_dead_idx ON outbox.events (destination, created_at)
    WHERE status OPERATOR(pg_catalog.=) 'dead';

-- What the relays know and the table does not, from shared memory (see
-- src/deststats.c): one row per destination of this database that a relay
-- has worked on since the server started.  "recent" is the last minute.
CREATE FUNCTION outbox.destination_runtime(
    OUT destination pg_catalog.text,
    OUT in_flight pg_catalog.int8,
    OUT circuit_state pg_catalog.text,
    OUT circuit_open_until pg_catalog.timestamptz,
    OUT last_success_at pg_catalog.timestamptz,
    OUT last_error_at pg_catalog.timestamptz,
    OUT recent_2xx pg_catalog.int8,
    OUT recent_3xx pg_catalog.int8,
    OUT recent_4xx pg_catalog.int8,
    OUT recent_5xx pg_catalog.int8,
    OUT recent_errors pg_catalog.int8,
    OUT recent_latency_avg_ms pg_catalog.float8,
    OUT recent_latency_max_ms pg_catalog.float8,
    OUT responses_2xx pg_catalog.int8,
    OUT responses_3xx pg_catalog.int8,
    OUT responses_4xx pg_catalog.int8,
    OUT responses_5xx pg_catalog.int8,
    OUT responses_errors pg_catalog.int8,
    OUT published_total pg_catalog.int8,
    OUT retried_total pg_catalog.int8,
    OUT dead_lettered_total pg_catalog.int8,
    OUT requests_total pg_catalog.int8,
    OUT request_seconds_total pg_catalog.float8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_destination_runtime'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION outbox.destination_runtime() IS
    'Per destination, from the relays'' shared memory: in-flight requests, circuit state, last success and error, results and latency of the last minute, counters since server start.';

-- For outbox.health(): are this database's relays running?
CREATE FUNCTION outbox._relay_presence(
    OUT preloaded pg_catalog.bool,
    OUT launcher_running pg_catalog.bool,
    OUT running pg_catalog.int4,
    OUT erroring pg_catalog.int4,
    OUT last_error pg_catalog.text)
AS 'MODULE_PATHNAME', 'outbox_relay_presence'
LANGUAGE C VOLATILE STRICT;

-- Wake this database's relays when the transaction commits.
CREATE FUNCTION outbox._wake()
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'outbox_wake'
LANGUAGE C VOLATILE STRICT;

-- A type pattern ('*' matches any text, like routes) as a LIKE pattern.
CREATE FUNCTION outbox._glob_to_like(pattern pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
               $1, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%');
$$;

-- A Prometheus label value, escaped.
CREATE FUNCTION outbox._prom_label(value pg_catalog.text)
RETURNS pg_catalog.text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
               $1, '\', '\\'), '"', '\"'), E'\n', '\n');
$$;

-- Pending and dead events per destination (NULL: unrouted), reading only
-- pending and dead rows.  The pending age does not count events never
-- attempted and scheduled for later (emit(..., not_before)).
CREATE VIEW outbox._destination_backlog AS
SELECT b.destination,
       pg_catalog.sum(b.pending)::pg_catalog.int8 AS pending,
       pg_catalog.sum(b.claimable)::pg_catalog.int8 AS claimable,
       pg_catalog.min(b.oldest_pending_at) AS oldest_pending_at,
       pg_catalog.min(b.oldest_claimable_at) AS oldest_claimable_at,
       pg_catalog.sum(b.dead)::pg_catalog.int8 AS dead,
       pg_catalog.min(b.oldest_dead_at) AS oldest_dead_at
  FROM (SELECT e.destination,
               pg_catalog.count(*) AS pending,
               pg_catalog.count(*) FILTER (
                   WHERE e.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                     AND (e.leased_until IS NULL
                          OR e.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())) AS claimable,
               pg_catalog.min(e.created_at) FILTER (
                   WHERE e.attempts OPERATOR(pg_catalog.>) 0
                      OR e.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()) AS oldest_pending_at,
               pg_catalog.min(e.created_at) FILTER (
                   WHERE e.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                     AND (e.leased_until IS NULL
                          OR e.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())) AS oldest_claimable_at,
               0::pg_catalog.int8 AS dead,
               NULL::pg_catalog.timestamptz AS oldest_dead_at
          FROM outbox.events AS e
         WHERE e.status OPERATOR(pg_catalog.=) 'pending'
         GROUP BY e.destination
        UNION ALL
        SELECT e.destination, 0, 0, NULL, NULL,
               pg_catalog.count(*), pg_catalog.min(e.created_at)
          FROM outbox.events AS e
         WHERE e.status OPERATOR(pg_catalog.=) 'dead'
         GROUP BY e.destination) AS b
 GROUP BY b.destination;

-- The 0.1.0 columns first, unchanged; then the backlog, the relays'
-- runtime state and the last minute's results.  One row per defined
-- destination, plus '(unrouted)' and any undefined name events still
-- carry.  Counting published rows reads the whole table: for frequent
-- scrapes use outbox.metrics() or outbox.health(), which do not.
CREATE OR REPLACE VIEW outbox.destination_stats AS
WITH b AS (SELECT * FROM outbox._destination_backlog),
     p AS (SELECT e.destination,
                  pg_catalog.count(*) AS published,
                  pg_catalog.max(e.published_at) AS last_published_at
             FROM outbox.events AS e
            WHERE e.status OPERATOR(pg_catalog.=) 'published'
            GROUP BY e.destination),
     r AS (SELECT * FROM outbox.destination_runtime()),
     k AS (SELECT d.name FROM outbox.destinations AS d
           UNION SELECT b.destination FROM b
           UNION SELECT p.destination FROM p)
SELECT coalesce(k.name, '(unrouted)') AS destination,
       coalesce(b.pending, 0)::pg_catalog.int8 AS pending,
       pg_catalog.now() OPERATOR(pg_catalog.-) b.oldest_pending_at AS oldest_pending_age,
       coalesce(p.published, 0)::pg_catalog.int8 AS published,
       p.last_published_at,
       coalesce(b.dead, 0)::pg_catalog.int8 AS dead,
       coalesce(b.claimable, 0)::pg_catalog.int8 AS claimable,
       pg_catalog.now() OPERATOR(pg_catalog.-) b.oldest_claimable_at AS oldest_claimable_age,
       pg_catalog.now() OPERATOR(pg_catalog.-) b.oldest_dead_at AS oldest_dead_age,
       coalesce(r.in_flight, 0)::pg_catalog.int8 AS in_flight,
       d.paused,
       CASE WHEN d.name IS NOT NULL THEN coalesce(r.circuit_state, 'closed') END AS circuit_state,
       r.last_success_at,
       r.last_error_at,
       coalesce(r.recent_2xx, 0)::pg_catalog.int8 AS recent_2xx,
       coalesce(r.recent_3xx, 0)::pg_catalog.int8 AS recent_3xx,
       coalesce(r.recent_4xx, 0)::pg_catalog.int8 AS recent_4xx,
       coalesce(r.recent_5xx, 0)::pg_catalog.int8 AS recent_5xx,
       coalesce(r.recent_errors, 0)::pg_catalog.int8 AS recent_errors,
       r.recent_latency_avg_ms,
       r.recent_latency_max_ms
  FROM k
  LEFT JOIN outbox.destinations AS d ON d.name OPERATOR(pg_catalog.=) k.name
  LEFT JOIN b ON b.destination IS NOT DISTINCT FROM k.name
  LEFT JOIN p ON p.destination IS NOT DISTINCT FROM k.name
  LEFT JOIN r ON r.destination OPERATOR(pg_catalog.=) k.name;

COMMENT ON VIEW outbox.destination_stats IS
    'Per destination: backlog (pending, claimable, dead and their ages), published rows, in-flight requests, paused, circuit state, last success/error and the last minute''s HTTP results and latency. No payloads.';

-- ok / warn / critical, with one reason per finding.  Thresholds:
-- outbox.pending_age_warning/_critical, outbox.dead_letters_warning/_critical.
CREATE FUNCTION outbox.health(OUT status pg_catalog.text, OUT reasons pg_catalog.text[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rp record;
    b record;
    level int4 := 0;                    -- 0 ok, 1 warn, 2 critical
    found_reasons text[] := '{}';
    age_warn interval;
    age_crit interval;
    dead_warn int8;
    dead_crit int8;
    dead_total int8 := 0;
    age interval;
BEGIN
    -- first, so that the library (and its settings) is loaded
    SELECT * INTO rp FROM outbox._relay_presence();
    age_warn := current_setting('outbox.pending_age_warning')::interval;
    age_crit := current_setting('outbox.pending_age_critical')::interval;
    dead_warn := current_setting('outbox.dead_letters_warning')::int8;
    dead_crit := current_setting('outbox.dead_letters_critical')::int8;

    IF NOT rp.preloaded THEN
        level := 2;
        found_reasons := found_reasons || 'critical: outbox_pg is not in shared_preload_libraries, so no relay runs'::text;
    ELSIF rp.running = 0 THEN
        level := 2;
        found_reasons := found_reasons || format('critical: no relay worker is running for database "%s"%s',
            current_database(),
            CASE WHEN NOT rp.launcher_running THEN ' (the outbox_pg launcher is not running either)'
                 ELSE ' (see outbox.workers() and outbox.databases)' END);
    ELSIF rp.erroring > 0 THEN
        level := greatest(level, 1);
        found_reasons := found_reasons || format('warn: %s relay worker(s) failed their last cycle: %s',
                                                 rp.erroring, rp.last_error);
    END IF;

    FOR b IN
        SELECT bl.*, d.name AS defined, d.paused
          FROM outbox._destination_backlog AS bl
          LEFT JOIN outbox.destinations AS d ON d.name = bl.destination
         ORDER BY bl.destination NULLS FIRST
    LOOP
        dead_total := dead_total + b.dead;
        age := now() - b.oldest_pending_at;
        IF age_crit > interval '0' AND age >= age_crit THEN
            level := 2;
            found_reasons := found_reasons || format('critical: the oldest pending event of destination "%s" is %s s old (outbox.pending_age_critical = %s)',
                coalesce(b.destination, '(unrouted)'), floor(extract(epoch FROM age)),
                current_setting('outbox.pending_age_critical'));
        ELSIF age_warn > interval '0' AND age >= age_warn THEN
            level := greatest(level, 1);
            found_reasons := found_reasons || format('warn: the oldest pending event of destination "%s" is %s s old (outbox.pending_age_warning = %s)',
                coalesce(b.destination, '(unrouted)'), floor(extract(epoch FROM age)),
                current_setting('outbox.pending_age_warning'));
        END IF;
        IF b.pending > 0 AND b.destination IS NULL THEN
            level := greatest(level, 1);
            found_reasons := found_reasons || format('warn: %s pending event(s) match no route and wait', b.pending);
        ELSIF b.pending > 0 AND b.defined IS NULL THEN
            level := greatest(level, 1);
            found_reasons := found_reasons || format('warn: %s pending event(s) name destination "%s", which does not exist',
                                                     b.pending, b.destination);
        END IF;
    END LOOP;

    FOR b IN SELECT d.name FROM outbox.destinations AS d WHERE d.paused ORDER BY d.name LOOP
        level := greatest(level, 1);
        found_reasons := found_reasons || format('warn: destination "%s" is paused', b.name);
    END LOOP;

    FOR b IN
        SELECT r.destination, r.circuit_state, r.last_error_at
          FROM outbox.destination_runtime() AS r
          JOIN outbox.destinations AS d ON d.name = r.destination
         WHERE r.circuit_state <> 'closed'
         ORDER BY r.destination
    LOOP
        level := greatest(level, 1);
        found_reasons := found_reasons || format('warn: destination "%s" is failing: its circuit is %s',
                                                 b.destination, b.circuit_state);
    END LOOP;

    IF dead_crit > 0 AND dead_total >= dead_crit THEN
        level := 2;
        found_reasons := found_reasons || format('critical: %s dead letter(s) (outbox.dead_letters_critical = %s); see outbox.dead_letters()',
                                                 dead_total, dead_crit);
    ELSIF dead_warn > 0 AND dead_total >= dead_warn THEN
        level := greatest(level, 1);
        found_reasons := found_reasons || format('warn: %s dead letter(s) (outbox.dead_letters_warning = %s); see outbox.dead_letters()',
                                                 dead_total, dead_warn);
    END IF;

    status := (ARRAY['ok', 'warn', 'critical'])[level + 1];
    reasons := found_reasons;
END
$$;

COMMENT ON FUNCTION outbox.health() IS
    'ok, warn or critical for this database''s outbox, with the reasons; thresholds are the outbox.pending_age_* and outbox.dead_letters_* settings.';

-- Prometheus text exposition format (version 0.0.4) for this database.
-- One query, no temporary objects: it also runs in read-only sessions.
CREATE FUNCTION outbox.metrics()
RETURNS pg_catalog.text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    preloaded bool;
    health text;
    db text;
BEGIN
    SELECT rp.preloaded INTO preloaded FROM outbox._relay_presence() AS rp;
    SELECT h.status INTO health FROM outbox.health() AS h;
    db := format('database="%s"', outbox._prom_label(current_database()));

    RETURN (
    WITH fam(ord, name, type, help) AS (VALUES
            (1, 'outbox_health_status', 'gauge', 'outbox.health() of this database: 0 ok, 1 warn, 2 critical.'),
            (2, 'outbox_relay_workers', 'gauge', 'Relay workers of this database by state (stopped and no extension: assigned slots not running).'),
            (3, 'outbox_relay_published_total', 'counter', 'Events acknowledged, per relay worker, since it started.'),
            (4, 'outbox_relay_failed_total', 'counter', 'Failed attempts (retried or dead-lettered), per relay worker, since it started.'),
            (5, 'outbox_relay_in_flight_requests', 'gauge', 'Requests in flight, per relay worker.'),
            (10, 'outbox_pending_events', 'gauge', 'Events waiting to be delivered.'),
            (11, 'outbox_claimable_events', 'gauge', 'Pending events due now (not waiting for a retry or a lease).'),
            (12, 'outbox_oldest_pending_age_seconds', 'gauge', 'Age of the oldest pending event (0 if none).'),
            (13, 'outbox_oldest_claimable_age_seconds', 'gauge', 'Age of the oldest event due now (0 if none).'),
            (14, 'outbox_dead_letters', 'gauge', 'Dead-lettered events.'),
            (15, 'outbox_oldest_dead_letter_age_seconds', 'gauge', 'Age of the oldest dead letter, from its creation (0 if none).'),
            (16, 'outbox_in_flight_requests', 'gauge', 'Requests the relays have in flight.'),
            (17, 'outbox_destination_paused', 'gauge', '1 if the destination is paused.'),
            (18, 'outbox_circuit_open', 'gauge', '1 if a relay has the destination''s circuit open or half-open.'),
            (20, 'outbox_published_total', 'counter', 'Events acknowledged by the destination since the server started.'),
            (21, 'outbox_retries_total', 'counter', 'Failed attempts scheduled for a retry since the server started.'),
            (22, 'outbox_dead_lettered_total', 'counter', 'Events dead-lettered by the relay since the server started.'),
            (23, 'outbox_http_responses_total', 'counter', 'Completed requests by HTTP status class (error: no HTTP answer) since the server started.'),
            (24, 'outbox_http_request_duration_seconds', 'summary', 'Duration of the requests since the server started.'),
            (25, 'outbox_last_success_timestamp_seconds', 'gauge', 'Unix time of the last acknowledged request.'),
            (26, 'outbox_last_error_timestamp_seconds', 'gauge', 'Unix time of the last failed request.')),
         w AS (SELECT * FROM outbox.workers() WHERE preloaded),
         b AS (SELECT * FROM outbox._destination_backlog),
         k AS (SELECT d.name FROM outbox.destinations AS d UNION SELECT b.destination FROM b),
         s AS (
            SELECT db || format(',destination="%s"', outbox._prom_label(coalesce(k.name, '(unrouted)'))) AS labels,
                   coalesce(b.pending, 0) AS pending,
                   coalesce(b.claimable, 0) AS claimable,
                   coalesce(extract(epoch FROM now() - b.oldest_pending_at), 0) AS pending_age,
                   coalesce(extract(epoch FROM now() - b.oldest_claimable_at), 0) AS claimable_age,
                   coalesce(b.dead, 0) AS dead,
                   coalesce(extract(epoch FROM now() - b.oldest_dead_at), 0) AS dead_age,
                   d.name IS NOT NULL AS defined,
                   coalesce(d.paused, false) AS paused,
                   r.*
              FROM k
              LEFT JOIN b ON b.destination IS NOT DISTINCT FROM k.name
              LEFT JOIN outbox.destinations AS d ON d.name = k.name
              LEFT JOIN outbox.destination_runtime() AS r ON r.destination = k.name),
         samples(ord, metric, labels, value) AS (
            SELECT 1, 'outbox_health_status', db,
                   (array_position(ARRAY['ok', 'warn', 'critical'], health) - 1)::text
            UNION ALL
            SELECT 2, 'outbox_relay_workers', db || format(',state="%s"', st.state), count(w.pid)::text
              FROM unnest(ARRAY['starting', 'idle', 'working', 'error', 'no extension', 'stopped']) AS st(state)
              LEFT JOIN w ON w.state = st.state AND w.database = current_database()
             GROUP BY st.state
            UNION ALL
            SELECT m.ord, m.metric, db || format(',worker="%s"', w.worker), m.value
              FROM w,
                   LATERAL (VALUES (3, 'outbox_relay_published_total', w.published::text),
                                   (4, 'outbox_relay_failed_total', w.failed::text),
                                   (5, 'outbox_relay_in_flight_requests', w.in_flight::text))
                       AS m(ord, metric, value)
             WHERE w.database = current_database() AND w.pid IS NOT NULL
            UNION ALL
            SELECT m.ord, m.metric, s.labels || m.extra, m.value
              FROM s,
                   LATERAL (VALUES
                       (10, 'outbox_pending_events', '', s.pending::text),
                       (11, 'outbox_claimable_events', '', s.claimable::text),
                       (12, 'outbox_oldest_pending_age_seconds', '', round(s.pending_age, 3)::text),
                       (13, 'outbox_oldest_claimable_age_seconds', '', round(s.claimable_age, 3)::text),
                       (14, 'outbox_dead_letters', '', s.dead::text),
                       (15, 'outbox_oldest_dead_letter_age_seconds', '', round(s.dead_age, 3)::text),
                       (16, 'outbox_in_flight_requests', '', coalesce(s.in_flight, 0)::text),
                       (17, 'outbox_destination_paused', '', CASE WHEN s.paused THEN '1' ELSE '0' END),
                       (18, 'outbox_circuit_open', '',
                        CASE WHEN coalesce(s.circuit_state, 'closed') = 'closed' THEN '0' ELSE '1' END),
                       (20, 'outbox_published_total', '', coalesce(s.published_total, 0)::text),
                       (21, 'outbox_retries_total', '', coalesce(s.retried_total, 0)::text),
                       (22, 'outbox_dead_lettered_total', '', coalesce(s.dead_lettered_total, 0)::text),
                       (23, 'outbox_http_responses_total', ',class="2xx"', coalesce(s.responses_2xx, 0)::text),
                       (23, 'outbox_http_responses_total', ',class="3xx"', coalesce(s.responses_3xx, 0)::text),
                       (23, 'outbox_http_responses_total', ',class="4xx"', coalesce(s.responses_4xx, 0)::text),
                       (23, 'outbox_http_responses_total', ',class="5xx"', coalesce(s.responses_5xx, 0)::text),
                       (23, 'outbox_http_responses_total', ',class="error"', coalesce(s.responses_errors, 0)::text),
                       (24, 'outbox_http_request_duration_seconds_sum', '',
                        round(coalesce(s.request_seconds_total, 0)::numeric, 6)::text),
                       (24, 'outbox_http_request_duration_seconds_count', '', coalesce(s.requests_total, 0)::text),
                       (25, 'outbox_last_success_timestamp_seconds', '',
                        round(extract(epoch FROM s.last_success_at), 3)::text),
                       (26, 'outbox_last_error_timestamp_seconds', '',
                        round(extract(epoch FROM s.last_error_at), 3)::text))
                       AS m(ord, metric, extra, value)
             WHERE m.value IS NOT NULL
               AND (m.ord < 16 OR s.defined))
    SELECT string_agg(x.line, E'\n' ORDER BY x.ord, x.sub, x.metric, x.labels) || E'\n'
      FROM (SELECT f.ord, 0 AS sub, '' AS metric, '' AS labels,
                   format('# HELP %s %s', f.name, f.help) AS line
              FROM fam AS f
            UNION ALL
            SELECT f.ord, 1, '', '', format('# TYPE %s %s', f.name, f.type)
              FROM fam AS f
            UNION ALL
            SELECT sm.ord, 2, sm.metric, sm.labels, format('%s{%s} %s', sm.metric, sm.labels, sm.value)
              FROM samples AS sm) AS x);
END
$$;

COMMENT ON FUNCTION outbox.metrics() IS
    'This database''s outbox metrics in the Prometheus text exposition format.';
-- Wait until an event is published (true), or the timeout passes or the
-- event is dead-lettered (false).  For read-your-publish flows and tests.
CREATE FUNCTION outbox.wait_published(id pg_catalog.uuid,
                                      timeout pg_catalog.interval DEFAULT '30 seconds')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'outbox_wait_published'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION outbox.wait_published(pg_catalog.uuid, pg_catalog.interval) IS
    'Wait until the event is published (true); false when the timeout passes first or the event is dead-lettered.';

-- Dead letters: list, redrive, purge.  These run as the extension owner
-- and are granted to nobody: EXECUTE is the whole grant for an operator
-- role.  Filters: destination (exact), type (pattern, '*' matches any
-- text), error_like (LIKE pattern on last_error), since/until (creation
-- time, until exclusive).
CREATE FUNCTION outbox.dead_letters(
    destination pg_catalog.text DEFAULT NULL,
    type        pg_catalog.text DEFAULT NULL,
    error_like  pg_catalog.text DEFAULT NULL,
    since       pg_catalog.timestamptz DEFAULT NULL,
    until       pg_catalog.timestamptz DEFAULT NULL,
    max_rows    pg_catalog.int4 DEFAULT 100)
RETURNS TABLE (id pg_catalog.uuid, destination pg_catalog.text, type pg_catalog.text,
               aggregate_type pg_catalog.text, aggregate_id pg_catalog.text,
               attempts pg_catalog.int4, last_status pg_catalog.int4,
               last_error pg_catalog.text, created_at pg_catalog.timestamptz,
               payload pg_catalog.jsonb, headers pg_catalog.jsonb)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.id, e.destination, e.type, e.aggregate_type, e.aggregate_id, e.attempts,
           e.last_status, e.last_error, e.created_at, e.payload, e.headers
      FROM outbox.events AS e
     WHERE e.status OPERATOR(pg_catalog.=) 'dead'
       AND ($1 IS NULL OR e.destination OPERATOR(pg_catalog.=) $1)
       AND ($2 IS NULL OR e.type OPERATOR(pg_catalog.~~) outbox._glob_to_like($2))
       AND ($3 IS NULL OR e.last_error OPERATOR(pg_catalog.~~) $3)
       AND ($4 IS NULL OR e.created_at OPERATOR(pg_catalog.>=) $4)
       AND ($5 IS NULL OR e.created_at OPERATOR(pg_catalog.<) $5)
     ORDER BY e.created_at, e.id
     LIMIT $6;
$$;

COMMENT ON FUNCTION outbox.dead_letters(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.int4) IS
    'Dead letters matching the filters, oldest first, with payload and last error.';

-- The dead letters a filter selects; a filter is required unless
-- all_dead is true, so a forgotten argument never means "everything".
CREATE FUNCTION outbox._dead_selection(
    destination pg_catalog.text, type pg_catalog.text, error_like pg_catalog.text,
    since pg_catalog.timestamptz, until pg_catalog.timestamptz, all_dead pg_catalog.bool,
    verb pg_catalog.text)
RETURNS SETOF pg_catalog.uuid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $1 IS NULL AND $2 IS NULL AND $3 IS NULL AND $4 IS NULL AND $5 IS NULL
       AND NOT coalesce($6, false) THEN
        RAISE EXCEPTION 'no filter given for the dead letters to %', $7
              USING ERRCODE = '22023',
                    HINT = 'Give destination, type, error_like, since or until, or all_dead => true for every dead letter.';
    END IF;
    RETURN QUERY
    SELECT e.id
      FROM outbox.events AS e
     WHERE e.status OPERATOR(pg_catalog.=) 'dead'
       AND ($1 IS NULL OR e.destination OPERATOR(pg_catalog.=) $1)
       AND ($2 IS NULL OR e.type OPERATOR(pg_catalog.~~) outbox._glob_to_like($2))
       AND ($3 IS NULL OR e.last_error OPERATOR(pg_catalog.~~) $3)
       AND ($4 IS NULL OR e.created_at OPERATOR(pg_catalog.>=) $4)
       AND ($5 IS NULL OR e.created_at OPERATOR(pg_catalog.<) $5);
END
$$;

-- Redrive one dead letter: pending again, due now, attempts from zero,
-- same id.  false if the event is not a dead letter.
CREATE FUNCTION outbox.redrive(id pg_catalog.uuid)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_status text;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'event id must not be null' USING ERRCODE = '22004';
    END IF;
    SELECT e.status INTO current_status FROM outbox.events AS e WHERE e.id = $1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event % does not exist', $1
              USING ERRCODE = '42704',
                    HINT = 'List dead letters with outbox.dead_letters().';
    END IF;
    IF current_status <> 'dead' THEN
        RETURN false;
    END IF;
    UPDATE outbox.events AS e
       SET status = 'pending', attempts = 0, next_attempt_at = now(), leased_until = NULL
     WHERE e.id = $1;
    PERFORM outbox._wake();
    RETURN true;
END
$$;

COMMENT ON FUNCTION outbox.redrive(pg_catalog.uuid) IS
    'Send a dead letter again (same id, attempts from zero); false if it is not a dead letter.';

CREATE FUNCTION outbox.redrive_dead(
    destination pg_catalog.text DEFAULT NULL,
    type        pg_catalog.text DEFAULT NULL,
    error_like  pg_catalog.text DEFAULT NULL,
    since       pg_catalog.timestamptz DEFAULT NULL,
    until       pg_catalog.timestamptz DEFAULT NULL,
    all_dead    pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n int8;
BEGIN
    UPDATE outbox.events AS e
       SET status = 'pending', attempts = 0, next_attempt_at = now(), leased_until = NULL
     WHERE e.id IN (SELECT s FROM outbox._dead_selection($1, $2, $3, $4, $5, $6, 'redrive') AS s)
       AND e.status = 'dead';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM outbox._wake();
    END IF;
    RETURN n;
END
$$;

COMMENT ON FUNCTION outbox.redrive_dead(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.bool) IS
    'Send the dead letters a filter selects again (same ids); all_dead => true for every one. Returns how many.';

CREATE FUNCTION outbox.purge_dead(
    destination pg_catalog.text DEFAULT NULL,
    type        pg_catalog.text DEFAULT NULL,
    error_like  pg_catalog.text DEFAULT NULL,
    since       pg_catalog.timestamptz DEFAULT NULL,
    until       pg_catalog.timestamptz DEFAULT NULL,
    all_dead    pg_catalog.bool DEFAULT false)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n int8;
BEGIN
    DELETE FROM outbox.events AS e
     WHERE e.id IN (SELECT s FROM outbox._dead_selection($1, $2, $3, $4, $5, $6, 'purge') AS s)
       AND e.status = 'dead';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

COMMENT ON FUNCTION outbox.purge_dead(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.bool) IS
    'Delete the dead letters a filter selects (never pending or published events); all_dead => true for every one. Returns how many.';

-- Pause and resume a destination: its events wait (requests already in
-- flight finish); resume wakes the relays at commit.
CREATE FUNCTION outbox._set_paused(destination pg_catalog.text, paused pg_catalog.bool)
RETURNS pg_catalog.void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'destination name must not be null' USING ERRCODE = '22004';
    END IF;
    UPDATE outbox.destinations AS d SET paused = $2 WHERE d.name = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'destination "%" does not exist', $1
              USING ERRCODE = '42704',
                    HINT = 'See outbox.destinations for the defined destinations.';
    END IF;
    PERFORM outbox._wake();
END
$$;

CREATE FUNCTION outbox.pause(destination pg_catalog.text)
RETURNS pg_catalog.void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT outbox._set_paused($1, true); $$;

CREATE FUNCTION outbox.resume(destination pg_catalog.text)
RETURNS pg_catalog.void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT outbox._set_paused($1, false); $$;

COMMENT ON FUNCTION outbox.pause(pg_catalog.text) IS
    'Stop leasing events of a destination; they wait until outbox.resume().';
COMMENT ON FUNCTION outbox.resume(pg_catalog.text) IS
    'Deliver a paused destination''s events again.';

-- Monitoring for the built-in pg_monitor role: health, metrics and the
-- statistics, never payloads or secrets (the views and SECURITY DEFINER
-- functions read the tables with the owner's rights; pg_monitor gets no
-- privilege on any table).
GRANT USAGE ON SCHEMA outbox TO pg_monitor;
GRANT SELECT ON outbox.destination_stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION outbox.health(), outbox.metrics(), outbox.workers(),
                          outbox.destination_runtime()
      TO pg_monitor;


------------------------------------------------------------------------
-- Brokers: SNS, SQS, RabbitMQ
------------------------------------------------------------------------

-- Secrets for broker destinations, referenced by name from
-- outbox.destinations.credentials.  Like the destinations table it is for
-- privileged roles only: never grant SELECT on it to application or
-- monitoring roles.  The relay hands the values to libcurl and never logs
-- them.
CREATE TABLE outbox.credentials (
    name                  pg_catalog.text PRIMARY KEY
                          CONSTRAINT credentials_name_check
                          CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.-]{1,63}$'),
    aws_access_key_id     pg_catalog.text
                          CONSTRAINT credentials_access_key_check
                          CHECK (aws_access_key_id OPERATOR(pg_catalog.~) '^[A-Za-z0-9]{1,128}$'),
    aws_secret_access_key pg_catalog.text
                          CONSTRAINT credentials_secret_check
                          CHECK (aws_secret_access_key OPERATOR(pg_catalog.~) '^[^[:space:][:cntrl:]]+$'),
    aws_session_token     pg_catalog.text
                          CONSTRAINT credentials_session_token_check
                          CHECK (aws_session_token OPERATOR(pg_catalog.~) '^[^[:space:][:cntrl:]]+$'),
    username              pg_catalog.text
                          CONSTRAINT credentials_username_check
                          CHECK (username OPERATOR(pg_catalog.~) '^[^:[:cntrl:]]{1,255}$'),
    password              pg_catalog.text
                          CONSTRAINT credentials_password_check
                          CHECK (password OPERATOR(pg_catalog.!~) '[[:cntrl:]]'),
    created_at            pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT credentials_aws_pair_check
        CHECK ((aws_access_key_id IS NULL) OPERATOR(pg_catalog.=) (aws_secret_access_key IS NULL)),
    CONSTRAINT credentials_token_check
        CHECK (aws_session_token IS NULL OR aws_access_key_id IS NOT NULL),
    CONSTRAINT credentials_basic_pair_check
        CHECK ((username IS NULL) OPERATOR(pg_catalog.=) (password IS NULL)),
    CONSTRAINT credentials_not_empty_check
        CHECK (aws_access_key_id IS NOT NULL OR username IS NOT NULL)
);

COMMENT ON TABLE outbox.credentials IS
    'Secrets of broker destinations (AWS keys, RabbitMQ user). Never grant SELECT on this table to application or monitoring roles.';

SELECT pg_catalog.pg_extension_config_dump('outbox.credentials', '');

ALTER TABLE outbox.destinations
    ADD COLUMN credentials pg_catalog.text
        REFERENCES outbox.credentials (name) ON UPDATE CASCADE ON DELETE RESTRICT;

COMMENT ON COLUMN outbox.destinations.credentials IS
    'For kinds sns, sqs and rabbitmq: the outbox.credentials row the relay signs or authenticates with.';

-- Validates a broker destination's url, options and credentials when it is
-- written, so that mistakes surface as errors here rather than as failed
-- deliveries later.  See README, "Destination kinds".
CREATE FUNCTION outbox._check_broker_destination()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o      pg_catalog.jsonb := NEW.options;
    k      pg_catalog.text;
    known  pg_catalog.text[];
    cred   outbox.credentials%ROWTYPE;
    region pg_catalog.text;
    wanted pg_catalog.text;
BEGIN
    -- webhooks, and kinds the CHECK constraint refuses anyway
    IF NEW.kind OPERATOR(pg_catalog.<>) ALL (ARRAY['sns', 'sqs', 'rabbitmq']) THEN
        RETURN NEW;
    END IF;

    known := CASE NEW.kind
        WHEN 'sns' THEN ARRAY['topic_arn', 'region', 'fifo', 'message_group_key', 'batch_size', 'circuit_threshold', 'ordering', 'on_dead']
        WHEN 'sqs' THEN ARRAY['queue_url', 'region', 'fifo', 'message_group_key', 'batch_size', 'circuit_threshold', 'ordering', 'on_dead']
        ELSE ARRAY['vhost', 'exchange', 'routing_key', 'unroutable', 'circuit_threshold', 'ordering', 'on_dead'] END;
    FOR k IN SELECT pg_catalog.jsonb_object_keys(o) LOOP
        IF NOT (k OPERATOR(pg_catalog.=) ANY (known)) THEN
            RAISE EXCEPTION 'unknown option "%" for a destination of kind %', k, NEW.kind
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = pg_catalog.format('Options of kind %s: %s.', NEW.kind,
                                               pg_catalog.array_to_string(known, ', '));
        END IF;
        wanted := CASE WHEN k OPERATOR(pg_catalog.=) 'fifo' THEN 'boolean'
                       WHEN k OPERATOR(pg_catalog.=) ANY (ARRAY['batch_size', 'circuit_threshold']) THEN 'number'
                       ELSE 'string' END;
        IF pg_catalog.jsonb_typeof(o OPERATOR(pg_catalog.->) k) OPERATOR(pg_catalog.<>) wanted THEN
            RAISE EXCEPTION 'option "%" of destination "%" has the wrong type', k, NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'fifo is a boolean, batch_size and circuit_threshold are numbers, the other options are strings.';
        END IF;
    END LOOP;

    IF NEW.credentials IS NULL THEN
        RAISE EXCEPTION 'a destination of kind % needs credentials', NEW.kind
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Insert a row into outbox.credentials and name it in the credentials column.';
    END IF;
    SELECT * INTO cred FROM outbox.credentials AS c WHERE c.name OPERATOR(pg_catalog.=) NEW.credentials;

    IF NEW.kind OPERATOR(pg_catalog.=) ANY (ARRAY['sns', 'sqs']) THEN
        IF cred.aws_access_key_id IS NULL THEN
            RAISE EXCEPTION 'credentials "%" have no AWS access key', NEW.credentials
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set aws_access_key_id and aws_secret_access_key in outbox.credentials.';
        END IF;
        -- libcurl 7.88 signs a query string unsorted: every parameter goes in the body
        IF pg_catalog.strpos(NEW.url, '?') OPERATOR(pg_catalog.>) 0 THEN
            RAISE EXCEPTION 'the url of an % destination must not have a query string', NEW.kind
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use the service endpoint, e.g. https://sqs.eu-west-1.amazonaws.com/.';
        END IF;
        IF NEW.kind OPERATOR(pg_catalog.=) 'sns' AND
           (o OPERATOR(pg_catalog.->>) 'topic_arn') IS NULL THEN
            RAISE EXCEPTION 'an sns destination needs the option topic_arn'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set options to e.g. {"topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders"}.';
        END IF;
        IF NEW.kind OPERATOR(pg_catalog.=) 'sns' AND
           (o OPERATOR(pg_catalog.->>) 'topic_arn') OPERATOR(pg_catalog.!~)
           '^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]+(\.fifo)?$' THEN
            RAISE EXCEPTION 'option topic_arn of destination "%" is not an SNS topic ARN', NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A topic ARN looks like arn:aws:sns:REGION:ACCOUNT:NAME (NAME ending in .fifo for a FIFO topic).';
        END IF;
        IF NEW.kind OPERATOR(pg_catalog.=) 'sqs' AND
           coalesce(o OPERATOR(pg_catalog.->>) 'queue_url', NEW.url) OPERATOR(pg_catalog.!~*)
           '^https?://[^/?#[:space:]]+/[0-9A-Za-z]+/[A-Za-z0-9_-]{1,80}(\.fifo)?$' THEN
            RAISE EXCEPTION 'destination "%" has no SQS queue URL', NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set the option queue_url to e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/orders.';
        END IF;
        region := coalesce(o OPERATOR(pg_catalog.->>) 'region',
                           NULLIF(pg_catalog.split_part(o OPERATOR(pg_catalog.->>) 'topic_arn', ':', 4), ''),
                           pg_catalog.substring(NEW.url, '^https?://[a-z0-9-]+\.([a-z0-9-]+)\.amazonaws\.com'));
        IF region IS NULL OR region OPERATOR(pg_catalog.!~) '^[a-z0-9-]{1,64}$' THEN
            RAISE EXCEPTION 'destination "%" has no AWS region', NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set the option region, e.g. {"region": "eu-west-1"}; it is derived only from a topic ARN or an amazonaws.com endpoint.';
        END IF;
        IF (o OPERATOR(pg_catalog.->>) 'message_group_key') OPERATOR(pg_catalog.<>) ALL (ARRAY['aggregate_id', 'type', 'destination']) THEN
            RAISE EXCEPTION 'option message_group_key must be aggregate_id, type or destination'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (o OPERATOR(pg_catalog.->>) 'batch_size')::pg_catalog.numeric OPERATOR(pg_catalog.<>) ALL (ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]::pg_catalog.numeric[]) THEN
            RAISE EXCEPTION 'option batch_size must be an integer from 1 to 10'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'SNS PublishBatch and SQS SendMessageBatch take at most 10 entries; 1 sends every message on its own.';
        END IF;
    ELSE
        IF cred.username IS NULL THEN
            RAISE EXCEPTION 'credentials "%" have no user name and password', NEW.credentials
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set username and password in outbox.credentials (a RabbitMQ user with the management tag).';
        END IF;
        IF (o OPERATOR(pg_catalog.->>) 'unroutable') OPERATOR(pg_catalog.<>) ALL (ARRAY['retry', 'dead']) THEN
            RAISE EXCEPTION 'option unroutable must be retry or dead'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF pg_catalog.length(coalesce(o OPERATOR(pg_catalog.->>) 'routing_key', '')) OPERATOR(pg_catalog.>) 255 THEN
            RAISE EXCEPTION 'option routing_key is longer than 255 bytes'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER destinations_check_broker
    BEFORE INSERT OR UPDATE ON outbox.destinations
    FOR EACH ROW EXECUTE FUNCTION outbox._check_broker_destination();



------------------------------------------------------------------------
-- Privileges: whatever the sections above created is not for PUBLIC
------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM PUBLIC;
