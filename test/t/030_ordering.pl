# Per-aggregate ordering end to end: an ordered destination, 40 aggregates
# plus one held back by the sink, a sink that fails about 30% of requests
# with 503, two relay workers, one of them killed with SIGKILL mid-run
# (the server restarts).  Checks, from the sink's log:
#   - order: every request for event n of an aggregate (any answer, first
#     try or duplicate) comes after a 2xx for each event 1..n-1 of that
#     aggregate — nothing is sent while an earlier event is unacknowledged;
#   - zero lost: every event was acknowledged;
#   - the held aggregate (its head always fails) sends nothing but its head
#     while every other aggregate is delivered, then catches up in order.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $AGGS = 40;
my $ROUNDS = 20;

my $sink = start_sink();
my $node = new_outbox_node('ordering', "outbox.workers_per_database = 2\nrestart_after_crash = on\n");
$node->start;
my $u = $sink->{url};

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, max_attempts,
	                                 backoff_base_ms, backoff_max_ms, options)
	VALUES ('ord', '$u/flaky/30/503/ord?hold=held', 2000, 16, 1000, 20, 200,
	        '{"ordering": "aggregate", "circuit_threshold": 0}');
});

# one transaction per round: event n of every aggregate (and of 'held')
sub emit_rounds
{
	my ($from, $to) = @_;
	for my $n ($from .. $to)
	{
		$node->safe_psql('postgres', qq{
			SELECT count(outbox.emit('ord.event', a, jsonb_build_object('agg', a, 'n', $n),
			                         destination => 'ord'))
			  FROM (SELECT 'agg' || g AS a FROM generate_series(1, $AGGS) g
			        UNION ALL SELECT 'held') s});
	}
}

sub published_others
{
	return $node->safe_psql('postgres', q{
		SELECT count(*) FROM outbox.events
		 WHERE status = 'published' AND aggregate_id <> 'held'});
}

emit_rounds(1, $ROUNDS / 2);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) >= 150 FROM outbox.events WHERE status = 'published'}),
	'delivery under way');

# kill a relay worker mid-run (SIGKILL: the server restarts)
my ($victim) = relay_pids($node, 'postgres');
kill 'KILL', $victim;
note("killed relay $victim with SIGKILL");
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'relays are back after the crash restart');

emit_rounds($ROUNDS / 2 + 1, $ROUNDS);
ok(wait_until(sub { published_others() == $AGGS * $ROUNDS }, 120),
	'every other aggregate is delivered while "held" is blocked by its head');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM outbox.events WHERE aggregate_id = 'held' AND status = 'published'}),
	'0', 'the held aggregate delivered nothing');
my @held = grep { ($_->{subject} // '') eq 'held' } sink_records($sink);
ok(@held >= 2, 'the held head was retried (' . scalar(@held) . ' requests)');
is(scalar(grep { $_->{data}{n} != 1 } @held), 0,
	'only the head of the held aggregate was ever sent');

# let it through: the held aggregate catches up, in order
$node->safe_psql('postgres', qq{UPDATE outbox.destinations SET url = '$u/flaky/30/503/ord' WHERE name = 'ord'});
ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = ($AGGS + 1) * $ROUNDS FROM outbox.events WHERE status = 'published'}),
	'the held aggregate catches up');

# the order check, over the sink's log in arrival order
my (%acked, $violations, $requests, $failures);
for my $r (sink_records($sink))
{
	next unless index($r->{path}, '/flaky/') == 0;
	my ($agg, $n) = ($r->{data}{agg}, $r->{data}{n});
	$requests++;
	for my $m (1 .. $n - 1)
	{
		next if $acked{$agg}{$m};
		$violations++;
		diag("$agg/$n sent before $agg/$m was acknowledged") if $violations <= 5;
		last;
	}
	if ($r->{answer} >= 200 && $r->{answer} < 300) { $acked{$agg}{$n} = 1; }
	else { $failures++; }
}
is($violations // 0, 0, 'no event was sent before an earlier event of its aggregate was acknowledged');
ok($failures > 50, "the sink failed requests on the way ($failures of $requests)");

my @ids = split /\n/, $node->safe_psql('postgres', q{SELECT id FROM outbox.events ORDER BY id});
is(scalar(@ids), ($AGGS + 1) * $ROUNDS, 'all events are there');
assert_zero_lost($sink, 'ordered', '/flaky/', @ids);

$node->stop;
stop_sink($sink);
done_testing();
