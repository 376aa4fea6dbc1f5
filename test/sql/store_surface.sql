--
-- store_surface: outbox.events as a view over the store (issue #21): the
-- 0.3 rows moved into the store by outbox._move_events_0_3() (what ALTER
-- EXTENSION UPDATE does), rows arriving in a log slot with another
-- transaction's xid (a restore), and the pg_dump condition of the slots
--
CREATE DATABASE regress_surface;
\c regress_surface
CREATE EXTENSION outbox_pg;
INSERT INTO outbox.destinations (name, url) VALUES ('sf', 'http://127.0.0.1:9/sf');
INSERT INTO outbox.destinations (name, url, options)
VALUES ('sf-ord', 'http://127.0.0.1:9/ord', '{"ordering": "aggregate"}');
CREATE FUNCTION sf_id(n int) RETURNS uuid LANGUAGE sql AS $$
    SELECT ('018f0000-0000-7000-8000-' || lpad(n::text, 12, '0'))::uuid
$$;
-- rows as 0.3 left them (a backend with the old library, or before the update)
INSERT INTO outbox.events_0_3 (id, type, payload, destination, status, attempts, next_attempt_at,
                               created_at, published_at, last_status, last_error, leased_until,
                               ordering_key)
VALUES (sf_id(1), 'sf.backlog', '{}', 'sf', 'pending', 0, now() - interval '1 minute',
        now() - interval '1 minute', NULL, NULL, NULL, NULL, NULL),
       (sf_id(2), 'sf.backlog', '{}', 'sf', 'pending', 0, now() - interval '1 minute',
        now() - interval '1 minute', NULL, NULL, NULL, NULL, NULL),
       (sf_id(3), 'sf.leased', '{}', 'sf', 'pending', 1, now() - interval '1 minute',
        now() - interval '1 minute', NULL, NULL, NULL, now() + interval '30 seconds', NULL),
       (sf_id(4), 'sf.retrying', '{}', 'sf', 'pending', 2, now() + interval '10 minutes',
        now() - interval '5 minutes', NULL, 503, 'HTTP 503', NULL, NULL),
       (sf_id(5), 'sf.later', '{}', 'sf', 'pending', 0, now() + interval '1 hour',
        now(), NULL, NULL, NULL, NULL, NULL),
       (sf_id(6), 'sf.dead', '{}', 'sf', 'dead', 5, now() - interval '1 hour',
        now() - interval '2 hours', NULL, 422, 'HTTP 422', NULL, NULL),
       (sf_id(7), 'sf.published', '{}', 'sf', 'published', 1, now() - interval '1 hour',
        now() - interval '1 hour', now() - interval '59 minutes', 204, NULL, NULL, NULL),
       -- an ordered aggregate whose head is retrying: its later events wait behind it
       (sf_id(10), 'sf.a1', '{}', 'sf-ord', 'pending', 1, now() + interval '1 minute',
        now() - interval '3 minutes', NULL, 500, 'boom', NULL, 'A'),
       (sf_id(11), 'sf.a2', '{}', 'sf-ord', 'pending', 0, now() - interval '2 minutes',
        now() - interval '2 minutes', NULL, NULL, NULL, NULL, 'A'),
       (sf_id(12), 'sf.b1', '{}', 'sf-ord', 'pending', 0, now() - interval '2 minutes',
        now() - interval '2 minutes', NULL, NULL, NULL, NULL, 'B');
SELECT id, type, status FROM outbox.events ORDER BY id;
SELECT outbox._move_events_0_3() AS moved;
SELECT outbox._move_events_0_3() AS moved_again;
-- every id once, with its 0.3 status; only published history stays behind
SELECT id, type, status, attempts, last_status, last_error, leased_until IS NULL AS unleased,
       next_attempt_at > now() AS later
  FROM outbox.events ORDER BY id;
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids FROM outbox.events;
SELECT id, status FROM outbox.events_0_3 ORDER BY id;
SELECT 'log' AS place, type FROM outbox.log
UNION ALL SELECT 'retries', type || CASE WHEN due_at > now() THEN ' (later)' ELSE ' (due)' END FROM outbox.retries
UNION ALL SELECT 'dead', type FROM outbox.dead_events
ORDER BY 1, 2;
-- the backlog is claimed in id order; on the ordered destination only the
-- other aggregate's event is claimed, and the retries lease gives nothing
-- while the head waits for its retry (its successor is held behind it)
SELECT id, type FROM outbox._claim(10, '1 minute', 'sf') ORDER BY id;
SELECT id, type FROM outbox._claim(10, '1 minute', 'sf-ord') ORDER BY id;
SELECT id, type FROM outbox._retries_lease(10, '1 minute', 'sf-ord') ORDER BY id;

-- rows arriving in a slot with another transaction's xid (pg_restore's
-- COPY) get the inserting transaction's: delivered after it
BEGIN;
INSERT INTO outbox.log_0 (id, xid, type, payload, destination, created_at)
VALUES (sf_id(20), '3', 'sf.restored', '{}', 'sf', now());
SELECT type, xid = pg_current_xact_id() AS own_xid FROM outbox.log_0 WHERE id = sf_id(20);
COMMIT;
SELECT type FROM outbox._claim(10, '1 minute', 'sf');

-- the dump condition: undelivered log rows only
SELECT seq AS sf_batch FROM outbox.batches WHERE destination = 'sf' ORDER BY seq DESC LIMIT 1 \gset
SELECT outbox._claim_ack('sf', :sf_batch) AS acked;
SELECT type, outbox._log_undelivered(id, destination, xid) AS dumped
  FROM outbox.log ORDER BY id;

-- a moved copy delivered: the event still shows, published, with its
-- attempts and when; a moved dead letter purged: gone for good (also after
-- _route_pending() forgets settled ids of truncated slots)
SELECT outbox._retries_ack(ARRAY[sf_id(4)]) AS acked;
SELECT id, status, attempts, published_at IS NOT NULL AS has_published_at FROM outbox.events WHERE id = sf_id(4);
SELECT outbox.purge_dead(all_dead => true) AS purged;
SELECT outbox._route_pending() >= 0 AS routed;
SELECT count(*) AS purged_shown FROM outbox.events WHERE id = sf_id(6);
SELECT outbox.wait_published(sf_id(4), '0 s') AS published;

\c contrib_regression
DROP DATABASE regress_surface;
