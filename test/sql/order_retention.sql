--
-- order_retention: retention of published events, ordering options
--
-- From 0.4.0 retention truncates whole log slots (test store_rotation)
-- and outbox.events is a view over the store.  A row inserted into it
-- without emit() goes into the log and is delivered like an emitted one;
-- an event is never updated or deleted in place.
INSERT INTO outbox.destinations (name, url) VALUES ('ret', 'http://127.0.0.1:9/');
INSERT INTO outbox.events (id, type, payload, destination)
VALUES ('018f0000-0000-7000-8000-000000000001', 'ret.inserted', '{"n": 1}', 'ret');
INSERT INTO outbox.events (type, payload, destination, next_attempt_at)
VALUES ('ret.later', '{}', 'ret', now() + interval '1 hour')
RETURNING id IS NOT NULL AS id_given, status, attempts;
-- a given id must be new: in the same slot of the log, and in another one
-- (the log rotated in between: each slot's primary key sees its own rows
-- only; 0.5.1 took the second event, and the relay then took one for the
-- other)
SELECT try($$INSERT INTO outbox.events (id, type, payload, destination)
             VALUES ('018f0000-0000-7000-8000-000000000001', 'ret.again', '{}', 'ret')$$);
UPDATE outbox.rotation SET slot = 1, generation = generation + 1;
SELECT try($$INSERT INTO outbox.events (id, type, payload, destination)
             VALUES ('018f0000-0000-7000-8000-000000000001', 'ret.again', '{}', 'ret')$$);
UPDATE outbox.rotation SET slot = 0, generation = generation + 1;
SELECT type, status, attempts, payload, next_attempt_at > now() AS later
  FROM outbox.events WHERE type LIKE 'ret.%' ORDER BY type;
SELECT l.type, l.xid = pg_current_xact_id() AS own_xid, l.not_before IS NOT NULL AS deferred
  FROM outbox.log AS l WHERE l.type LIKE 'ret.%' ORDER BY l.type;
SELECT try($$INSERT INTO outbox.events (type, payload, destination, status)
             VALUES ('ret.old', '{}', 'ret', 'published')$$);
-- what the relay must be able to send: per-event headers are checked as
-- emit() checks them (a line break or a Content-Length of their own split
-- the request on the wire), and created_at is a finite time
SELECT try($$INSERT INTO outbox.events (type, payload, destination, headers)
             VALUES ('ret.split', '{}', 'ret', '{"X-A": "1\r\nX-B: 2"}')$$);
SELECT try($$INSERT INTO outbox.events (type, payload, destination, headers)
             VALUES ('ret.length', '{}', 'ret', '{"Content-Length": "0"}')$$);
SELECT try($$INSERT INTO outbox.events (type, payload, destination, created_at)
             VALUES ('ret.forever', '{}', 'ret', 'infinity')$$);
SELECT try($$INSERT INTO outbox.events (type, payload, destination, traceparent)
             VALUES ('ret.trace', '{}', 'ret',
                     E'01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\r\nX-Injected: 1')$$);
SELECT try($$INSERT INTO outbox.events (type, payload, destination, next_attempt_at)
             VALUES ('ret.never', '{}', 'ret', 'infinity')$$);
SELECT try($$UPDATE outbox.events SET status = 'published' WHERE type LIKE 'ret.%'$$);
SELECT try($$DELETE FROM outbox.events WHERE type LIKE 'ret.%'$$);
-- the inserted row is claimed like an emitted one; the deferred one waits
SELECT type, attempts FROM outbox._claim(10, '1 minute', 'ret') ORDER BY type;
SELECT type, status, attempts, leased_until > now() AS leased
  FROM outbox.events WHERE type LIKE 'ret.%' ORDER BY type;

-- the settings
SHOW outbox.retention;
SHOW outbox.retention_batch;

-- the claim and its acknowledgement never write the log: no update, no
-- dead row behind the position
DO $$ BEGIN PERFORM outbox.emit('ret.hot', g::text, '{}', destination => 'ret') FROM generate_series(1, 20) g; END $$;
SELECT count(*) AS claimed, min(seq) AS hot_batch FROM outbox._claim(20, '1 minute', 'ret') \gset
SELECT :claimed AS claimed, outbox._claim_ack('ret', :hot_batch) AS acked;
SELECT count(*) FILTER (WHERE status = 'published') AS published
  FROM outbox.events WHERE type = 'ret.hot';
SELECT sum(n_tup_upd + n_tup_del) AS log_updates
  FROM pg_stat_xact_user_tables WHERE relid IN ('outbox.log_0'::regclass, 'outbox.log_1'::regclass,
                                                'outbox.log_2'::regclass);

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
DELETE FROM outbox.destinations WHERE name IN ('ret', 'ord');
DELETE FROM outbox.retries WHERE destination = 'ret';
