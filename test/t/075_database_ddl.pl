# Statements that need a database without sessions — DROP DATABASE,
# ALTER DATABASE ... RENAME TO, ALTER DATABASE ... SET TABLESPACE and
# CREATE DATABASE ... TEMPLATE — work on a database whose relays are
# running: they stop its relays first, and the relays come back when the
# statement is over (or go for good with the database).  Before, every one
# of them failed after 5 s with "database ... is being accessed by other
# users".  Only a role allowed to run the statement stops the relays:
# another one's attempt fails as before and leaves them running.  Template
# databases have no relays, so the extension in template1 never stood in
# the way of CREATE DATABASE; that stays so.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);

my $sink = start_sink();
my $node = new_outbox_node('database_ddl', qq{
outbox.workers_per_database = 2
});
$node->start;
my $log_start = -s $node->logfile;

# A database with the extension and a destination that delivers.
sub make_relayed_database
{
	my ($db) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
		CREATE EXTENSION outbox_pg;
		INSERT INTO outbox.destinations (name, url)
		VALUES ('sink', 'http://127.0.0.1:$sink->{port}/$db');
		SELECT outbox.emit('ddl.test', 'a', '{}', destination => 'sink');
	});
}

sub running_relays
{
	my ($db) = @_;
	return scalar(relay_pids($node, $db));
}

# Run a statement in postgres as a role; (ok, seconds, stderr).
sub timed_psql
{
	my ($sql, $role) = @_;
	my ($out, $err);
	my $t0 = time;
	my $rc = $node->psql('postgres', $sql, stdout => \$out, stderr => \$err,
		extra_params => [ defined $role ? ('-U', $role) : () ]);
	return ($rc == 0, time - $t0, $err);
}

# Every event of a database reaches the sink (the relays work there).
sub delivers
{
	my ($db) = @_;
	return wait_until(sub {
		$node->safe_psql($db, q{
			SELECT count(*) = 0 FROM outbox.events WHERE status <> 'published'}) eq 't';
	}, 20);
}

make_relayed_database('app');
ok(wait_until(sub { running_relays('app') == 2 }, 20), 'both relays of app run');
ok(delivers('app'), 'app delivers');

# CREATE DATABASE ... TEMPLATE a relayed database
my ($ok, $secs, $err) = timed_psql('CREATE DATABASE app_copy TEMPLATE app');
ok($ok, sprintf('CREATE DATABASE ... TEMPLATE app succeeds (%.2f s)', $secs))
  or diag($err);
ok(wait_until(sub { running_relays('app') == 2 }, 20), 'the relays of app come back');
$node->safe_psql('app', q{SELECT outbox.emit('ddl.test', 'b', '{}', destination => 'sink')});
ok(delivers('app'), 'app delivers after the copy');

# A test suite clones its template again and again: the relays stopped
# for it come back at once every time (they are not failures that back
# off: 0.5 s, 1 s, 2 s, 4 s, ... before).
for my $n (1 .. 5)
{
	($ok, $secs, $err) = timed_psql("CREATE DATABASE app_copy_$n TEMPLATE app");
	ok($ok, "copy $n succeeds") or diag($err);
	my $t0 = time;
	wait_until(sub { running_relays('app') == 2 }, 20);
	my $back = time - $t0;
	ok($back < 10, sprintf('copy %d: the relays of app are back after %.2f s', $n, $back));
	# (the copies have the extension: they would take relay slots)
	$node->safe_psql('postgres', "DROP DATABASE app_copy_$n");
}

# A RENAME rolled back, after a copy, ten times: the relays come back
# under the old name every time.  (The launcher kept its relays' handles
# in memory it reset after each pass; with relays restarted this often,
# two slots came to share one handle and worker 0 was never restarted.)
my $stuck = 0;
for my $n (1 .. 10)
{
	$node->safe_psql('postgres', "CREATE DATABASE app_again_$n TEMPLATE app");
	$node->safe_psql('postgres', q{
		BEGIN;
		ALTER DATABASE app RENAME TO app_never;
		ROLLBACK;
	});
	$node->safe_psql('postgres', "DROP DATABASE app_again_$n");
	next if wait_until(sub { running_relays('app') == 2 }, 20);
	$stuck = $n;
	diag($node->safe_psql('postgres', 'SELECT * FROM outbox.workers()'));
	last;
}
is($stuck, 0, 'a rolled-back RENAME leaves the relays to the old name, ten times');

# ALTER DATABASE ... RENAME TO
($ok, $secs, $err) = timed_psql('ALTER DATABASE app RENAME TO app_renamed');
ok($ok, sprintf('ALTER DATABASE app RENAME TO succeeds (%.2f s)', $secs)) or diag($err);
ok(wait_until(sub { running_relays('app_renamed') == 2 }, 20),
	'the relays come back for the renamed database');
$node->safe_psql('app_renamed', q{SELECT outbox.emit('ddl.test', 'c', '{}', destination => 'sink')});
ok(delivers('app_renamed'), 'the renamed database delivers');

# ALTER DATABASE ... SET TABLESPACE
my $ts_dir = PostgreSQL::Test::Utils::tempdir_short();
$node->safe_psql('postgres', "CREATE TABLESPACE ddl_ts LOCATION '$ts_dir'");
($ok, $secs, $err) = timed_psql('ALTER DATABASE app_renamed SET TABLESPACE ddl_ts');
ok($ok, sprintf('ALTER DATABASE ... SET TABLESPACE succeeds (%.2f s)', $secs)) or diag($err);
ok(wait_until(sub { running_relays('app_renamed') == 2 }, 20),
	'the relays come back after the move');

# A role that may not drop the database stops nothing.
$node->safe_psql('postgres', 'CREATE ROLE intruder LOGIN');
my @before = sort(relay_pids($node, 'app_renamed'));
($ok, $secs, $err) = timed_psql('DROP DATABASE app_renamed', 'intruder');
ok(!$ok && $err =~ /must be owner of database app_renamed/,
	'DROP DATABASE by a role that does not own it fails as before')
  or diag($err);
is(join(',', sort(relay_pids($node, 'app_renamed'))), join(',', @before),
	'and the relays it could not drop keep running, same processes');

# DROP DATABASE: the relays go, and stay gone.
($ok, $secs, $err) = timed_psql('DROP DATABASE app_renamed');
ok($ok, sprintf('DROP DATABASE of a relayed database succeeds (%.2f s)', $secs))
  or diag($err);
ok(wait_until(sub {
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay'
		   AND datid NOT IN (SELECT oid FROM pg_database)}) == 0
}, 5), 'no relay is left for the dropped database');
sleep(3);
my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/FATAL:.*database .*does not exist/,
	'no relay was started for the dropped database');

# DROP and CREATE again in one session, the way a test suite resets its
# database: the new database's relays start at once (the dropped one's
# hold does not pass to the slots they reuse).
make_relayed_database('suite');
ok(wait_until(sub { running_relays('suite') == 2 }, 20), 'both relays of suite run');
# The session stays open afterwards (an open session kept the drop's hold
# on the slots until it ended).
my $session = IPC::Run::start(
	[
		'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
		'-c', 'DROP DATABASE suite',
		'-c', 'CREATE DATABASE suite TEMPLATE app_copy',
		'-c', 'SELECT pg_sleep(15)'
	],
	'>', \my $session_out, '2>', \my $session_err);
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT count(*) FROM pg_database WHERE datname = 'suite'}) eq '1'
	  && $node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(15)'}) eq '1'
}, 20), 'the session dropped and created the database again and is still open');
my $t0 = time;
ok(wait_until(sub { running_relays('suite') == 2 }, 10),
	sprintf('the database created again in the same session gets relays (%.2f s), the session still open',
		time - $t0));
$session->finish;
is($session_err, '', 'the session had no error');

# Copying a database takes its owner (or a superuser) unless it is a
# template: a role with CREATEDB that does not own it stops nothing.
make_relayed_database('other');
ok(wait_until(sub { running_relays('other') == 2 }, 20), 'both relays of other run');
$node->safe_psql('postgres', 'CREATE ROLE creator LOGIN CREATEDB');
@before = sort(relay_pids($node, 'other'));
($ok, $secs, $err) = timed_psql('CREATE DATABASE stolen TEMPLATE other', 'creator');
ok(!$ok && $err =~ /permission denied to copy database "other"/,
	'copying a database by a role that does not own it fails as before')
  or diag($err);
is(join(',', sort(relay_pids($node, 'other'))), join(',', @before),
	'and its relays keep running, same processes');

# The extension in template1: templates are not relayed, and every
# CREATE DATABASE copies the extension into a database that is.
$node->safe_psql('template1', 'CREATE EXTENSION outbox_pg');
($ok, $secs, $err) = timed_psql('CREATE DATABASE fresh');
ok($ok, sprintf('CREATE DATABASE from template1 with the extension (%.2f s)', $secs))
  or diag($err);
is(running_relays('template1'), 0, 'template1 has no relays');
$node->safe_psql('fresh', qq{
	INSERT INTO outbox.destinations (name, url)
	VALUES ('sink', 'http://127.0.0.1:$sink->{port}/fresh');
	SELECT outbox.emit('ddl.test', 'f', '{}', destination => 'sink');
});
ok(delivers('fresh'), 'the new database has relays that deliver');

$log = slurp_file($node->logfile, $log_start);
my @stops = ($log =~ /(stopping the outbox_pg relays of database "[^"]+" for [A-Z ]+)/g);
note(join("\n", @stops));
ok(scalar(grep { /"app" for CREATE DATABASE/ } @stops) >= 1,
	'the log says why the relays stopped');

done_testing();
