/* sql/outbox_pg--0.3.0--0.4.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.4.0'" to load this file. \quit

------------------------------------------------------------------------
-- insert-only store (issue #21): design A of src/worker/README.store
------------------------------------------------------------------------

-- The objects of the append-only store (design: src/worker/README.store).
-- emit() appends to the log, the relay claims and acknowledges through the
-- statements of src/worker/store.c (exposed to tests by the internal
-- wrappers outbox._claim, _claim_ack, _claim_recover, _snapshot_cut,
-- _retries_*, _rotate_log, _trim_batches), and outbox.events becomes a
-- view over the store further below, after the move of its rows.
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
    destination       pg_catalog.text NOT NULL
                      REFERENCES outbox.streams ON UPDATE CASCADE ON DELETE CASCADE,
    seq               pg_catalog.int8 NOT NULL,
    from_snap         pg_catalog.pg_snapshot NOT NULL,
    to_snap           pg_catalog.pg_snapshot NOT NULL,
    leased_until      pg_catalog.timestamptz NOT NULL,
    events            pg_catalog.int4 NOT NULL,
    oldest_created_at pg_catalog.timestamptz,
    PRIMARY KEY (destination, seq)
);

-- The batch that claimed an event, found from the event's xid (positions
-- only move forward, so the ends are ordered as the batches are): for
-- outbox.events, which would otherwise walk all of a destination's
-- batches for each of its events.
CREATE INDEX batches_end_idx
    ON outbox.batches (destination, pg_catalog.pg_snapshot_xmax(to_snap), seq);

-- A batch is done when its row here exists (inserted once, never updated).
CREATE TABLE outbox.batch_acks (
    destination pg_catalog.text NOT NULL
                REFERENCES outbox.streams ON UPDATE CASCADE ON DELETE CASCADE,
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
-- its log starts empty (seq 0, acknowledged).  Renaming, deleting or
-- truncating destinations reaches the stream and from it the batches and
-- their acknowledgements (foreign keys).
CREATE FUNCTION outbox._stream_changed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
    pos pg_catalog.pg_snapshot;
BEGIN
    pos := outbox._snapshot_cut(pg_catalog.pg_current_snapshot(),
                                pg_catalog.pg_current_xact_id());
    INSERT INTO outbox.streams (destination) VALUES (NEW.name);
    INSERT INTO outbox.batches (destination, seq, from_snap, to_snap, leased_until, events)
    VALUES (NEW.name, 0, pos, pos, pg_catalog.now(), 0);
    INSERT INTO outbox.batch_acks (destination, seq) VALUES (NEW.name, 0);
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION outbox._stream_changed() FROM PUBLIC;

CREATE TRIGGER destinations_stream
    AFTER INSERT ON outbox.destinations
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
-- store surface (issue #21): outbox.events becomes a view over the store
------------------------------------------------------------------------

-- From 0.4.0 emit() writes the log (outbox.log_0..2) and nothing updates
-- an event row any more.  The 0.3 table keeps its rows under a new name:
-- its published history stays readable through the view below (and is
-- counted by destination_stats) until its retention; the move of its
-- pending and dead rows into the store follows further down.
-- Emitting transactions finish first, new ones wait, the relays' NOWAIT
-- locks fail: nothing is written to the table while it moves.
LOCK TABLE outbox.events IN EXCLUSIVE MODE;
ALTER TABLE outbox.events RENAME TO events_0_3;
COMMENT ON TABLE outbox.events_0_3 IS
    'outbox.events as 0.3 kept it: published history, shown by the view outbox.events; nothing writes here any more.';

-- Unrouted events of the log that outbox._route_pending() gave a
-- destination (their copy went to outbox.retries), and dead letters that
-- outbox.purge_dead() deleted: a log row is never changed, so what became
-- of it is kept here until its slot is truncated.
CREATE TABLE outbox.settled_events (
    id          pg_catalog.uuid PRIMARY KEY,
    settled     pg_catalog.text NOT NULL
                CONSTRAINT settled_events_settled_check
                CHECK (settled OPERATOR(pg_catalog.=) ANY (ARRAY['routed', 'delivered', 'purged'])),
    settled_at  pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    attempts    pg_catalog.int4
);

COMMENT ON TABLE outbox.settled_events IS
    'Log events routed later (copied to outbox.retries), delivered from outbox.retries (with their attempts) or purged as dead letters; kept until their log slot is truncated.';

-- The compatibility view: every event the store knows, one row per id,
-- with the columns and types of the 0.3 table.  For reading (and for
-- INSERT, see below), not for the hot path: a log row's state is derived
-- from its destination's batches.
--   dead_events                         -> 'dead'
--   retries (failed, deferred, held,    -> 'pending' with their attempts,
--     redriven, routed later)              due_at, leased_until, last_*
--   log, not yet claimed (its xid not   -> 'pending', attempts 0
--     visible in the destination's
--     position), unrouted, or for a
--     destination that does not exist
--   log, in an unacknowledged batch     -> 'pending', attempts 1, the
--                                          batch's leased_until
--   log, acknowledged                   -> 'published', published_at the
--                                          batch's acknowledgement time
--                                          while the batch row exists
--                                          (NULL once trimmed)
--   log or events_0_3, delivered from   -> 'published' with the copy's
--     a copy in retries (settled           attempts, published_at the
--     'delivered')                         copy's acknowledgement
--   events_0_3 (0.3's rows)             -> as stored (unless purged)
-- A copy in retries or dead_events hides its log row; a log row hides an
-- events_0_3 row of the same id.  next_attempt_at of a log row is
-- not_before (else created_at): the claim does not write it.
CREATE VIEW outbox.events AS
-- each destination's position and oldest batch kept, read once per query:
-- read per event, a long read of the view walked the index entries of
-- every batch claimed or trimmed since it began (two minutes and more for
-- 900,000 events under 1,000 commits/s)
WITH q AS MATERIALIZED (
        SELECT st.destination,
               (SELECT t.to_snap FROM outbox.batches AS t
                 WHERE t.destination OPERATOR(pg_catalog.=) st.destination
                 ORDER BY t.seq DESC LIMIT 1) AS newest,
               (SELECT t.from_snap FROM outbox.batches AS t
                 WHERE t.destination OPERATOR(pg_catalog.=) st.destination
                 ORDER BY t.seq LIMIT 1) AS oldest
          FROM outbox.streams AS st)
SELECT d.id, d.type, d.aggregate_type, d.aggregate_id, d.payload, d.headers, d.traceparent,
       d.destination, 'dead'::pg_catalog.text AS status, d.attempts,
       d.due_at AS next_attempt_at, d.created_at,
       NULL::pg_catalog.timestamptz AS published_at, d.last_status, d.last_error,
       NULL::pg_catalog.timestamptz AS leased_until, d.ordering_key
  FROM outbox.dead_events AS d
UNION ALL
SELECT r.id, r.type, r.aggregate_type, r.aggregate_id, r.payload, r.headers, r.traceparent,
       r.destination, 'pending', r.attempts, r.due_at, r.created_at, NULL,
       r.last_status, r.last_error, r.leased_until, r.ordering_key
  FROM outbox.retries AS r
 WHERE NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x WHERE x.id OPERATOR(pg_catalog.=) r.id)
UNION ALL
SELECT l.id, l.type, l.aggregate_type, l.aggregate_id, l.payload, l.headers, l.traceparent,
       l.destination,
       CASE WHEN s.settled IS NOT NULL OR (c.claimed AND c.acked IS NOT FALSE)
            THEN 'published' ELSE 'pending' END,
       CASE WHEN s.settled OPERATOR(pg_catalog.=) 'delivered' THEN s.attempts
            WHEN s.settled IS NOT NULL OR c.claimed THEN 1 ELSE 0 END,
       COALESCE(l.not_before, l.created_at), l.created_at,
       CASE WHEN s.settled OPERATOR(pg_catalog.=) 'delivered' THEN s.settled_at
            WHEN c.claimed AND c.acked IS NOT FALSE THEN c.acked_at END,
       NULL, NULL,
       CASE WHEN c.acked IS FALSE THEN c.leased_until END,
       l.ordering_key
  FROM outbox.log AS l
  LEFT JOIN outbox.settled_events AS s ON s.id OPERATOR(pg_catalog.=) l.id
  LEFT JOIN q ON q.destination OPERATOR(pg_catalog.=) l.destination
  LEFT JOIN LATERAL (
        SELECT p.claimed, b.leased_until, b.acked, b.acked_at
          FROM (SELECT COALESCE(pg_catalog.pg_visible_in_snapshot(l.xid, q.newest), false) AS claimed) AS p
          LEFT JOIN LATERAL (
                SELECT t.leased_until, a.seq IS NOT NULL AS acked, a.acked_at
                  FROM outbox.batches AS t
                  LEFT JOIN outbox.batch_acks AS a
                    ON a.destination OPERATOR(pg_catalog.=) t.destination
                   AND a.seq OPERATOR(pg_catalog.=) t.seq
                 WHERE p.claimed
                   -- not in a trimmed batch: the oldest batch kept does not see it
                   AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, q.oldest)
                   AND t.destination OPERATOR(pg_catalog.=) l.destination
                   AND pg_catalog.pg_snapshot_xmax(t.to_snap) OPERATOR(pg_catalog.>) l.xid
                   AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin(t.from_snap)
                   AND pg_catalog.pg_visible_in_snapshot(l.xid, t.to_snap)
                   AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, t.from_snap)
                 -- the first batch whose end is past the xid, and on
                 -- (batches_end_idx): the one that claimed it is a few on
                 ORDER BY pg_catalog.pg_snapshot_xmax(t.to_snap), t.seq LIMIT 1) AS b ON true) AS c ON true
 WHERE (s.settled IS NULL OR s.settled OPERATOR(pg_catalog.<>) 'purged')
   AND NOT EXISTS (SELECT 1 FROM outbox.retries AS x WHERE x.id OPERATOR(pg_catalog.=) l.id)
   AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x WHERE x.id OPERATOR(pg_catalog.=) l.id)
UNION ALL
SELECT o.id, o.type, o.aggregate_type, o.aggregate_id, o.payload, o.headers, o.traceparent,
       o.destination, o.status, COALESCE(s.attempts, o.attempts), o.next_attempt_at,
       o.created_at, COALESCE(s.settled_at, o.published_at),
       o.last_status, o.last_error, o.leased_until, o.ordering_key
  FROM outbox.events_0_3 AS o
  LEFT JOIN outbox.settled_events AS s
    ON s.id OPERATOR(pg_catalog.=) o.id AND s.settled OPERATOR(pg_catalog.=) 'delivered'
 WHERE NOT EXISTS (SELECT 1 FROM outbox.settled_events AS p
                    WHERE p.id OPERATOR(pg_catalog.=) o.id
                      AND p.settled OPERATOR(pg_catalog.<>) 'delivered')
   AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x WHERE x.id OPERATOR(pg_catalog.=) o.id)
   AND NOT EXISTS (SELECT 1 FROM outbox.retries AS x WHERE x.id OPERATOR(pg_catalog.=) o.id)
   AND NOT EXISTS (SELECT 1 FROM outbox.log AS x WHERE x.id OPERATOR(pg_catalog.=) o.id);

COMMENT ON VIEW outbox.events IS
    'Every event with its 0.3 columns, derived from the store (log, batches, retries, dead letters) and the 0.3 history; for reading, not for the hot path. INSERT writes the log; UPDATE and DELETE are refused.';

-- INSERT INTO outbox.events (without emit()): the row goes into the log
-- with the inserting transaction's xid and is delivered like an emitted
-- one, without emit()'s checks (destination as given, routed by type when
-- NULL; a missing id is generated).  Only 'pending' rows are accepted.
CREATE FUNCTION outbox._events_insert()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox__events_insert'
LANGUAGE C SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- UPDATE and DELETE: an event is never changed in place any more.
CREATE FUNCTION outbox._events_refuse()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'cannot % outbox.events', pg_catalog.lower(TG_OP)
          USING ERRCODE = 'feature_not_supported',
                DETAIL = 'Since outbox_pg 0.4.0 outbox.events is a view over the event store; events are never changed in place.',
                HINT = 'Use outbox.redrive() or outbox.redrive_dead() to send dead letters again, outbox.purge_dead() to delete them, outbox.release_aggregate() to unblock an aggregate; published events expire with outbox.retention.';
END
$$;

REVOKE ALL ON FUNCTION outbox._events_insert() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._events_refuse() FROM PUBLIC;

CREATE TRIGGER events_insert
    INSTEAD OF INSERT ON outbox.events
    FOR EACH ROW EXECUTE FUNCTION outbox._events_insert();
CREATE TRIGGER events_refuse
    INSTEAD OF UPDATE OR DELETE ON outbox.events
    FOR EACH ROW EXECUTE FUNCTION outbox._events_refuse();

-- whoever could read or write the 0.3 table can read or write the view
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT CASE WHEN x.grantee = 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(r.rolname) END AS who,
               x.privilege_type AS what
          FROM pg_catalog.pg_class AS c,
               LATERAL pg_catalog.aclexplode(c.relacl) AS x
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) x.grantee
         WHERE c.oid OPERATOR(pg_catalog.=) 'outbox.events_0_3'::pg_catalog.regclass
           AND x.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND x.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['SELECT', 'INSERT'])
    LOOP
        EXECUTE pg_catalog.format('GRANT %s ON outbox.events TO %s', g.what, g.who);
    END LOOP;
END
$$;

-- The log rows of one destination past its position (all of them when it
-- has none): how many, how many due, the oldest due one's creation.  A
-- function, so that the backlog view's estimate stays small (its plan
-- would otherwise be JIT-compiled at every scrape) and this plan cached.
CREATE FUNCTION outbox._log_backlog(destination pg_catalog.text,
                                    OUT pending pg_catalog.int8, OUT claimable pg_catalog.int8,
                                    OUT oldest_claimable_at pg_catalog.timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql STABLE ROWS 1 SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    pos pg_snapshot;
BEGIN
    SELECT t.to_snap INTO pos FROM outbox.batches AS t
     WHERE t.destination = _log_backlog.destination ORDER BY t.seq DESC LIMIT 1;
    RETURN QUERY
    SELECT count(*),
           count(*) FILTER (WHERE l.not_before IS NULL OR l.not_before <= now()),
           min(l.created_at) FILTER (WHERE l.not_before IS NULL OR l.not_before <= now())
      FROM outbox.log AS l
     WHERE l.destination = _log_backlog.destination
       AND l.xid >= COALESCE(pg_snapshot_xmin(pos), '0'::xid8)
       AND (pos IS NULL OR NOT pg_visible_in_snapshot(l.xid, pos));
END
$$;

REVOKE ALL ON FUNCTION outbox._log_backlog(pg_catalog.text) FROM PUBLIC;

-- Published events per destination, through outbox.events (a full read).
CREATE FUNCTION outbox._published_counts(OUT destination pg_catalog.text,
                                         OUT published pg_catalog.int8,
                                         OUT last_published_at pg_catalog.timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE ROWS 10 SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
    SELECT e.destination, count(*), max(e.published_at)
      FROM outbox.events AS e
     WHERE e.status = 'published'
     GROUP BY e.destination;
$$;

REVOKE ALL ON FUNCTION outbox._published_counts() FROM PUBLIC;
-- outbox.destination_stats calls both with the reader's rights: whoever
-- may read it needs EXECUTE on them (counts only, no payloads)
GRANT EXECUTE ON FUNCTION outbox._log_backlog(pg_catalog.text), outbox._published_counts()
      TO pg_monitor;

-- Pending and dead events per destination (NULL: unrouted), as in 0.3,
-- from the store: pending = unclaimed log rows + events of
-- unacknowledged batches + retries; claimable = unclaimed rows due now +
-- events of batches whose lease ran out + retries due and not leased;
-- the ages are exact (the oldest unclaimed row, the oldest event of an
-- unacknowledged batch, the oldest retries row attempted or due), never
-- counting events scheduled for later and not yet attempted.  The log is
-- read from each destination's position on (index (destination, xid));
-- the destinations present in the log are found by a skip scan.  A row
-- past its destination's position has no copy anywhere yet (the claim,
-- the acknowledgement and the rotation make the copies), so none is
-- probed for there.
CREATE OR REPLACE VIEW outbox._destination_backlog AS
WITH RECURSIVE dl(destination) AS (
        SELECT (SELECT pg_catalog.min(l.destination) FROM outbox.log AS l)
        UNION ALL
        SELECT (SELECT pg_catalog.min(l.destination) FROM outbox.log AS l
                 WHERE l.destination OPERATOR(pg_catalog.>) dl.destination)
          FROM dl WHERE dl.destination IS NOT NULL)
SELECT b.destination,
       pg_catalog.sum(b.pending)::pg_catalog.int8 AS pending,
       pg_catalog.sum(b.claimable)::pg_catalog.int8 AS claimable,
       pg_catalog.min(b.oldest_pending_at) AS oldest_pending_at,
       pg_catalog.min(b.oldest_claimable_at) AS oldest_claimable_at,
       pg_catalog.sum(b.dead)::pg_catalog.int8 AS dead,
       pg_catalog.min(b.oldest_dead_at) AS oldest_dead_at
  FROM (-- unclaimed log rows of each destination found in the log
        SELECT dl.destination, u.pending, u.claimable, u.oldest_claimable_at AS oldest_pending_at,
               u.oldest_claimable_at, 0::pg_catalog.int8 AS dead,
               NULL::pg_catalog.timestamptz AS oldest_dead_at
          FROM dl
          CROSS JOIN LATERAL outbox._log_backlog(dl.destination) AS u
         WHERE dl.destination IS NOT NULL AND u.pending OPERATOR(pg_catalog.>) 0
        UNION ALL
        -- unrouted log rows not routed since
        SELECT NULL, pg_catalog.count(*),
               pg_catalog.count(*) FILTER (
                   WHERE l.not_before IS NULL OR l.not_before OPERATOR(pg_catalog.<=) pg_catalog.now()),
               pg_catalog.min(l.created_at) FILTER (
                   WHERE l.not_before IS NULL OR l.not_before OPERATOR(pg_catalog.<=) pg_catalog.now()),
               pg_catalog.min(l.created_at) FILTER (
                   WHERE l.not_before IS NULL OR l.not_before OPERATOR(pg_catalog.<=) pg_catalog.now()),
               0, NULL
          FROM outbox.log AS l
         WHERE l.destination IS NULL
           AND NOT EXISTS (SELECT 1 FROM outbox.settled_events AS s WHERE s.id OPERATOR(pg_catalog.=) l.id)
           AND NOT EXISTS (SELECT 1 FROM outbox.retries AS x WHERE x.id OPERATOR(pg_catalog.=) l.id)
        HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0
        UNION ALL
        -- claimed, not acknowledged: the batch's log rows (its deferred
        -- and held events are counted as the retries rows they became).
        -- The unacknowledged batches first (OFFSET 0 keeps them apart),
        -- then each one's range of the log by the (destination, xid)
        -- index: a join of all batches with all log rows of their
        -- destination took half a minute under load.
        SELECT t.destination, u.pending, u.claimable, u.oldest_pending_at,
               u.oldest_claimable_at, 0, NULL
          FROM (SELECT t.destination, t.from_snap, t.to_snap, t.leased_until
                  FROM outbox.batches AS t
                 WHERE NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS a
                                    WHERE a.destination OPERATOR(pg_catalog.=) t.destination
                                      AND a.seq OPERATOR(pg_catalog.=) t.seq)
                OFFSET 0) AS t
          CROSS JOIN LATERAL (
                SELECT pg_catalog.count(l.id) AS pending,
                       pg_catalog.count(l.id) FILTER (
                           WHERE t.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now()) AS claimable,
                       pg_catalog.min(l.created_at) AS oldest_pending_at,
                       pg_catalog.min(l.created_at) FILTER (
                           WHERE t.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now()) AS oldest_claimable_at
                  FROM outbox.log AS l
                 WHERE l.destination OPERATOR(pg_catalog.=) t.destination
                   AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin(t.from_snap)
                   AND l.xid OPERATOR(pg_catalog.<) pg_catalog.pg_snapshot_xmax(t.to_snap)
                   AND pg_catalog.pg_visible_in_snapshot(l.xid, t.to_snap)
                   AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, t.from_snap)
                   AND NOT EXISTS (SELECT 1 FROM outbox.retries AS x WHERE x.id OPERATOR(pg_catalog.=) l.id)
                   AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x
                                    WHERE x.id OPERATOR(pg_catalog.=) l.id)) AS u
         WHERE u.pending OPERATOR(pg_catalog.>) 0
        UNION ALL
        -- failed, deferred, held, redriven, routed later
        SELECT r.destination, pg_catalog.count(*),
               pg_catalog.count(*) FILTER (
                   WHERE r.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                     AND (r.leased_until IS NULL
                          OR r.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())),
               pg_catalog.min(r.created_at) FILTER (
                   WHERE r.attempts OPERATOR(pg_catalog.>) 0
                      OR r.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()),
               pg_catalog.min(r.created_at) FILTER (
                   WHERE r.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                     AND (r.leased_until IS NULL
                          OR r.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())),
               0, NULL
          FROM outbox.retries AS r
         WHERE NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x WHERE x.id OPERATOR(pg_catalog.=) r.id)
         GROUP BY r.destination
        UNION ALL
        SELECT d.destination, 0, 0, NULL, NULL, pg_catalog.count(*), pg_catalog.min(d.created_at)
          FROM outbox.dead_events AS d
         GROUP BY d.destination) AS b
 GROUP BY b.destination;

-- As in 0.3; published rows are counted through outbox.events (acknowledged
-- log rows and the 0.3 history): still a full read, as documented.
CREATE OR REPLACE VIEW outbox.destination_stats AS
WITH b AS (SELECT * FROM outbox._destination_backlog),
     p AS (SELECT * FROM outbox._published_counts()),
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

-- Unreleased dead letters of ordered destinations (policy 'block') from
-- outbox.dead_events; waiting = the aggregate's later events still to be
-- sent: copies in outbox.retries (the claim holds them there) and log rows
-- past the destination's position.
CREATE OR REPLACE VIEW outbox.blocked_aggregates AS
SELECT d.destination, d.aggregate_id,
       d.id AS dead_event_id, d.type AS dead_event_type,
       d.created_at AS dead_event_created_at,
       d.last_status, d.last_error,
       (SELECT pg_catalog.count(*) FROM outbox.retries AS p
         WHERE p.destination OPERATOR(pg_catalog.=) d.destination
           AND p.ordering_key OPERATOR(pg_catalog.=) d.ordering_key
           AND p.id OPERATOR(pg_catalog.>) d.id)
       OPERATOR(pg_catalog.+)
       (SELECT pg_catalog.count(*) FROM outbox.log AS l
         WHERE l.destination OPERATOR(pg_catalog.=) d.destination
           AND l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin(d.pos)
           AND NOT pg_catalog.pg_visible_in_snapshot(l.xid, d.pos)
           AND l.ordering_key OPERATOR(pg_catalog.=) d.ordering_key
           AND l.id OPERATOR(pg_catalog.>) d.id) AS waiting
  FROM outbox.destinations AS dst
  JOIN LATERAL (
        SELECT e.*,
               (SELECT t.to_snap FROM outbox.batches AS t
                 WHERE t.destination OPERATOR(pg_catalog.=) e.destination
                 ORDER BY t.seq DESC LIMIT 1) AS pos
          FROM outbox.dead_events AS e
         WHERE e.destination OPERATOR(pg_catalog.=) dst.name
           AND e.ordering_key IS NOT NULL
           AND e.id OPERATOR(pg_catalog.>) COALESCE(
                 (SELECT r.released_through FROM outbox.aggregate_releases AS r
                   WHERE r.destination OPERATOR(pg_catalog.=) e.destination
                     AND r.aggregate_id OPERATOR(pg_catalog.=) e.ordering_key),
                 '00000000-0000-0000-0000-000000000000'::pg_catalog.uuid)
           AND NOT EXISTS (
                 SELECT 1 FROM outbox.dead_events AS x
                  WHERE x.destination OPERATOR(pg_catalog.=) e.destination
                    AND x.ordering_key OPERATOR(pg_catalog.=) e.ordering_key
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

-- The dead-letter functions, release_aggregate() and _route_pending() on
-- the store: dead letters are the rows of outbox.dead_events; a redrive
-- moves them to outbox.retries (attempts from zero, due now, last error
-- kept); a purge deletes them and records the id as settled so that the
-- log row does not show again.
CREATE OR REPLACE FUNCTION outbox.release_aggregate(destination pg_catalog.text,
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
    SELECT e.id INTO through FROM outbox.dead_events AS e
     WHERE e.destination OPERATOR(pg_catalog.=) release_aggregate.destination
       AND e.ordering_key OPERATOR(pg_catalog.=) release_aggregate.aggregate_id
     ORDER BY e.id DESC LIMIT 1;
    IF through IS NULL OR through OPERATOR(pg_catalog.<=) previous THEN
        RETURN 0;
    END IF;
    SELECT pg_catalog.count(*) INTO released FROM outbox.dead_events AS e
     WHERE e.destination OPERATOR(pg_catalog.=) release_aggregate.destination
       AND e.ordering_key OPERATOR(pg_catalog.=) release_aggregate.aggregate_id
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

CREATE OR REPLACE FUNCTION outbox.dead_letters(
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
      FROM outbox.dead_events AS e
     WHERE ($1 IS NULL OR e.destination OPERATOR(pg_catalog.=) $1)
       AND ($2 IS NULL OR e.type OPERATOR(pg_catalog.~~) outbox._glob_to_like($2))
       AND ($3 IS NULL OR e.last_error OPERATOR(pg_catalog.~~) $3)
       AND ($4 IS NULL OR e.created_at OPERATOR(pg_catalog.>=) $4)
       AND ($5 IS NULL OR e.created_at OPERATOR(pg_catalog.<) $5)
     ORDER BY e.created_at, e.id
     LIMIT $6;
$$;

CREATE OR REPLACE FUNCTION outbox._dead_selection(
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
      FROM outbox.dead_events AS e
     WHERE ($1 IS NULL OR e.destination OPERATOR(pg_catalog.=) $1)
       AND ($2 IS NULL OR e.type OPERATOR(pg_catalog.~~) outbox._glob_to_like($2))
       AND ($3 IS NULL OR e.last_error OPERATOR(pg_catalog.~~) $3)
       AND ($4 IS NULL OR e.created_at OPERATOR(pg_catalog.>=) $4)
       AND ($5 IS NULL OR e.created_at OPERATOR(pg_catalog.<) $5);
END
$$;

-- Dead letters back to outbox.retries (same ids); returns how many moved.
CREATE FUNCTION outbox._redrive_ids(ids pg_catalog.uuid[])
RETURNS pg_catalog.int8
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH moved AS (
        DELETE FROM outbox.dead_events AS e
         WHERE e.id OPERATOR(pg_catalog.=) ANY ($1)
        RETURNING e.*),
    ins AS (
        INSERT INTO outbox.retries AS r
               (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,
                destination, ordering_key, created_at, attempts, due_at, leased_until,
                last_status, last_error)
        SELECT m.id, m.type, m.aggregate_type, m.aggregate_id, m.payload, m.headers,
               m.traceparent, m.destination, m.ordering_key, m.created_at, 0,
               pg_catalog.now(), NULL, m.last_status, m.last_error
          FROM moved AS m
            ON CONFLICT (id) DO UPDATE
           SET attempts = 0, due_at = pg_catalog.now(), leased_until = NULL
        RETURNING 1)
    SELECT pg_catalog.count(*) FROM ins;
$$;

REVOKE ALL ON FUNCTION outbox._redrive_ids(pg_catalog.uuid[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.redrive(id pg_catalog.uuid)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'event id must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM 1 FROM outbox.dead_events AS e WHERE e.id = $1 FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM 1 FROM outbox.events AS e WHERE e.id = $1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'event % does not exist', $1
                  USING ERRCODE = '42704',
                        HINT = 'List dead letters with outbox.dead_letters().';
        END IF;
        RETURN false;
    END IF;
    PERFORM outbox._redrive_ids(ARRAY[$1]);
    PERFORM outbox._wake();
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION outbox.redrive_dead(
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
    n := outbox._redrive_ids(ARRAY(
            SELECT s FROM outbox._dead_selection($1, $2, $3, $4, $5, $6, 'redrive') AS s));
    IF n > 0 THEN
        PERFORM outbox._wake();
    END IF;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION outbox.purge_dead(
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
    WITH purged AS (
        DELETE FROM outbox.dead_events AS e
         WHERE e.id IN (SELECT s FROM outbox._dead_selection($1, $2, $3, $4, $5, $6, 'purge') AS s)
        RETURNING e.id)
    INSERT INTO outbox.settled_events AS t (id, settled)
    SELECT p.id, 'purged' FROM purged AS p
        ON CONFLICT (id) DO UPDATE SET settled = 'purged', settled_at = now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


-- 0.2's statements on outbox.events, exposed for tests, are gone with the
-- table: the store's are outbox._claim, _claim_ack, _claim_recover and
-- _retries_* (their C functions may stay in the library for a release).
DROP FUNCTION IF EXISTS outbox._lease(pg_catalog.int4, pg_catalog.interval, pg_catalog.text);
DROP FUNCTION IF EXISTS outbox._ack(pg_catalog.uuid[], pg_catalog.int4[]);
DROP FUNCTION IF EXISTS outbox._retry(pg_catalog.uuid[], pg_catalog.timestamptz[], pg_catalog.int4[],
                                      pg_catalog.text[], pg_catalog.timestamptz[]);
DROP FUNCTION IF EXISTS outbox._dead(pg_catalog.uuid[], pg_catalog.int4[], pg_catalog.text[],
                                     pg_catalog.timestamptz[]);
DROP FUNCTION IF EXISTS outbox._requeue(pg_catalog.uuid[], pg_catalog.timestamptz[], pg_catalog.int4[],
                                        pg_catalog.text[], pg_catalog.timestamptz[]);
DROP FUNCTION IF EXISTS outbox._expire_published(pg_catalog.interval, pg_catalog.int4);

-- The pending and dead rows of the 0.3 table move into the store (README.store,
-- plan step 6); published rows stay there as history.  Run by this update
-- and, for rows a backend still running the old library inserted after
-- it, by the relay (worker 0) at each poll; returns how many rows moved.
--   pending, never attempted, due and not leased -> the current log slot
--       with this transaction's xid, in id order (the update's own xid is
--       hidden by the seq-0 positions above, so they are claimed after it);
--   attempted, leased, or due later -> outbox.retries (attempts, last
--       status and error kept, due at greatest(next_attempt_at,
--       leased_until), not leased);
--   an event of an ordered aggregate behind one that went to retries ->
--       outbox.retries too (attempts 0, due now: the retries lease takes
--       an aggregate's head only), so the aggregate keeps its order;
--   dead -> outbox.dead_events.
-- A row moved to the log leaves events_0_3.  A row copied to retries or
-- dead_events stays there as 'published' with no published_at, hidden by
-- its copy in the view outbox.events: once the copy is delivered and
-- deleted, the event still shows, as published (a purged dead letter is
-- hidden by outbox.settled_events).
CREATE FUNCTION outbox._move_events_0_3()
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur int2;
    locked int2;
    moved int8 := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM outbox.events_0_3 AS e WHERE e.status = 'pending')
       AND NOT EXISTS (SELECT 1 FROM outbox.events_0_3 AS e WHERE e.status = 'dead') THEN
        RETURN 0;
    END IF;
    -- one mover at a time; inserts wait for the few milliseconds it takes
    LOCK TABLE outbox.events_0_3 IN SHARE ROW EXCLUSIVE MODE;
    -- the current slot, locked before it is trusted (as emit() does)
    SELECT r.slot INTO cur FROM outbox.rotation AS r;
    LOOP
        EXECUTE format('LOCK TABLE outbox.log_%s IN ROW EXCLUSIVE MODE', cur);
        locked := cur;
        SELECT r.slot INTO cur FROM outbox.rotation AS r;
        EXIT WHEN cur = locked;
    END LOOP;

    EXECUTE format($f$
        WITH c AS (
            SELECT e.*,
                   CASE WHEN e.status = 'dead' THEN 'dead'
                        WHEN e.attempts > 0
                          OR e.next_attempt_at > now()
                          OR e.leased_until > now() THEN 'retry'
                        ELSE 'log' END AS target
              FROM outbox.events_0_3 AS e
             WHERE e.status IN ('pending', 'dead')
               FOR UPDATE),
        m AS (
            -- ordered aggregates: what follows a head that went to retries
            -- waits there behind it
            SELECT c.*,
                   CASE WHEN c.target = 'log' AND c.ordering_key IS NOT NULL
                             AND EXISTS (SELECT 1 FROM c AS h
                                          WHERE h.target = 'retry'
                                            AND h.destination = c.destination
                                            AND h.ordering_key = c.ordering_key
                                            AND h.id < c.id)
                        THEN 'held' ELSE c.target END AS goes
              FROM c),
        to_log AS (
            INSERT INTO outbox.log_%s (id, xid, type, aggregate_type, aggregate_id, payload,
                                       headers, traceparent, destination, ordering_key,
                                       not_before, created_at)
            SELECT m.id, pg_current_xact_id(), m.type, m.aggregate_type, m.aggregate_id,
                   m.payload, m.headers, m.traceparent, m.destination, m.ordering_key, NULL,
                   m.created_at
              FROM m WHERE m.goes = 'log'
             ORDER BY m.id
                ON CONFLICT DO NOTHING
            RETURNING 1),
        to_retries AS (
            INSERT INTO outbox.retries AS r
                   (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,
                    destination, ordering_key, created_at, attempts, due_at, leased_until,
                    last_status, last_error)
            SELECT m.id, m.type, m.aggregate_type, m.aggregate_id, m.payload, m.headers,
                   m.traceparent, m.destination, m.ordering_key, m.created_at,
                   CASE WHEN m.goes = 'held' THEN 0 ELSE m.attempts END,
                   CASE WHEN m.goes = 'held' THEN now()
                        ELSE greatest(m.next_attempt_at, m.leased_until) END,
                   NULL, m.last_status, m.last_error
              FROM m WHERE m.goes IN ('retry', 'held')
                ON CONFLICT (id) DO NOTHING
            RETURNING 1),
        to_dead AS (
            INSERT INTO outbox.dead_events AS d
                   (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,
                    destination, ordering_key, created_at, attempts, due_at, leased_until,
                    last_status, last_error)
            SELECT m.id, m.type, m.aggregate_type, m.aggregate_id, m.payload, m.headers,
                   m.traceparent, m.destination, m.ordering_key, m.created_at, m.attempts,
                   m.next_attempt_at, NULL, m.last_status, m.last_error
              FROM m WHERE m.goes = 'dead'
                ON CONFLICT (id) DO NOTHING
            RETURNING 1),
        gone AS (
            DELETE FROM outbox.events_0_3 AS e USING m
             WHERE e.id = m.id AND m.goes = 'log'
            RETURNING 1),
        shadowed AS (
            UPDATE outbox.events_0_3 AS e
               SET status = 'published', published_at = NULL, leased_until = NULL
              FROM m
             WHERE e.id = m.id AND m.goes <> 'log'
            RETURNING 1)
        SELECT (SELECT count(*) FROM to_log) + (SELECT count(*) FROM to_retries)
               + (SELECT count(*) FROM to_dead)
               + 0 * ((SELECT count(*) FROM gone) + (SELECT count(*) FROM shadowed))$f$, cur)
    INTO moved;
    IF moved > 0 THEN
        PERFORM outbox._wake();
    END IF;
    RETURN moved;
END
$$;

REVOKE ALL ON FUNCTION outbox._move_events_0_3() FROM PUBLIC;

-- Unrouted events whose type a route now matches: copies of the log rows
-- go to outbox.retries with the destination (due now, or at not_before),
-- the id is recorded as routed; copies the rotation already moved to
-- outbox.retries (destination NULL) get it in place.  Also forgets the
-- settled ids whose log slot has been truncated, and moves into the store
-- the rows a backend still running the 0.3 library wrote into
-- outbox.events_0_3 (the relay runs this every few seconds).
CREATE OR REPLACE FUNCTION outbox._route_pending()
RETURNS pg_catalog.int8
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH c AS (
        SELECT l.id, l.type, l.aggregate_type, l.aggregate_id, l.payload, l.headers,
               l.traceparent, d.destination, l.ordering_key, l.created_at,
               COALESCE(l.not_before, pg_catalog.now()) AS due_at
          FROM outbox.log AS l
          CROSS JOIN LATERAL (SELECT outbox.route(l.type) AS destination) AS d
         WHERE l.destination IS NULL
           AND d.destination IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM outbox.settled_events AS s WHERE s.id = l.id)
           AND NOT EXISTS (SELECT 1 FROM outbox.retries AS r WHERE r.id = l.id)
           AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS x WHERE x.id = l.id)),
    copied AS (
        INSERT INTO outbox.retries AS r
               (id, type, aggregate_type, aggregate_id, payload, headers, traceparent,
                destination, ordering_key, created_at, attempts, due_at)
        SELECT c.id, c.type, c.aggregate_type, c.aggregate_id, c.payload, c.headers,
               c.traceparent, c.destination, c.ordering_key, c.created_at, 0, c.due_at
          FROM c
            ON CONFLICT (id) DO NOTHING
        RETURNING r.id),
    marked AS (
        INSERT INTO outbox.settled_events (id, settled)
        SELECT copied.id, 'routed' FROM copied
            ON CONFLICT (id) DO NOTHING
        RETURNING 1),
    moved AS (
        UPDATE outbox.retries AS r
           SET destination = outbox.route(r.type)
         WHERE r.destination IS NULL
           AND outbox.route(r.type) IS NOT NULL
        RETURNING 1),
    forgotten AS (
        DELETE FROM outbox.settled_events AS s
         WHERE NOT EXISTS (SELECT 1 FROM outbox.log AS l WHERE l.id = s.id)
           AND NOT EXISTS (SELECT 1 FROM outbox.events_0_3 AS o WHERE o.id = s.id)
        RETURNING 1)
    SELECT (SELECT pg_catalog.count(*) FROM marked)
           + (SELECT pg_catalog.count(*) FROM moved)
           + (SELECT pg_catalog.count(*) FROM forgotten) * 0
           + outbox._move_events_0_3() * 0;
$$;

SELECT outbox._move_events_0_3();

-- pg_dump: the store's xids and snapshots belong to this cluster.  The
-- streams, batches and acknowledgements are not dumped (a restored
-- destination starts a new stream at the restore, see _stream_changed);
-- the log is dumped without what its destinations acknowledged, and rows
-- that arrive in a slot by COPY or INSERT ... SELECT with another
-- transaction's xid (a restore) are given the inserting transaction's
-- xid, so they are delivered after it like emitted ones.  Copies in
-- retries and dead letters are dumped whole.  emit() inserts through the
-- executor directly and does not fire the statement trigger.

-- Is this log row still to be delivered (not acknowledged by its
-- destination, not settled, no copy in retries or dead_events)?  For the
-- dump condition of the slots.  The same rule as the view outbox.events,
-- on the tables only: pg_dump does not let a dump condition read views
-- (restrict_nonsystem_relation_kind).
CREATE FUNCTION outbox._log_undelivered(id pg_catalog.uuid, destination pg_catalog.text,
                                        xid pg_catalog.xid8)
RETURNS pg_catalog.bool
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT NOT EXISTS (SELECT 1 FROM outbox.settled_events AS s WHERE s.id = $1)
       AND NOT EXISTS (SELECT 1 FROM outbox.retries AS r WHERE r.id = $1)
       AND NOT EXISTS (SELECT 1 FROM outbox.dead_events AS d WHERE d.id = $1)
       AND (NOT COALESCE(pg_visible_in_snapshot($3,
                (SELECT t.to_snap FROM outbox.batches AS t
                  WHERE t.destination = $2 ORDER BY t.seq DESC LIMIT 1)), false)
            OR EXISTS (SELECT 1 FROM outbox.batches AS t
                        WHERE t.destination = $2
                          AND $3 < pg_snapshot_xmax(t.to_snap)
                          AND $3 >= pg_snapshot_xmin(t.from_snap)
                          AND pg_visible_in_snapshot($3, t.to_snap)
                          AND NOT pg_visible_in_snapshot($3, t.from_snap)
                          AND NOT EXISTS (SELECT 1 FROM outbox.batch_acks AS a
                                           WHERE a.destination = t.destination
                                             AND a.seq = t.seq)));
$$;

REVOKE ALL ON FUNCTION outbox._log_undelivered(pg_catalog.uuid, pg_catalog.text, pg_catalog.xid8)
    FROM PUBLIC;

CREATE FUNCTION outbox._log_restamp()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('UPDATE %s AS l SET xid = pg_current_xact_id()'
                   '  FROM arrived AS a'
                   ' WHERE l.id = a.id AND a.xid <> pg_current_xact_id()',
                   TG_RELID::regclass);
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION outbox._log_restamp() FROM PUBLIC;

DO $$
BEGIN
    FOR slot IN 0 .. 2 LOOP
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER log_%s_restamp AFTER INSERT ON outbox.log_%s'
            ' REFERENCING NEW TABLE AS arrived'
            ' FOR EACH STATEMENT EXECUTE FUNCTION outbox._log_restamp()', slot, slot);
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('outbox.log_%s', slot)::pg_catalog.regclass,
            'WHERE outbox._log_undelivered(id, destination, xid)');
    END LOOP;
END
$$;
SELECT pg_catalog.pg_extension_config_dump('outbox.retries', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.dead_events', '');

------------------------------------------------------------------------
-- log rotation in outbox.health() (issue #21): relay worker 0 keeps the
-- last result of the rotation in its slot (retention.c); health() warns
-- when it has been blocked for longer than outbox.retention
------------------------------------------------------------------------
CREATE FUNCTION outbox._log_rotation(OUT state pg_catalog.text,
                                     OUT checked_at pg_catalog.timestamptz,
                                     OUT rotated_at pg_catalog.timestamptz,
                                     OUT blocked_since pg_catalog.timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_log_rotation'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION outbox._log_rotation() FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.health(OUT status pg_catalog.text, OUT reasons pg_catalog.text[])
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
    rot record;
    keep interval;
    measured_at timestamptz;
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

    measured_at := clock_timestamp();
    FOR b IN
        SELECT bl.*, d.name AS defined, d.paused
          FROM outbox._destination_backlog AS bl
          LEFT JOIN outbox.destinations AS d ON d.name = bl.destination
         ORDER BY bl.destination NULLS FIRST
    LOOP
        dead_total := dead_total + b.dead;
        age := measured_at - b.oldest_pending_at;
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

    -- the log's rotation (0.4.0): blocked for longer than the retention,
    -- the log holds more than its bound and keeps growing until the cause
    -- ends (a reader's lock such as pg_dump's, an old writing transaction,
    -- a destination that does not acknowledge)
    keep := CASE WHEN current_setting('outbox.retention') IN ('-1', '-1s', '-1ms')
                 THEN NULL ELSE current_setting('outbox.retention')::interval END;
    SELECT * INTO rot FROM outbox._log_rotation();
    IF keep IS NOT NULL AND rot.blocked_since IS NOT NULL
       AND now() - rot.blocked_since >= keep THEN
        level := greatest(level, 1);
        found_reasons := found_reasons || format('warn: the event log has not been rotated for %s s (%s), so it grows past outbox.retention = %s; it rotates once that ends',
            floor(extract(epoch FROM now() - rot.blocked_since)), rot.state,
            current_setting('outbox.retention'));
    END IF;

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
-- Ages are measured from the clock read just before the statement that
-- reads the backlog: now() is the start of the caller's transaction, older
-- than that statement's snapshot, so an event committed in between showed a
-- negative age (measured: -1.2 s while metrics() was slow); the clock at
-- the end of a slow statement would add its duration to every age
-- (measured: 5.0 s for an event 0.1 s old while metrics() took 5.6 s)
CREATE OR REPLACE FUNCTION outbox.metrics()
RETURNS pg_catalog.text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    preloaded bool;
    health text;
    db text;
    measured_at timestamptz;
BEGIN
    SELECT rp.preloaded INTO preloaded FROM outbox._relay_presence() AS rp;
    SELECT h.status INTO health FROM outbox.health() AS h;
    db := format('database="%s"', outbox._prom_label(current_database()));

    measured_at := clock_timestamp();
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
                   greatest(coalesce(extract(epoch FROM measured_at - b.oldest_pending_at), 0), 0) AS pending_age,
                   greatest(coalesce(extract(epoch FROM measured_at - b.oldest_claimable_at), 0), 0) AS claimable_age,
                   coalesce(b.dead, 0) AS dead,
                   greatest(coalesce(extract(epoch FROM measured_at - b.oldest_dead_at), 0), 0) AS dead_age,
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

-- health() and metrics() are read every few seconds by monitoring; their
-- statements are short, and JIT compiling them once the log is large
-- cost seconds per call (measured: health() 1.5 s at 56,000 log rows)
ALTER FUNCTION outbox.health() SET jit = off;
ALTER FUNCTION outbox.metrics() SET jit = off;
-- end of log rotation in outbox.health()

------------------------------------------------------------------------
-- inbox: messages waiting for their aggregate are set aside (issue #17)
------------------------------------------------------------------------

-- The worker's lease (src/worker/inbox_process.c), walking the due
-- pending messages in (next_attempt_at, seq) order with FOR UPDATE SKIP
-- LOCKED.  A message of an ordered handler waits while an earlier message
-- of its aggregate (any type) is pending, so it cannot go before the
-- aggregate's first pending message is done.  0.2's lease skipped such a
-- message and met it again at every lease: 20,000 of them behind a retry
-- an hour away cost 355-565 ms per lease, for every aggregate, and one
-- aggregate's burst cost a walk over all of it per message.
--
-- This lease sets such a message aside instead: its next_attempt_at
-- becomes the first message's when that one waits for a retry more than a
-- lease away, or the end of this lease when this walk leased the first
-- message.  The walk then passes it once per attempt of that message, not
-- once per lease.  When a message is processed or dead, the worker makes
-- the next message of its aggregate due again if it was set aside
-- (inbox_process.c), so an aggregate goes one message after the other
-- without waiting for those times.  Anything else that ends the first
-- message early (a DELETE, a handler no longer ordered) leaves the rest
-- until the time they were set aside to.  What waits behind a message
-- another worker has leased, or one retried within a lease, is stepped
-- over, batch_size of them at most (the walk stops there; the next batch
-- or poll looks again): set aside until that lease's end, it could miss
-- the other worker's release, which may commit before this lease does,
-- and wait for up to outbox.lease_margin (with two workers and an ordered
-- handler, receiving while processing went at 1,606 messages/s of 3,244
-- received).
-- Returns the leased messages; their attempt is counted and their
-- next_attempt_at pushed out by lease.
--
-- The walk must read messages_pending_idx in order and stop early, whatever
-- the statistics say: planned while the table looked small (after a
-- TRUNCATE, or before its first ANALYZE), it became a bitmap scan of every
-- due message and a sort, 200-240 ms per lease of 100 in a backlog of
-- 20,000 (auto_explain), and the inbox bench processed about 1,000
-- messages/s instead of 13,000 -- with 0.2's lease as well.  Without
-- sorts, only that index gives the order.  The same plan cache kept the
-- lease's UPDATE of the leased ids as a sequential scan (15-25 ms per
-- lease while a burst filled the table); without sequential scans it is
-- the primary key's.
CREATE OR REPLACE FUNCTION inbox._lease(batch_size pg_catalog.int4, lease pg_catalog.interval)
RETURNS TABLE (id pg_catalog.text, attempts pg_catalog.int4)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET enable_seqscan = off
AS $$
DECLARE
    m           record;
    leased      text[] := '{}';
    leased_aggs text[] := '{}';
    aside       text[] := '{}';
    aside_until timestamptz[] := '{}';
    stepped     int4 := 0;
    horizon     timestamptz := now() + lease;
BEGIN
    IF batch_size < 1 THEN
        RETURN;
    END IF;
    FOR m IN
        SELECT w.id AS walk_id, w.aggregate_id AS walk_aggregate,
               CASE WHEN w.aggregate_id IS NOT NULL
                     AND coalesce((inbox.handler_for(w.type)).ordered, false)
               THEN (SELECT p.next_attempt_at
                       FROM inbox.messages AS p
                      WHERE p.aggregate_id = w.aggregate_id
                        AND p.status = 'pending'
                        AND p.seq < w.seq
                      ORDER BY p.seq
                      LIMIT 1)
               END AS first_due
          FROM inbox.messages AS w
         WHERE w.status = 'pending'
           AND w.next_attempt_at <= now()
         ORDER BY w.next_attempt_at, w.seq
           FOR UPDATE OF w SKIP LOCKED
    LOOP
        IF m.first_due IS NULL THEN
            leased := leased || m.walk_id;
            IF m.walk_aggregate IS NOT NULL THEN
                leased_aggs := leased_aggs || m.walk_aggregate;
            END IF;
            EXIT WHEN cardinality(leased) >= batch_size;
        ELSIF m.first_due > horizon THEN
            aside := aside || m.walk_id;
            aside_until := aside_until || m.first_due;
        ELSIF m.walk_aggregate = ANY (leased_aggs) THEN
            aside := aside || m.walk_id;
            aside_until := aside_until || horizon;
        ELSE
            stepped := stepped + 1;
            EXIT WHEN stepped >= batch_size;
        END IF;
    END LOOP;
    IF cardinality(aside) > 0 THEN
        UPDATE inbox.messages AS a
           SET next_attempt_at = s.until
          FROM unnest(aside, aside_until) AS s(aside_id, until)
         WHERE a.id = s.aside_id;
    END IF;
    RETURN QUERY
        UPDATE inbox.messages AS l
           SET attempts = l.attempts + 1,
               next_attempt_at = horizon
         WHERE l.id = ANY (leased)
        RETURNING l.id, l.attempts;
END
$$;
-- end of inbox: messages waiting for their aggregate are set aside

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
-- outbox.destination_stats calls these two with the reader's rights;
-- they return counts and times per destination, no payloads
GRANT EXECUTE ON FUNCTION outbox._log_backlog(pg_catalog.text), outbox._published_counts()
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

------------------------------------------------------------------------
-- kinds kafka and amqp (issue #16)
------------------------------------------------------------------------

-- A Kafka destination's url lists its bootstrap servers,
-- kafka://host:port[,host:port...]; an AMQP destination's names its broker,
-- amqp://host[:port][/vhost] or amqps://...; each kind checks the rest
-- (src/destination/kafka.c, amqp.c; HTTP kinds refuse any scheme but http
-- and https, src/destination/validate.c).
ALTER TABLE outbox.destinations DROP CONSTRAINT destinations_url_check;
ALTER TABLE outbox.destinations ADD CONSTRAINT destinations_url_check
    CHECK (url OPERATOR(pg_catalog.~*) '^(https?|kafka|amqps?)://[^[:space:][:cntrl:]]+$');
COMMENT ON CONSTRAINT destinations_url_check ON outbox.destinations IS
    'The url is an http:// or https:// URL, or for kind kafka a kafka:// and for kind amqp an amqp:// or amqps:// URL, without spaces or control characters.';
COMMENT ON COLUMN outbox.destinations.kind IS
    'webhook, sns, sqs, rabbitmq, kafka or amqp: the kinds the library registers; a destination is checked against its kind when written.';
-- end of kinds kafka and amqp (issue #16)
