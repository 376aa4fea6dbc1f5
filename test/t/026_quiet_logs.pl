# A relay started for a database without the extension exits and is
# started again every outbox.discovery_interval.  The server log hears
# about that database once per change of state — "not installed" once, not
# a start and an exit every interval — and CREATE EXTENSION there still
# brings a relay within one discovery interval, without any emit(), that
# delivers.  Dropping the extension again is logged once more, and only
# once.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $sink = start_sink();
my $node = new_outbox_node('quiet_logs', qq{
outbox.workers_per_database = 2
outbox.discovery_interval = 1
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox_pg');
my $log_start = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE DATABASE quiet');

# Lines of the server log since the test began that name the database the
# way the relay's messages do (statements logged by log_statement never
# contain this spelling).
sub db_lines
{
	my ($pattern) = @_;
	my $log = slurp_file($node->logfile, $log_start);
	return scalar(grep { /database "quiet"/ && /$pattern/ } split /\n/, $log);
}

# Relays of the database started since a time (outbox.workers() lists the
# slots of the whole cluster, also those whose relay has exited).
sub starts_since
{
	my ($since) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) FROM outbox.workers()
		 WHERE database = 'quiet' AND started_at > '$since'});
}

# Several discovery intervals: relays of both slots keep starting, finding
# no extension and exiting.
my $t0 = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
my $restarts = 0;
for my $round (1 .. 4)
{
	my $mark = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	ok(wait_until(sub { starts_since($mark) == 2 }, 10),
		"round $round: both relays of the database were started again");
	$restarts += 2;
}
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT state, ',') FROM outbox.workers() WHERE database = 'quiet'}),
	'no extension', 'the slots say why nothing runs');
is(db_lines('.'), 1, "$restarts relay starts without the extension: one line in the log");
is(db_lines('is exiting: the extension is not installed'), 1, '... saying the extension is not installed');

# CREATE EXTENSION, no emit(): a relay stays within one discovery interval
$node->safe_psql('quiet', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('q', '$sink->{url}/ok/q');
});
my $created = time;
ok(wait_until(sub {
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity
		 WHERE backend_type = 'outbox_pg relay' AND datname = 'quiet'}) == 2 }, 10),
	'CREATE EXTENSION: the relays start by themselves');
my $wait = time - $created;
note(sprintf('relays running %.2f s after CREATE EXTENSION (discovery interval 1 s)', $wait));
ok($wait < 2.5, 'within one discovery interval (and the poll), not after an emit()');
my $id = $node->safe_psql('quiet', q{SELECT outbox.emit('q.created', '1', '{}', destination => 'q')});
is($node->safe_psql('quiet', qq{SELECT outbox.wait_published('$id', '10 s')}), 't',
	'an emitted event is delivered');
ok(wait_until(sub { sink_ids($sink, '/ok/q')->{$id} }, 10), 'the sink has it');
is(db_lines('started for database'), 2, 'each relay logs its start once the extension is there');
is(db_lines('is exiting'), 1, 'no more "not installed"');

# DROP EXTENSION: one more line, however many intervals pass
$node->safe_psql('quiet', 'DROP EXTENSION outbox_pg');
for my $round (1 .. 3)
{
	my $mark = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	ok(wait_until(sub { starts_since($mark) == 2 }, 10),
		"after DROP EXTENSION, round $round: the relays are started again");
}
is(db_lines('is exiting: the extension is not installed'), 2,
	'DROP EXTENSION is logged once');
is(db_lines('.'), 4, 'and nothing else names the database');

# A database left invalid by an interrupted DROP DATABASE cannot be
# entered: the launcher leaves it alone.  It started a relay for it every
# 0.5 s, for ever, each one failing to connect.
$node->safe_psql('postgres', q{
	CREATE DATABASE broken ALLOW_CONNECTIONS false;
	UPDATE pg_database SET datconnlimit = -2, datallowconn = true WHERE datname = 'broken'});
my $invalid_from = -s $node->logfile;
sleep 8;
my $invalid_log = substr(slurp_file($node->logfile), $invalid_from);
my $invalid_tries = () = $invalid_log =~ /cannot connect to invalid database "broken"/g;
is($invalid_tries, 0, 'no relay is started for an invalid database')
  or diag("$invalid_tries failed starts in 8 s");
$node->safe_psql('postgres', 'DROP DATABASE broken');

ok(!$node->log_contains('terminated by signal'), 'no worker crashed');
$node->stop;
stop_sink($sink);
done_testing();
