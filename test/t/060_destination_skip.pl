# A destination whose definition the relay cannot use (here a kind no
# library knows, written past the trigger and the CHECK constraint) is
# skipped by the relay's loader, alone: its events stay pending and
# unleased, the reason is in a WARNING (at most once a minute per
# destination) and in the relay's last_error, and the other destinations
# of the database keep being delivered.  Fixing the row recovers it.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $sink = start_sink();
my $node = new_outbox_node('skip', "log_min_messages = warning\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('good', '$sink->{url}/good');
	ALTER TABLE outbox.destinations DROP CONSTRAINT IF EXISTS destinations_kind_check;
	SET session_replication_role = replica;
	INSERT INTO outbox.destinations (name, kind, url) VALUES ('broken', 'nosuch', '$sink->{url}/broken');
});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'the relay runs');

$node->safe_psql('postgres', q{
	SELECT outbox.emit('skip.broken', 'b' || g, '{}', destination => 'broken') FROM generate_series(1, 2) g;
	SELECT outbox.emit('skip.good', 'g' || g, '{}', destination => 'good') FROM generate_series(1, 3) g;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 3 FROM outbox.events WHERE destination = 'good' AND status = 'published'}),
	'the other destination is delivered');
ok($node->poll_query_until('postgres', q{
	SELECT last_error LIKE 'destination "broken" skipped: unknown destination kind "nosuch"%'
	  FROM outbox.workers() WHERE pid IS NOT NULL}),
	'the reason is in the relay\'s last_error');

# many lease steps later (poll interval 200 ms): still pending, never
# leased, and the WARNING was logged once
$node->safe_psql('postgres', q{SELECT outbox.emit('skip.good', 'late', '{}', destination => 'good')});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 4 FROM outbox.events WHERE destination = 'good' AND status = 'published'}),
	'later events of the other destination too');
usleep(1_500_000);
is($node->safe_psql('postgres', q{
	SELECT string_agg(status || ':' || attempts, ',') FROM outbox.events WHERE destination = 'broken'}),
	'pending:0,pending:0', 'the skipped destination\'s events stay pending, never leased');
my $log = slurp_file($node->logfile);
my $warnings = () = $log =~ /WARNING:  outbox_pg relay skips destination "broken"/g;
is($warnings, 1, 'one WARNING, not one per lease step');
like($log, qr/WARNING:  outbox_pg relay skips destination "broken"\n.*DETAIL:  unknown destination kind "nosuch"\n.*HINT:  The kinds are: webhook, sns, sqs, rabbitmq, kafka, amqp\./,
	'with the reason and the hint');
unlike($log, qr/failed a cycle/, 'no relay cycle failed');

# fixing the row recovers its events
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET kind = 'webhook' WHERE name = 'broken'});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.events WHERE destination = 'broken' AND status = 'published'}),
	'once the row is fixed, its events are delivered');
is(scalar(grep { $_->{path} =~ m{^/broken} } sink_records($sink)), 2, 'each once');

$node->stop;
stop_sink($sink);
done_testing();
