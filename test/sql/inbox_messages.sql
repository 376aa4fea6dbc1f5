--
-- inbox_messages: receive() stores a message once, in the caller's
-- transaction; handlers are registered with checks; privileges
--
SELECT inbox.receive('im-1', 'order.paid', '{"amount": 10}') AS first;
SELECT inbox.receive('im-1', 'order.paid', '{"amount": 10}') AS duplicate;
SELECT inbox.receive('im-1', 'other.type', '{}') AS duplicate_other_content;
SELECT inbox.receive('im-2', 'order.paid', '{"amount": 5}', aggregate_id => 'o-1',
                     headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
                     source => 'sqs:orders') AS with_options;

-- a rolled-back receive is no receive
BEGIN;
SELECT inbox.receive('im-3', 'order.paid', '{}') AS received;
ROLLBACK;
SELECT inbox.receive('im-3', 'order.paid', '{}') AS after_rollback;

-- inside a subtransaction, too
BEGIN;
SAVEPOINT s;
SELECT inbox.receive('im-4', 'order.paid', '{}') AS received;
ROLLBACK TO SAVEPOINT s;
SELECT inbox.receive('im-4', 'order.paid', '{}') AS received_again;
COMMIT;

SELECT id, type, aggregate_id, payload, headers IS NOT NULL AS has_headers, source,
       status, attempts, processed_at IS NULL AS unprocessed, last_error,
       received_at = next_attempt_at AS due_at_once
  FROM inbox.messages ORDER BY seq;
-- received order
SELECT array_agg(id ORDER BY seq) AS received_order FROM inbox.messages;

-- bad input
SELECT try($$SELECT inbox.receive(NULL, 't', '{}')$$);
SELECT try($$SELECT inbox.receive('', 't', '{}')$$);
SELECT try($$SELECT inbox.receive(repeat('m', 1025), 't', '{}')$$);
SELECT try($$SELECT inbox.receive(E'm\n1', 't', '{}')$$);
SELECT try($$SELECT inbox.receive('im-9', NULL, '{}')$$);
SELECT try($$SELECT inbox.receive('im-9', '', '{}')$$);
SELECT try($$SELECT inbox.receive('im-9', repeat('t', 256), '{}')$$);
SELECT try($$SELECT inbox.receive('im-9', 't', NULL)$$);
SELECT try($$SELECT inbox.receive('im-9', 't', '{}', aggregate_id => '')$$);
SELECT try($$SELECT inbox.receive('im-9', 't', '{}', headers => '[1]')$$);
SELECT try($$SELECT inbox.receive('im-9', 't', '{}', source => '')$$);
SET outbox.max_payload_size = 1024;
SELECT try($$SELECT inbox.receive('im-9', 't', jsonb_build_object('x', repeat('y', 2000)))$$);
-- the headers a peer sent are bounded the same way
SELECT try($$SELECT inbox.receive('im-9', 't', '{}', headers => jsonb_build_object('x', repeat('y', 2000)))$$);
SELECT inbox.receive('im-9h', 't', '{}', headers => jsonb_build_object('x', repeat('y', 900))) AS small_headers;
DELETE FROM inbox.messages WHERE id = 'im-9h';
RESET outbox.max_payload_size;
BEGIN READ ONLY;
SELECT try($$SELECT inbox.receive('im-9', 't', '{}')$$);
ROLLBACK;
SELECT count(*) AS none_stored FROM inbox.messages WHERE id = 'im-9';

-- handlers: one argument of type inbox.messages
CREATE FUNCTION handle_paid(m inbox.messages) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION handle_wrong(payload jsonb) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION handle_set(m inbox.messages) RETURNS SETOF int LANGUAGE sql AS $$ SELECT 1 $$;
CREATE PROCEDURE handle_proc(m inbox.messages) LANGUAGE sql AS $$ SELECT $$;
SELECT inbox.register_handler('order.*', 'handle_paid(inbox.messages)');
SELECT inbox.register_handler('order.paid', 'handle_paid(inbox.messages)', max_attempts => 3,
                              backoff_base_ms => 100, backoff_max_ms => 1000, ordered => true);
SELECT pattern, function, priority, max_attempts, backoff_base_ms, backoff_max_ms, ordered
  FROM inbox.handlers ORDER BY pattern;
-- the most specific pattern wins; NULL when nothing matches
SELECT (inbox.handler_for('order.paid')).pattern AS paid,
       (inbox.handler_for('order.shipped')).pattern AS shipped,
       (inbox.handler_for('user.created')).pattern IS NULL AS unmatched;
-- registering again replaces
SELECT inbox.register_handler('order.*', 'handle_paid(inbox.messages)', priority => 5);
SELECT (inbox.handler_for('order.paid')).pattern AS paid_by_priority;
SELECT try($$SELECT inbox.register_handler('x', 'handle_wrong(jsonb)')$$);
SELECT try($$SELECT inbox.register_handler('x', 'handle_set(inbox.messages)')$$);
SELECT try($$SELECT inbox.register_handler('x', 'handle_proc(inbox.messages)')$$);
SELECT try($$SELECT inbox.register_handler('x', 'no_such(inbox.messages)')$$);
SELECT try($$SELECT inbox.register_handler('', 'handle_paid(inbox.messages)')$$);
SELECT try($$SELECT inbox.register_handler('x', 'handle_paid(inbox.messages)', max_attempts => 0)$$);
SELECT try($$SELECT inbox.register_handler('x', 'handle_paid(inbox.messages)', backoff_base_ms => 5)$$);
SELECT try($$SELECT inbox.register_handler('x', 'handle_paid(inbox.messages)', backoff_base_ms => 500, backoff_max_ms => 100)$$);
SELECT try($$SELECT inbox.register_handler('x', NULL)$$);
-- direct writes get the same signature check
SELECT try($$INSERT INTO inbox.handlers (pattern, function) VALUES ('y', 'handle_wrong(jsonb)')$$);
SELECT try($$UPDATE inbox.handlers SET function = 'handle_wrong(jsonb)'$$);
SELECT try($$SELECT inbox.unregister_handler('nope')$$);
SELECT inbox.unregister_handler('order.paid');
SELECT pattern FROM inbox.handlers ORDER BY 1;

-- dead letters: redrive and purge only dead messages, 42704 for unknown ids
UPDATE inbox.messages SET status = 'dead', attempts = 3, finished_attempts = 2, last_error = 'boom' WHERE id IN ('im-3', 'im-4');
SELECT inbox.redrive('im-3');
SELECT id, status, attempts, finished_attempts FROM inbox.messages WHERE id = 'im-3';
SELECT inbox.purge('im-4');
SELECT count(*) AS purged FROM inbox.messages WHERE id = 'im-4';
SELECT try($$SELECT inbox.redrive('im-404')$$);
SELECT try($$SELECT inbox.purge('im-404')$$);
SELECT try($$SELECT inbox.redrive('im-1')$$);
SELECT try($$SELECT inbox.purge('im-1')$$);
-- a purged id can be received again: it is gone
SELECT inbox.receive('im-4', 'order.paid', '{}') AS received_after_purge;

SELECT type, pending, processed, dead FROM inbox.message_stats ORDER BY type;

-- the worker's lease (no relay runs here): due pending messages in received
-- order; for an ordered handler, not while an earlier message of the same
-- aggregate is pending (leased or waiting for a retry); dead ones do not
-- hold their aggregate back
DELETE FROM inbox.messages;
SELECT inbox.register_handler('step.*', 'handle_paid(inbox.messages)', ordered => true);
SELECT inbox.receive('s-a1', 'step.x', '{}', aggregate_id => 'A'),
       inbox.receive('s-a2', 'step.x', '{}', aggregate_id => 'A'),
       inbox.receive('s-b1', 'step.x', '{}', aggregate_id => 'B'),
       inbox.receive('s-n1', 'order.x', '{}', aggregate_id => 'A'),
       inbox.receive('s-n2', 'order.x', '{}', aggregate_id => 'A');
SELECT array_agg(id ORDER BY id) AS leased FROM inbox._lease(10, '1 hour');
SELECT array_agg(id ORDER BY id) AS leased_again FROM inbox._lease(10, '1 hour');
-- unordered handlers (order.*) were not held back by aggregate A; s-a1
-- is leased or waiting for its retry, so s-a2 still waits
SELECT array_agg(id ORDER BY id) AS while_a1_retries FROM inbox._lease(10, '1 hour');
UPDATE inbox.messages SET status = 'dead' WHERE id = 's-a1';
-- the lease that took s-a1 set s-a2 aside until that lease's end; the
-- worker, recording s-a1's death, makes it due again (release_plan in
-- src/worker/inbox_process.c; 040_inbox_handlers.pl runs it): here, as it
-- would
UPDATE inbox.messages SET next_attempt_at = received_at WHERE id = 's-a2';
SELECT array_agg(id ORDER BY id) AS after_a1_dead FROM inbox._lease(10, '1 hour');
SELECT id, attempts FROM inbox.messages ORDER BY seq;

-- a message waiting behind its aggregate's first pending message is set
-- aside until that message's retry (its next_attempt_at becomes the
-- retry's), more than a lease away (w-a2, w-a3) or not (w-c2, 0.5.2;
-- before, stepped over and left due): later leases do not walk it again;
-- a type whose handler is not ordered is not held back at all.
DELETE FROM inbox.messages;
SELECT inbox.receive('w-a1', 'step.x', '{}', aggregate_id => 'A'),
       inbox.receive('w-a2', 'step.x', '{}', aggregate_id => 'A'),
       inbox.receive('w-n1', 'order.x', '{}', aggregate_id => 'A'),
       inbox.receive('w-a3', 'step.x', '{}', aggregate_id => 'A'),
       inbox.receive('w-c1', 'step.x', '{}', aggregate_id => 'C'),
       inbox.receive('w-c2', 'step.x', '{}', aggregate_id => 'C');
UPDATE inbox.messages SET attempts = 2, next_attempt_at = now() + '1 day', last_error = 'boom'
 WHERE id = 'w-a1';
UPDATE inbox.messages SET attempts = 1, next_attempt_at = now() + '30 s', last_error = 'boom'
 WHERE id = 'w-c1';
SELECT array_agg(id ORDER BY id) AS leased FROM inbox._lease(10, '1 minute');
SELECT m.id, m.attempts,
       m.next_attempt_at = a1.next_attempt_at AS set_aside_to_a1_retry,
       m.next_attempt_at <= now() AS due
  FROM inbox.messages AS m, inbox.messages AS a1
 WHERE a1.id = 'w-a1'
 ORDER BY m.seq;
SELECT array_agg(id ORDER BY id) AS leased_again FROM inbox._lease(10, '1 minute');

-- the messages behind a first message that failed were set aside to the
-- end of its lease, and its retry comes after that: due before it, they
-- come first in the walk.  0.5.1 stepped over a batch of them and ended
-- the walk there, at every lease: neither the first message nor any
-- message due after them (here r-x1, of another aggregate) was leased
-- again, and the inbox stopped.  Now they are set aside to the retry;
-- once it is due the first message comes first (same time, lower seq),
-- and the others wait for a lease (its end makes the next one due at
-- once: release_plan in src/worker/inbox_process.c)
DELETE FROM inbox.messages;
SELECT inbox.receive('r-a1', 'step.x', '{}', aggregate_id => 'R');
SELECT count(inbox.receive('r-a' || i, 'step.x', '{}', aggregate_id => 'R'))
  FROM generate_series(2, 6) AS i;
SELECT inbox.receive('r-x1', 'step.x', '{}', aggregate_id => 'X');
UPDATE inbox.messages SET next_attempt_at = now() - interval '2 s'
 WHERE aggregate_id = 'R' AND id <> 'r-a1';
UPDATE inbox.messages SET attempts = 1, finished_attempts = 1, last_error = 'boom',
       next_attempt_at = now() + '5 s'
 WHERE id = 'r-a1';
UPDATE inbox.messages SET next_attempt_at = now() - interval '1 s' WHERE id = 'r-x1';
SELECT array_agg(id ORDER BY id) AS leased FROM inbox._lease(3, '10 s');
SELECT count(*) AS set_aside_to_the_retry
  FROM inbox.messages AS m, inbox.messages AS a1
 WHERE a1.id = 'r-a1' AND m.id <> 'r-a1' AND m.aggregate_id = 'R'
   AND m.next_attempt_at = a1.next_attempt_at;
-- the retry's time has come (every time of aggregate R an hour earlier)
UPDATE inbox.messages SET next_attempt_at = next_attempt_at - interval '1 hour'
 WHERE aggregate_id = 'R';
SELECT array_agg(id ORDER BY id) AS retry_due FROM inbox._lease(3, '10 s');
SELECT array_agg(id ORDER BY id) AS leased_again FROM inbox._lease(3, '10 s');

-- 20,000 messages of one aggregate behind a retry an hour away, next to
-- 2,000 of other aggregates: the first lease sets them aside, and twenty
-- leases take under a second here.  The lease that stepped over them
-- every time took 355 ms each (PostgreSQL 15, no JIT): the timeout fails
-- it.
DELETE FROM inbox.messages;
SELECT inbox.receive('p-head', 'step.x', '{}', aggregate_id => 'P');
UPDATE inbox.messages SET attempts = 3, next_attempt_at = now() + '1 hour', last_error = 'boom'
 WHERE id = 'p-head';
SELECT count(inbox.receive('p-' || i, 'step.x', '{}', aggregate_id => 'P'))
  FROM generate_series(1, 20000) AS i;
SELECT count(inbox.receive('q-' || i, 'step.x', '{}', aggregate_id => 'Q' || i))
  FROM generate_series(1, 2000) AS i;
ANALYZE inbox.messages;
SET jit = off;
SET statement_timeout = '5s';
CREATE FUNCTION pg_temp.twenty_leases() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint := 0;
BEGIN
    FOR i IN 1..20 LOOP
        n := n + (SELECT count(*) FROM inbox._lease(100, '10 s'));
    END LOOP;
    RETURN n;
END
$$;
SELECT pg_temp.twenty_leases() AS leased_in_twenty;
RESET statement_timeout;
RESET jit;
SELECT count(*) FILTER (WHERE next_attempt_at = (SELECT next_attempt_at FROM inbox.messages
                                                 WHERE id = 'p-head')
                                AND id <> 'p-head') AS set_aside,
       count(*) FILTER (WHERE attempts = 1) AS leased_once
  FROM inbox.messages;
DELETE FROM inbox.messages;
SELECT inbox.unregister_handler('step.*');

-- a message whose last attempt ended without a result (attempts above
-- finished_attempts: the worker died while its batch ran) is leased
-- alone, so the one that kills the worker takes no other message with it
-- again (0.5.1): after others it is stepped over, first it is the
-- lease's only message
SELECT count(inbox.receive('u-' || i, 'order.x', '{}')) FROM generate_series(1, 4) AS i;
UPDATE inbox.messages SET attempts = 1 WHERE id IN ('u-2', 'u-3');
SELECT array_agg(id ORDER BY id) AS first_lease FROM inbox._lease(10, '1 hour');
SELECT array_agg(id ORDER BY id) AS second_lease FROM inbox._lease(10, '1 hour');
SELECT array_agg(id ORDER BY id) AS third_lease FROM inbox._lease(10, '1 hour');
SELECT id, attempts, finished_attempts FROM inbox.messages ORDER BY seq;
DELETE FROM inbox.messages;

-- privileges: EXECUTE on receive() is the whole grant
CREATE ROLE regress_inbox_app;
CREATE ROLE regress_inbox_nobody;
GRANT USAGE ON SCHEMA inbox TO regress_inbox_app, regress_inbox_nobody;
GRANT EXECUTE ON FUNCTION inbox.receive(text, text, jsonb, text, jsonb, text) TO regress_inbox_app;
SET ROLE regress_inbox_app;
SELECT inbox.receive('priv-im-1', 'order.paid', '{}') AS app_can_receive;
SELECT inbox.receive('priv-im-1', 'order.paid', '{}') AS app_dedupes;
SELECT try($$SELECT * FROM inbox.messages$$);
SELECT try($$UPDATE inbox.messages SET status = 'processed'$$);
SELECT try($$INSERT INTO inbox.handlers (pattern, function) VALUES ('evil', 'handle_paid(inbox.messages)')$$);
SELECT try($$SELECT inbox.register_handler('evil', 'handle_paid(inbox.messages)')$$);
SELECT try($$SELECT inbox.redrive('im-1')$$);
SELECT try($$SELECT * FROM inbox._lease(10, '1 minute')$$);
RESET ROLE;
-- a role that may write inbox.handlers still cannot have another role's
-- function run as that role
GRANT INSERT ON inbox.handlers TO regress_inbox_app;
SET ROLE regress_inbox_app;
SELECT try($$INSERT INTO inbox.handlers (pattern, function) VALUES ('evil', 'handle_paid(inbox.messages)')$$);
RESET ROLE;
REVOKE INSERT ON inbox.handlers FROM regress_inbox_app;
SET ROLE regress_inbox_nobody;
SELECT try($$SELECT inbox.receive('priv-im-2', 'order.paid', '{}')$$);
RESET ROLE;
SELECT id FROM inbox.messages WHERE id LIKE 'priv-%' ORDER BY 1;
REVOKE ALL ON SCHEMA inbox FROM regress_inbox_app, regress_inbox_nobody;
REVOKE ALL ON FUNCTION inbox.receive(text, text, jsonb, text, jsonb, text) FROM regress_inbox_app;
DROP ROLE regress_inbox_app;
DROP ROLE regress_inbox_nobody;
DELETE FROM inbox.handlers;
DELETE FROM inbox.messages;
