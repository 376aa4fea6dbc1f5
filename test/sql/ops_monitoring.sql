--
-- ops_monitoring: the monitoring views, health, metrics and the admin
-- functions, in the states a relay-less instance can reach (the relay's
-- steps are driven by hand through the store's outbox._claim, _claim_ack
-- and _retries_*)
--

-- a database of its own, so that other tests' events do not show
CREATE DATABASE regress_ops;
\c regress_ops
CREATE EXTENSION outbox_pg;
CREATE FUNCTION try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- no relay runs here (outbox.databases = ''): health is critical
SELECT status, reasons FROM outbox.health();
SELECT count(*) AS stats_rows FROM outbox.destination_stats;
SELECT count(*) AS runtime_rows FROM outbox.destination_runtime();

INSERT INTO outbox.destinations (name, url) VALUES
    ('ops-a', 'http://127.0.0.1:9/a'),
    ('ops-b', 'http://127.0.0.1:9/b'),
    ('ops-idle', 'http://127.0.0.1:9/idle');
-- one transaction per event, so that a claim can take some of them
CREATE TEMP TABLE ev (id uuid, g int);
SELECT format($$INSERT INTO ev SELECT outbox.emit('ops.created', %s::text,
                                                  jsonb_build_object('secret', 'payload ' || %s),
                                                  destination => %L), %s$$,
              g, g, CASE WHEN g <= 6 THEN 'ops-a' ELSE 'ops-b' END, g)
  FROM generate_series(1, 9) g \gexec
-- scheduled for later: pending, not claimable, not aged
INSERT INTO ev SELECT outbox.emit('ops.later', 'l', '{}', destination => 'ops-b',
                                  not_before => now() + interval '1 hour'), 10;
-- unrouted
INSERT INTO ev SELECT outbox.emit('ops.nowhere', 'n', '{}'), 11;

-- every event is pending and (but one) claimable; nothing dead
SELECT destination, pending, claimable, published, dead, in_flight, paused, circuit_state,
       oldest_pending_age >= '0' AS aged, oldest_claimable_age >= '0' AS claimable_aged,
       oldest_dead_age IS NULL AS no_dead_age, recent_5xx
  FROM outbox.destination_stats ORDER BY destination;

-- a claim takes events out of "claimable" (they wait for their batch's
-- lease); its acknowledgement publishes, copies failures to retries (not
-- claimable until due) and dead ones to the dead letters
SELECT count(*) AS leased, min(seq) AS a_batch FROM outbox._claim(5, '1 minute', 'ops-a') \gset
SELECT :leased AS leased;
SELECT outbox._claim_ack('ops-a', :a_batch,
                         failed => ARRAY(SELECT id FROM ev WHERE g = 3),
                         due_at => ARRAY[now() + interval '1 minute'], attempts => ARRAY[1],
                         status => ARRAY[503], error => ARRAY['HTTP 503: busy'],
                         dead => ARRAY(SELECT id FROM ev WHERE g IN (4, 5) ORDER BY g),
                         dead_status => ARRAY[422, NULL],
                         dead_error => ARRAY['HTTP 422: rejected', 'connection refused']);
SELECT count(*) AS leased, min(seq) AS b1_batch FROM outbox._claim(1, '1 minute', 'ops-b') \gset
SELECT outbox._claim_ack('ops-b', :b1_batch, dead => ARRAY(SELECT id FROM ev WHERE g = 7),
                         dead_status => ARRAY[410], dead_error => ARRAY['HTTP 410: gone']);
-- the claim copies the event scheduled for later to retries
SELECT count(*) AS leased, min(seq) AS b_batch FROM outbox._claim(5, '1 minute', 'ops-b') \gset
SELECT :leased AS leased;

SELECT destination, pending, claimable, published, dead, last_published_at IS NOT NULL AS has_published,
       oldest_dead_age >= '0' AS dead_aged
  FROM outbox.destination_stats ORDER BY destination;

-- health: no relay (critical), dead letters (warn), unrouted (warn)
SELECT status, reasons FROM outbox.health();

-- old events cross the age thresholds (defaults: warn 5 min, critical 30
-- min); the log is insert-only, only a test moves created_at
CREATE FUNCTION age_event(i uuid, t timestamptz) RETURNS void LANGUAGE sql AS $$
    UPDATE outbox.log_0 SET created_at = t WHERE id = i;
    UPDATE outbox.log_1 SET created_at = t WHERE id = i;
    UPDATE outbox.log_2 SET created_at = t WHERE id = i;
    UPDATE outbox.retries SET created_at = t WHERE id = i;
$$;
SELECT age_event((SELECT id FROM ev WHERE g = 6), now() - interval '10 minutes');
SELECT reason FROM unnest((outbox.health()).reasons) AS reason WHERE reason LIKE '%oldest pending%';
SELECT age_event((SELECT id FROM ev WHERE g = 6), now() - interval '2 hours');
SELECT reason FROM unnest((outbox.health()).reasons) AS reason WHERE reason LIKE '%oldest pending%';
-- an event scheduled for later does not count, however old
SELECT age_event((SELECT id FROM ev WHERE g = 10), now() - interval '2 hours');
SELECT reason FROM unnest((outbox.health()).reasons) AS reason WHERE reason LIKE '%"ops-b" is%';
SELECT age_event((SELECT id FROM ev WHERE g = 6), now());

-- the dead-letter thresholds are settings (reload)
ALTER SYSTEM SET outbox.dead_letters_critical = 3;
SELECT pg_reload_conf();
SELECT pg_sleep(0.3);
SELECT reason FROM unnest((outbox.health()).reasons) AS reason WHERE reason LIKE '%dead letter%';
ALTER SYSTEM RESET outbox.dead_letters_critical;
SELECT pg_reload_conf();
SELECT pg_sleep(0.3);
SELECT try($$SET outbox.dead_letters_warning = 5$$);

-- listing dead letters, with every filter
SELECT g, d.destination, d.type, d.attempts, d.last_status, d.last_error, d.payload
  FROM outbox.dead_letters() d JOIN ev USING (id) ORDER BY g;
SELECT g FROM outbox.dead_letters(destination => 'ops-b') JOIN ev USING (id);
SELECT g FROM outbox.dead_letters(type => 'ops.*') JOIN ev USING (id) ORDER BY g;
SELECT count(*) FROM outbox.dead_letters(type => 'ops_created');
SELECT g FROM outbox.dead_letters(error_like => 'HTTP 4%') JOIN ev USING (id) ORDER BY g;
SELECT count(*) FROM outbox.dead_letters(since => now() + interval '1 minute');
SELECT count(*) FROM outbox.dead_letters(until => now() + interval '1 minute');
SELECT count(*) FROM outbox.dead_letters(max_rows => 1);

-- redrive one: same id, pending, attempts from zero, due now
SELECT outbox.redrive((SELECT id FROM ev WHERE g = 4)) AS redriven;
SELECT g, e.status, e.attempts, e.next_attempt_at <= now() AS due, e.last_error
  FROM outbox.events e JOIN ev USING (id) WHERE g = 4;
SELECT outbox.redrive((SELECT id FROM ev WHERE g = 4)) AS again;       -- not dead any more
SELECT outbox.redrive((SELECT id FROM ev WHERE g = 1)) AS published;   -- published: untouched
SELECT try($$SELECT outbox.redrive('00000000-0000-7000-8000-000000000000')$$);
SELECT try($$SELECT outbox.redrive(NULL)$$);

-- redrive a filter; no filter at all is refused
SELECT try($$SELECT outbox.redrive_dead()$$);
SELECT outbox.redrive_dead(destination => 'ops-b') AS redriven;
SELECT g, e.status, e.attempts FROM outbox.events e JOIN ev USING (id) WHERE g = 7;
SELECT outbox.redrive_dead(error_like => 'nothing like this') AS none;

-- make dead letters again (from retries, and from the in-flight batch,
-- whose other event fails), purge some by filter, then all
SELECT outbox._retries_dead(ARRAY(SELECT id FROM ev WHERE g IN (4, 7) ORDER BY g), ARRAY[500, 500],
                            ARRAY['x', 'y']);
SELECT outbox._claim_ack('ops-b', :b_batch,
                         failed => ARRAY(SELECT id FROM ev WHERE g = 9),
                         due_at => ARRAY[now() + interval '1 minute'], attempts => ARRAY[1],
                         status => ARRAY[503], error => ARRAY['HTTP 503'],
                         dead => ARRAY(SELECT id FROM ev WHERE g = 8),
                         dead_status => ARRAY[500], dead_error => ARRAY['z']);
SELECT try($$SELECT outbox.purge_dead()$$);
SELECT outbox.purge_dead(destination => 'ops-a') AS purged;
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
SELECT outbox.purge_dead(all_dead => true) AS purged;
SELECT status, count(*) FROM outbox.events GROUP BY status ORDER BY status;
SELECT g FROM ev WHERE id NOT IN (SELECT id FROM outbox.events) ORDER BY g;

-- redrive all
SELECT outbox._retries_dead(ARRAY(SELECT id FROM ev WHERE g = 9), ARRAY[500], ARRAY['x']);
SELECT outbox.redrive_dead(all_dead => true) AS redriven;
SELECT count(*) AS dead FROM outbox.events WHERE status = 'dead';

-- pause and resume
SELECT outbox.pause('ops-a');
SELECT destination, paused FROM outbox.destination_stats WHERE destination LIKE 'ops-%' ORDER BY 1;
SELECT reason FROM unnest((outbox.health()).reasons) AS reason WHERE reason LIKE '%paused%';
SELECT outbox.resume('ops-a');
SELECT paused FROM outbox.destinations WHERE name = 'ops-a';
SELECT try($$SELECT outbox.pause('no-such-destination')$$);
SELECT try($$SELECT outbox.resume(NULL)$$);

-- wait_published
SELECT outbox.wait_published((SELECT id FROM ev WHERE g = 1), '1 second') AS published_at_once;
SELECT outbox._retries_dead(ARRAY(SELECT id FROM ev WHERE g = 9), ARRAY[500], ARRAY['x']);
SELECT outbox.wait_published((SELECT id FROM ev WHERE g = 9), '10 seconds') AS dead_at_once;
SELECT outbox.wait_published((SELECT id FROM ev WHERE g = 6), '50 milliseconds') AS times_out;
SELECT try($$SELECT outbox.wait_published('00000000-0000-7000-8000-000000000000', '1 second')$$);
SELECT try($$SELECT outbox.wait_published(gen_random_uuid(), '-1 second')$$);
-- timeouts beyond int64 microseconds: huge ones wait (here: published at
-- once), huge negative ones are refused (they wrapped around before)
SELECT outbox.wait_published((SELECT id FROM ev WHERE g = 1), '300000 years') AS huge_timeout;
SELECT try($$SELECT outbox.wait_published(gen_random_uuid(), '-300000 years')$$);
SELECT try($$SELECT outbox.wait_published(NULL)$$);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT try($$SELECT outbox.wait_published((SELECT id FROM ev WHERE g = 1))$$);
COMMIT;
-- in the transaction that emitted the event: refused at once (it waited
-- for the whole timeout, then answered false); an event of an earlier
-- transaction is still waited for by a transaction that has written
BEGIN;
CREATE TEMP TABLE own_event AS
  SELECT outbox.emit('ops.own', 'o-1', '{}', destination => 'ops-a') AS id;
SELECT try($$SELECT outbox.wait_published((SELECT id FROM own_event), '1 hour')$$);
ROLLBACK;
BEGIN;
CREATE TEMP TABLE wrote_something (x int);
SELECT outbox.wait_published((SELECT id FROM ev WHERE g = 6), '50 milliseconds') AS other_transaction_times_out;
ROLLBACK;

-- metrics: the exposition format's shape (TAP parses it with a real parser)
SELECT line FROM regexp_split_to_table(outbox.metrics(), E'\n') AS line
 WHERE line ~ '^(# TYPE|outbox_pending_events|outbox_dead_letters\{|outbox_destination_paused|outbox_relay_workers)'
 ORDER BY line COLLATE "C";
SELECT right(outbox.metrics(), 1) = E'\n' AS ends_with_newline;
SELECT outbox._prom_label(E'a"b\\c\nd') AS escaped;

-- the README's postgres_exporter queries and runbook query run as written
SELECT CASE status WHEN 'ok' THEN 0 WHEN 'warn' THEN 1 ELSE 2 END AS status FROM outbox.health();
SELECT destination, pending, claimable, dead, in_flight,
       coalesce(extract(epoch FROM oldest_pending_age), 0) >= 0 AS oldest_pending_age_seconds,
       (circuit_state IS DISTINCT FROM 'closed' AND circuit_state IS NOT NULL)::int AS circuit_open,
       coalesce(paused, false)::int AS paused
  FROM outbox.destination_stats ORDER BY destination;
SELECT destination, last_status, left(last_error, 60) AS error, count(*)
  FROM outbox.dead_letters(max_rows => 100000) GROUP BY 1, 2, 3 ORDER BY 4 DESC;

-- a pg_monitor member reads health, metrics and statistics, never
-- payloads or secrets, and cannot change anything
CREATE ROLE regress_ops_monitor IN ROLE pg_monitor;
SET ROLE regress_ops_monitor;
SELECT status IS NOT NULL AS reads_health FROM outbox.health();
SELECT outbox.metrics() LIKE '%outbox_pending_events{%' AS reads_metrics;
SELECT count(*) > 0 AS reads_stats FROM outbox.destination_stats;
SELECT count(*) >= 0 AS reads_runtime FROM outbox.destination_runtime();
SELECT try($$SELECT * FROM outbox.workers()$$);
SELECT try($$SELECT payload FROM outbox.events$$);
SELECT try($$SELECT bearer_token, signing_secrets FROM outbox.destinations$$);
SELECT try($$SELECT * FROM outbox._destination_backlog$$);
SELECT try($$SELECT * FROM outbox.dead_letters()$$);
SELECT try($$SELECT outbox.redrive_dead(all_dead => true)$$);
SELECT try($$SELECT outbox.purge_dead(all_dead => true)$$);
SELECT try($$SELECT outbox.pause('ops-a')$$);
SELECT try($$SELECT outbox.wait_published(gen_random_uuid())$$);
RESET ROLE;
DROP ROLE regress_ops_monitor;

\c contrib_regression
DROP DATABASE regress_ops;
