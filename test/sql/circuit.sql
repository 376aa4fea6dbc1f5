--
-- circuit: the relay's requeue (a retry with give_back) gives back the
-- attempt the lease counted (a failure while the destination's circuit is
-- open is not the event's); the circuit state itself is tested by
-- test/t/025 with relays
--
INSERT INTO outbox.destinations (name, url) VALUES ('circuit-test', 'http://127.0.0.1:9/');
CREATE TEMP TABLE c AS
SELECT outbox.emit('circuit.test', g::text, '{}', destination => 'circuit-test') AS id, g
  FROM generate_series(1, 3) g;
-- the claim takes the batch; 1 and 2 fail (copied to retries with the
-- attempt the batch counted), 3 is published
SELECT count(*) AS leased, min(seq) AS batch FROM outbox._claim(10, '1 minute', 'circuit-test') \gset
SELECT :leased AS leased;
SELECT outbox._claim_ack('circuit-test', :batch,
                         failed => ARRAY(SELECT id FROM c WHERE g IN (1, 2) ORDER BY g),
                         due_at => ARRAY[now(), now()], attempts => ARRAY[1, 1],
                         status => ARRAY[NULL::int, 503], error => ARRAY['x', 'y']);
SELECT leased_until AS lease0 FROM outbox._retries_lease(10, '1 minute', 'circuit-test') LIMIT 1 \gset
-- 1: an outage failure, due at once with its attempt given back
SELECT outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 1)], ARRAY[now()],
                             ARRAY[NULL::int], ARRAY['connection refused'],
                             give_back => ARRAY[true]);
-- 2: an ordinary failure keeps its attempt and backs off
SELECT outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 2)], ARRAY[now() + interval '5 seconds'],
                             ARRAY[503], ARRAY['HTTP 503']);
-- 3: published; a late requeue changes nothing
SELECT outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 3)], ARRAY[now()],
                             ARRAY[503], ARRAY['late'], give_back => ARRAY[true]);
SELECT c.g, e.status, e.attempts, e.last_status, e.last_error,
       e.leased_until IS NULL AS unleased, e.next_attempt_at <= now() AS due
  FROM c JOIN outbox.events e USING (id) ORDER BY c.g;
-- the requeued event is leased again at once, as attempt 2 again
SELECT attempts FROM outbox._retries_lease(10, '1 minute', 'circuit-test');
-- attempts never go below zero
SELECT outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 1)], ARRAY[now()],
                             ARRAY[NULL::int], ARRAY['refused'], give_back => ARRAY[true]) AS requeued,
       outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 1)], ARRAY[now()],
                             ARRAY[NULL::int], ARRAY['refused'], give_back => ARRAY[true]) AS again;
SELECT attempts FROM outbox.events WHERE id = (SELECT id FROM c WHERE g = 1);
-- fenced by the lease, like retry and dead: a requeue from an older lease
-- changes nothing, the current lease's requeue works
SELECT leased_until AS lease1 FROM outbox._retries_lease(10, '1 minute', 'circuit-test') \gset
SELECT outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 1)], ARRAY[now()],
                             ARRAY[NULL::int], ARRAY['stale'],
                             ARRAY[:'lease1'::timestamptz - interval '1 second'],
                             ARRAY[true]) AS stale_requeue,
       outbox._retries_retry(ARRAY[(SELECT id FROM c WHERE g = 1)], ARRAY[now()],
                             ARRAY[NULL::int], ARRAY['current'],
                             ARRAY[:'lease1'::timestamptz], ARRAY[true]) AS current_requeue;
SELECT last_error, leased_until IS NULL AS unleased
  FROM outbox.events WHERE id = (SELECT id FROM c WHERE g = 1);
-- internal: not granted to anyone
SELECT has_function_privilege('public', 'outbox._retries_retry(uuid[], timestamptz[], int4[], text[], timestamptz[], bool[])',
                              'EXECUTE') AS public_execute;
-- without a relay no destination has runtime state, so no circuit either
SELECT count(*) AS runtime_rows FROM outbox.destination_runtime();
SELECT circuit_state FROM outbox.destination_stats WHERE destination = 'circuit-test';
SHOW outbox.circuit_max_pause;
-- the circuits' (and statistics') entries in shared memory: sized at start
SHOW outbox.max_destinations;
SET outbox.max_destinations = 100;
SELECT outbox._retries_ack(ARRAY(SELECT id FROM c)) AS acked;
DELETE FROM outbox.destinations WHERE name = 'circuit-test';
