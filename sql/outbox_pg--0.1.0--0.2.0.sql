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
LANGUAGE plpgsql VOLATILE STRICT
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
    INSERT INTO outbox.aggregate_releases AS r (destination, aggregate_id, released_through)
    VALUES (release_aggregate.destination, release_aggregate.aggregate_id, through)
    ON CONFLICT ON CONSTRAINT aggregate_releases_pkey
    DO UPDATE SET released_through = excluded.released_through,
                  released_at = pg_catalog.now(), released_by = CURRENT_USER;
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
