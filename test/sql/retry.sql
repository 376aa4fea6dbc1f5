--
-- retry: the backoff schedule is a pure function of the attempt number
--
-- no jitter: half the exponential delay; full jitter: all of it
SELECT a AS attempt,
       outbox.backoff_delay(a, 1000, 60000, 0) AS min_ms,
       outbox.backoff_delay(a, 1000, 60000, 1) AS max_ms
  FROM generate_series(1, 9) a;

-- jitter stays inside the bounds and never returns early
SELECT bool_and(d BETWEEN 4000 AND 8000) AS within_bounds
  FROM (SELECT outbox.backoff_delay(4, 1000, 60000, random()) AS d
          FROM generate_series(1, 1000)) s;

-- huge attempt numbers stay at the cap, no overflow
SELECT outbox.backoff_delay(1000000, 1000, 600000, 1) AS capped;
SELECT outbox.backoff_delay(0, 1000, 600000, 1) AS attempt_zero;

-- bad arguments
SELECT try($$SELECT outbox.backoff_delay(1, 0, 1000, 0.5)$$);
SELECT try($$SELECT outbox.backoff_delay(1, 2000, 1000, 0.5)$$);
SELECT try($$SELECT outbox.backoff_delay(1, 1000, 2000, 1.5)$$);

-- the relay's bookkeeping on the store: a batch is acknowledged once, with
-- its failures copied to retries and its dead ones to dead_events
INSERT INTO outbox.destinations (name, url) VALUES ('retry-test', 'http://127.0.0.1:9/');
CREATE TEMP TABLE r AS
SELECT outbox.emit('retry.test', g::text, '{}', destination => 'retry-test') AS id, g
  FROM generate_series(1, 3) g;
SELECT count(*) AS leased, min(seq) AS batch FROM outbox._claim(10, '1 minute', 'retry-test') \gset
SELECT :leased AS leased;
SELECT outbox._claim_ack('retry-test', :batch,
                         failed => ARRAY[(SELECT id FROM r WHERE g = 2)],
                         due_at => ARRAY[now() + interval '5 seconds'], attempts => ARRAY[1],
                         status => ARRAY[503], error => ARRAY['HTTP 503: busy'],
                         dead => ARRAY[(SELECT id FROM r WHERE g = 3)],
                         dead_status => ARRAY[NULL::int], dead_error => ARRAY['connection refused']);
-- a late result for an already acknowledged batch changes nothing
SELECT outbox._claim_ack('retry-test', :batch,
                         failed => ARRAY[(SELECT id FROM r WHERE g = 1)], due_at => ARRAY[now()],
                         attempts => ARRAY[1], status => ARRAY[500], error => ARRAY['late']) AS late;
SELECT r.g, e.status, e.attempts, e.last_status, e.last_error,
       e.published_at IS NOT NULL AS published,
       e.next_attempt_at > now() AS waiting
  FROM r JOIN outbox.events e USING (id) ORDER BY r.g;

-- unrouted events get a destination once a route exists
SELECT outbox.emit('late.routed', 'x', '{}') IS NOT NULL AS emitted;
SELECT destination FROM outbox.events WHERE type = 'late.routed';
INSERT INTO outbox.routes (pattern, destination) VALUES ('late.*', 'retry-test');
SELECT outbox._route_pending() >= 1 AS routed;
SELECT destination FROM outbox.events WHERE type = 'late.routed';
-- clean up (the store is insert-only; a test may delete)
DELETE FROM outbox.retries WHERE destination = 'retry-test';
DELETE FROM outbox.dead_events WHERE destination = 'retry-test';
