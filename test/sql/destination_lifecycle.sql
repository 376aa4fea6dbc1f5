--
-- destination_lifecycle: a destination's stream (its position, batches
-- and acknowledgements) belongs to its name and outlives the destination's
-- row (0.5.0).  Deleting a destination and creating it again, in one
-- transaction or two, keeps its pending events pending; events written
-- for a name before it existed are delivered once it does; the rotation
-- spills a deleted destination's backlog to outbox.retries and never
-- copies what it acknowledged.
--
TRUNCATE outbox.log_0, outbox.log_1, outbox.log_2, outbox.retries;
UPDATE outbox.rotation SET slot = 0;

-- delete, then create again in another transaction: lc1.a stays pending
INSERT INTO outbox.destinations (name, url) VALUES ('lc1', 'http://127.0.0.1:9/lc1');
SELECT outbox.emit('lc1.a', NULL, '{}', destination => 'lc1') IS NOT NULL AS emitted;
DELETE FROM outbox.destinations WHERE name = 'lc1';
SELECT status FROM outbox.events WHERE type = 'lc1.a';
INSERT INTO outbox.destinations (name, url) VALUES ('lc1', 'http://127.0.0.1:9/lc1');
SELECT status FROM outbox.events WHERE type = 'lc1.a';
-- delete and create again in one transaction
SELECT outbox.emit('lc1.b', NULL, '{}', destination => 'lc1') IS NOT NULL AS emitted;
BEGIN;
DELETE FROM outbox.destinations WHERE name = 'lc1';
INSERT INTO outbox.destinations (name, url) VALUES ('lc1', 'http://127.0.0.1:9/lc1');
COMMIT;
SELECT type FROM outbox._claim(10, '1 min', 'lc1') ORDER BY type;
SELECT outbox._claim_ack('lc1', (SELECT max(seq) FROM outbox.batches WHERE destination = 'lc1'));
SELECT type, status FROM outbox.events WHERE destination = 'lc1' ORDER BY type;

-- TRUNCATE reaches no stream: a destination written again continues
INSERT INTO outbox.destinations (name, url) VALUES ('lc6', 'http://127.0.0.1:9/lc6');
SELECT outbox.emit('lc6.a', NULL, '{}', destination => 'lc6') IS NOT NULL AS emitted;
BEGIN;
SET LOCAL client_min_messages = warning;
TRUNCATE outbox.destinations CASCADE;
INSERT INTO outbox.destinations (name, url) VALUES ('lc6', 'http://127.0.0.1:9/lc6');
SELECT status FROM outbox.events WHERE type = 'lc6.a';
ROLLBACK;
SELECT count(*) AS lc6_streams FROM outbox.streams WHERE destination = 'lc6';
SELECT DISTINCT seq AS b6 FROM outbox._claim(10, '1 min', 'lc6') \gset
SELECT outbox._claim_ack('lc6', :b6);

-- an event written for a name before the destination exists is claimed
-- once it does (outbox.events accepts any name; emit() checks routes)
INSERT INTO outbox.events (type, payload, destination) VALUES ('lc3.early', '{}', 'lc3');
INSERT INTO outbox.destinations (name, url) VALUES ('lc3', 'http://127.0.0.1:9/lc3');
SELECT type, seq AS b3 FROM outbox._claim(10, '1 min', 'lc3') \gset
SELECT :'type' AS lc3_claimed, outbox._claim_ack('lc3', :b3);

-- deleted with a batch in flight: the relay's acknowledgement still finds
-- the batch and keeps the failed event for a retry
INSERT INTO outbox.destinations (name, url) VALUES ('lc4', 'http://127.0.0.1:9/lc4');
SELECT outbox.emit('lc4.a', NULL, '{}', destination => 'lc4') IS NOT NULL AS emitted;
SELECT outbox.emit('lc4.b', NULL, '{}', destination => 'lc4') IS NOT NULL AS emitted;
SELECT seq AS b4, id AS f4 FROM outbox._claim(10, '1 hour', 'lc4') WHERE type = 'lc4.b' \gset
DELETE FROM outbox.destinations WHERE name = 'lc4';
SELECT outbox._claim_ack('lc4', :b4, ARRAY[:'f4']::uuid[], ARRAY[now()], ARRAY[1], ARRAY[503],
                         ARRAY['busy']) AS acked;
SELECT type, status, attempts FROM outbox.events WHERE destination = 'lc4' ORDER BY type;

-- the rotation: lc5's acknowledged event is history and is not copied,
-- its backlog is spilled to outbox.retries; lc7's batch whose lease ran
-- out is spilled too; created again, lc5 leases its backlog once
INSERT INTO outbox.destinations (name, url)
VALUES ('lc5', 'http://127.0.0.1:9/lc5'), ('lc7', 'http://127.0.0.1:9/lc7');
SELECT outbox.emit('lc5.done', NULL, '{}', destination => 'lc5') IS NOT NULL AS emitted;
SELECT DISTINCT seq AS b5 FROM outbox._claim(10, '1 min', 'lc5') \gset
SELECT outbox._claim_ack('lc5', :b5);
SELECT outbox.emit('lc5.backlog', NULL, '{}', destination => 'lc5') IS NOT NULL AS emitted;
SELECT outbox.emit('lc7.a', NULL, '{}', destination => 'lc7') IS NOT NULL AS emitted;
SELECT count(*) AS lc7_claimed FROM outbox._claim(10, '0 s', 'lc7');
DELETE FROM outbox.destinations WHERE name IN ('lc5', 'lc7');
SELECT outbox._rotate_log('0 s');
SELECT outbox._rotate_log('0 s');
SELECT outbox._rotate_log('0 s');
SELECT (SELECT count(*) FROM outbox.log_0) AS slot0, (SELECT count(*) FROM outbox.log_1) AS slot1,
       (SELECT count(*) FROM outbox.log_2) AS slot2;
SELECT type, attempts FROM outbox.retries WHERE destination IN ('lc5', 'lc7') ORDER BY type;
-- health() names the deleted destination's undelivered events
SELECT r FROM outbox.health() AS h, unnest(h.reasons) AS r WHERE r ~ 'lc[57]' ORDER BY r;
INSERT INTO outbox.destinations (name, url) VALUES ('lc5', 'http://127.0.0.1:9/lc5');
SELECT count(*) AS lc5_claimed FROM outbox._claim(10, '1 min', 'lc5');
SELECT type FROM outbox._retries_lease(10, '1 min', 'lc5');

-- an aggregate released past its dead letters stays released when its
-- ordered destination is deleted and created again: the release belongs
-- to the name, as the dead letters do (0.5.1; 0.5.0 deleted it with the
-- row, and the same dead letter blocked the aggregate again)
INSERT INTO outbox.destinations (name, url, options)
VALUES ('lc8', 'http://127.0.0.1:9/lc8', '{"ordering": "aggregate"}');
SELECT outbox.emit('lc8.a', 'A', '{}', destination => 'lc8') IS NOT NULL AS emitted;
SELECT seq AS b8, id AS d8 FROM outbox._claim(10, '1 min', 'lc8') \gset
SELECT outbox._claim_ack('lc8', :b8, dead => ARRAY[:'d8']::uuid[], dead_status => ARRAY[400],
                         dead_error => ARRAY['refused']) AS acked;
SELECT outbox.emit('lc8.b', 'A', '{}', destination => 'lc8') IS NOT NULL AS emitted;
SELECT destination, aggregate_id FROM outbox.blocked_aggregates WHERE destination = 'lc8';
SELECT outbox.release_aggregate('lc8', 'A') AS released;
BEGIN;
DELETE FROM outbox.destinations WHERE name = 'lc8';
INSERT INTO outbox.destinations (name, url, options)
VALUES ('lc8', 'http://127.0.0.1:9/lc8', '{"ordering": "aggregate"}');
COMMIT;
SELECT count(*) AS lc8_blocked FROM outbox.blocked_aggregates WHERE destination = 'lc8';
SELECT type, seq AS b8 FROM outbox._claim(10, '1 min', 'lc8') \gset
SELECT :'type' AS lc8_claimed, outbox._claim_ack('lc8', :b8);

-- a rename is still refused: the stream would stay under the old name
UPDATE outbox.destinations SET name = 'lc5_renamed' WHERE name = 'lc5';

-- the trim keeps the streams of deleted names while the log holds events
-- of them, and deletes them after; it keeps a deleted name's releases
-- while its dead letters of the aggregate are there
SELECT outbox.emit('lc1.c', NULL, '{}', destination => 'lc1') IS NOT NULL AS emitted;
DELETE FROM outbox.destinations WHERE name LIKE 'lc%';
SELECT outbox._trim_batches() >= 0 AS trimmed;
SELECT destination FROM outbox.streams WHERE destination LIKE 'lc%' ORDER BY 1;
SELECT destination, aggregate_id FROM outbox.aggregate_releases WHERE destination LIKE 'lc%';
TRUNCATE outbox.log_0, outbox.log_1, outbox.log_2, outbox.retries;
-- ... and while the dead letter, redriven, waits in outbox.retries (it may
-- die again: the release covers it)
DELETE FROM outbox.dead_events WHERE destination LIKE 'lc%' AND destination <> 'lc8';
SELECT outbox.redrive_dead(destination => 'lc8') AS redriven;
SELECT outbox._trim_batches() >= 0 AS trimmed;
SELECT count(*) AS lc8_releases_while_redriven FROM outbox.aggregate_releases WHERE destination = 'lc8';
TRUNCATE outbox.retries;
SELECT outbox._trim_batches() >= 0 AS trimmed;
SELECT count(*) AS lc_streams FROM outbox.streams WHERE destination LIKE 'lc%';
SELECT count(*) AS lc_releases FROM outbox.aggregate_releases WHERE destination LIKE 'lc%';
UPDATE outbox.rotation SET slot = 0;
