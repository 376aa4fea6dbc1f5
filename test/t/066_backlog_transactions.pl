# A backlog made of many transactions drains without waiting for the poll.
# A claim is cut at a transaction boundary, so with 50-event transactions
# and 64 events of capacity each claim takes 50: the relay must take that
# as "more to claim", not as "drained".  (It did, and a backlog of small
# transactions went out one claim per poll interval: 200 events per
# minute here.)  The poll interval is 60 s, longer than the deadline, so
# only claiming again at once can drain it in time; the same for a
# backlog where the first transaction alone exceeds the capacity.
#
# The resume makes the relays sweep, which marks the destination due; a
# claim that follows looks for an expired batch to recover first.  Only
# the first: every claim of the backlog used to, one statement that reads
# every batch of the destination per claim (counted by pg_stat_statements).
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $sink = start_fast_sink();
my $node = start_counting_node('backlogtx', qq{
outbox.poll_interval = '60s'
outbox.workers_per_database = 2
});
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, paused) VALUES
		('small', '$sink->{url}/small', 64, true);
});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'the relays run');

# 100 transactions of 50 events, committed while the destination is paused
for my $i (1 .. 100)
{
	$node->safe_psql('postgres', qq{
		SELECT count(outbox.emit('backlog.tx', 'a$i-' || g, '{}', destination => 'small'))
		  FROM generate_series(1, 50) g});
}
my $t0 = time;
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false WHERE name = 'small'});
ok(wait_until(sub { scalar(keys %{ fast_sink_ids($sink) }) >= 5000 }, 30),
	'5,000 events in 100 transactions drain well within one poll interval');
note(sprintf('drained in %.1f s', time - $t0));
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.events WHERE destination = 'small' AND status = 'published'}),
	'5000', 'every one is published');
my $claims = statement_calls($node, 'SELECT p.seq, p.to_snap, c.cur, x.xid%');
my $recoveries = statement_calls($node, 'UPDATE outbox.batches AS b%outbox.batch_acks%');
cmp_ok($claims, '>=', 50, "the backlog took many claims ($claims)");
cmp_ok($recoveries, '<=', 10, "few of them looked for a batch to recover first ($recoveries)");

# later transactions after the drain are claimed at their commit too
$node->safe_psql('postgres', q{
	SELECT count(outbox.emit('backlog.tx', 'late-' || g, '{}', destination => 'small'))
	  FROM generate_series(1, 300) g});
ok(wait_until(sub { scalar(keys %{ fast_sink_ids($sink) }) >= 5300 }, 30),
	'a transaction larger than the capacity goes out whole at once');

$node->stop;
stop_sink($sink);
done_testing();
