# Two relay workers process an inbox backlog together, each message once,
# each in the attempt that leased it.  A worker's lease that looks at a row
# just as another worker's lease commits keeps that row's lock for a moment
# (its recheck finds the row no longer due); the other worker's processing
# step used to skip such rows (SKIP LOCKED), and the messages waited for
# their lease to run out: 2,045 of a 20,000-message backlog waited 10 s
# with two workers, and were processed in a second attempt.  The lease
# margin here is 60 s, far beyond the deadline: a message left behind that
# way fails the check instead of being picked up late.
#
# From PostgreSQL 16 on, a handler can see its own backend's subtransaction
# count: the messages of a batch share one subtransaction (split only where
# a handler fails), so a batch of 100 writing handlers never overflows the
# 64 subtransactions a backend's snapshot entry can list.  One each, every
# snapshot in the server had to look up pg_subtrans while such a batch was
# open.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $messages = 10000;
my $node = new_outbox_node('inboxworkers', qq{
outbox.workers_per_database = 2
outbox.lease_margin = '60s'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION outbox_pg;
	CREATE TABLE public.ledger (message_id text PRIMARY KEY, amount int NOT NULL);
	CREATE FUNCTION public.apply(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.ledger VALUES (m.id, (m.payload ->> 'amount')::int);
	END
	$$;
	SELECT inbox.register_handler('payment.*', 'public.apply(inbox.messages)');
});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'two relay workers run');

for my $round (1 .. 2)
{
	my $t0 = time;
	$node->safe_psql('postgres', qq{
		SELECT count(inbox.receive('r$round-' || g, 'payment.created',
		                           jsonb_build_object('amount', g),
		                           aggregate_id => (g % 1000)::text))
		  FROM generate_series(1, $messages) g});
	my $done = wait_until(sub {
		$node->safe_psql('postgres', q{
			SELECT NOT EXISTS (SELECT FROM inbox.messages WHERE status = 'pending')}) eq 't' }, 40);
	my $secs = time - $t0;
	ok($done, sprintf('round %d: %d messages processed by two workers in %.1f s (lease margin 60 s)',
		$round, $messages, $secs));
	is($node->safe_psql('postgres', qq{
		SELECT count(*) || ' ' || sum(amount) FROM public.ledger WHERE message_id LIKE 'r$round-%'}),
		"$messages " . ($messages * ($messages + 1) / 2), "round $round: each message's handler write once");
	is($node->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE status = 'processed' AND attempts = 1) || ' ' || count(*)
		  FROM inbox.messages WHERE id LIKE 'r$round-%'}),
		"$messages $messages", "round $round: every message processed in its first attempt");
}
# the fetch's own lock_timeout (1 s, bounding the wait above) is for that
# statement only: handlers run with the server's setting
$node->safe_psql('postgres', q{
	CREATE TABLE public.settings_seen (message_id text, lock_timeout text);
	CREATE FUNCTION public.see(m inbox.messages) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.settings_seen
	    VALUES (m.id, pg_catalog.current_setting('lock_timeout'));
	END
	$$;
	SELECT inbox.register_handler('see.*', 'public.see(inbox.messages)');
	SELECT inbox.receive('see-1', 'see.it', '{}');
});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'processed' FROM inbox.messages WHERE id = 'see-1'}),
	'a handler that reads its settings is processed');
is($node->safe_psql('postgres', q{SELECT lock_timeout FROM public.settings_seen}),
	'0', 'the handler runs with the server\'s lock_timeout, not the fetch\'s');

SKIP:
{
	skip 'pg_stat_get_backend_subxact() needs PostgreSQL 16', 2
	  if $node->safe_psql('postgres', q{SHOW server_version_num}) < 160000;
	$node->safe_psql('postgres', q{
		CREATE TABLE public.subx (message_id text, n int, overflowed bool);
		CREATE FUNCTION public.audit(m inbox.messages) RETURNS void
		LANGUAGE plpgsql AS $$
		BEGIN
		    PERFORM pg_catalog.pg_stat_clear_snapshot();
		    INSERT INTO public.subx
		    SELECT m.id, s.subxact_count, s.subxact_overflowed
		      FROM pg_catalog.pg_stat_get_backend_idset() AS b(id),
		           pg_catalog.pg_stat_get_backend_subxact(b.id) AS s
		     WHERE pg_catalog.pg_stat_get_backend_pid(b.id) OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid();
		END
		$$;
		SELECT inbox.register_handler('audit.*', 'public.audit(inbox.messages)');
		SELECT count(inbox.receive('audit-' || g, 'audit.done', '{}')) FROM generate_series(1, 300) g;
	});
	ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 300 FROM inbox.messages WHERE type = 'audit.done' AND status = 'processed'}),
		'300 writing handlers processed');
	is($node->safe_psql('postgres', q{
		SELECT count(*) || ' ' || max(n) || ' ' || bool_or(overflowed) FROM public.subx}),
		'300 1 false', 'a batch of writing handlers used one subtransaction, never overflowing');
}

my $pids = $node->safe_psql('postgres', q{
	SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay'});
is($pids, '2', 'both workers still run');

$node->stop;
done_testing();
