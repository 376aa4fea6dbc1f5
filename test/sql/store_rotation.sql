--
-- store_rotation: retention of the insert-only store's log (issue #21,
-- src/worker/retention.c): slots are truncated whole, only when every row
-- in them is acknowledged and no writer can be inside, and a row no
-- stream will claim is kept in outbox.retries first.
--
-- the batches and streams of the destinations earlier tests deleted go
-- first, so that the trims below count rt's only
SELECT outbox._trim_batches() >= 0 AS trimmed_earlier;
INSERT INTO outbox.destinations (name, url) VALUES ('rt', 'http://127.0.0.1:9/rt');
SELECT slot FROM outbox.rotation;
SELECT outbox.emit('rt.a', NULL, '{}', destination => 'rt') IS NOT NULL AS emitted;
SELECT outbox.emit('rt.b', NULL, '{}', destination => 'rt') IS NOT NULL AS emitted;
-- an unrouted event: no stream claims it
SELECT outbox.emit('rt.unrouted', NULL, '{}') IS NOT NULL AS emitted;

-- not due yet
SELECT outbox._rotate_log('1 hour');
-- the next slot (1) is empty: rotated, and emit() follows
SELECT outbox._rotate_log('0 s');
SELECT slot FROM outbox.rotation;
SELECT outbox.emit('rt.c', NULL, '{}', destination => 'rt') IS NOT NULL AS emitted;
SELECT (SELECT count(*) FROM outbox.log_0) AS slot0, (SELECT count(*) FROM outbox.log_1) AS slot1;
-- the transaction of the latest switch is still running: no rotation
BEGIN;
SELECT outbox._rotate_log('0 s');
SELECT outbox._rotate_log('0 s');
ROLLBACK;
SELECT outbox._rotate_log('0 s');
SELECT slot FROM outbox.rotation;

-- slot 0 is next and holds rt's unclaimed events: kept
SELECT outbox._rotate_log('0 s');
-- rt.a claimed, not acknowledged: kept
SELECT seq AS batch FROM outbox._claim(1, '1 min', 'rt') \gset
SELECT outbox._rotate_log('0 s');
-- rt.a acknowledged, rt.b not claimed: kept
SELECT outbox._claim_ack('rt', :batch);
SELECT outbox._rotate_log('0 s');
SELECT DISTINCT seq AS batch FROM outbox._claim(10, '1 min', 'rt') \gset
SELECT outbox._claim_ack('rt', :batch);
-- all acknowledged: slot 0 is truncated and current; the unrouted event
-- is kept in outbox.retries
SELECT outbox._rotate_log('0 s');
SELECT slot FROM outbox.rotation;
SELECT (SELECT count(*) FROM outbox.log_0) AS slot0, (SELECT count(*) FROM outbox.log_1) AS slot1;
SELECT type, destination, attempts, due_at = created_at AS due_at_emit FROM outbox.retries;
-- slot 1 (rt.c, acknowledged) is next
SELECT outbox._rotate_log('0 s');
SELECT slot, (SELECT count(*) FROM outbox.log_1) AS slot1 FROM outbox.rotation;

-- batches: below the oldest unacknowledged one (else the newest) they go
SELECT outbox.emit('rt.d', NULL, '{}', destination => 'rt') IS NOT NULL AS emitted;
SELECT DISTINCT seq AS unacked FROM outbox._claim(10, '1 min', 'rt');
SELECT outbox.emit('rt.e', NULL, '{}', destination => 'rt') IS NOT NULL AS emitted;
SELECT DISTINCT seq AS batch FROM outbox._claim(10, '1 min', 'rt') \gset
SELECT outbox._claim_ack('rt', :batch);
SELECT array_agg(seq ORDER BY seq) AS batches FROM outbox.batches WHERE destination = 'rt';
SELECT outbox._trim_batches() AS trimmed;
SELECT array_agg(b.seq ORDER BY b.seq) AS batches, array_agg(k.seq ORDER BY k.seq) AS acks
  FROM outbox.batches b LEFT JOIN outbox.batch_acks k USING (destination, seq)
 WHERE destination = 'rt';
SELECT outbox._claim_ack('rt', 3);
SELECT outbox._trim_batches() AS trimmed;
SELECT array_agg(seq ORDER BY seq) AS batches FROM outbox.batches WHERE destination = 'rt';
SELECT type FROM outbox._claim(10, '1 min', 'rt');
SELECT outbox._trim_batches() AS nothing_to_trim;

DELETE FROM outbox.destinations WHERE name = 'rt';
TRUNCATE outbox.log_0, outbox.log_1, outbox.log_2, outbox.retries;
UPDATE outbox.rotation SET slot = 0;

-- a large slot: 100,000 acknowledged events in 1,000 batches.  The check
-- reads each destination's acknowledged-through snapshot once and the slot
-- through its index; it once evaluated the snapshot's subqueries for every
-- row of the slot (over a minute for this one: the timeout below fails it).
INSERT INTO outbox.destinations (name, url) VALUES ('rt_big', 'http://127.0.0.1:9/big');
SELECT slot FROM outbox.rotation;
DO $$
BEGIN
    FOR i IN 1 .. 1000 LOOP
        PERFORM outbox.emit('rt.big', NULL, '{}', destination => 'rt_big')
           FROM generate_series(1, 100);
        COMMIT;
    END LOOP;
END $$;
DO $$
DECLARE
    s bigint;
BEGIN
    LOOP
        SELECT max(c.seq) INTO s FROM outbox._claim(100, '1 min', 'rt_big') AS c;
        EXIT WHEN s IS NULL;
        PERFORM outbox._claim_ack('rt_big', s);
        COMMIT;
    END LOOP;
END $$;
SELECT count(*) AS batches FROM outbox.batches WHERE destination = 'rt_big' AND events > 0;
-- slots 1 and 2 are empty; slot 0 is next after them
SELECT outbox._rotate_log('0 s');
SELECT outbox._rotate_log('0 s');
SET statement_timeout = '60s';
SELECT outbox._rotate_log('0 s');
RESET statement_timeout;
SELECT slot FROM outbox.rotation;
SELECT (SELECT count(*) FROM outbox.log_0) AS slot0, (SELECT count(*) FROM outbox.log_1) AS slot1,
       (SELECT count(*) FROM outbox.log_2) AS slot2;
DELETE FROM outbox.destinations WHERE name = 'rt_big';
UPDATE outbox.rotation SET slot = 0;

-- a paused ordered destination whose batch is in flight: its later events
-- are not spilled to outbox.retries past that batch (the retries lease took
-- ro.a2 while ro.a1 was still unacknowledged, so the aggregate could go out
-- of order), and the slot is kept as it was before
INSERT INTO outbox.destinations (name, url, options)
VALUES ('rt_ord', 'http://127.0.0.1:9/ro', '{"ordering": "aggregate"}');
SELECT outbox.emit('ro.a1', 'A', '{}', destination => 'rt_ord') IS NOT NULL AS emitted;
SELECT outbox.emit('ro.a2', 'A', '{}', destination => 'rt_ord') IS NOT NULL AS emitted;
SELECT seq AS ord_batch, type FROM outbox._claim(1, '1 hour', 'rt_ord') \gset
SELECT :'type' AS in_flight;
SELECT outbox._rotate_log('0 s');
SELECT outbox._rotate_log('0 s');
UPDATE outbox.destinations SET paused = true WHERE name = 'rt_ord';
SELECT outbox._rotate_log('0 s');
SELECT count(*) AS spilled FROM outbox.retries WHERE destination = 'rt_ord';
UPDATE outbox.destinations SET paused = false WHERE name = 'rt_ord';
SELECT count(*) AS leased_past_the_batch FROM outbox._retries_lease(10, '1 min', 'rt_ord');
-- acknowledged, the rest is claimed in order
SELECT outbox._claim_ack('rt_ord', :ord_batch);
SELECT type FROM outbox._claim(10, '1 min', 'rt_ord');
