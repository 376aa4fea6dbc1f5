--
-- store_rotation: retention of the insert-only store's log (issue #21,
-- src/worker/retention.c): slots are truncated whole, only when every row
-- in them is acknowledged and no writer can be inside, and a row no
-- stream will claim is kept in outbox.retries first.
--
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
