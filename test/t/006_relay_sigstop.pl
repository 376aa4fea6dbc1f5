# A relay worker stopped with SIGSTOP for longer than its lease, while its
# requests are in flight, then continued (issue #13).  Another worker
# leases the same rows again once the lease has run out and delivers them;
# the stopped worker's late answers are failures (the sink answers its
# requests, the first of each message id, with a slow 422, and the
# destination allows one attempt, so each late answer is a dead letter).
# The lease fence (store.c) keeps those late dead letters off the rows the
# other worker holds: nothing is lost, nothing goes dead, and the only
# duplicates are the requests the stopped worker had in flight.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $N = 40;

my $sink = start_sink();
# one worker at first, so that every first request comes from it; the
# shortest lease margin: a lease is timeout_ms + 1 s = 5 s
my $node = new_outbox_node('sigstop', "outbox.workers_per_database = 1\noutbox.lease_margin = '1s'\n");
$node->start;
my $u = $sink->{url};

# first request of each id: 422 after 1 s; later requests: 204 after 2.5 s
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, max_concurrency,
	                                 backoff_base_ms, backoff_max_ms, options)
	VALUES ('stall', '$u/slowfirst/1000/422/2500/s', 4000, 1, 100, 50, 200,
	        '{"circuit_threshold": 0}');
});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}),
	'one relay worker runs');
my $stopped = $node->safe_psql('postgres', q{SELECT pid FROM outbox.workers() WHERE database = 'postgres'});

sub requests
{
	my ($nth) = @_;
	return scalar(grep { $_->{path} =~ m{^/slowfirst/} && $_->{nth} == $nth } sink_records($sink));
}

my @ids = emit_events($node, 'stall.test', 'stall', $N);
ok(wait_until(sub { requests(1) == $N }, 30), "the worker has sent all $N requests");
kill 'STOP', $stopped;
my $stop_at = time;
my @first = grep { $_->{path} =~ m{^/slowfirst/} } sink_records($sink);
my $first_arrival = (sort { $a <=> $b } map { $_->{t} } @first)[0];
ok($stop_at - $first_arrival < 1.0,
	sprintf('SIGSTOP %.2f s after the first request arrived: before any answer (they take 1 s)', $stop_at - $first_arrival));
my $in_flight = $node->safe_psql('postgres', qq{SELECT in_flight FROM outbox.workers() WHERE pid = $stopped});
note("stopped relay $stopped with $in_flight requests in flight");
is($in_flight, $N, 'the stopped worker has every request in flight');

# a second worker; it finds nothing due until the stopped worker's lease runs out
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.workers_per_database = 2; SELECT pg_reload_conf();});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}),
	'a second relay worker runs');
ok(wait_until(sub { requests(2) == $N }, 30), 'the other worker sends every event again once the lease ran out');
my $relet_after = time - $stop_at;
cmp_ok($relet_after, '>=', 4.0, sprintf('... not before the lease ran out (%.1f s after SIGSTOP; lease 5 s)', $relet_after));
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'pending' AND leased_until > now()}),
	$N, 'the rows are pending under the new lease while its requests run');

# continue the stopped worker while the other one's requests are in flight
kill 'CONT', $stopped;
note(sprintf('continued relay %d after %.1f s', $stopped, time - $stop_at));
ok($node->poll_query_until('postgres', qq{SELECT failed >= $N FROM outbox.workers() WHERE pid = $stopped}),
	'the continued worker recorded its late answers as failures');
is($node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE status = 'dead') || '/'
	    || count(*) FILTER (WHERE status = 'pending' AND leased_until IS NULL)
	  FROM outbox.events}),
	'0/0', 'the late dead letters changed nothing: no row is dead, none lost its lease');

ok($node->poll_query_until('postgres', qq{SELECT count(*) = $N FROM outbox.events WHERE status = 'published'}),
	'the other worker publishes every event');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status <> 'published'}),
	'0', 'every row stays published');
assert_zero_lost($sink, 'SIGSTOP past the lease', '/slowfirst/', @ids);
my $requests = scalar(grep { $_->{path} =~ m{^/slowfirst/} } sink_records($sink));
my $extra = $requests - $N;
note("SIGSTOP: $requests requests for $N events; $extra sent again; the stopped worker had $in_flight in flight");
cmp_ok($extra, '<=', $in_flight, 'requests sent again <= what the stopped worker had in flight');
my $ids = sink_ids($sink, '/slowfirst/');
is(scalar(grep { $ids->{$_} > 2 } keys %$ids), 0, 'no message was sent a third time');

ok($node->poll_query_until('postgres', qq{SELECT state <> 'error' FROM outbox.workers() WHERE pid = $stopped}),
	'the continued worker carries on');
ok(!$node->log_contains('terminated by signal'), 'no process crashed');

# Each of the two workers, long running (no recovery sweep of their start
# is due), stopped in turn while it holds a claimed batch: the other one
# finds the batch once its lease has run out.  Only the periodic sweep can
# find it (no commit announces it), and that is the first worker's job:
# when the second is stopped, the first's light sweep finds it; when the
# first is stopped, its sweep is overdue and the second sweeps instead
# (without that, the batch waited as long as the first worker stayed
# stopped).  Requests take 3 s, the lease is 4 s + 1 s.
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, options)
	VALUES ('turn', '$u/delay/3000/turn', 4000, 100, '{"circuit_threshold": 0}')});
for my $holder (1, 0)
{
	my $other = 1 - $holder;
	my %pid = map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
		SELECT worker || '|' || pid FROM outbox.workers() WHERE database = 'postgres'});
	kill 'STOP', $pid{$other};
	my @turn = emit_events($node, 'turn.test', 'turn', 5);
	my $list = join(',', map { "'$_'" } @turn);
	ok($node->poll_query_until('postgres', qq{SELECT in_flight = 5 FROM outbox.workers() WHERE pid = $pid{$holder}}),
		"worker $holder claimed the batch while worker $other was stopped");
	kill 'STOP', $pid{$holder};
	kill 'CONT', $pid{$other};
	my $t0 = time;
	ok(wait_until(sub {
		$node->safe_psql('postgres', qq{SELECT count(*) FROM outbox.events WHERE id IN ($list) AND status = 'published'}) == 5
	}, 30), "worker $holder stopped: worker $other delivers its batch");
	note(sprintf('worker %d stopped: published by worker %d %.1f s later', $holder, $other, time - $t0));
	kill 'CONT', $pid{$holder};
}
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND state <> 'error'}),
	'both workers carry on');

$node->stop;
stop_sink($sink);
done_testing();
