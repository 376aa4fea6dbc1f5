# A large outbox.retries does not slow the sweep for the other destinations.
#
# The rotation spills the backlog of a destination paused for long to
# outbox.retries; its copies are due.  The periodic sweep (the relay's
# safety net: it finds retries another relay wrote, leases that ran out,
# events committed by COMMIT PREPARED) is paced by its own cost, 200 times
# its last duration.  It read every due copy: with 300,000 copies of a
# paused destination the sweeps came seconds apart, for every destination
# of the database.  Now it asks each destination that has copies for its
# first due one, and sweeps once per poll interval (counted over 10 s by
# pg_stat_statements; a retry written then waits for the next sweep, so
# timing one delivery tells the two apart only by chance).  A copy for
# another destination written straight into outbox.retries, as another
# relay's retry would be (nothing announces it), is found by the sweep
# and delivered.
#
# And the relay leases outbox.retries when something there may have come
# due, not before every claim: an ordered destination with one aggregate
# held (its first event deferred by an hour, 500 more behind it in
# outbox.retries) drains 5,000 events of other aggregates with far fewer
# retries leases than claims (pg_stat_statements counts them).  Before, each
# pass leased first, and each lease looked through the held copies.
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
my $node = start_counting_node('sweepretries', qq{
outbox.poll_interval = '1s'
outbox.workers_per_database = 1
});
$node->safe_psql('postgres', qq{
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

# a few sweeps over the parked copies, so that the pace follows their cost;
# then the sweeps of 10 s are counted
sleep 5;
$node->safe_psql('postgres', q{SELECT pg_stat_statements_reset()});
sleep 10;
my $sweeps = statement_calls($node, '%SELECT DISTINCT x.destination%outbox.batch_acks%');
note("sweeps in 10 s: $sweeps");
cmp_ok($sweeps, '>=', 4, "the sweep keeps to the poll interval next to 300,000 parked copies ($sweeps in 10 s)");

my $id = $node->safe_psql('postgres', q{
	INSERT INTO outbox.retries (id, type, aggregate_id, payload, destination,
	                            created_at, attempts, due_at)
	VALUES (gen_random_uuid(), 'live.retry', 'l', '{}', 'live', now(), 1, now())
	RETURNING id});
my $t0 = time;
ok(wait_until(sub { exists fast_sink_ids($sink)->{$id} }, 60),
	'a retry of another destination is found by the sweep and delivered');
note(sprintf('delivered after %.1f s', time - $t0));
ok($node->poll_query_until('postgres', qq{
	SELECT NOT EXISTS (SELECT 1 FROM outbox.retries WHERE id = '$id')
	   AND EXISTS (SELECT 1 FROM outbox.settled_events WHERE id = '$id' AND settled = 'delivered')}),
	'and settled as delivered');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.retries WHERE destination = 'parked' AND attempts > 0}),
	'0', 'the paused destination\'s copies are left alone');

# an ordered destination with one aggregate held
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, options) VALUES
		('ord', '$sink->{url}/ord', 64, '{"ordering": "aggregate"}');
	SELECT outbox.emit('held.first', 'H', '{}', destination => 'ord',
	                   not_before => now() + interval '1 hour');
	SELECT count(outbox.emit('held.next', 'H', '{}', destination => 'ord'))
	  FROM generate_series(1, 500);
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 501 FROM outbox.retries WHERE destination = 'ord'}),
	'the held aggregate is in outbox.retries');
$node->safe_psql('postgres', q{SELECT pg_stat_statements_reset()});
my $before = scalar(keys %{ fast_sink_ids($sink) });
# 100 transactions of 50 (psql runs each statement in its own)
$node->safe_psql('postgres', join('', map { qq{
	SELECT count(outbox.emit('ord.e', 'a' || (g % 100), '{}', destination => 'ord'))
	  FROM generate_series(1, 50) g;} } 1 .. 100));
ok(wait_until(sub { scalar(keys %{ fast_sink_ids($sink) }) >= $before + 5000 }, 60),
	'5,000 events of other aggregates are delivered past it');
my $claims = statement_calls($node, 'SELECT p.seq, p.to_snap, c.cur, x.xid%');
my $leases = statement_calls($node, 'WITH RECURSIVE%a AS MATERIALIZED%UPDATE outbox.retries%');
note("claims $claims, retries leases $leases");
cmp_ok($claims, '>=', 20, "the events took many claims ($claims)");
cmp_ok($leases, '<', $claims / 2, "far fewer retries leases ($leases)");
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.retries WHERE destination = 'ord' AND aggregate_id = 'H'}),
	'501', 'the held aggregate stays held');

$node->stop;
stop_sink($sink);
done_testing();
