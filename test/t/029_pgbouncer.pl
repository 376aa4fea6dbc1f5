# outbox_pg behind PgBouncer in transaction pooling mode, with fewer
# server connections (2) than clients: emit() in application transactions
# that commit or roll back, interleaved; the relay delivers the committed
# events only; inbox.claim() dedupes across client connections that run on
# different server connections, and a rolled-back claim can be claimed
# again; wait_published() returns when the event is delivered, and holds
# its server connection while it waits, also after its client went away; a
# destination and route created over a direct connection reach the pooled
# server connections, and an ordered destination's per-aggregate lock
# works across them; a session-level SET (here outbox.traceparent) stays
# on the server connection and reaches other clients, SET LOCAL does not;
# the TypeScript client (clients/node) emits, claims and waits through
# PgBouncer, and node-postgres's named prepared statements work only where
# PgBouncer supports them (1.21 and later, with max_prepared_statements).
use strict;
use warnings;
use Cwd qw(abs_path);
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $PGBOUNCER = '/usr/sbin/pgbouncer';
plan skip_all => 'not installed (run test/install-deps as root): pgbouncer' unless -x $PGBOUNCER;

my $SRC = abs_path("$FindBin::RealBin/../..");
my $POOL_SIZE = 2;

my $sink = start_sink();
my $node = new_outbox_node('pgb', "outbox.workers_per_database = 1\n");
$node->start;
my $secret = secret();
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, signing_secrets)
	VALUES ('hook', '$sink->{url}/ok/hook', ARRAY['$secret']);
	INSERT INTO outbox.routes (pattern, destination) VALUES ('order.*', 'hook');
	CREATE ROLE app LOGIN IN ROLE outbox_writer;
	CREATE TABLE orders (id int PRIMARY KEY, note text);
	-- no unique constraint: exactly-once is the inbox's doing
	CREATE TABLE ledger (message_id text NOT NULL, consumer text NOT NULL, attempt int);
	GRANT SELECT, INSERT ON orders, ledger TO app;
});

# PgBouncer: its own port and files, transaction pooling, two server
# connections for the database, as this OS user (like the cluster)
my ($version) = `$PGBOUNCER --version` =~ /PgBouncer (\d+\.\d+)/;
my ($vmaj, $vmin) = split /\./, $version;
my $named_supported = $vmaj > 1 || $vmin >= 21;
my $dir = "$PostgreSQL::Test::Utils::tmp_check/pgbouncer";
mkdir $dir or die "could not create $dir: $!";
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $host = $node->host;
my $nport = $node->port;
open(my $fh, '>', "$dir/userlist.txt") or die;
print $fh qq{"app" ""\n"postgres" ""\n};
close $fh;
open($fh, '>', "$dir/pgbouncer.ini") or die;
print $fh qq{[databases]
postgres = host=$host port=$nport dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir = $host
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $POOL_SIZE
reserve_pool_size = 0
max_client_conn = 100
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
};
# 1.21 and later keep track of protocol-level named prepared statements
# (older ones refuse to start with the setting)
print $fh "max_prepared_statements = 100\n" if $named_supported;
close $fh;
# -q: the log goes to the logfile only (nobody reads a pipe while it runs)
my $pgb_run = IPC::Run::start([ $PGBOUNCER, '-q', "$dir/pgbouncer.ini" ],
	'>', "$dir/pgbouncer.out", '2>&1');
END { $pgb_run->kill_kill if $pgb_run && $pgb_run->pumpable; }
note("PgBouncer $version on port $port");

# PgBouncer's socket, as a node object: psql, safe_psql and background_psql
# connect through it
my $pgb = PostgreSQL::Test::Cluster->new('pgbouncer', port => $port);
ok(wait_until(sub {
	my ($rc) = $pgb->psql('postgres', 'SELECT 1', timeout => 10);
	return defined $rc && $rc == 0; }, 30), 'PgBouncer accepts connections')
  or BAIL_OUT('PgBouncer did not start: ' . slurp_file("$dir/pgbouncer.out"));

# a statement through PgBouncer, as app
sub pgb_sql
{
	my ($sql) = @_;
	return $pgb->safe_psql('postgres', $sql, timeout => 120, extra_params => [ '-U', 'app' ]);
}

# a session through PgBouncer
sub pgb_session
{
	return $pgb->background_psql('postgres', extra_params => [ '-U', 'app' ], on_error_stop => 0);
}

# a statement through PgBouncer that is still running when this returns;
# pgb_finish() waits for it
my $PSQL = $node->installed_command('psql');
sub pgb_start
{
	my ($sql) = @_;
	my $h = { out => '', err => '', t0 => time };
	$h->{run} = IPC::Run::start(
		[ $PSQL, '-XAtq', '-v', 'ON_ERROR_STOP=1', '-h', $host, '-p', $port, '-U', 'app', '-d', 'postgres', '-c', $sql ],
		'>', \$h->{out}, '2>', \$h->{err}, IPC::Run::timeout(120));
	return $h;
}

sub pgb_finish
{
	my ($h) = @_;
	eval { $h->{run}->finish; };
	$h->{elapsed} = time - $h->{t0};
	chomp $h->{out};
	return $h->{out};
}

# five client sessions, two server connections
my @s = map { pgb_session() } 1 .. 5;
my %pids = map { ($_->query_safe('SELECT pg_backend_pid()') => 1) } @s;
ok(keys(%pids) >= 1 && keys(%pids) <= $POOL_SIZE,
	'five client sessions run on at most two server connections (' . join(' ', sort keys %pids) . ')');
ok($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'}) <= $POOL_SIZE,
	'the server sees at most two connections of app');

# emit() in interleaved application transactions: two open at once (all
# the server connections there are), commits and rollbacks
my %emitted;
sub emit_in
{
	my ($s, $order) = @_;
	$s->query_safe("BEGIN; INSERT INTO orders VALUES ($order, 'psql');");
	return $emitted{$order} = $s->query_safe(
		"SELECT outbox.emit('order.created', '$order', jsonb_build_object('order', $order))");
}
emit_in($s[0], 1);
emit_in($s[1], 2);
my $pid0 = $s[0]->query_safe('SELECT pg_backend_pid()');
my $pid1 = $s[1]->query_safe('SELECT pg_backend_pid()');
isnt($pid0, $pid1, 'two open transactions run on two server connections');
$s[0]->query_safe('ROLLBACK');
emit_in($s[2], 3);
$s[1]->query_safe('COMMIT');
emit_in($s[3], 4);
$s[2]->query_safe('COMMIT');
$s[3]->query_safe('ROLLBACK');
$emitted{5} = pgb_sql(q{
	BEGIN;
	INSERT INTO orders VALUES (5, 'psql');
	SELECT outbox.emit('order.created', '5', '{"order": 5}');
	COMMIT;
});
# a transaction that fails after its emit() is rolled back
my ($rc, $out, $err) = $pgb->psql('postgres', q{
	BEGIN;
	INSERT INTO orders VALUES (6, 'psql');
	SELECT outbox.emit('order.created', '6', '{"order": 6}');
	SELECT outbox.emit('order.created', '6', '{"order": 6}', destination => 'no such destination');
	COMMIT;
}, timeout => 60, extra_params => [ '-U', 'app' ]);
like($err, qr/destination "no such destination" does not exist/, 'an emit() error aborts its transaction');
($emitted{6}) = $out =~ /([0-9a-f-]{36})/;
ok($emitted{6}, 'the failed transaction had emitted an event first');
my @committed = map { $emitted{$_} } 2, 3, 5;
my @rolled_back = map { $emitted{$_} } 1, 4, 6;
ok(wait_until(sub { my $ids = sink_ids($sink); !grep { !$ids->{$_} } @committed }, 60),
	'the relay delivered the committed events');
is($node->safe_psql('postgres', q{SELECT string_agg(id::text, ' ' ORDER BY id) FROM orders}), '2 3 5',
	'the committed orders are stored, the rolled-back ones are not');
is($node->safe_psql('postgres', q{SELECT string_agg(aggregate_id, ' ' ORDER BY aggregate_id) FROM outbox.events}),
	'2 3 5', 'outbox.events has the committed events only');
my $ids = sink_ids($sink);
is(scalar(grep { $ids->{$_} } @rolled_back), 0, 'no rolled-back event was delivered');
my %signed = map { $_->{id} => $_->{sig_ok} } sink_records($sink);
is(scalar(grep { $signed{$_} } @committed), 3, 'each delivery is signed');

# inbox.claim(): a claim still open in one client's transaction makes
# another client's claim of the same id wait (on the other server
# connection); it answers false once the first commits, true once it rolls
# back
$s[0]->query_safe('BEGIN');
my $claim_pid = $s[0]->query_safe('SELECT pg_backend_pid()');
is($s[0]->query_safe(q{SELECT inbox.claim('m-1', 'ledger')}), 't', 'first claim of m-1: true');
$s[0]->query_safe(q{INSERT INTO ledger VALUES ('m-1', 'ledger', 1)});
my $second = pgb_start(q{SELECT inbox.claim('m-1', 'ledger')::text || ' ' || pg_backend_pid()});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity WHERE usename = 'app' AND wait_event_type = 'Lock'}),
	'a second client\'s claim of m-1 waits for the first transaction');
$s[0]->query_safe('COMMIT');
my ($answer, $pid) = split / /, pgb_finish($second);
is($answer, 'false', 'it answers false once the first claim committed');
isnt($pid, $claim_pid, 'on another server connection');
is(pgb_sql(q{SELECT inbox.claim('m-1', 'ledger')}), 'f', 'a later claim of m-1 by a third client: false');

$s[1]->query_safe('BEGIN');
is($s[1]->query_safe(q{SELECT inbox.claim('m-2', 'ledger')}), 't', 'first claim of m-2: true');
$second = pgb_start(q{SELECT inbox.claim('m-2', 'ledger')});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity WHERE usename = 'app' AND wait_event_type = 'Lock'}),
	'a second client\'s claim of m-2 waits');
$s[1]->query_safe('ROLLBACK');
is(pgb_finish($second), 't', 'it answers true once the first claim rolled back');
is(pgb_sql(q{SELECT inbox.claim('m-2', 'ledger')}), 'f', 'and that claim holds: a third claim of m-2 is false');
is($node->safe_psql('postgres', q{SELECT string_agg(message_id || ':' || consumer, ' ' ORDER BY message_id) FROM inbox.claims}),
	'm-1:ledger m-2:ledger', 'inbox.claims has one row per message id');

# wait_published(): while the destination is paused it waits; it returns
# true when the event has been delivered
$node->safe_psql('postgres', q{SELECT outbox.pause('hook')});
my $held = pgb_sql(q{SELECT outbox.emit('order.created', '7', '{"order": 7}')});
my $waiter = pgb_start(qq{SELECT outbox.wait_published('$held', '60s')});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity WHERE usename = 'app' AND state = 'active'
	   AND query LIKE '%wait_published%'}), 'wait_published() waits while the destination is paused');
usleep(500_000);
ok($waiter->{run}->pumpable && $waiter->{out} eq '', 'it has not returned');
ok(!sink_ids($sink)->{$held}, 'the event was not delivered yet');
$node->safe_psql('postgres', q{SELECT outbox.resume('hook')});
is(pgb_finish($waiter), 't', 'wait_published() returns true once the destination is resumed');
ok(sink_ids($sink)->{$held}, 'by then the sink has the event');
note(sprintf('wait_published() waited %.1f s', $waiter->{elapsed}));

# ... and holds a server connection while it waits: two waiters take both,
# and a third client's statement waits in PgBouncer until one of them ends
$node->safe_psql('postgres', q{SELECT outbox.pause('hook')});
$held = pgb_sql(q{SELECT outbox.emit('order.created', '8', '{"order": 8}')});
my @waiters = map { pgb_start(qq{SELECT outbox.wait_published('$held', '6s')}) } 1 .. 2;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM pg_stat_activity WHERE usename = 'app' AND state = 'active'
	   AND query LIKE '%wait_published%'}), 'two wait_published() calls hold both server connections');
my $t0 = time;
is(pgb_sql('SELECT 1'), '1', 'a third client\'s statement runs ...');
my $queued = time - $t0;
ok($queued >= 1.5, sprintf('... only once a waiter has returned (it queued for %.1f s)', $queued));
is(join(' ', map { pgb_finish($_) } @waiters), 'f f', 'the waiters time out: false');
$node->safe_psql('postgres', q{SELECT outbox.resume('hook')});
is(pgb_sql(qq{SELECT outbox.wait_published('$held', '60s')}), 't', 'after resume(): true');

# a client that goes away while it waits (killed, or its own timeout):
# PgBouncer closes that server connection, but the backend does not read
# its socket while it waits and goes on until its timeout, outside the
# pool (which has room for two others meanwhile) -- unless
# client_connection_check_interval is set, which ends it within that
# interval
my $waiting = q{
	SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' AND state = 'active'
	   AND query LIKE '%wait_published%'};
$node->safe_psql('postgres', q{SELECT outbox.pause('hook')});
$held = pgb_sql(q{SELECT outbox.emit('order.created', '12', '{"order": 12}')});
my $gone = pgb_start(qq{SELECT outbox.wait_published('$held', '10s')});
ok($node->poll_query_until('postgres', "SELECT ($waiting) = 1"), 'a client waits');
$gone->{run}->kill_kill;
sleep 2;
is($node->safe_psql('postgres', $waiting), '1', 'the client went away: its wait goes on');
$s[$_]->query_safe('BEGIN') for 0, 1;
isnt($s[0]->query_safe('SELECT pg_backend_pid()'), $s[1]->query_safe('SELECT pg_backend_pid()'),
	'while two other clients hold two server connections');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'}), '3',
	'so the server has more connections of app than the pool\'s two');
$s[$_]->query_safe('COMMIT') for 0, 1;
ok($node->poll_query_until('postgres', "SELECT ($waiting) = 0"), 'it ends at its timeout');
$node->append_conf('postgresql.conf', "client_connection_check_interval = '500ms'\n");
$node->reload;
$gone = pgb_start(qq{SELECT outbox.wait_published('$held', '60s')});
ok($node->poll_query_until('postgres', "SELECT ($waiting) = 1"), 'with client_connection_check_interval: a client waits');
$gone->{run}->kill_kill;
$t0 = time;
ok($node->poll_query_until('postgres', "SELECT ($waiting) = 0"), 'the client went away: its wait ends');
my $lingered = time - $t0;
ok($lingered < 15, sprintf('soon (%.1f s, not the 60 s of its timeout)', $lingered));
$node->safe_psql('postgres', q{SELECT outbox.resume('hook')});

# session state: SET LOCAL outbox.traceparent ends with the transaction;
# a plain SET stays on whichever server connection ran it, for the next
# clients that get it.  Run in two transactions held at once, each SET
# lands on one of the two server connections.
my $tp_local = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my $tp_leak = '00-11111111111111111111111111111111-2222222222222222-01';
my $tp_id = pgb_sql(qq{
	BEGIN;
	SET LOCAL outbox.traceparent = '$tp_local';
	SELECT outbox.emit('order.created', '9', '{"order": 9}');
	COMMIT;
});
my @plain;
for my $i (0, 1)
{
	$s[$i]->query_safe('BEGIN');
	push @plain, $s[$i]->query_safe(q{SELECT outbox.emit('order.created', '10', '{"order": 10}')});
}
$s[$_]->query_safe('COMMIT') for 0, 1;
is($node->safe_psql('postgres', qq{SELECT traceparent FROM outbox.events WHERE id = '$tp_id'}), $tp_local,
	'SET LOCAL outbox.traceparent: the event has it');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.events WHERE aggregate_id = '10' AND traceparent IS NULL}), '2',
	'and it ended with its transaction: the next events, on both server connections, have none');
for my $i (0, 1)
{
	$s[$i]->query_safe('BEGIN');
	$s[$i]->query_safe("SET outbox.traceparent = '$tp_leak'");
}
$s[$_]->query_safe('COMMIT') for 0, 1;
my $other = pgb_sql(q{SELECT outbox.emit('order.created', '11', '{"order": 11}')});
is($node->safe_psql('postgres', qq{SELECT traceparent FROM outbox.events WHERE id = '$other'}), $tp_leak,
	'a plain SET by other clients reaches this client\'s emit(): session settings do not belong to the client');
ok(wait_until(sub { my $r = sink_ids($sink); $r->{$tp_id} && $r->{$other} }, 60), 'both delivered');
my %tp = map { $_->{id} => $_->{headers}{traceparent} } sink_records($sink);
is($tp{$tp_id}, $tp_local, 'the SET LOCAL trace context was sent');
# configuration made over a direct connection reaches the pooled server
# connections, which cached the routes when they emitted above (both did,
# in the two transactions held at once); and per-aggregate ordering:
# emit() serialises an aggregate's emits with a lock that ends with the
# transaction, so through PgBouncer too a second client's emit() for the
# aggregate waits for the first transaction (on the other server
# connection), and the events arrive in emit order
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, options)
	VALUES ('ordered', '$sink->{url}/ok/ordered', '{"ordering": "aggregate"}');
	INSERT INTO outbox.routes (pattern, destination) VALUES ('acct.*', 'ordered');
});
$s[0]->query_safe('BEGIN');
my $a1 = $s[0]->query_safe(q{SELECT outbox.emit('acct.changed', 'acct-1', '{"n": 1}')});
my $later = pgb_start(q{SELECT outbox.emit('acct.changed', 'acct-1', '{"n": 2}')});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity WHERE usename = 'app' AND wait_event_type = 'Lock'
	   AND query LIKE '%acct-1%'}),
	'routed to the new ordered destination, a second client\'s emit() for the aggregate waits for the first transaction');
$s[0]->query_safe('COMMIT');
my $a2 = pgb_finish($later);
ok($a1 lt $a2, 'and its message id is the later one');
ok(wait_until(sub { my $r = sink_ids($sink, '/ok/ordered'); $r->{$a1} && $r->{$a2} }, 60),
	'both delivered');
is(join(' ', map { $_->{id} } grep { $_->{path} =~ m{^/ok/ordered} } sink_records($sink)), "$a1 $a2",
	'in emit order');

for my $i (0, 1)
{
	$s[$i]->query_safe('BEGIN');
	$s[$i]->query_safe('RESET outbox.traceparent');
}
$s[$_]->query_safe('COMMIT') for 0, 1;
$_->quit for @s;

# the TypeScript client through PgBouncer, built as test/run's node suite
# builds it (test/run tap runs npm ci in clients/node)
my $client_dir = "$SRC/clients/node";
SKIP:
{
	skip 'clients/node has no node_modules (test/run tap runs npm ci there)', 15
	  unless -f "$client_dir/node_modules/typescript/bin/tsc" && -d "$client_dir/node_modules/pg";
	my ($tsc_out, $node_out, $node_err) = ('', '', '');
	my $built = IPC::Run::run([ 'node', "$client_dir/node_modules/typescript/bin/tsc", '-p', "$client_dir/tsconfig.json" ],
		'>', \$tsc_out, '2>&1', IPC::Run::timeout(300));
	ok($built, 'the client builds') or diag($tsc_out);
	local $ENV{PGHOST} = '127.0.0.1';
	local $ENV{PGPORT} = $port;
	local $ENV{PGUSER} = 'app';
	local $ENV{PGDATABASE} = 'postgres';
	my $ran = IPC::Run::run([ 'node', "$SRC/test/sink/pooled_client.mjs", $client_dir, 100 ],
		'>', \$node_out, '2>', \$node_err, IPC::Run::timeout(300));
	ok($ran, 'the client script ran') or diag("$node_out\n$node_err");
	my $r = eval { decode_json($node_out) } // {};
	note("client: $node_out");
	is(scalar(@{ $r->{committed} // [] }), 4, 'four of eight concurrent transactions committed their emit()');
	ok(($r->{emit_backends} // 0) >= 1 && $r->{emit_backends} <= $POOL_SIZE,
		"on at most two server connections ($r->{emit_backends})");
	my @node_committed = map { $_->{id} } @{ $r->{committed} // [] };
	my @node_rolled_back = map { $_->{id} } @{ $r->{rolled_back} // [] };
	is_deeply($r->{published}, [ (JSON::PP::true) x 4 ], 'waitPublished() of each committed event: true');
	is($r->{wait_rolled_back}, 'NotFoundError 42704', 'waitPublished() of a rolled-back event: NotFoundError');
	$ids = sink_ids($sink);
	is(scalar(grep { $ids->{$_} } @node_committed), 4, 'the sink has the committed events');
	is(scalar(grep { $ids->{$_} } @node_rolled_back), 0, 'and none of the rolled-back ones');
	my ($rec) = grep { $_->{id} eq ($node_committed[0] // '') } sink_records($sink);
	is_deeply($rec->{data}{lines}, [ 100, 'x', { n => 0 } ], 'an array in the payload arrived as JSON');
	is($r->{inbox_ran}, 1, 'withInbox() of one message id from four connections at once: ran once');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE message_id = 'node-msg-100'}), '1',
		'the ledger has one write for it');
	is($node->safe_psql('postgres', q{
		SELECT string_agg(attempt::text, ' ') FROM ledger WHERE message_id = 'node-msg-100-retry'}), '1',
		'and of a message whose first attempt failed, the second attempt\'s only');
	is("$r->{failed_attempt} / $r->{retry} / " . ($r->{duplicate_after_retry} ? 'ran' : 'skipped'),
		'handler failed / second / skipped',
		'a failed attempt rolls its claim back: the redelivery runs, the next is a duplicate');

	# named prepared statements: with PgBouncer's support (1.21+), they
	# work; without it, a name prepared on one server connection is unknown
	# on the other (26000) or exists already for another client (42P05)
	if ($named_supported)
	{
		is(join(' ', @{ $r->{named} }), '1 1 2 2 3 3', "PgBouncer $version: named prepared statements work");
	}
	else
	{
		ok((grep { /^(26000|42P05)$/ } @{ $r->{named} }) > 0,
			"PgBouncer $version: named prepared statements fail (" . join(' ', @{ $r->{named} }) . ')');
	}
	is(join(' ', @{ $r->{unnamed} // [] }), '1 1 2 2 3 3', 'unnamed ones (what the client uses) work');
}

$pgb_run->kill_kill;
$node->stop;
stop_sink($sink);
done_testing();
