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
    RETURN NEW;
END
$$;

CREATE TRIGGER handlers_check
    BEFORE INSERT OR UPDATE ON inbox.handlers
    FOR EACH ROW EXECUTE FUNCTION inbox._check_handler();

-- pg_dump keeps the handlers and every message not processed yet (a
-- processed message only matters for deduplication until retention).
SELECT pg_catalog.pg_extension_config_dump('inbox.handlers', '');
SELECT pg_catalog.pg_extension_config_dump('inbox.messages',
    'WHERE status OPERATOR(pg_catalog.<>) ''processed''');
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
CREATE FUNCTION inbox.redrive(message_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
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
            USING ERRCODE = '55000', DETAIL = pg_catalog.format('Its status is %s.', st);
    END IF;
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
                  HINT = 'Only dead letters are purged; processed messages go by retention.';
    END IF;
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



------------------------------------------------------------------------
-- Brokers: SNS, SQS, RabbitMQ
------------------------------------------------------------------------



------------------------------------------------------------------------
-- Privileges: whatever the sections above created is not for PUBLIC
------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM PUBLIC;
