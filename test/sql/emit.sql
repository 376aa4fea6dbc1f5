--
-- emit: events are written in the caller's transaction, and only there
--
INSERT INTO outbox.destinations (name, url) VALUES
    ('payments', 'http://127.0.0.1:9/payments'),
    ('audit', 'https://127.0.0.1:9/audit');
INSERT INTO outbox.routes (pattern, destination) VALUES ('payment.*', 'payments');

CREATE TABLE payments (id int PRIMARY KEY, amount numeric NOT NULL);

-- committed: state and event together
BEGIN;
INSERT INTO payments VALUES (1, 10);
SELECT outbox.emit('payment.created', '1', '{"amount": 10}') IS NOT NULL AS emitted;
COMMIT;

-- rolled back: neither
BEGIN;
INSERT INTO payments VALUES (2, 20);
SELECT outbox.emit('payment.created', '2', '{"amount": 20}') IS NOT NULL AS emitted;
ROLLBACK;

-- subtransaction rolled back: only its event disappears
BEGIN;
INSERT INTO payments VALUES (3, 30);
SELECT outbox.emit('payment.created', '3', '{"amount": 30}') IS NOT NULL AS emitted;
SAVEPOINT s1;
INSERT INTO payments VALUES (4, 40);
SELECT outbox.emit('payment.created', '4', '{"amount": 40}') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT s1;
COMMIT;

-- an exception block is a subtransaction too
DO $$
BEGIN
    PERFORM outbox.emit('payment.created', '5', '{"amount": 50}');
    RAISE EXCEPTION 'business rule failed';
EXCEPTION WHEN raise_exception THEN
    NULL;
END
$$;

SELECT p.id AS payment, e.type, e.aggregate_id, e.payload, e.destination,
       e.status, e.attempts, e.next_attempt_at = e.created_at AS due_now,
       e.published_at IS NULL AS unpublished
  FROM payments p FULL JOIN outbox.events e ON e.aggregate_id = p.id::text
 ORDER BY e.id;

-- the returned id is the row's id, a version-7 UUID
BEGIN;
CREATE TEMP TABLE ids AS
SELECT outbox.emit('payment.refunded', '1', '{"amount": 10}',
                   aggregate_type => 'payment') AS id;
SELECT e.type, e.aggregate_type, substr(i.id::text, 15, 1) AS version,
       substr(i.id::text, 20, 1) IN ('8', '9', 'a', 'b') AS rfc_variant
  FROM ids i JOIN outbox.events e USING (id);
COMMIT;

-- ids are time-ordered and strictly increasing within a session
BEGIN;
CREATE TEMP TABLE many AS
SELECT g, outbox.emit('bulk.created', g::text, jsonb_build_object('n', g)) AS id
  FROM generate_series(1, 500) g;
SELECT count(DISTINCT id) AS distinct_ids,
       bool_and(id > prev) AS increasing
  FROM (SELECT id, lag(id) OVER (ORDER BY g) AS prev FROM many) s;
ROLLBACK;

-- emit from a trigger: the event rides on the triggering statement
CREATE FUNCTION payments_emit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbox.emit('payment.' || lower(TG_OP), NEW.id::text, to_jsonb(NEW),
                        aggregate_type => 'payment');
    RETURN NEW;
END
$$;
CREATE TRIGGER payments_emit AFTER INSERT OR UPDATE ON payments
    FOR EACH ROW EXECUTE FUNCTION payments_emit();

INSERT INTO payments VALUES (6, 60);
UPDATE payments SET amount = 61 WHERE id = 6;
BEGIN;
INSERT INTO payments VALUES (7, 70);
ROLLBACK;
SELECT type, aggregate_id, payload, destination FROM outbox.events
 WHERE aggregate_type = 'payment' AND type <> 'payment.refunded' ORDER BY id;
DROP TRIGGER payments_emit ON payments;

-- optional arguments: destination, headers, traceparent, not_before
SELECT outbox.emit('note.added', NULL, '"free text"',
                   destination => 'audit',
                   headers => '{"X-Tenant": "acme", "x-request-id": "r-1"}',
                   traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
                   not_before => now() + interval '1 hour') IS NOT NULL AS emitted;
SELECT type, aggregate_id, payload, destination, headers, traceparent,
       next_attempt_at - created_at AS delay
  FROM outbox.events WHERE type = 'note.added';

-- a not_before in the past means now
SELECT outbox.emit('note.late', 'x', '{}', not_before => '2000-01-01') IS NOT NULL AS emitted;
SELECT next_attempt_at = created_at AS due_now FROM outbox.events WHERE type = 'note.late';

-- the traceparent can come from a transaction-local setting
BEGIN;
SET LOCAL outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT outbox.emit('traced.one', 'x', '{}') IS NOT NULL AS emitted;
-- the argument wins over the setting
SELECT outbox.emit('traced.two', 'x', '{}',
                   traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00') IS NOT NULL AS emitted;
COMMIT;
SELECT outbox.emit('traced.three', 'x', '{}') IS NOT NULL AS emitted;
SELECT type, traceparent FROM outbox.events WHERE type LIKE 'traced.%' ORDER BY id;

-- no route matches: stored without a destination, never dropped
SELECT outbox.emit('order.created', 'o-1', '{}') IS NOT NULL AS emitted;
SELECT type, destination, status FROM outbox.events WHERE type = 'order.created';

-- a read-only transaction cannot emit
BEGIN READ ONLY;
SELECT try($$SELECT outbox.emit('payment.created', '9', '{}')$$);
ROLLBACK;

-- emit works as a plain INSERT would under load from one statement
SELECT count(*) AS emitted FROM (
    SELECT outbox.emit('load.test', (g % 10)::text, '{}') FROM generate_series(1, 1000) g
) s;
SELECT count(*) AS stored, count(DISTINCT id) AS distinct_ids
  FROM outbox.events WHERE type = 'load.test';
