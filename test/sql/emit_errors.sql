--
-- emit_errors: every bad input is refused with a clear message and SQLSTATE,
-- and leaves no row behind
--
SELECT count(*) AS before FROM outbox.events \gset

-- type
SELECT try($$SELECT outbox.emit(NULL, '1', '{}')$$);
SELECT try($$SELECT outbox.emit('', '1', '{}')$$);
SELECT try($$SELECT outbox.emit(repeat('t', 256), '1', '{}')$$);
SELECT try($$SELECT outbox.emit(E'payment\r\ncreated', '1', '{}')$$);

-- aggregate id and type
SELECT try($$SELECT outbox.emit('payment.created', '', '{}')$$);
SELECT try($$SELECT outbox.emit('payment.created', repeat('a', 1025), '{}')$$);
SELECT try($$SELECT outbox.emit('payment.created', E'a\nb', '{}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', aggregate_type => '')$$);

-- payload
SELECT try($$SELECT outbox.emit('payment.created', '1', NULL)$$);
SET outbox.max_payload_size = '2kB';
SELECT try($$SELECT outbox.emit('payment.created', '1',
                   jsonb_build_object('blob', repeat('x', 3000)))$$);
-- a large payload that compresses well is measured by its real size
SELECT try($$SELECT outbox.emit('payment.created', '1',
                   (SELECT jsonb_build_object('blob', repeat('x', 100000))))$$);
SELECT try($$SELECT outbox.emit('payment.created', '1',
                   jsonb_build_object('blob', repeat('x', 1000)))$$);
RESET outbox.max_payload_size;
-- the cap is a superuser setting
CREATE ROLE regress_outbox_plain;
SET ROLE regress_outbox_plain;
SELECT try($$SET outbox.max_payload_size = '1GB'$$);
RESET ROLE;
DROP ROLE regress_outbox_plain;

-- destination
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', destination => 'nowhere')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', destination => '')$$);

-- headers
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '[1, 2]')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '"x"')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '{"X-Num": 1}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '{"bad name": "v"}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '{"X-Evil": "a\r\nHost: evil"}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '{"Content-Length": "5"}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '{"ce-id": "forged"}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', headers => '{"Webhook-Signature": "v1,x"}')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   headers => (SELECT jsonb_object_agg('x-h' || g, 'v') FROM generate_series(1, 65) g))$$);

-- traceparent
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', traceparent => 'garbage')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => '00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => '00-00000000000000000000000000000000-b7ad6b7169203331-01')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra')$$);
SELECT try($$SET outbox.traceparent = 'not-a-traceparent'$$);
-- a future version may carry more fields (visible ASCII, not parsed):
-- nothing that would split the header line it becomes, nor anything over
-- 512 characters
SELECT try($$SELECT outbox.emit('payment.created', 'future', '{}',
                   traceparent => '01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra')$$);
SELECT try($$SELECT outbox.emit('payment.created', 'future', '{}',
                   traceparent => '01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-00AB_cd.x')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => E'01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\r\nX-Injected: 1')$$);
SELECT left(try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => '01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-' || repeat('a', 457))$$), 30);
SELECT try($$SELECT outbox.emit('payment.created', 'future', '{}',
                   traceparent => '01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-' || repeat('a', 456))$$);
SELECT try($$SET outbox.traceparent = E'01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\r\nX: y'$$);
-- the refused value is quoted escaped and cut: an escape sequence in it
-- reached the client's error and the server log as it was, and all of it
SELECT strpos(m, chr(27)) = 0 AS no_escape_byte, strpos(m, chr(13)) = 0 AS no_carriage_return,
       right(m, 12) AS shown
  FROM try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => E'01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\r\x1b[2J')$$) AS m;
SELECT length(try($$SELECT outbox.emit('payment.created', '1', '{}',
                   traceparent => '01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-' || repeat('a', 2000))$$))
       < 200 AS cut;

-- not_before
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', not_before => 'infinity')$$);
SELECT try($$SELECT outbox.emit('payment.created', '1', '{}', not_before => '-infinity')$$);

-- only the two valid calls above left rows
SELECT count(*) - :before AS new_rows FROM outbox.events;

-- a constraint violated by emit()'s direct insert is reported as that
-- violation (from 16 on the message needs the range table's permission
-- entry; without one it would be an internal error, XX000)
BEGIN;
ALTER TABLE outbox.log_0 ADD CONSTRAINT events_regress_check
    CHECK (aggregate_id <> 'forbidden');
ALTER TABLE outbox.log_1 ADD CONSTRAINT events_regress_check
    CHECK (aggregate_id <> 'forbidden');
ALTER TABLE outbox.log_2 ADD CONSTRAINT events_regress_check
    CHECK (aggregate_id <> 'forbidden');
SELECT try($$SELECT outbox.emit('payment.created', 'forbidden', '{}')$$) LIKE '23514: %' AS check_violation;
ROLLBACK;
