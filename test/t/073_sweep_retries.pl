# A large outbox.retries does not slow the sweep for the other destinations.
#
# The rotation spills the backlog of a destination paused for long to
# outbox.retries; its copies are due.  The periodic sweep (the relay's
# safety net: it finds retries another relay wrote, leases that ran out,
# events committed by COMMIT PREPARED) is paced by its own cost, 200 times
# its last duration.  It read every due copy: with 100,000 copies of a
# paused destination the next sweep came 8 s later, with 300,000 about
# 25 s, for every destination of the database.  Now it asks each
# destination that has copies for its first due one.
#
# Here a copy for another destination is written straight into
# outbox.retries, as another relay's retry would be (nothing announces
# it): only the periodic sweep finds it, and it is delivered within a few
# poll intervals.
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
my $node = new_outbox_node('sweepretries', qq{
outbox.poll_interval = '1s'
outbox.workers_per_database = 1
});
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, paused) VALUES
		('parked', '$sink->{url}/parked', true),
		('live', '$sink->{url}/live', false);
	INSERT INTO outbox.retries (id, type, aggregate_id, payload, destination,
	                            created_at, attempts, due_at)
	SELECT gen_random_uuid(), 'parked.event', 'p' || g, '{}', 'parked',
	       now(), 0, now()
	  FROM generate_series(1, 300000) AS g;
});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'the relay runs');

# a few sweeps over the parked copies, so that the pace follows their cost
sleep 5;

my $id = $node->safe_psql('postgres', q{
	INSERT INTO outbox.retries (id, type, aggregate_id, payload, destination,
	                            created_at, attempts, due_at)
	VALUES (gen_random_uuid(), 'live.retry', 'l', '{}', 'live', now(), 1, now())
	RETURNING id});
my $t0 = time;
ok(wait_until(sub { exists fast_sink_ids($sink)->{$id} }, 6),
	'a retry of another destination is found by the sweep within a few poll intervals');
note(sprintf('delivered after %.1f s', time - $t0));
ok($node->poll_query_until('postgres', qq{
	SELECT NOT EXISTS (SELECT 1 FROM outbox.retries WHERE id = '$id')
	   AND EXISTS (SELECT 1 FROM outbox.settled_events WHERE id = '$id' AND settled = 'delivered')}),
	'and settled as delivered');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.retries WHERE destination = 'parked' AND attempts > 0}),
	'0', 'the paused destination\'s copies are left alone');

$node->stop;
stop_sink($sink);
done_testing();
