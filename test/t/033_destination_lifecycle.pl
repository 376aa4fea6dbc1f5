# A destination deleted and created again while the relays deliver it
# (0.5.0: its stream belongs to its name).  In 0.4.0 the delete took the
# destination's position with it: the batch in flight could not be
# acknowledged, the events still pending were shown as published once the
# name existed again and were never sent, and the rotation copied the
# events it had delivered to outbox.retries, to be sent again.
#
#  - delete and create again in one transaction during a drain: zero lost;
#  - delete during a drain, wait until the rotation has truncated every
#    slot that held the destination's events (the backlog is spilled to
#    outbox.retries), create again: zero lost, and no event that the sink
#    acknowledged before the delete is sent again.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = start_sink();
my $node = new_outbox_node('lifecycle', qq{
outbox.workers_per_database = 2
outbox.retention = '4s'
outbox.batch_size = 20
});
$node->start;
my $u = $sink->{url};

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, max_concurrency) VALUES
		('tx', '$u/delay/20/tx', 4),
		('gone', '$u/delay/20/gone', 4);
});

# n events in transactions of ten: a claim takes whole transactions, and
# the relays are to have a backlog left when the destination is deleted
sub emit_small
{
	my ($type, $dest, $n) = @_;
	my $sql = '';
	for (my $i = 0; $i < $n; $i += 10)
	{
		$sql .= qq{SELECT string_agg(outbox.emit('$type', g::text, jsonb_build_object('n', g),
		                                         destination => '$dest')::text, ' ')
		             FROM generate_series($i + 1, $i + 10) g;\n};
	}
	return split /\s+/, $node->safe_psql('postgres', $sql);
}

sub acked_count
{
	my ($prefix) = @_;
	return scalar(keys %{ sink_ids($sink, $prefix) });
}

# one transaction
my @tx = emit_small('lc.tx', 'tx', 400);
is(scalar(@tx), 400, 'tx: 400 events emitted');
ok(wait_until(sub { acked_count('/delay/20/tx') >= 40 }, 60), 'tx: the drain has begun');
$node->safe_psql('postgres', qq{
	BEGIN;
	DELETE FROM outbox.destinations WHERE name = 'tx';
	INSERT INTO outbox.destinations (name, url, max_concurrency) VALUES ('tx', '$u/delay/20/tx', 4);
	COMMIT;
});
my $left = $node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.events WHERE type = 'lc.tx' AND status <> 'published'});
note("tx: $left of 400 not published when the destination was written again");
ok($left > 0, 'tx: the destination was written again during the drain');
ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 400 FROM outbox.events WHERE type = 'lc.tx' AND status = 'published'}),
	'tx: every event is published');
assert_zero_lost($sink, 'tx', '/delay/20/tx', @tx);

# two transactions, with rotations in between
my @gone = emit_small('lc.gone', 'gone', 400);
ok(wait_until(sub { acked_count('/delay/20/gone') >= 40 }, 60), 'gone: the drain has begun');
my %before = %{ sink_ids($sink, '/delay/20/gone') };
$node->safe_psql('postgres', q{DELETE FROM outbox.destinations WHERE name = 'gone'});
# (the trim deletes it once the log holds no event of the name: below)
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.streams WHERE destination = 'gone'}),
	'1', 'gone: the stream of the name outlives the delete');
# the relays let the destination go: nothing more reaches it once its
# batches in flight are done
my $settled = 0;
my $last = -1;
ok(wait_until(sub {
	my $n = acked_count('/delay/20/gone');
	$settled = ($n == $last) ? $settled + 1 : 0;
	$last = $n;
	return $settled >= 60;
}, 90), 'gone: the sink saw no new event for 3 s after the delete');
note("gone: $last of 400 acknowledged by the sink at the delete");
ok($last < 400, 'gone: the delete left events to deliver');
cmp_ok($node->safe_psql('postgres', q{
		SELECT count(*) FROM outbox.events WHERE type = 'lc.gone' AND status = 'pending'}),
	'==', 400 - $last, 'gone: the events the sink did not acknowledge are pending');
ok($node->poll_query_until('postgres', q{
		SELECT EXISTS (SELECT 1 FROM unnest((outbox.health()).reasons) AS r
		                WHERE r ~ 'pending event\(s\) name destination "gone", which does not exist')}),
	'gone: health() names the pending events of the deleted destination');
ok($node->poll_query_until('postgres', q{
		SELECT NOT EXISTS (SELECT 1 FROM outbox.log WHERE destination = 'gone')}),
	'gone: the rotation truncated every slot that held the destination\'s events');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.retries WHERE destination = 'gone'}),
	400 - $last, 'gone: its backlog is kept in outbox.retries');
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency) VALUES ('gone', '$u/ok/gone', 4)});
ok(wait_until(sub { acked_count('/delay/20/gone') + acked_count('/ok/gone') >= 400 }, 120),
	'gone: every event reaches the sink once the destination exists again');
ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM outbox.events WHERE type = 'lc.gone' AND status <> 'published'}),
	'gone: none is left pending');
assert_zero_lost($sink, 'gone', '', @gone);
my %again = %{ sink_ids($sink, '/ok/gone') };
my @resent = grep { $again{$_} } keys %before;
is(scalar(@resent), 0, 'gone: no event acknowledged before the delete is sent again');
is(scalar(keys %again), 400 - $last, 'gone: the events left at the delete are sent once');

unlike(slurp_file($node->logfile), qr/PANIC|server process .* was terminated/,
	'no process crashed');
done_testing();
