--
-- order_retention: retention of published events, ordering options
--
-- expired published rows, created two hours ago (UUIDv7 ids of that time)
CREATE FUNCTION old_id(g int, age interval) RETURNS uuid LANGUAGE sql AS $$
    SELECT (lpad(to_hex((extract(epoch FROM now() - age) * 1000)::bigint), 12, '0')
            || '7' || lpad(to_hex(g), 3, '0') || '8' || lpad(to_hex(g), 15, '0'))::uuid
$$;
INSERT INTO outbox.destinations (name, url) VALUES ('ret', 'http://127.0.0.1:9/');
INSERT INTO outbox.events (id, type, payload, destination, status, created_at, published_at)
SELECT old_id(g, '2 hours'), 'ret.old', '{}', 'ret', 'published',
       now() - interval '2 hours', now() - interval '2 hours' + interval '1 second'
  FROM generate_series(1, 25) g;
-- old but pending, old and dead: never deleted by retention
INSERT INTO outbox.events (id, type, payload, destination, status, created_at)
SELECT old_id(100 + g, '3 hours'), 'ret.pending', '{}', 'ret', 'pending', now() - interval '3 hours'
  FROM generate_series(1, 5) g;
INSERT INTO outbox.events (id, type, payload, destination, status, created_at)
SELECT old_id(200 + g, '3 hours'), 'ret.dead', '{}', 'ret', 'dead', now() - interval '3 hours'
  FROM generate_series(1, 5) g;
-- old, but published recently (a long retry): kept
INSERT INTO outbox.events (id, type, payload, destination, status, created_at, published_at)
SELECT old_id(300 + g, '3 hours'), 'ret.late', '{}', 'ret', 'published', now() - interval '3 hours',
       now() - interval '10 minutes'
  FROM generate_series(1, 5) g;
-- recent published rows: kept
DO $$ BEGIN PERFORM outbox.emit('ret.new', g::text, '{}', destination => 'ret') FROM generate_series(1, 5) g; END $$;
UPDATE outbox.events SET status = 'published', published_at = now() WHERE type = 'ret.new';

-- bounded batches of at most 10 rows
SELECT outbox._expire_published('1 hour', 10) AS batch1;
SELECT outbox._expire_published('1 hour', 10) AS batch2;
SELECT outbox._expire_published('1 hour', 10) AS batch3;
SELECT outbox._expire_published('1 hour', 10) AS batch4;
SELECT type, status, count(*) FROM outbox.events WHERE type LIKE 'ret.%' GROUP BY 1, 2 ORDER BY 1;
-- a shorter retention reaches the late ones too, never pending or dead
SELECT outbox._expire_published('5 minutes', 100) AS batch5;
SELECT type, status, count(*) FROM outbox.events WHERE type LIKE 'ret.%' GROUP BY 1, 2 ORDER BY 1;
SELECT try($$SELECT outbox._expire_published('1 hour', -1)$$);
SELECT try($$SELECT outbox._expire_published(NULL, 1)$$);
DELETE FROM outbox.events WHERE type LIKE 'ret.%';
DROP FUNCTION old_id(int, interval);

-- the settings
SHOW outbox.retention;
SHOW outbox.retention_batch;

-- the lease does not write next_attempt_at any more, and it is HOT
DO $$ BEGIN PERFORM outbox.emit('ret.hot', g::text, '{}', destination => 'ret') FROM generate_series(1, 20) g; END $$;
SELECT count(*) AS leased FROM outbox._lease(20, '1 minute', 'ret');
SELECT count(*) FILTER (WHERE leased_until > now()) AS in_flight,
       count(*) FILTER (WHERE next_attempt_at <= now()) AS next_attempt_unchanged
  FROM outbox.events WHERE type = 'ret.hot';
SELECT n_tup_upd = n_tup_hot_upd AS all_leases_hot
  FROM pg_stat_xact_user_tables WHERE relid = 'outbox.events'::regclass;
DELETE FROM outbox.events WHERE type LIKE 'ret.%';

-- ordering options are checked
SELECT try($$INSERT INTO outbox.destinations (name, url, options) VALUES ('bad', 'http://127.0.0.1:9/', '{"ordering": "fifo"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, url, options) VALUES ('bad', 'http://127.0.0.1:9/', '{"ordering": "aggregate", "on_dead": "drop"}')$$);
SELECT try($$SELECT outbox.release_aggregate('nope', 'A')$$);
-- nothing blocked: nothing to release
INSERT INTO outbox.destinations (name, url, options) VALUES ('ord', 'http://127.0.0.1:9/', '{"ordering": "aggregate"}');
SELECT outbox.release_aggregate('ord', 'A') AS released;
-- the emit of an ordered aggregate holds its lock until the end of the transaction
BEGIN;
SELECT outbox.emit('o.1', 'A', '{}', destination => 'ord') IS NOT NULL AS emitted;
SELECT locktype, objsubid, mode, granted FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid();
COMMIT;
SELECT count(*) AS advisory_locks_after_commit FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid();
-- an unordered destination takes no lock
BEGIN;
SELECT outbox.emit('o.1', 'A', '{}', destination => 'ret') IS NOT NULL AS emitted;
SELECT count(*) AS advisory_locks FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
ROLLBACK;
DELETE FROM outbox.events WHERE destination IN ('ret', 'ord');
DELETE FROM outbox.destinations WHERE name IN ('ret', 'ord');
