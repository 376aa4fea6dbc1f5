# The full inbox with the real worker: received messages run through their
# handlers exactly once (handler writes and the processed mark commit
# together), as the handler function's owner; a failing handler retries
# with backoff and is dead-lettered without holding up other messages;
# ordered handlers keep the received order per aggregate; retention removes
# old processed messages and expired claims and never anything pending or
# dead; a hanging handler is cancelled by the handler timeout; receive()
# wakes the worker at commit; a retention below the redelivery window is
# overridden loudly.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = new_outbox_node('inbox', qq{
outbox.redelivery_window = '2s'
outbox.inbox_retention = '3s'
outbox.inbox_handler_timeout = '1s'
});
$node->start;

$node->safe_psql('postgres', q{
	CREATE EXTENSION outbox_pg;
	CREATE ROLE regress_inbox_owner;
	CREATE TABLE public.ledger (message_id text PRIMARY KEY, amount int NOT NULL,
	                            run_as text NOT NULL);
	ALTER TABLE public.ledger OWNER TO regress_inbox_owner;
	CREATE TABLE public.seq_log (n bigserial PRIMARY KEY, aggregate_id text, message_id text);
	ALTER TABLE public.seq_log OWNER TO regress_inbox_owner;

	-- writes its effect, then fails for payloads that say so: the write
	-- must vanish with the failure
	CREATE FUNCTION public.apply_payment(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.ledger VALUES (m.id, (m.payload ->> 'amount')::int, current_user);
	    IF (m.payload ->> 'fail')::boolean THEN
	        RAISE EXCEPTION 'payment % refused', m.id;
	    END IF;
	END
	$$;
	ALTER FUNCTION public.apply_payment(inbox.messages) OWNER TO regress_inbox_owner;

	CREATE FUNCTION public.apply_step(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    IF m.attempts < coalesce((m.payload ->> 'fail_until')::int, 0) THEN
	        RAISE EXCEPTION 'not yet';
	    END IF;
	    INSERT INTO public.seq_log (aggregate_id, message_id) VALUES (m.aggregate_id, m.id);
	END
	$$;
	ALTER FUNCTION public.apply_step(inbox.messages) OWNER TO regress_inbox_owner;

	SELECT inbox.register_handler('payment.*', 'public.apply_payment(inbox.messages)',
	                              max_attempts => 3, backoff_base_ms => 400, backoff_max_ms => 800);
	SELECT inbox.register_handler('step.*', 'public.apply_step(inbox.messages)',
	                              max_attempts => 5, backoff_base_ms => 300, backoff_max_ms => 300,
	                              ordered => true);
});

ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'a relay worker runs for the database');

# --- processing, exactly once, as the function's owner; failures isolated
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT inbox.receive('pay-bad', 'payment.created', '{"amount": 1, "fail": true}');
	SELECT inbox.receive('pay-' || g, 'payment.created', jsonb_build_object('amount', g))
	  FROM generate_series(1, 50) g;
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 50 FROM inbox.messages WHERE id LIKE 'pay-%' AND status = 'processed'}),
	'every good message is processed while the failing one retries');
is($node->safe_psql('postgres', q{
	SELECT count(*) || ' ' || count(DISTINCT message_id) || ' ' || sum(amount)
	  FROM public.ledger WHERE message_id <> 'pay-bad'}),
	'50 50 1275', 'each handler write happened exactly once');
is($node->safe_psql('postgres', q{SELECT DISTINCT run_as FROM public.ledger}),
	'regress_inbox_owner', 'the handler ran as the owner of its function, not as the superuser worker');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM inbox.messages
	 WHERE id LIKE 'pay-%' AND id <> 'pay-bad'
	   AND (attempts <> 1 OR processed_at IS NULL OR last_error IS NOT NULL)}),
	'0', 'processed messages: one attempt, processed_at set, no error');

# the failing one: retried with backoff, then dead
my $first = $node->safe_psql('postgres', q{
	SELECT status, attempts, last_error,
	       next_attempt_at - received_at >= interval '200 ms'
	  FROM inbox.messages WHERE id = 'pay-bad'});
like($first, qr/^(pending\|[12]\|P0001: payment pay-bad refused\|t|dead\|3\|.*)$/,
	'a failure records the error and schedules the retry after the backoff');
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' FROM inbox.messages WHERE id = 'pay-bad'}),
	'the failing message is dead-lettered');
is($node->safe_psql('postgres', q{
	SELECT attempts || ' ' || last_error FROM inbox.messages WHERE id = 'pay-bad'}),
	'3 P0001: payment pay-bad refused', 'after max_attempts, with the last error');
is($node->safe_psql('postgres', q{SELECT count(*) FROM public.ledger WHERE message_id = 'pay-bad'}),
	'0', 'the failed handler\'s writes were rolled back every time');
is($node->safe_psql('postgres', q{SELECT dead FROM inbox.message_stats WHERE type = 'payment.created'}),
	'1', 'dead letters are visible in inbox.message_stats');

# a duplicate delivery of a processed message is refused and not run again
is($node->safe_psql('postgres', q{SELECT inbox.receive('pay-7', 'payment.created', '{"amount": 7}')}),
	'f', 'a redelivered processed message is a duplicate');

# redrive after fixing the cause: processed once
$node->safe_psql('postgres', q{
	CREATE OR REPLACE FUNCTION public.apply_payment(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.ledger VALUES (m.id, (m.payload ->> 'amount')::int, current_user);
	END
	$$;
	SELECT inbox.redrive('pay-bad');
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'pay-bad'}),
	'a redriven dead letter is processed');
is($node->safe_psql('postgres', q{SELECT count(*) FROM public.ledger WHERE message_id = 'pay-bad'}),
	'1', 'exactly once');

# --- failures in the middle of a batch: the messages of a batch share a
# subtransaction, split where a handler fails; the ones before the failing
# one run again (their first writes rolled back with it), the ones after it
# go on.  A handler that does not answer the same twice (flaky: every third
# call fails) fails in the rerun too.  Every good message's writes exactly
# once, none of a failed attempt's, and no good message pays another
# attempt for a neighbour's failure.
$node->safe_psql('postgres', q{
	CREATE TABLE public.mix_log (message_id text NOT NULL, n int NOT NULL);
	ALTER TABLE public.mix_log OWNER TO regress_inbox_owner;
	CREATE SEQUENCE public.flaky_calls;
	ALTER SEQUENCE public.flaky_calls OWNER TO regress_inbox_owner;
	CREATE FUNCTION public.apply_mix(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.mix_log VALUES (m.id, (m.payload ->> 'n')::int);
	    IF m.type = 'mix.bad' THEN
	        RAISE EXCEPTION 'mix % refused', m.id;
	    END IF;
	    IF (m.payload ->> 'flaky')::boolean
	       AND pg_catalog.nextval('public.flaky_calls') % 3 = 0 THEN
	        RAISE EXCEPTION 'flaky %', m.id;
	    END IF;
	END
	$$;
	ALTER FUNCTION public.apply_mix(inbox.messages) OWNER TO regress_inbox_owner;
	SELECT inbox.register_handler('mix.*', 'public.apply_mix(inbox.messages)',
	                              max_attempts => 30, backoff_base_ms => 50, backoff_max_ms => 100);
	SELECT inbox.register_handler('mix.bad', 'public.apply_mix(inbox.messages)',
	                              max_attempts => 1);
	BEGIN;
	SELECT inbox.receive('mix-' || g,
	                     CASE WHEN g IN (5, 6, 40, 80) THEN 'mix.bad' ELSE 'mix.ok' END,
	                     jsonb_build_object('n', g, 'flaky', g % 4 = 0 AND g NOT IN (40, 80)))
	  FROM generate_series(1, 80) g;
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) FILTER (WHERE type = 'mix.ok' AND status = 'processed') = 76
	   AND count(*) FILTER (WHERE type = 'mix.bad' AND status = 'dead') = 4
	  FROM inbox.messages WHERE id LIKE 'mix-%'}),
	'a batch with failures in its middle: the good messages processed, the failing ones dead');
is($node->safe_psql('postgres', q{
	SELECT count(*) || ' ' || count(DISTINCT message_id) || ' ' || sum(n)
	  FROM public.mix_log}),
	'76 76 ' . (3240 - 5 - 6 - 40 - 80), 'each good message\'s writes once, no failed attempt\'s');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM inbox.messages
	 WHERE type = 'mix.ok' AND NOT (payload ->> 'flaky')::boolean AND attempts <> 1}),
	'0', 'a neighbour\'s failure cost no good message an attempt');
ok($node->safe_psql('postgres', q{
	SELECT count(*) FROM inbox.messages
	 WHERE type = 'mix.ok' AND (payload ->> 'flaky')::boolean AND attempts > 1}) > 0,
	'the flaky handler failed some attempts (the path is exercised)');
is($node->safe_psql('postgres', q{
	SELECT string_agg(last_error, ',' ORDER BY seq) FROM inbox.messages WHERE type = 'mix.bad'}),
	'P0001: mix mix-5 refused,P0001: mix mix-6 refused,P0001: mix mix-40 refused,P0001: mix mix-80 refused',
	'each failing message has its own error');
$node->safe_psql('postgres', q{
	SELECT inbox.purge(id) FROM inbox.messages WHERE type = 'mix.bad';
	SELECT inbox.unregister_handler('mix.bad');
	SELECT inbox.unregister_handler('mix.*');
});

# --- ordered per aggregate: a1 fails twice; a2, a3 wait for it; b does not
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT inbox.receive('a1', 'step.done', '{"fail_until": 3}', aggregate_id => 'A');
	SELECT inbox.receive('a2', 'step.done', '{}', aggregate_id => 'A');
	SELECT inbox.receive('b1', 'step.done', '{}', aggregate_id => 'B');
	SELECT inbox.receive('a3', 'step.done', '{}', aggregate_id => 'A');
	SELECT inbox.receive('b2', 'step.done', '{}', aggregate_id => 'B');
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 5 FROM inbox.messages WHERE type = 'step.done' AND status = 'processed'}),
	'ordered messages are all processed');
is($node->safe_psql('postgres', q{
	SELECT string_agg(message_id, ',' ORDER BY n) FROM public.seq_log WHERE aggregate_id = 'A'}),
	'a1,a2,a3', 'aggregate A in received order although its first message was retried');
is($node->safe_psql('postgres', q{
	SELECT string_agg(message_id, ',' ORDER BY n) FROM public.seq_log WHERE aggregate_id = 'B'}),
	'b1,b2', 'aggregate B in received order');
is($node->safe_psql('postgres', q{
	SELECT (SELECT n FROM public.seq_log WHERE message_id = 'b2')
	     < (SELECT n FROM public.seq_log WHERE message_id = 'a1')}),
	't', 'aggregate B was not held up by aggregate A');
is($node->safe_psql('postgres', q{SELECT attempts FROM inbox.messages WHERE id = 'a1'}),
	'3', 'the first message of A took three attempts');

# --- messages behind a retry more than a lease away are set aside until
# it (their next_attempt_at becomes its), so the lease stops walking them;
# when an operator moves that retry forward and the message is processed,
# they are due again at once and keep their order
$node->safe_psql('postgres', q{
	SELECT inbox.register_handler('hold.*', 'public.apply_step(inbox.messages)',
	                              backoff_base_ms => 3600000, backoff_max_ms => 3600000,
	                              ordered => true);
	SELECT inbox.receive('c1', 'hold.step', '{"fail_until": 2}', aggregate_id => 'C');
});
ok($node->poll_query_until('postgres', q{
	SELECT attempts = 1 AND next_attempt_at > now() + interval '30 minutes'
	  FROM inbox.messages WHERE id = 'c1'}),
	'set aside: the first message of C failed, its retry an hour away');
$node->safe_psql('postgres', q{
	SELECT inbox.receive('c-' || g, 'hold.step', '{}', aggregate_id => 'C')
	  FROM generate_series(1, 200) g;
	SELECT inbox.receive('d1', 'hold.step', '{}', aggregate_id => 'D');
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'd1'}),
	'set aside: another aggregate is processed');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 200 FROM inbox.messages
	 WHERE id LIKE 'c-%' AND attempts = 0
	   AND next_attempt_at = (SELECT next_attempt_at FROM inbox.messages WHERE id = 'c1')}),
	'set aside: the 200 messages behind it wait for its retry, unattempted');
# One message of an aggregate per batch, and the next batch at once: a
# batch that was not full used to wait for the next wake-up or poll, and
# these 201 messages took 46 s.  They take 0.2-0.6 s now; the bound is 20.
my $t0 = time;
$node->safe_psql('postgres', q{UPDATE inbox.messages SET next_attempt_at = now() WHERE id = 'c1'});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 201 FROM public.seq_log WHERE aggregate_id = 'C'}),
	'set aside: processed once the operator moved the retry forward, not an hour later');
my $took = time - $t0;
cmp_ok($took, '<', 20, sprintf('set aside: the 201 messages of one aggregate in %.1f s', $took));
is($node->safe_psql('postgres', q{
	SELECT string_agg(message_id, ',' ORDER BY n) = 'c1,' || (SELECT string_agg('c-' || g, ',' ORDER BY g)
	                                                              FROM generate_series(1, 200) g)
	  FROM public.seq_log WHERE aggregate_id = 'C'}),
	't', 'set aside: aggregate C in received order');

# One aggregate's burst: 2,000 messages received at once go one after the
# other, each made due by the one before it.  The lease used to step over
# the whole rest of the burst for each message (and the next batch waited
# for the next wake-up or poll).
$t0 = time;
$node->safe_psql('postgres', q{
	SELECT inbox.receive('hot-' || g, 'hold.step', '{}', aggregate_id => 'HOT')
	  FROM generate_series(1, 2000) g;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2000 FROM public.seq_log WHERE aggregate_id = 'HOT'}),
	'burst: 2,000 messages of one aggregate processed');
$took = time - $t0;
cmp_ok($took, '<', 60, sprintf('burst: in %.1f s', $took));
is($node->safe_psql('postgres', q{
	SELECT bool_and(ok) FROM (
	    SELECT message_id = 'hot-' || row_number() OVER (ORDER BY n) AS ok
	      FROM public.seq_log WHERE aggregate_id = 'HOT') AS s}),
	't', 'burst: in received order');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM inbox.messages WHERE aggregate_id = 'HOT' AND attempts <> 1}),
	'0', 'burst: each message attempted once');
$node->safe_psql('postgres', q{SELECT inbox.unregister_handler('hold.*')});

# --- a message no handler matches waits, with the reason recorded, and
# uses none of its attempts: a handler registered late gets all of them.
# Until 0.5.1 each look counted, and a handler registered after more looks
# than its max_attempts dead-lettered the message without running.
$node->safe_psql('postgres', q{SELECT inbox.receive('orphan-1', 'unknown.type', '{}')});
ok($node->poll_query_until('postgres', q{
	SELECT last_error = 'no inbox handler matches message type "unknown.type"' AND status = 'pending'
	  FROM inbox.messages WHERE id = 'orphan-1'}),
	'a message without handler stays pending with the reason');
$node->safe_psql('postgres', q{SELECT inbox.receive('late-1', 'late.type', '{"amount": 6}')});
ok($node->poll_query_until('postgres', q{
	SELECT last_error IS NOT NULL FROM inbox.messages WHERE id = 'late-1'}),
	'late handler: the message was looked at without one');
is($node->safe_psql('postgres', q{
	SELECT attempts || ' ' || finished_attempts || ' ' || status FROM inbox.messages WHERE id = 'late-1'}),
	'0 0 pending', 'late handler: no attempt used');
$node->safe_psql('postgres', q{
	SELECT inbox.register_handler('late.*', 'public.apply_payment(inbox.messages)', max_attempts => 1)});
ok($node->poll_query_until('postgres', q{
	SELECT status <> 'pending' FROM inbox.messages WHERE id = 'late-1'}),
	'late handler: the message is settled');
is($node->safe_psql('postgres', q{
	SELECT status || ' ' || attempts || ' ' || coalesce(last_error, '-') FROM inbox.messages WHERE id = 'late-1'}),
	'processed 1 -', 'late handler: its handler ran, in its one attempt');
$node->safe_psql('postgres', q{SELECT inbox.unregister_handler('late.*')});

# a message that has waited an hour for a handler is dead-lettered, loudly,
# once two looks in a row found none: an hour-old message the inbox had
# not looked at yet gets a wait first
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT inbox.receive('stale-1', 'stale.type', '{}');
	SELECT inbox.receive('stale-2', 'stale.type', '{}');
	UPDATE inbox.messages SET received_at = now() - interval '61 minutes'
	 WHERE id IN ('stale-1', 'stale-2');
	UPDATE inbox.messages SET last_error = 'no inbox handler matches message type "stale.type"'
	 WHERE id = 'stale-1';
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' FROM inbox.messages WHERE id = 'stale-1'}),
	'a message without handler for an hour is dead-lettered');
ok($node->wait_for_log(qr/inbox message "stale-1" is dead: no handler matched its type for an hour/,
	$log_offset), 'and it is logged');
is($node->safe_psql('postgres', q{SELECT attempts FROM inbox.messages WHERE id = 'stale-1'}), '0',
	'with no attempt used');
is($node->safe_psql('postgres', q{
	SELECT status || ' ' || attempts || ' ' || (last_error IS NOT NULL) || ' ' ||
	       (next_attempt_at > now() + interval '4 minutes')
	  FROM inbox.messages WHERE id = 'stale-2'}),
	'pending 0 true true', 'one as old that no look had missed yet waits for the next look, minutes away');
$node->safe_psql('postgres', q{
	SELECT inbox.purge('stale-1');
	DELETE FROM inbox.messages WHERE id = 'stale-2';
});

# --- a handler registered again with fewer attempts than a message has
# had: dead without running, and said so (it read "attempt 1 of 1 ended
# without a result", which it had not)
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.refuse(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '% refused', m.id; END $$;
	SELECT inbox.register_handler('lower.*', 'public.refuse(inbox.messages)',
	                              max_attempts => 3, backoff_base_ms => 60000, backoff_max_ms => 60000);
	SELECT inbox.receive('lower-1', 'lower.x', '{}');
});
ok($node->poll_query_until('postgres', q{
	SELECT attempts = 1 AND last_error = 'P0001: lower-1 refused' FROM inbox.messages WHERE id = 'lower-1'}),
	'lower: the message failed once');
$node->safe_psql('postgres', q{
	SELECT inbox.register_handler('lower.*', 'public.refuse(inbox.messages)', max_attempts => 1);
	UPDATE inbox.messages SET next_attempt_at = now() WHERE id = 'lower-1';
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' FROM inbox.messages WHERE id = 'lower-1'}),
	'lower: dead once its handler allows fewer attempts');
is($node->safe_psql('postgres', q{SELECT attempts || ' ' || last_error FROM inbox.messages WHERE id = 'lower-1'}),
	'1 no attempt left: the message has had 1, and its handler allows 1',
	'lower: and says why, charged only the attempt that ran');
$node->safe_psql('postgres', q{
	SELECT inbox.purge('lower-1');
	SELECT inbox.unregister_handler('lower.*');
});

# --- a handler that hangs is cancelled by outbox.inbox_handler_timeout and
# counts as a failed attempt; the worker goes on
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.hang(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_catalog.pg_sleep(30); END $$;
	SELECT inbox.register_handler('hang.*', 'public.hang(inbox.messages)', max_attempts => 1);
	SELECT inbox.receive('hang-1', 'hang.now', '{}');
	SELECT inbox.receive('after-hang', 'payment.created', '{"amount": 3}');
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' FROM inbox.messages WHERE id = 'hang-1'}),
	'a hanging handler is cancelled and, out of attempts, dead-lettered');
is($node->safe_psql('postgres', q{SELECT last_error FROM inbox.messages WHERE id = 'hang-1'}),
	'57014: canceling statement due to statement timeout', 'the timeout is the recorded error');
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'after-hang'}),
	'the next message is processed');
$node->safe_psql('postgres', q{SELECT inbox.purge('hang-1')});

# --- a handler error longer than the stored bound, in multibyte
# characters, is cut between characters: the row stays valid text, so a
# dump of it restores (convert_from verifies the bytes)
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.shout(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN RAISE EXCEPTION '%', pg_catalog.repeat('€', 700); END $$;
	SELECT inbox.register_handler('shout.*', 'public.shout(inbox.messages)', max_attempts => 1);
	SELECT inbox.receive('shout-1', 'shout.now', '{}');
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' FROM inbox.messages WHERE id = 'shout-1'}),
	'a handler with a long multibyte error is dead-lettered');
is($node->safe_psql('postgres', q{
	SELECT pg_catalog.convert_from(pg_catalog.convert_to(last_error, 'UTF8'), 'UTF8') = last_error
	       AND pg_catalog.octet_length(last_error) BETWEEN 900 AND 1007
	       AND last_error LIKE 'P0001: €%€'
	  FROM inbox.messages WHERE id = 'shout-1'}),
	't', 'its stored error is cut between characters');
$node->safe_psql('postgres', q{SELECT inbox.purge('shout-1')});

# --- retention: processed messages after outbox.inbox_retention, expired
# claims; pending and dead messages stay
$node->safe_psql('postgres', q{
	SELECT inbox.claim('claim-short', ttl => '2s');
	SELECT inbox.claim('claim-long', ttl => '1 hour');
	BEGIN;
	SELECT inbox.receive('keep-dead', 'unknown.type', '{}');
	UPDATE inbox.messages SET status = 'dead' WHERE id = 'keep-dead';
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT NOT EXISTS (SELECT FROM inbox.messages WHERE status = 'processed')
	   AND NOT EXISTS (SELECT FROM inbox.claims WHERE message_id = 'claim-short')}),
	'processed messages and expired claims are deleted after their retention');
is($node->safe_psql('postgres', q{
	SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM inbox.messages}),
	'keep-dead:dead,orphan-1:pending', 'pending and dead messages are never deleted');
is($node->safe_psql('postgres', q{SELECT string_agg(message_id, ',') FROM inbox.claims}),
	'claim-long', 'unexpired claims stay');

# a processed message is kept for the retention, not deleted at once
$node->safe_psql('postgres', q{SELECT inbox.receive('keep-1', 'payment.created', '{"amount": 1}')});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'keep-1'}), 'processed');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM inbox.messages WHERE id = 'keep-1'
	   AND processed_at > now() - interval '3 s'}),
	'1', 'still there while younger than the retention');

# --- below the safe floor: overridden, loudly
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET outbox.inbox_retention = '1s';
	SELECT pg_reload_conf();
});
ok($node->wait_for_log(qr/outbox\.inbox_retention \(1 s\) is shorter than outbox\.redelivery_window \(2 s\); processed inbox messages are kept for 2 s/,
	$log_offset), 'a retention below the redelivery window is overridden, and logged');

# --- a handler that writes to a table with a DEFERRABLE INITIALLY DEFERRED
# foreign key (Django makes every one so): PostgreSQL refuses to queue a
# deferred trigger in the handler's security-restricted context, and every
# such message failed with 42501; the worker checks constraints at the end
# of each of the handler's statements instead
$node->safe_psql('postgres', q{
	CREATE TABLE public.accounts (id text PRIMARY KEY);
	CREATE TABLE public.entries (message_id text PRIMARY KEY,
		account text NOT NULL REFERENCES public.accounts DEFERRABLE INITIALLY DEFERRED);
	INSERT INTO public.accounts VALUES ('acc-1');
	CREATE FUNCTION public.book(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.entries VALUES (m.id, m.payload ->> 'account');
	END $$;
	SELECT inbox.register_handler('book.*', 'public.book(inbox.messages)', max_attempts => 1);
	SELECT inbox.receive('book-1', 'book.entry', '{"account": "acc-1"}');
	SELECT inbox.receive('book-2', 'book.entry', '{"account": "nobody"}');
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM inbox.messages WHERE id IN ('book-1', 'book-2') AND status <> 'pending'}),
	'deferred foreign key: both messages are settled');
is($node->safe_psql('postgres', q{
	SELECT string_agg(id || ' ' || status || ' ' || coalesce(left(last_error, 5), '-'), ', ' ORDER BY id)
	  FROM inbox.messages WHERE id IN ('book-1', 'book-2')}),
	'book-1 processed -, book-2 dead 23503',
	'the one that keeps the key is processed, the one that breaks it fails on the key');
is($node->safe_psql('postgres', q{SELECT string_agg(message_id, ',') FROM public.entries}), 'book-1',
	'and only its write is kept');

# --- a handler that kills its worker never reports back: the lease
# counted the attempt, and a message leased beyond its max_attempts is
# dead-lettered without running its handler again.  It ran after every
# lease, for ever, and killed the worker each time.
$node->safe_psql('postgres', q{
	CREATE SEQUENCE public.kill_calls;
	CREATE FUNCTION public.kill_me(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    PERFORM nextval('public.kill_calls');
	    PERFORM pg_terminate_backend(pg_backend_pid());
	    PERFORM pg_sleep(5);
	END $$;
	SELECT inbox.register_handler('kill.*', 'public.kill_me(inbox.messages)', max_attempts => 3);
	CREATE TABLE public.mates (message_id text PRIMARY KEY, attempts int NOT NULL);
	ALTER TABLE public.mates OWNER TO regress_inbox_owner;
	CREATE FUNCTION public.record_mate(m inbox.messages) RETURNS void
	LANGUAGE sql AS $$ INSERT INTO public.mates VALUES (m.id, m.attempts) $$;
	ALTER FUNCTION public.record_mate(inbox.messages) OWNER TO regress_inbox_owner;
	SELECT inbox.register_handler('mate.*', 'public.record_mate(inbox.messages)', max_attempts => 3);
	BEGIN;
	SELECT inbox.receive('kill-1', 'kill.now', '{}');
	SELECT inbox.receive('kill-mate-' || g, 'mate.now', '{}') FROM generate_series(1, 20) g;
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' FROM inbox.messages WHERE id = 'kill-1'}),
	'a handler that kills its worker: dead-lettered once out of attempts');
is($node->safe_psql('postgres', q{
	SELECT attempts || ' ' || last_error FROM inbox.messages WHERE id = 'kill-1'}),
	'4 attempt 3 of 3 ended without a result: the worker stopped, or its transaction failed, while the message was being processed',
	'it says why');
is($node->safe_psql('postgres', q{SELECT last_value FROM public.kill_calls}), '3',
	'its handler ran max_attempts times');
# the messages leased with it were charged the first death only: after it
# each message is leased alone (0.5.1).  Before, they were leased with it
# again at every lease and dead-lettered with it (max_attempts 3 each).
# (Processed messages go by retention within seconds here: the handler's
# table keeps what it saw.)
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 20 FROM public.mates}),
	'the messages of its batch are processed');
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT attempts::text, ',') || ' ' ||
	       (SELECT count(*) FROM inbox.messages WHERE id LIKE 'kill-mate-%' AND status <> 'processed')
	  FROM public.mates}),
	'2 0', 'each in its second attempt: charged one attempt for the death');
$node->safe_psql('postgres', q{
	SELECT inbox.purge('kill-1');
	SELECT inbox.unregister_handler('kill.*');
	SELECT inbox.unregister_handler('mate.*');
	SELECT inbox.receive('after-kill', 'payment.created', '{"amount": 4}');
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'after-kill'}),
	'the next message is processed');

# --- retention whose deletion of messages fails (an application trigger on
# inbox.messages): logged, and the expired claims are deleted all the same
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.keep_messages() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN RAISE EXCEPTION 'messages are kept'; END $$;
	CREATE TRIGGER keep_messages BEFORE DELETE ON inbox.messages
		FOR EACH ROW EXECUTE FUNCTION public.keep_messages();
	SELECT inbox.claim('claim-kept', ttl => '2s');
});
ok($node->wait_for_log(qr/outbox_pg deletion of processed inbox messages failed: messages are kept/,
	$log_offset), 'the failed deletion is logged');
ok($node->poll_query_until('postgres', q{
	SELECT NOT EXISTS (SELECT FROM inbox.claims WHERE message_id = 'claim-kept')}),
	'expired claims are deleted meanwhile');
$node->safe_psql('postgres', q{SELECT inbox.receive('while-kept', 'payment.created', '{"amount": 5}')});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'while-kept'}),
	'and messages are processed');
$node->safe_psql('postgres', q{DROP TRIGGER keep_messages ON inbox.messages});

# --- a handler's SET CONSTRAINTS ALL DEFERRED ends with it: the mode is
# transaction state that its settings' rollback does not restore, and the
# next handler of the batch that wrote to a table with a deferrable foreign
# key failed (42501)
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.defer_all(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    SET CONSTRAINTS ALL DEFERRED;
	END $$;
	SELECT inbox.register_handler('defer.*', 'public.defer_all(inbox.messages)', max_attempts => 1);
	BEGIN;
	SELECT inbox.receive('defer-1', 'defer.all', '{}');
	SELECT inbox.receive('book-3', 'book.entry', '{"account": "acc-1"}');
	COMMIT;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM inbox.messages WHERE id IN ('defer-1', 'book-3') AND status <> 'pending'}),
	'SET CONSTRAINTS in a handler: both messages are settled');
is($node->safe_psql('postgres', q{
	SELECT string_agg(id || ' ' || status || ' ' || coalesce(left(last_error, 5), '-'), ', ' ORDER BY id)
	  FROM inbox.messages WHERE id IN ('defer-1', 'book-3')}),
	'book-3 processed -, defer-1 processed -',
	'the next handler of the batch is not deferred by it');

# --- a dead message's id and error reach the server log escaped: a handler
# error quoting the payload (a carriage return and an escape sequence in
# it) cannot rewrite the log line on a terminal
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.quote_payload(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    RAISE EXCEPTION 'bad amount: %', m.payload ->> 'a';
	END $$;
	SELECT inbox.register_handler('quote.*', 'public.quote_payload(inbox.messages)', max_attempts => 1);
	SELECT inbox.receive('quote-1' || chr(8238), 'quote.it', '{"a": "x\r\u001b[31mred"}');
});
ok($node->wait_for_log(qr/inbox message "quote-1\\u202E" is dead after 1 attempts/i, $log_offset),
	'the dead message is logged, its id escaped');
my $logged = slurp_file($node->logfile, $log_offset);
ok($logged =~ /bad amount: x\\r\\x1B\[31mred/i && $logged !~ /\x1b/ && $logged !~ /\r/,
	'the error quoting the payload is logged escaped: no carriage return or escape byte');

# --- an ordered message waiting for its retry keeps its backoff while later
# messages of its aggregate with an unordered handler are processed: each
# of them released it (made it due at once)
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.always_fail(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    RAISE EXCEPTION 'not yet';
	END $$;
	CREATE FUNCTION public.no_op(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$ BEGIN END $$;
	SELECT inbox.register_handler('ord.*', 'public.always_fail(inbox.messages)',
	                              max_attempts => 5, backoff_base_ms => 600000, backoff_max_ms => 600000,
	                              ordered => true);
	SELECT inbox.register_handler('unord.*', 'public.no_op(inbox.messages)');
	SELECT inbox.receive('ord-1', 'ord.x', '{}', aggregate_id => 'Z');
});
ok($node->poll_query_until('postgres', q{SELECT attempts = 1 FROM inbox.messages WHERE id = 'ord-1' AND last_error IS NOT NULL}),
	'the ordered message failed once');
for my $i (1 .. 4)
{
	$node->safe_psql('postgres', qq{SELECT inbox.receive('unord-$i', 'unord.x', '{}', aggregate_id => 'Z')});
	ok($node->poll_query_until('postgres', qq{SELECT status = 'processed' FROM inbox.messages WHERE id = 'unord-$i'}),
		"unordered message $i of the aggregate is processed");
}
sleep(1);
is($node->safe_psql('postgres', q{
	SELECT attempts || ' ' || (next_attempt_at > now() + interval '4 min') FROM inbox.messages WHERE id = 'ord-1'}),
	'1 true', 'the ordered message still waits for its retry 5 to 10 minutes away: one attempt');

# --- a database in SQL_ASCII: text that is not UTF-8 is shown escaped.  The
# conversion to UTF-8 for the log checked the bytes and failed: emit()
# answered 22021 instead of naming the bad traceparent, and the dead
# letter's log line failed its whole batch, again at every lease.
$node->safe_psql('postgres', q{CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('ascii', q{CREATE EXTENSION outbox_pg});
my ($a_ret, $a_out, $a_err) = $node->psql('ascii', q{
	SELECT outbox.emit('x.y', '1', '{}', traceparent => E'00-\xe9')});
like($a_err, qr/ERROR:  invalid traceparent "00-\\xe9"/, 'SQL_ASCII: a traceparent that is not UTF-8 is named, escaped');
# bytes that happen to be legal UTF-8 are shown as the bytes they are,
# not as the character UTF-8 would make of them
($a_ret, $a_out, $a_err) = $node->psql('ascii', q{
	SELECT outbox.emit('x.y', '1', '{}', traceparent => E'00-\xc3\xa9')});
like($a_err, qr/ERROR:  invalid traceparent "00-\\xc3\\xa9"/, 'SQL_ASCII: bytes that look like UTF-8 are shown as bytes');
$log_offset = -s $node->logfile;
$node->safe_psql('ascii', q{
	BEGIN;
	SELECT inbox.receive(E'bad-\xe9', 'nothing.x', '{}');
	SELECT inbox.receive(E'bad-\xc3\xa9', 'nothing.x', '{}');
	UPDATE inbox.messages SET received_at = now() - interval '61 minutes',
	       last_error = 'no inbox handler matches message type "nothing.x"';
	COMMIT;
});
ok($node->poll_query_until('ascii', q{SELECT bool_and(status = 'dead') FROM inbox.messages}),
	'SQL_ASCII: messages whose ids are not UTF-8 are dead-lettered');
ok($node->wait_for_log(qr/inbox message "bad-\\xe9" is dead: no handler matched/, $log_offset),
	'and logged, the id escaped');
ok($node->wait_for_log(qr/inbox message "bad-\\xc3\\xa9" is dead: no handler matched/, $log_offset),
	'and the id whose bytes look like UTF-8 logged as its bytes');

# --- a handler's transaction waits for the local WAL flush (local), unless
# the server has synchronous_commit off (the relay's own commits are
# asynchronous): before 0.5.2 the handlers' writes, their outbox.emit()
# among them, committed without waiting for the flush too; the setting
# follows a reload of the configuration
$node->safe_psql('postgres', q{
	CREATE TABLE public.commit_modes (id text, mode text);
	CREATE FUNCTION public.record_commit_mode(m inbox.messages) RETURNS void
	LANGUAGE sql AS $$
	    INSERT INTO public.commit_modes VALUES (m.id, current_setting('synchronous_commit'))
	$$;
	SELECT inbox.register_handler('commitmode.*', 'public.record_commit_mode(inbox.messages)');
	SELECT inbox.receive('cm-1', 'commitmode.x', '{}');
});
ok($node->poll_query_until('postgres', q{SELECT mode FROM public.commit_modes WHERE id = 'cm-1'}, 'local'),
	"a handler's transaction commits with synchronous_commit = local (the server's is on)");
$node->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_commit = 'off'; SELECT pg_reload_conf()});
sleep(1);    # the relay reloads at its next poll
$node->safe_psql('postgres', q{SELECT inbox.receive('cm-2', 'commitmode.x', '{}')});
ok($node->poll_query_until('postgres', q{SELECT mode FROM public.commit_modes WHERE id = 'cm-2'}, 'off'),
	'... and off once a reload gave the server off');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET synchronous_commit; SELECT pg_reload_conf()});

# --- wake at commit: with a 60 s poll, a received message is processed at once
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET outbox.poll_interval = '60s';
	SELECT pg_reload_conf();
});
sleep(1);    # the relay picks the setting up at its next 200 ms poll
$node->safe_psql('postgres', q{SELECT inbox.receive('wake-1', 'payment.created', '{"amount": 1}')});
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT status FROM inbox.messages WHERE id = 'wake-1'}) eq 'processed' }, 10),
	'processed within seconds although the poll interval is 60 s: the commit woke the worker');

$node->stop;
done_testing();
