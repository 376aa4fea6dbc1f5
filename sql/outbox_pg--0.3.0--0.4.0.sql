/* sql/outbox_pg--0.3.0--0.4.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.4.0'" to load this file. \quit

------------------------------------------------------------------------
-- insert-only store (issue #21): design A of src/worker/README.store
------------------------------------------------------------------------

-- The objects of the append-only store, side by side with outbox.events.
-- Nothing writes to them yet except the statements of src/worker/store.c
-- that the SQL wrappers below expose (outbox._claim, _claim_ack,
-- _claim_recover, _snapshot_cut, _retries_*, _emit_log, _rotate_log, _trim_batches); emit(), the relay, the views and the
-- move of outbox.events' rows follow in the order README.store section 6
-- gives (see HANDOVER.store.md).
--
-- The log: three slots, emit() inserts into the current one, retention
-- truncates whole slots (PgQ's rotation).  Plain tables rather than
-- partitions: emit() inserts straight into a leaf through the executor's
-- simple-insert path, which does not route.  A row is never updated or
-- deleted.  xid is the emitting transaction's top-level xid8: a
-- destination's position is a snapshot, and an event belongs to the range
-- between two positions whose second one shows its xid and whose first
-- one does not.  Insert-only and truncated long before any freeze age:
-- autovacuum has nothing to do on them (ANALYZE is left to the claim's
-- plan shapes, which do not depend on statistics).
DO $$
BEGIN
    FOR slot IN 0 .. 2 LOOP
        EXECUTE pg_catalog.format($f$
            CREATE TABLE outbox.log_%s (
                id              pg_catalog.uuid NOT NULL,
                xid             pg_catalog.xid8 NOT NULL,
                type            pg_catalog.text NOT NULL,
                aggregate_type  pg_catalog.text,
                aggregate_id    pg_catalog.text,
                payload         pg_catalog.jsonb NOT NULL,
                headers         pg_catalog.jsonb,
                traceparent     pg_catalog.text,
                destination     pg_catalog.text,
                ordering_key    pg_catalog.text,
                not_before      pg_catalog.timestamptz,
                created_at      pg_catalog.timestamptz NOT NULL,
                CONSTRAINT log_%s_pkey PRIMARY KEY (id)
            ) WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)$f$,
            slot, slot);
        EXECUTE pg_catalog.format(
            'CREATE INDEX log_%s_destination_xid_idx ON outbox.log_%s (destination, xid)',
            slot, slot);
        EXECUTE pg_catalog.format(
            'COMMENT ON TABLE outbox.log_%s IS %L', slot,
            'Slot ' || slot || ' of the event log (insert-only; truncated whole by retention).');
    END LOOP;
END
$$;

-- The whole log.  A UNION ALL of the slots is flattened into an append of
-- three index scans, each with the caller's conditions pushed down.
CREATE VIEW outbox.log AS
    SELECT 0::pg_catalog.int2 AS slot, * FROM outbox.log_0
    UNION ALL
    SELECT 1::pg_catalog.int2, * FROM outbox.log_1
    UNION ALL
    SELECT 2::pg_catalog.int2, * FROM outbox.log_2;

-- Which slot emit() writes to.  One row, updated only by the rotation;
-- generation counts the switches (shared memory will mirror it so that
-- emit() finds its slot with one atomic read).  switch_xid: the first xid
-- assigned after the switch; a slot left by a switch takes no more rows
-- once the oldest running xid has passed it.
CREATE TABLE outbox.rotation (
    only_row    pg_catalog.bool PRIMARY KEY DEFAULT true CHECK (only_row),
    slot        pg_catalog.int2 NOT NULL
                CHECK (slot OPERATOR(pg_catalog.>=) 0 AND slot OPERATOR(pg_catalog.<=) 2),
    generation  pg_catalog.int8 NOT NULL,
    switched_at pg_catalog.timestamptz NOT NULL,
    switch_xid  pg_catalog.xid8 NOT NULL
);
INSERT INTO outbox.rotation (slot, generation, switched_at, switch_xid)
VALUES (0, 0, pg_catalog.now(), pg_catalog.pg_current_xact_id());

-- One row per destination, only ever locked: a claim of a destination
-- holds its row (FOR NO KEY UPDATE SKIP LOCKED), so one worker at a time
-- claims a destination and the others serve other destinations.
CREATE TABLE outbox.streams (
    destination pg_catalog.text PRIMARY KEY
                REFERENCES outbox.destinations (name) ON UPDATE CASCADE ON DELETE CASCADE
);

-- One row per claimed range of a destination's log, inserted by the claim
-- (never empty).  A destination's position is the to_snap of its newest
-- row; the events of a batch are those whose xid to_snap shows and
-- from_snap does not.  leased_until is moved only when a batch whose
-- lease ran out without an acknowledgement is claimed again.
CREATE TABLE outbox.batches (
    destination       pg_catalog.text NOT NULL,
    seq               pg_catalog.int8 NOT NULL,
    from_snap         pg_catalog.pg_snapshot NOT NULL,
    to_snap           pg_catalog.pg_snapshot NOT NULL,
    leased_until      pg_catalog.timestamptz NOT NULL,
    events            pg_catalog.int4 NOT NULL,
    oldest_created_at pg_catalog.timestamptz,
    PRIMARY KEY (destination, seq)
);

-- A batch is done when its row here exists (inserted once, never updated).
CREATE TABLE outbox.batch_acks (
    destination pg_catalog.text NOT NULL,
    seq         pg_catalog.int8 NOT NULL,
    acked_at    pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (destination, seq)
);

-- Copies of the events that failed or were deferred (not_before), leased
-- and updated in place like 0.2's rows: they are few.
CREATE TABLE outbox.retries (
    id              pg_catalog.uuid PRIMARY KEY,
    type            pg_catalog.text NOT NULL,
    aggregate_type  pg_catalog.text,
    aggregate_id    pg_catalog.text,
    payload         pg_catalog.jsonb NOT NULL,
    headers         pg_catalog.jsonb,
    traceparent     pg_catalog.text,
    destination     pg_catalog.text,
    ordering_key    pg_catalog.text,
    created_at      pg_catalog.timestamptz NOT NULL,
    attempts        pg_catalog.int4 NOT NULL,
    due_at          pg_catalog.timestamptz NOT NULL,
    leased_until    pg_catalog.timestamptz,
    last_status     pg_catalog.int4,
    last_error      pg_catalog.text
) WITH (fillfactor = 50);
CREATE INDEX retries_due_idx ON outbox.retries (destination, due_at);
CREATE INDEX retries_created_idx ON outbox.retries (destination, created_at);
CREATE INDEX retries_ordering_idx ON outbox.retries (destination, ordering_key, id)
    WHERE ordering_key IS NOT NULL;

-- Copies of dead events.  (Named dead_events: outbox.dead_letters() is
-- already the function that lists them.)
CREATE TABLE outbox.dead_events (
    LIKE outbox.retries,
    died_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (id)
);
CREATE INDEX dead_events_created_idx ON outbox.dead_events (destination, created_at);
CREATE INDEX dead_events_ordering_idx ON outbox.dead_events (destination, ordering_key, id)
    WHERE ordering_key IS NOT NULL;

-- s cut at xid: shows what s shows below xid and nothing from xid on.  The
-- claim cuts its batch this way (whole transactions), and a new
-- destination starts at the current snapshot cut at its own transaction's
-- xid (the plain snapshot shows the own xid as committed once a later xid
-- has completed: events emitted in the creating transaction would be
-- skipped).  Internal, granted to no one.
CREATE FUNCTION outbox._snapshot_cut(s pg_catalog.pg_snapshot, xid pg_catalog.xid8)
RETURNS pg_catalog.pg_snapshot
AS 'MODULE_PATHNAME', 'outbox__snapshot_cut'
LANGUAGE C IMMUTABLE STRICT;

-- A destination's stream starts at the creating transaction's snapshot:
-- its log starts empty (seq 0, acknowledged).  Deleting a destination
-- deletes its stream (foreign key) and its batches.
CREATE FUNCTION outbox._stream_changed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
    pos pg_catalog.pg_snapshot;
BEGIN
    IF TG_OP = 'INSERT' THEN
        pos := outbox._snapshot_cut(pg_catalog.pg_current_snapshot(),
                                    pg_catalog.pg_current_xact_id());
        INSERT INTO outbox.streams (destination) VALUES (NEW.name);
        INSERT INTO outbox.batches (destination, seq, from_snap, to_snap, leased_until, events)
        VALUES (NEW.name, 0, pos, pos, pg_catalog.now(), 0);
        INSERT INTO outbox.batch_acks (destination, seq) VALUES (NEW.name, 0);
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE outbox.batches SET destination = NEW.name
         WHERE destination OPERATOR(pg_catalog.=) OLD.name;
        UPDATE outbox.batch_acks SET destination = NEW.name
         WHERE destination OPERATOR(pg_catalog.=) OLD.name;
        RETURN NEW;
    END IF;
    DELETE FROM outbox.batches WHERE destination OPERATOR(pg_catalog.=) OLD.name;
    DELETE FROM outbox.batch_acks WHERE destination OPERATOR(pg_catalog.=) OLD.name;
    RETURN OLD;
END
$$;

REVOKE ALL ON FUNCTION outbox._stream_changed() FROM PUBLIC;

CREATE TRIGGER destinations_stream
    AFTER INSERT OR DELETE OR UPDATE OF name ON outbox.destinations
    FOR EACH ROW EXECUTE FUNCTION outbox._stream_changed();

-- the destinations that exist now start at the update's snapshot
INSERT INTO outbox.streams (destination) SELECT name FROM outbox.destinations;
INSERT INTO outbox.batches (destination, seq, from_snap, to_snap, leased_until, events)
SELECT name, 0,
       outbox._snapshot_cut(pg_catalog.pg_current_snapshot(), pg_catalog.pg_current_xact_id()),
       outbox._snapshot_cut(pg_catalog.pg_current_snapshot(), pg_catalog.pg_current_xact_id()),
       pg_catalog.now(), 0
  FROM outbox.destinations;
INSERT INTO outbox.batch_acks (destination, seq) SELECT name, 0 FROM outbox.destinations;

-- The claim (src/worker/store.c, the statements the relay will run):
-- up to about batch_size events of a destination, whole transactions,
-- that became visible since its position; records the batch and returns
-- its events with the batch's seq.  Nothing when another worker is
-- claiming the destination or nothing is new.  Events whose not_before is
-- still ahead, and on an ordered destination those behind an earlier
-- event of their aggregate in outbox.retries (or a dead, unreleased one
-- under on_dead = 'block'), are copied to outbox.retries instead of being
-- returned.
CREATE FUNCTION outbox._claim(batch_size pg_catalog.int4, lease pg_catalog.interval,
                              destination pg_catalog.text)
RETURNS TABLE (id pg_catalog.uuid, type pg_catalog.text, aggregate_id pg_catalog.text,
               payload pg_catalog.text, headers pg_catalog.jsonb, traceparent pg_catalog.text,
               "time" pg_catalog.text, attempts pg_catalog.int4, age pg_catalog.float8,
               leased_until pg_catalog.timestamptz, seq pg_catalog.int8)
AS 'MODULE_PATHNAME', 'outbox__claim'
LANGUAGE C VOLATILE;

-- A batch is done: the acknowledgement row, and (only if this is the
-- first acknowledgement of the batch) copies of the failed events into
-- outbox.retries, due at due_at with the given attempts, status and error,
-- and of the dead ones into outbox.dead_events.  Returns whether this call
-- acknowledged the batch.
CREATE FUNCTION outbox._claim_ack(destination pg_catalog.text, seq pg_catalog.int8,
                                  failed pg_catalog.uuid[] DEFAULT '{}',
                                  due_at pg_catalog.timestamptz[] DEFAULT '{}',
                                  attempts pg_catalog.int4[] DEFAULT '{}',
                                  status pg_catalog.int4[] DEFAULT '{}',
                                  error pg_catalog.text[] DEFAULT '{}',
                                  dead pg_catalog.uuid[] DEFAULT '{}',
                                  dead_status pg_catalog.int4[] DEFAULT '{}',
                                  dead_error pg_catalog.text[] DEFAULT '{}')
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'outbox__claim_ack'
LANGUAGE C VOLATILE;

-- The oldest batch of a destination, at or above low_seq, whose lease ran
-- out without an acknowledgement: leased again and its events returned as
-- _claim returns them.
CREATE FUNCTION outbox._claim_recover(lease pg_catalog.interval, destination pg_catalog.text,
                                      low_seq pg_catalog.int8 DEFAULT 0)
RETURNS TABLE (id pg_catalog.uuid, type pg_catalog.text, aggregate_id pg_catalog.text,
               payload pg_catalog.text, headers pg_catalog.jsonb, traceparent pg_catalog.text,
               "time" pg_catalog.text, attempts pg_catalog.int4, age pg_catalog.float8,
               leased_until pg_catalog.timestamptz, seq pg_catalog.int8)
AS 'MODULE_PATHNAME', 'outbox__claim_recover'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._snapshot_cut(pg_catalog.pg_snapshot, pg_catalog.xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._claim(pg_catalog.int4, pg_catalog.interval, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._claim_ack(pg_catalog.text, pg_catalog.int8, pg_catalog.uuid[],
                                         pg_catalog.timestamptz[], pg_catalog.int4[],
                                         pg_catalog.int4[], pg_catalog.text[], pg_catalog.uuid[],
                                         pg_catalog.int4[], pg_catalog.text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._claim_recover(pg_catalog.interval, pg_catalog.text, pg_catalog.int8)
    FROM PUBLIC;

-- outbox.retries' statements (src/worker/store.c): the lease, retry and
-- dead of outbox.events' rows, on the copies (fenced by leased_until the
-- same way); an acknowledged copy is deleted, a dead one moves to
-- outbox.dead_events.  Internal, granted to no one.
CREATE FUNCTION outbox._retries_lease(batch_size pg_catalog.int4, lease pg_catalog.interval,
                                      destination pg_catalog.text)
RETURNS TABLE (id pg_catalog.uuid, type pg_catalog.text, aggregate_id pg_catalog.text,
               payload pg_catalog.text, headers pg_catalog.jsonb, traceparent pg_catalog.text,
               "time" pg_catalog.text, attempts pg_catalog.int4, age pg_catalog.float8,
               leased_until pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'outbox__retries_lease'
LANGUAGE C VOLATILE;

CREATE FUNCTION outbox._retries_ack(ids pg_catalog.uuid[])
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox__retries_ack'
LANGUAGE C VOLATILE;

CREATE FUNCTION outbox._retries_retry(ids pg_catalog.uuid[], next_at pg_catalog.timestamptz[],
                                      status pg_catalog.int4[], error pg_catalog.text[],
                                      leases pg_catalog.timestamptz[] DEFAULT NULL,
                                      give_back pg_catalog.bool[] DEFAULT NULL)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox__retries_retry'
LANGUAGE C VOLATILE;

CREATE FUNCTION outbox._retries_dead(ids pg_catalog.uuid[], status pg_catalog.int4[],
                                     error pg_catalog.text[],
                                     leases pg_catalog.timestamptz[] DEFAULT NULL)
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox__retries_dead'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._retries_lease(pg_catalog.int4, pg_catalog.interval, pg_catalog.text)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._retries_ack(pg_catalog.uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._retries_retry(pg_catalog.uuid[], pg_catalog.timestamptz[],
                                             pg_catalog.int4[], pg_catalog.text[],
                                             pg_catalog.timestamptz[], pg_catalog.bool[])
    FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._retries_dead(pg_catalog.uuid[], pg_catalog.int4[], pg_catalog.text[],
                                            pg_catalog.timestamptz[]) FROM PUBLIC;

-- emit() into the log (src/api/emit.c): the same checks, ordering lock and
-- row as outbox.emit(), inserted into the current slot with the
-- transaction's xid.  Internal and temporary: the tests use it until
-- emit() itself writes to the log.  Granted to no one.
CREATE FUNCTION outbox._emit_log(
    type            pg_catalog.text,
    aggregate_id    pg_catalog.text,
    payload         pg_catalog.jsonb,
    aggregate_type  pg_catalog.text DEFAULT NULL,
    destination     pg_catalog.text DEFAULT NULL,
    headers         pg_catalog.jsonb DEFAULT NULL,
    traceparent     pg_catalog.text DEFAULT NULL,
    not_before      pg_catalog.timestamptz DEFAULT NULL)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'outbox__emit_log'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION outbox._emit_log(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb,
                                        pg_catalog.text, pg_catalog.text, pg_catalog.jsonb,
                                        pg_catalog.text, pg_catalog.timestamptz) FROM PUBLIC;

-- emit() caches the current slot per backend; a switch invalidates it
CREATE TRIGGER rotation_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox.rotation
    FOR EACH STATEMENT EXECUTE FUNCTION outbox._config_changed();

-- Retention of the log (src/worker/retention.c): when the current slot is
-- older than every, truncate the next one and make it current, if every
-- row in it is acknowledged, no writer can still be inside and its lock
-- comes at once; rows no stream will claim are kept in outbox.retries
-- first.  Returns what happened.  Internal, granted to no one.
CREATE FUNCTION outbox._rotate_log(every pg_catalog.interval)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'outbox__rotate_log'
LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION outbox._rotate_log(pg_catalog.interval) FROM PUBLIC;

-- Delete the batches (and their acknowledgements) below each
-- destination's oldest unacknowledged batch, else below its position;
-- returns how many batches went.  Internal, granted to no one.
CREATE FUNCTION outbox._trim_batches()
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'outbox__trim_batches'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._trim_batches() FROM PUBLIC;
-- end of insert-only store (issue #21)

------------------------------------------------------------------------
-- predefined roles (issue #18) -- keep this section last: it grants
-- on objects the sections above define
------------------------------------------------------------------------

-- Three NOLOGIN roles an administrator grants to login roles:
--
--   outbox_writer   the application: emit(), inbox.claim(),
--                   inbox.receive(), wait_published() -- and nothing to
--                   read; an event is "its own" in that it holds its id
--   outbox_monitor  health, metrics, statistics, destination and worker
--                   state: no payloads, no secrets, no configuration
--   outbox_admin    destinations, routes and credentials; pause and
--                   resume; dead letters (list, redrive, purge, with
--                   their payloads) and release_aggregate; it is a
--                   member of outbox_monitor
--
-- Roles are cluster-wide and belong to no extension: the script creates
-- them only if they do not exist (a CREATE EXTENSION in a second
-- database, or one running at the same time, finds them), and DROP
-- EXTENSION leaves them.  What they may do is granted here, per
-- database, on objects of the extension (kept in pg_init_privs, so
-- pg_dump does not repeat them).
DO $$
DECLARE
    r pg_catalog.text;
BEGIN
    FOREACH r IN ARRAY ARRAY['outbox_writer', 'outbox_monitor', 'outbox_admin']
    LOOP
        IF EXISTS (SELECT FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) r) THEN
            -- made by an earlier CREATE EXTENSION, or by an administrator:
            -- use it, but say so when it is more than a group role
            IF EXISTS (SELECT FROM pg_catalog.pg_roles
                        WHERE rolname OPERATOR(pg_catalog.=) r
                          AND (rolcanlogin OR rolsuper OR rolcreaterole
                               OR rolcreatedb OR rolbypassrls OR rolreplication)) THEN
                RAISE WARNING 'role "%" already exists and is more than a group role', r
                    USING DETAIL = 'It can log in or has attributes beyond NOLOGIN; the extension grants to it all the same.',
                          HINT = pg_catalog.format('Check that "%s" is the role you mean to hold the privileges of the outbox.', r);
            END IF;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;               -- created by a concurrent CREATE EXTENSION
        END;
    END LOOP;
    -- an administrator also monitors (membership is cluster-wide, too)
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_auth_members m
                    WHERE m.roleid OPERATOR(pg_catalog.=)
                          (SELECT oid FROM pg_catalog.pg_roles
                            WHERE rolname OPERATOR(pg_catalog.=) 'outbox_monitor')
                      AND m.member OPERATOR(pg_catalog.=)
                          (SELECT oid FROM pg_catalog.pg_roles
                            WHERE rolname OPERATOR(pg_catalog.=) 'outbox_admin')) THEN
        BEGIN
            GRANT outbox_monitor TO outbox_admin;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;               -- granted by a concurrent CREATE EXTENSION
        END;
    END IF;
END
$$;

-- Whatever the sections above created is not for PUBLIC (as in every
-- release before): functions are executable by PUBLIC by default.
REVOKE ALL ON ALL TABLES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM PUBLIC;

-- outbox.emit() and inbox.receive() with a payload of type text
-- (src/api/payload_text.c): the forms an untyped parameter resolves to,
-- so that a payload that is not JSON -- usually a JavaScript array that
-- the driver sent as an array literal such as '{1,2}' -- fails with a
-- hint instead of failing while the parameters are bound.  Typed jsonb
-- arguments still reach the jsonb forms.  Granted to PUBLIC because they
-- grant nothing: each requires EXECUTE on its jsonb form.
CREATE FUNCTION outbox.emit(
    type            pg_catalog.text,
    aggregate_id    pg_catalog.text,
    payload         pg_catalog.text,
    aggregate_type  pg_catalog.text DEFAULT NULL,
    destination     pg_catalog.text DEFAULT NULL,
    headers         pg_catalog.jsonb DEFAULT NULL,
    traceparent     pg_catalog.text DEFAULT NULL,
    not_before      pg_catalog.timestamptz DEFAULT NULL)
RETURNS pg_catalog.uuid
AS 'MODULE_PATHNAME', 'outbox_emit_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION inbox.receive(
    message_id      pg_catalog.text,
    type            pg_catalog.text,
    payload         pg_catalog.text,
    aggregate_id    pg_catalog.text DEFAULT NULL,
    headers         pg_catalog.jsonb DEFAULT NULL,
    source          pg_catalog.text DEFAULT NULL)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'inbox_receive_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION outbox.emit(pg_catalog.text, pg_catalog.text, pg_catalog.text,
                                pg_catalog.text, pg_catalog.text, pg_catalog.jsonb,
                                pg_catalog.text, pg_catalog.timestamptz) IS
    'outbox.emit() for a payload given as text (an untyped parameter): parses it as jsonb, with a hint when it is not JSON.';
COMMENT ON FUNCTION inbox.receive(pg_catalog.text, pg_catalog.text, pg_catalog.text,
                                  pg_catalog.text, pg_catalog.jsonb, pg_catalog.text) IS
    'inbox.receive() for a payload given as text (an untyped parameter): parses it as jsonb, with a hint when it is not JSON.';

GRANT EXECUTE ON FUNCTION
    outbox.emit(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text,
                pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.timestamptz),
    inbox.receive(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text,
                  pg_catalog.jsonb, pg_catalog.text)
    TO PUBLIC;

GRANT USAGE ON SCHEMA outbox, inbox TO outbox_writer, outbox_monitor, outbox_admin, pg_monitor;

-- outbox_writer.  emit(), claim() and receive() write through the
-- executor and need no table privilege; wait_published() is SECURITY
-- DEFINER and answers only whether the event of a given id is published.
-- Event ids are random UUIDs that only emit() hands out: the events a
-- writer can wait for are those whose id it was given, and it cannot list
-- or read any event, claim or inbox message.
GRANT EXECUTE ON FUNCTION
    outbox.emit(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text,
                pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.timestamptz),
    outbox.wait_published(pg_catalog.uuid, pg_catalog.interval),
    inbox.claim(pg_catalog.text, pg_catalog.text, pg_catalog.interval),
    inbox.receive(pg_catalog.text, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text,
                  pg_catalog.jsonb, pg_catalog.text)
    TO outbox_writer;

-- outbox_monitor, and pg_monitor as since 0.2.0 (granted again here in
-- case a section above replaced an object): the views and SECURITY
-- DEFINER functions read the tables with the owner's rights and show
-- counts, ages, states and times -- no payload, header, URL, secret or
-- peer error text.  No privilege on any table.
GRANT EXECUTE ON FUNCTION
    outbox.health(),
    outbox.metrics(),
    outbox.workers(),
    outbox.destination_runtime()
    TO outbox_monitor, pg_monitor;
GRANT SELECT ON outbox.destination_stats, inbox.message_stats
    TO outbox_monitor, pg_monitor;

-- outbox_admin: the configuration tables (they hold the secrets: an
-- administrator who can point a destination elsewhere can have them sent
-- there anyway), the releases and blocked aggregates of ordered
-- destinations, and the operations.  inbox.handlers only to read: a
-- handler is code that runs as its function's owner on every message,
-- for the extension's owner to register.
GRANT SELECT, INSERT, UPDATE, DELETE
    ON outbox.destinations, outbox.routes, outbox.credentials
    TO outbox_admin;
-- Writing a destination fires outbox._stream_changed(), which keeps the
-- store's rows of the destination (streams, batches): those are the
-- owner's, so the trigger runs with the owner's rights.
ALTER FUNCTION outbox._stream_changed() SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
GRANT SELECT ON outbox.aggregate_releases, outbox.blocked_aggregates, inbox.handlers
    TO outbox_admin;
GRANT EXECUTE ON FUNCTION
    outbox.route(pg_catalog.text),
    outbox.pause(pg_catalog.text),
    outbox.resume(pg_catalog.text),
    outbox.dead_letters(pg_catalog.text, pg_catalog.text, pg_catalog.text,
                        pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.int4),
    outbox.redrive(pg_catalog.uuid),
    outbox.redrive_dead(pg_catalog.text, pg_catalog.text, pg_catalog.text,
                        pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.bool),
    outbox.purge_dead(pg_catalog.text, pg_catalog.text, pg_catalog.text,
                      pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.bool),
    outbox.release_aggregate(pg_catalog.text, pg_catalog.text),
    inbox.redrive(pg_catalog.text),
    inbox.purge(pg_catalog.text)
    TO outbox_admin;
-- end of predefined roles (issue #18)
