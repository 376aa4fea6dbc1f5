# The cluster has 64 relay slots.  Every database outbox.databases names
# takes outbox.workers_per_database of them, also one without the
# extension, so with '*' and many databases a database with the extension
# can find none left: its events wait and no relay is there to warn.  The
# launcher warns, naming such a database, and the hint's remedy (naming
# only the databases that use outbox_pg) gets its events delivered.
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
my $node = new_outbox_node('relay_slots', qq{
max_worker_processes = 100
outbox.workers_per_database = 16
log_min_messages = warning
});
$node->start;
my $log_start = -s $node->logfile;

# postgres and three more databases without the extension take 64 slots;
# the last one created has the extension and an event to deliver.
$node->safe_psql('postgres', "CREATE DATABASE idle_$_") for 1 .. 3;
$node->safe_psql('postgres', 'CREATE DATABASE busy');
$node->safe_psql('busy', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url)
	VALUES ('sink', 'http://127.0.0.1:$sink->{port}/busy');
	SELECT outbox.emit('slots.test', 'a', '{}', destination => 'sink');
});

ok(wait_until(sub {
	slurp_file($node->logfile, $log_start) =~ /WARNING:  outbox_pg has no relay slot left for 1 database/
}, 30), 'the launcher warns that a database got no relay slot');
my $log = slurp_file($node->logfile, $log_start);
like($log, qr/DETAIL:  All 64 relay slots are in use; database "busy" has no relay/,
	'the warning names the database left without a relay');
is($node->safe_psql('busy', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}),
	'0', 'its event is not delivered meanwhile');
my @warnings = ($log =~ /(no relay slot left)/g);
sleep(3);
$log = slurp_file($node->logfile, $log_start);
is(scalar(() = $log =~ /no relay slot left/g), scalar(@warnings),
	'the warning is not repeated every pass');

# The hint's remedy.
$node->append_conf('postgresql.conf', "outbox.databases = 'busy'\n");
$node->reload;
ok(wait_until(sub {
	$node->safe_psql('busy', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}) eq '1'
}, 30), 'with outbox.databases naming it, the database gets relays and delivers');

# Changing outbox.databases while relays start and exit: the launcher
# frees and reassigns slots under relays that are still starting.  A relay
# that connected to its slot's database of the moment once found a freed
# slot and crashed the server (a stress loop of reloads did it about once
# in 100); now it connects to the database it was started for and leaves
# a slot that is no longer its own.
$node->append_conf('postgresql.conf', "outbox.databases = '*'\n");
for my $i (1 .. 30)
{
	$node->append_conf('postgresql.conf',
		$i % 2 ? "outbox.databases = 'busy'\n" : "outbox.databases = '*'\n");
	$node->reload;
	usleep(int(rand(300_000)));
}
$log = slurp_file($node->logfile, $log_start);
unlike($log, qr/terminated by signal/, 'no relay crashed while the slots changed hands');
is($node->safe_psql('busy', q{SELECT outbox.emit('slots.test', 'b', '{}', destination => 'sink') IS NOT NULL}),
	't', 'the server is up');
ok(wait_until(sub {
	$node->safe_psql('busy', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}) eq '2'
}, 30), 'and the database still delivers');

done_testing();
