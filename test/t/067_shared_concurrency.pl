# max_concurrency is the destination's, not each relay's (issue #20): with
# two relay workers and a receiver that answers after 200-500 ms and
# counts the requests it has in flight itself (test/sink/slow_sink.py),
#   - max_concurrency 16: never more than 16 in flight, with both workers
#     delivering;
#   - max_concurrency 200: well above 128 in flight (two workers at the
#     old 64 connections per host each), never above 200: the connections
#     follow the concurrency;
#   - a slow destination (500 ms) at its limit does not hold up a fast one
#     of the same workers: every fast event is answered while the slow
#     destination still has most of its events to go;
#   - the worker's connections (outbox.max_connections_per_worker) are
#     shared by its destinations: a slow one with a concurrency far above
#     them leases no more than it can connect (none of its requests times
#     out waiting inside curl for a connection), and leaves its share to
#     a neighbour;
#   - each connection is a file descriptor: the relay raises its soft
#     limit of open files to fit the setting, and where the hard limit is
#     too low it says so in a WARNING and still delivers.
# Events are emitted in many small transactions, so both workers claim.
# Assertions are on bounds, with generous deadlines, never on timings.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = start_slow_sink();
my $u = $sink->{url};
my $node = new_outbox_node('conc', q{
outbox.workers_per_database = 2
outbox.batch_size = 400
});
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency) VALUES
		('c16', '$u/delay/200/c16', 60000, 16),
		('c200', '$u/delay/500/c200', 60000, 200),
		('slow', '$u/delay/500/slow', 60000, 8),
		('fast', '$u/delay/0/fast', 60000, 16);
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}),
	'two relay workers run');

# n events to dest, per events a transaction, with a pause of ms
# milliseconds after each commit: every commit wakes both workers, and
# both claim (a backlog that is there all at once is claimed by one
# worker, the other finding it taken)
sub emit_in_transactions
{
	my ($dest, $n, $per, $ms) = @_;
	my $txns = $n / $per;
	my $pause = ($ms // 0) / 1000.0;
	$node->safe_psql('postgres', qq{
		DO \$\$
		BEGIN
			FOR t IN 0 .. $txns - 1 LOOP
				PERFORM outbox.emit('conc.$dest', (t * $per + g)::text, '{}', destination => '$dest')
				   FROM generate_series(1, $per) g;
				COMMIT;
				PERFORM pg_catalog.pg_sleep($pause);
			END LOOP;
		END \$\$});
}

# events published by each relay worker so far, by pid
sub published_by_worker
{
	my %n = map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
		SELECT pid, published FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL});
	return \%n;
}

sub answered
{
	my ($name) = @_;
	return slow_sink_stats($sink)->{names}{$name}{requests} // 0;
}

# 1. max_concurrency 16 with two workers: 16 in flight at most (each
# worker kept 16 before: 32).  600 events in 4 s or more, faster than the
# 80 a second that 16 at 200 ms deliver: both workers have work.
my $before = published_by_worker();
emit_in_transactions('c16', 600, 4, 25);
ok(wait_until(sub { answered('c16') >= 600 }, 300), 'c16: 600 events answered');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 600 FROM outbox.events WHERE destination = 'c16' AND status = 'published'}),
	'c16: 600 events published');
my $c16 = slow_sink_stats($sink)->{names}{c16};
cmp_ok($c16->{max_in_flight}, '<=', 16, "c16: the receiver never had more than 16 in flight ($c16->{max_in_flight})");
cmp_ok($c16->{max_in_flight}, '>=', 12, 'c16: ... and the limit was used');
my $after = published_by_worker();
my @busy = grep { ($after->{$_} // 0) - ($before->{$_} // 0) > 0 } keys %$after;
is(scalar(@busy), 2, 'c16: both workers delivered ('
	. join(', ', map { ($after->{$_} // 0) - ($before->{$_} // 0) } sort keys %$after) . ')');

# 2. max_concurrency 200: more than two workers' old 64 connections each,
# and both workers share the backlog.  It is there when the destination is
# resumed, so both claim at once and one finds the stream locked by the
# other: that worker took the destination for drained and stopped for
# good in about half the runs, the other holding every slot (a 200 ms
# receiver got 0.5x of max_concurrency / 0.2 s instead of 0.9x).
$before = $after;
$node->safe_psql('postgres', q{SELECT outbox.pause('c200')});
emit_in_transactions('c200', 2000, 10);
$node->safe_psql('postgres', q{SELECT outbox.resume('c200')});
ok(wait_until(sub { answered('c200') >= 2000 }, 300), 'c200: 2,000 events answered');
my $c200 = slow_sink_stats($sink)->{names}{c200};
cmp_ok($c200->{max_in_flight}, '<=', 200, "c200: never more than 200 in flight ($c200->{max_in_flight})");
cmp_ok($c200->{max_in_flight}, '>', 128, 'c200: more than 2 x 64 in flight: connections follow the concurrency');
$after = published_by_worker();
my @shares = map { ($after->{$_} // 0) - ($before->{$_} // 0) } sort keys %$after;
note('c200: the receiver saw at most ' . slow_sink_stats($sink)->{max_connections} . ' connections');
is(scalar(grep { $_ >= 500 } @shares), 2,
	'c200: each worker published a quarter of the backlog or more (' . join(', ', @shares) . ')');

# 3. no head-of-line blocking: the slow destination at its limit (8 at
# 500 ms: 300 events take 19 s or more), the fast one goes through
emit_in_transactions('slow', 300, 10, 25);
ok(wait_until(sub { (slow_sink_stats($sink)->{names}{slow}{in_flight} // 0) >= 8 }, 120),
	'slow: at its limit');
emit_in_transactions('fast', 400, 10);
ok(wait_until(sub { answered('fast') >= 400 }, 300), 'fast: 400 events answered');
my $slow_done = answered('slow');
cmp_ok($slow_done, '<', 300, "fast: done while the slow destination still had events to go ($slow_done of 300 answered)");
ok(wait_until(sub { answered('slow') >= 300 }, 300), 'slow: 300 events answered');
my $slow = slow_sink_stats($sink)->{names}{slow};
cmp_ok($slow->{max_in_flight}, '<=', 8, "slow: never more than 8 in flight ($slow->{max_in_flight})");
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 3300 FROM outbox.events WHERE status = 'published'}),
	'every event is published');

# 4. 24 connections per worker, a destination with a concurrency of 200
# at 2 s and a timeout of 3.5 s: each worker used to lease up to 100 of
# its events, 24 connected and the rest waiting in curl, where they timed
# out and were sent again.  Now it leases what the worker can connect,
# and 16 of the 24 once the neighbour has work.
$node->append_conf('postgresql.conf', 'outbox.max_connections_per_worker = 24');
$node->reload;
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency) VALUES
		('hog', '$u/delay/2000/hog', 3500, 200),
		('neighbour', '$u/delay/0/neighbour', 60000, 8);
});
emit_in_transactions('hog', 240, 10, 25);
ok(wait_until(sub { (slow_sink_stats($sink)->{names}{hog}{in_flight} // 0) >= 30 }, 120),
	'hog: both workers sending');
emit_in_transactions('neighbour', 100, 10);
ok(wait_until(sub { answered('neighbour') >= 100 }, 300), 'neighbour: 100 events answered');
my $hog_done = answered('hog');
cmp_ok($hog_done, '<', 240, "neighbour: done while the hog still had events to go ($hog_done of 240 answered)");
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 240 FROM outbox.events WHERE destination = 'hog' AND status = 'published'}),
	'hog: 240 events published');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.events WHERE destination = 'hog' AND attempts > 1}),
	'0', 'hog: every event published at its first attempt');
# the receiver writes its counts every 0.1 s, after the relay has the
# answer: wait for the 240th, then long enough for a 241st to show
ok(wait_until(sub { answered('hog') >= 240 }, 30), 'hog: the receiver counted 240 answers');
sleep(1);
my $hog = slow_sink_stats($sink)->{names}{hog};
is($hog->{requests}, 240, 'hog: the receiver answered 240 requests, none sent twice');
cmp_ok($hog->{max_in_flight}, '<=', 48, "hog: at most 2 x 24 in flight ($hog->{max_in_flight})");

# 5. open files: 3,000 connections need more than the usual soft limit of
# 1,024 (and PostgreSQL's max_files_per_process of its own)
sub open_files_limits
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/limits") or die "cannot read /proc/$pid/limits: $!";
	my ($soft, $hard) = map { /^Max open files\s+(\S+)\s+(\S+)/ ? ($1, $2) : () } <$fh>;
	close($fh);
	return ($soft, $hard);
}
$node->append_conf('postgresql.conf', 'outbox.max_connections_per_worker = 3000');
$node->reload;
$node->safe_psql('postgres', q{SELECT outbox.emit('conc.neighbour', 'x', '{}', destination => 'neighbour')});
ok(wait_until(sub { answered('neighbour') >= 101 }, 60), 'limits: an event sent after the reload');
my ($relay) = relay_pids($node, 'postgres');
my ($soft, $hard) = open_files_limits($relay);
my $max_safe = $node->safe_psql('postgres', 'SHOW max_files_per_process');
SKIP:
{
	skip "the hard limit of open files ($hard) is below what 3,000 connections need", 1
	  if $hard ne 'unlimited' && $hard < 3000 + $max_safe + 64;
	cmp_ok($soft, '>=', 3000, "limits: the relay raised its soft limit of open files ($soft, hard $hard)");
}

# ... and with a hard limit of 1,100 the relays restarted under it use
# fewer connections, say so, and deliver
my $pm_pid = (split /\n/, PostgreSQL::Test::Utils::slurp_file($node->data_dir . '/postmaster.pid'))[0];
system('prlimit', "--pid=$pm_pid", '--nofile=1024:1100') == 0 or die "prlimit failed";
# log_min_messages = log (the test default) leaves WARNINGs out of the log
$node->append_conf('postgresql.conf', 'log_min_messages = warning');
$node->reload;
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
	 WHERE backend_type = 'outbox_pg relay'});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}),
	'limits: two relay workers run again');
$node->safe_psql('postgres', q{SELECT outbox.emit('conc.neighbour', 'y', '{}', destination => 'neighbour')});
ok(wait_until(sub { answered('neighbour') >= 102 }, 120), 'limits: delivered under a hard limit of 1,100');
note("postmaster: open files " . join('/', open_files_limits($pm_pid)) . "; relays: "
	. join(', ', map { join('/', open_files_limits($_)) } relay_pids($node, 'postgres')));
ok(wait_until(sub {
	PostgreSQL::Test::Utils::slurp_file($node->logfile, $log_offset)
	  =~ /WARNING:  outbox.max_connections_per_worker is 3000, but this relay worker can open only \d+ connections/ }, 30),
	'limits: the worker says how many connections it can open');

$node->stop;
stop_sink($sink);
done_testing();
