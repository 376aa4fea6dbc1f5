--
-- store_retries: outbox.retries, the copies of failed and deferred events
-- of the insert-only store (issue #21): lease (ordered heads included),
-- retry and dead fenced by the lease, ack, the move to outbox.dead_events.
--
INSERT INTO outbox.destinations (name, url) VALUES ('sp', 'http://127.0.0.1:9/sp');
INSERT INTO outbox.destinations (name, url, options)
VALUES ('sr', 'http://127.0.0.1:9/sr', '{"ordering": "aggregate"}');

-- copy n: id ...000n (ids order the copies), due after the given delay
CREATE FUNCTION pg_temp.copy(n int, d text, key text DEFAULT NULL, delay interval DEFAULT '0 s')
RETURNS void LANGUAGE sql AS $$
    INSERT INTO outbox.retries (id, type, aggregate_id, payload, destination, ordering_key,
                                created_at, attempts, due_at)
    VALUES (('00000000-0000-7000-8000-' || lpad(n::text, 12, '0'))::uuid, d || '.' || n, key, '{}',
            d, key, now() - interval '1 min', 1, now() + delay);
$$;
CREATE FUNCTION pg_temp.id(n int) RETURNS uuid LANGUAGE sql AS $$
    SELECT ('00000000-0000-7000-8000-' || lpad(n::text, 12, '0'))::uuid
$$;
-- twenty leases of ten copies each, each lease run out at once
CREATE FUNCTION pg_temp.twenty_leases(d text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 20 LOOP
        PERFORM outbox._retries_lease(10, '0 s', d);
    END LOOP;
END $$;

-- plain destination: due copies in due order, each lease an attempt
SELECT pg_temp.copy(1, 'sp'), pg_temp.copy(2, 'sp'), pg_temp.copy(3, 'sp', delay => '1 hour');
SELECT type, attempts, leased_until > now() AS leased, age > 0 AS aged
  FROM outbox._retries_lease(10, '1 min', 'sp') ORDER BY type;
SELECT count(*) AS leased_again FROM outbox._retries_lease(10, '1 min', 'sp');

-- retry: fenced by the lease; give_back returns the attempt
SELECT outbox._retries_retry(ARRAY[pg_temp.id(1)], ARRAY[now()], ARRAY[503], ARRAY['busy'],
                             ARRAY[now() - interval '1 day']) AS stale_fence;
SELECT outbox._retries_retry(ARRAY[pg_temp.id(1)], ARRAY[now()], ARRAY[503], ARRAY['busy'],
                             ARRAY(SELECT leased_until FROM outbox.retries WHERE id = pg_temp.id(1)),
                             ARRAY[true]) AS retried;
SELECT type, attempts, leased_until IS NULL AS free, last_status, last_error
  FROM outbox.retries WHERE id = pg_temp.id(1);
SELECT type, attempts FROM outbox._retries_lease(10, '1 min', 'sp');

-- dead: fenced, moves the copy to outbox.dead_events
SELECT outbox._retries_dead(ARRAY[pg_temp.id(2)], ARRAY[400], ARRAY['bad'],
                            ARRAY[now() - interval '1 day']) AS stale_fence;
SELECT outbox._retries_dead(ARRAY[pg_temp.id(2)], ARRAY[400], ARRAY['bad']) AS dead;
SELECT type, attempts, last_status, last_error, died_at IS NOT NULL AS died
  FROM outbox.dead_events ORDER BY type;
-- ack: the copy goes
SELECT outbox._retries_ack(ARRAY[pg_temp.id(1), pg_temp.id(2)]) AS acked;
SELECT type FROM outbox.retries ORDER BY type;

-- ordered destination: only the head of each aggregate, and under
-- on_dead = 'block' not behind an unreleased dead copy
SELECT pg_temp.copy(11, 'sr', 'k1'), pg_temp.copy(12, 'sr', 'k1'), pg_temp.copy(13, 'sr', 'k2'),
       pg_temp.copy(14, 'sr'), pg_temp.copy(15, 'sr', 'k3'), pg_temp.copy(16, 'sr', 'k3');
SELECT type FROM outbox._retries_lease(10, '1 min', 'sr') ORDER BY type;
SELECT outbox._retries_ack(ARRAY[pg_temp.id(11)]) AS acked;
SELECT outbox._retries_dead(ARRAY[pg_temp.id(15)], ARRAY[400], ARRAY['bad']) AS dead;
UPDATE outbox.retries SET leased_until = NULL WHERE destination = 'sr';
SELECT type FROM outbox._retries_lease(10, '1 min', 'sr') ORDER BY type;
INSERT INTO outbox.aggregate_releases (destination, aggregate_id, released_through)
VALUES ('sr', 'k3', pg_temp.id(15));
SELECT type FROM outbox._retries_lease(10, '1 min', 'sr') ORDER BY type;

-- many copies behind few heads: the first look (4 x the batch + 64 due
-- copies) finds one head among 500 copies of 'a', so the heads come from a
-- skip scan of the aggregates, and copies without one are looked up too
INSERT INTO outbox.destinations (name, url, options)
VALUES ('sh', 'http://127.0.0.1:9/sh', '{"ordering": "aggregate"}');
SELECT count(*) AS copies FROM (SELECT pg_temp.copy(1000 + g, 'sh', 'a') FROM generate_series(1, 500) AS g) AS c;
SELECT count(*) AS copies FROM (SELECT pg_temp.copy(2000 + g, 'sh', 'k' || g) FROM generate_series(1, 5) AS g) AS c;
SELECT pg_temp.copy(3001, 'sh'), pg_temp.copy(3002, 'sh', 'k6', delay => '1 hour');
SELECT type FROM outbox._retries_lease(10, '1 min', 'sh') ORDER BY type;
SELECT count(*) AS leased_again FROM outbox._retries_lease(10, '1 min', 'sh');
SELECT outbox._retries_ack(ARRAY[pg_temp.id(1001), pg_temp.id(2003)]) AS acked;
SELECT type FROM outbox._retries_lease(10, '1 min', 'sh') ORDER BY type;
-- in due order when more heads are due than asked for
UPDATE outbox.retries SET leased_until = NULL WHERE destination = 'sh';
SELECT type FROM outbox._retries_lease(3, '1 min', 'sh') ORDER BY type;
-- 100,000 copies of one aggregate whose head is not due: twenty leases
-- take well under the timeout (each once probed every copy: 0.9 s)
DELETE FROM outbox.retries WHERE destination = 'sh';
INSERT INTO outbox.retries (id, type, aggregate_id, payload, destination, ordering_key,
                            created_at, attempts, due_at)
SELECT pg_temp.id(10000 + g), 'sh.held', 'h', '{}', 'sh', 'h', now(), 0,
       CASE WHEN g = 1 THEN now() + interval '1 hour' ELSE now() END
  FROM generate_series(1, 100000) AS g;
SELECT pg_temp.copy(3003, 'sh', 'k7');
ANALYZE outbox.retries;
SET statement_timeout = '5s';
SELECT pg_temp.twenty_leases('sh');
RESET statement_timeout;
SELECT type, attempts FROM outbox.retries WHERE destination = 'sh' AND attempts > 0 ORDER BY type;
-- and the heads of 300 other aggregates, due before them, which the
-- statistics have not seen: each head's probe for an earlier copy of its
-- aggregate is an index probe (a plan that believed the statistics, one
-- key for all copies, scanned the 100,000 copies for each head)
SELECT count(*) AS heads
  FROM (SELECT pg_temp.copy(200000 + g, 'sh', 'o' || g, delay => '-1 hour')
          FROM generate_series(1, 300) AS g) AS c;
-- with the relay's settings (relay.c)
SET plan_cache_mode = force_generic_plan;
SET jit = off;
SET statement_timeout = '5s';
SELECT pg_temp.twenty_leases('sh');
RESET statement_timeout;
RESET plan_cache_mode;
RESET jit;
SELECT count(*) FILTER (WHERE ordering_key LIKE 'o%' AND attempts > 1) >= 10 AS heads_leased,
       count(*) FILTER (WHERE ordering_key = 'h' AND attempts > 0) AS held_leased
  FROM outbox.retries WHERE destination = 'sh';
DELETE FROM outbox.destinations WHERE name = 'sh';

-- a failure acknowledged with its batch comes back through the retries
INSERT INTO outbox.log_0 (id, xid, type, payload, destination, created_at)
VALUES (gen_random_uuid(), pg_current_xact_id(), 'sp.failed', '{}', 'sp', now());
SELECT id AS failed_id, seq AS failed_seq FROM outbox._claim(10, '1 min', 'sp') \gset
SELECT outbox._claim_ack('sp', :failed_seq, ARRAY[:'failed_id']::uuid[], ARRAY[now()], ARRAY[1],
                         ARRAY[502], ARRAY['bad gateway']) AS acked;
SELECT type, attempts FROM outbox._retries_lease(10, '1 min', 'sp');

-- errors
SELECT * FROM outbox._retries_lease(-1, '1 min', 'sp');
SELECT outbox._retries_ack(NULL);

DELETE FROM outbox.aggregate_releases WHERE destination = 'sr';
DELETE FROM outbox.destinations WHERE name IN ('sp', 'sr');
TRUNCATE outbox.log_0, outbox.retries, outbox.dead_events;
