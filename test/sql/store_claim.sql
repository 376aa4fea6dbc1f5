--
-- store_claim: the insert-only store of issue #21 (src/worker/README.store,
-- section 3.1): claims of a destination's log by snapshot ranges, their
-- acknowledgement and the recovery of a batch whose lease ran out.  The
-- events are appended to outbox.log_0 directly: emit() does not write to
-- the log yet.
--

-- snapshot arithmetic: a cut shows what the snapshot showed below the
-- xid and nothing from it on
SELECT s, x, outbox._snapshot_cut(s::pg_snapshot, x::xid8) AS cut
  FROM (VALUES ('10:20:12,15', '14'), ('10:20:12,15', '12'), ('10:20:12,15', '5'),
               ('10:20:12,15', '20'), ('10:20:12,15', '30'), ('10:10:', '10')) AS v(s, x);
SELECT count(*) FILTER (
         WHERE pg_visible_in_snapshot(x::text::xid8, outbox._snapshot_cut('10:20:12,15', c::text::xid8))
               IS DISTINCT FROM
               (pg_visible_in_snapshot(x::text::xid8, '10:20:12,15') AND x < c)) AS disagreements
  FROM generate_series(1, 25) AS x, generate_series(1, 25) AS c;

CREATE FUNCTION pg_temp.append(t text, d text DEFAULT 'sc', nb timestamptz DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO outbox.log_0 (id, xid, type, payload, destination, not_before, created_at)
    VALUES (gen_random_uuid(), pg_current_xact_id(), t, '{}', d, nb, clock_timestamp());
$$;

-- a new destination gets a stream whose position hides its own
-- transaction: an event appended in the same transaction is claimed
BEGIN;
INSERT INTO outbox.destinations (name, url) VALUES ('sc', 'http://127.0.0.1:9/sc');
SELECT pg_temp.append('sc.creating');
COMMIT;
INSERT INTO outbox.destinations (name, url) VALUES ('sc_other', 'http://127.0.0.1:9/other');
SELECT destination FROM outbox.streams WHERE destination LIKE 'sc%' ORDER BY 1;
SELECT destination, seq, events, from_snap::text = to_snap::text AS empty,
       EXISTS (SELECT 1 FROM outbox.batch_acks k
                WHERE k.destination = b.destination AND k.seq = b.seq) AS acked
  FROM outbox.batches b WHERE destination LIKE 'sc%' ORDER BY 1, 2;
SELECT type, seq, attempts, "time" ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$' AS rfc3339,
       age >= 0 AS age_ok, leased_until > now() AS leased
  FROM outbox._claim(10, '1 min', 'sc');
-- nothing new: no rows and no batch
SELECT count(*) AS claimed FROM outbox._claim(10, '1 min', 'sc');
SELECT max(seq) AS newest_seq FROM outbox.batches WHERE destination = 'sc';

-- batches are cut at transaction boundaries: a transaction goes whole,
-- even past batch_size when it is the first one
SELECT pg_temp.append('sc.a');
BEGIN;
SELECT pg_temp.append('sc.b1');
SELECT pg_temp.append('sc.b2');
SELECT pg_temp.append('sc.b3');
COMMIT;
SELECT pg_temp.append('sc.c');
SELECT pg_temp.append('sc.elsewhere', 'sc_other');
SELECT pg_temp.append('sc.later', nb => now() + interval '1 hour');
BEGIN;
SELECT pg_temp.append('sc.rolled_back');
ROLLBACK;
SELECT type, seq FROM outbox._claim(1, '1 min', 'sc') ORDER BY type;
SELECT type, seq FROM outbox._claim(2, '1 min', 'sc') ORDER BY type;
SELECT type, seq FROM outbox._claim(10, '1 min', 'sc') ORDER BY type;
-- the deferred event went to outbox.retries, due at its not_before
SELECT type, attempts, due_at > now() AS later FROM outbox.retries ORDER BY type;
SELECT count(*) AS claimed FROM outbox._claim(10, '1 min', 'sc');
SELECT type, seq FROM outbox._claim(10, '1 min', 'sc_other');
-- each batch starts where the one before ended; its count and oldest
-- event are recorded
SELECT seq, events, from_snap::text = lag(to_snap::text) OVER (ORDER BY seq) AS chained,
       oldest_created_at IS NOT NULL AS has_oldest
  FROM outbox.batches WHERE destination = 'sc' AND seq > 0 ORDER BY seq;

-- the acknowledgement: once per batch; the failures of the first one are
-- copied to outbox.retries, a late one changes nothing
SELECT outbox._claim_ack('sc', 1) AS acked, outbox._claim_ack('sc', 1) AS acked_again,
       outbox._claim_ack('sc', 99) AS no_such_batch;
SELECT outbox._claim_ack('sc', 3, ARRAY(SELECT id FROM outbox.log_0 WHERE type IN ('sc.b1', 'sc.b3')),
                         ARRAY[now() + interval '5 s', now() + interval '5 s'], ARRAY[1, 1],
                         ARRAY[503, 500], ARRAY['unavailable', 'boom'],
                         ARRAY(SELECT id FROM outbox.log_0 WHERE type = 'sc.b2'),
                         ARRAY[400], ARRAY['rejected']) AS acked;
SELECT type, destination, attempts, last_status, last_error, died_at IS NOT NULL AS died
  FROM outbox.dead_events ORDER BY type;
SELECT outbox._claim_ack('sc', 3, ARRAY(SELECT id FROM outbox.log_0 WHERE type = 'sc.b2'),
                         ARRAY[now()], ARRAY[1], ARRAY[503], ARRAY['late']) AS late_ack;
SELECT type, destination, attempts, due_at > now() AS later, last_status, last_error
  FROM outbox.retries ORDER BY type;

-- recovery: an unacknowledged batch whose lease ran out is leased again
-- with the same events; an acknowledged or still leased one is not
SELECT pg_temp.append('sc.lost');
SELECT type, seq FROM outbox._claim(10, '0 s', 'sc');
SELECT type, seq, leased_until > now() AS leased FROM outbox._claim_recover('1 min', 'sc');
SELECT count(*) AS recovered_again FROM outbox._claim_recover('1 min', 'sc');
UPDATE outbox.batches SET leased_until = now() - interval '1 s' WHERE destination = 'sc';
SELECT seq FROM outbox._claim_recover('1 min', 'sc', 5);
SELECT count(*) AS above_low_seq FROM outbox._claim_recover('1 min', 'sc', 6);
SELECT DISTINCT seq AS oldest_first FROM outbox._claim_recover('1 min', 'sc');
SELECT outbox._claim_ack('sc', 2), outbox._claim_ack('sc', 4), outbox._claim_ack('sc', 5),
       outbox._claim_ack('sc', 6);
SELECT count(*) AS nothing_unacknowledged FROM outbox._claim_recover('1 min', 'sc');


-- outbox.emit() writes the current slot with the transaction's
-- xid, ordering key on an ordered destination, not_before when ahead
UPDATE outbox.destinations SET options = '{"ordering": "aggregate"}' WHERE name = 'sc';
BEGIN;
SELECT outbox.emit('sc.emitted', 'agg-1', '{"n": 1}', destination => 'sc',
                        headers => '{"x-h": "v"}') IS NOT NULL AS emitted;
SELECT xid = pg_current_xact_id() AS own_xid, ordering_key, not_before IS NULL AS due,
       created_at = now() AS created_now, headers
  FROM outbox.log_0 WHERE type = 'sc.emitted';
COMMIT;
SELECT outbox.emit('sc.deferred', NULL, '{}', destination => 'sc',
                        not_before => now() + interval '1 hour') IS NOT NULL AS emitted;
SELECT outbox.emit('sc.past', NULL, '{}', destination => 'sc',
                        not_before => now() - interval '1 hour') IS NOT NULL AS emitted;
SELECT type, not_before IS NOT NULL AS has_not_before FROM outbox.log_0
 WHERE type IN ('sc.deferred', 'sc.past') ORDER BY type;
-- a switch of the rotation sends the next emit to the new slot; the
-- claim reads every slot
UPDATE outbox.rotation SET slot = 1, generation = generation + 1;
SELECT outbox.emit('sc.slot1', NULL, '{}', destination => 'sc') IS NOT NULL AS emitted;
SELECT count(*) AS in_slot1 FROM outbox.log_1 WHERE type = 'sc.slot1';
UPDATE outbox.rotation SET slot = 0, generation = generation + 1;
SELECT type FROM outbox._claim(10, '1 min', 'sc') ORDER BY type;
SELECT type, attempts FROM outbox.retries WHERE type = 'sc.deferred';
SELECT outbox.emit('sc.nowhere', NULL, '{}', destination => 'nowhere');

-- ordered destination: an event behind an earlier one of its aggregate
-- in outbox.retries, or behind a deferred one in the same range, is held
-- (copied to retries, not sent); other aggregates go on
INSERT INTO outbox.destinations (name, url, options)
VALUES ('so', 'http://127.0.0.1:9/so', '{"ordering": "aggregate"}');
SELECT outbox.emit('so.a1', 'A', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT outbox.emit('so.b1', 'B', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT type FROM outbox._claim(10, '1 min', 'so') ORDER BY type;
SELECT outbox._claim_ack('so', 1, ARRAY(SELECT id FROM outbox.log_0 WHERE type = 'so.a1'),
                         ARRAY[now()], ARRAY[1], ARRAY[503], ARRAY['busy']) AS acked;
SELECT outbox.emit('so.a2', 'A', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT outbox.emit('so.b2', 'B', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT outbox.emit('so.c1', 'C', '{}', destination => 'so',
                        not_before => now() + interval '1 hour') IS NOT NULL AS emitted;
SELECT outbox.emit('so.c2', 'C', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT type FROM outbox._claim(10, '1 min', 'so') ORDER BY type;
SELECT type, attempts, due_at > now() AS later FROM outbox.retries
 WHERE destination = 'so' ORDER BY type;
-- a batch with nothing to send is acknowledged by its claim
SELECT outbox.emit('so.a2b', 'A', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT count(*) AS sent FROM outbox._claim(10, '1 min', 'so');
SELECT b.seq, b.events, k.seq IS NOT NULL AS acked
  FROM outbox.batches b LEFT JOIN outbox.batch_acks k USING (destination, seq)
 WHERE destination = 'so' ORDER BY b.seq DESC LIMIT 1;
-- the retries lease takes the heads only: a1 (c1 is not due)
SELECT type FROM outbox._retries_lease(10, '1 min', 'so') ORDER BY type;
-- a recovered batch does not send its held events again
SELECT outbox.emit('so.a3', 'A', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT outbox.emit('so.d1', 'D', '{}', destination => 'so') IS NOT NULL AS emitted;
SELECT type FROM outbox._claim(10, '0 s', 'so') ORDER BY type;
SELECT type FROM outbox._claim_recover('1 min', 'so') ORDER BY type;
DELETE FROM outbox.destinations WHERE name = 'so';

-- one transaction of 20,000 events to an ordered destination, over 1,000
-- aggregates, one of them deferred: a single claim, in well under the
-- timeout (an earlier claim probed the whole range for each of its events
-- and took about a minute); the deferred event's later one is held
INSERT INTO outbox.destinations (name, url, options)
VALUES ('sb', 'http://127.0.0.1:9/sb', '{"ordering": "aggregate"}');
SELECT count(outbox.emit('sb.e', 'agg-' || (g % 1000), '{}', destination => 'sb',
                         not_before => CASE WHEN g = 500 THEN now() + interval '1 hour' END)) AS emitted
  FROM generate_series(1, 20000) AS g;
SET statement_timeout = '10s';
SELECT count(*) AS sent FROM outbox._claim(100, '1 min', 'sb');
RESET statement_timeout;
SELECT count(*) AS held_or_deferred, count(*) FILTER (WHERE aggregate_id = 'agg-500') AS of_agg_500
  FROM outbox.retries WHERE destination = 'sb';
DELETE FROM outbox.destinations WHERE name = 'sb';

-- one aggregate with 10,000 copies in outbox.retries (its head deferred),
-- the only key the statistics know: a transaction of 10,000 events of
-- other aggregates is claimed in well under the timeout, each event's
-- probe for a copy of its aggregate an index probe (a plan that believed
-- the statistics scanned every copy for each event: about 2 ms an event)
INSERT INTO outbox.destinations (name, url, options)
VALUES ('sk', 'http://127.0.0.1:9/sk', '{"ordering": "aggregate"}');
INSERT INTO outbox.retries (id, type, aggregate_id, payload, destination, ordering_key,
                            created_at, attempts, due_at)
SELECT gen_random_uuid(), 'sk.held', 'held', '{}', 'sk', 'held', now(), 0,
       CASE WHEN g = 1 THEN now() + interval '1 hour' ELSE now() END
  FROM generate_series(1, 10000) AS g;
ANALYZE outbox.retries;
SELECT count(outbox.emit('sk.e', 'agg-' || (g % 1000), '{}', destination => 'sk')) AS emitted
  FROM generate_series(1, 10000) AS g;
-- with the relay's settings (relay.c)
SET plan_cache_mode = force_generic_plan;
SET jit = off;
SET statement_timeout = '3s';
SELECT count(*) AS sent FROM outbox._claim(20000, '1 min', 'sk');
RESET statement_timeout;
RESET plan_cache_mode;
RESET jit;
DELETE FROM outbox.destinations WHERE name = 'sk';

-- errors and edge cases
SELECT * FROM outbox._claim(0, '1 min', 'sc');
SELECT * FROM outbox._claim(NULL, '1 min', 'sc');
SELECT count(*) AS unknown_destination FROM outbox._claim(10, '1 min', 'nowhere');

-- a deleted destination keeps its stream, batches and acknowledgements
-- (0.5.0: they are its name's; test destination_lifecycle)
DELETE FROM outbox.destinations WHERE name IN ('sc', 'sc_other');
SELECT (SELECT count(*) FROM outbox.streams WHERE destination LIKE 'sc%') AS streams,
       (SELECT count(*) FROM outbox.batches WHERE destination LIKE 'sc%') AS batches,
       (SELECT count(*) FROM outbox.batch_acks WHERE destination LIKE 'sc%') AS acks;
TRUNCATE outbox.log_0, outbox.log_1, outbox.retries, outbox.dead_events;
DELETE FROM outbox.streams WHERE destination LIKE 'sc%';
