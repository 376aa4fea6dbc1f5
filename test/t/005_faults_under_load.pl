# Faults while applications keep committing (issue #13).  Emitter processes
# run many short transactions, each calling outbox.emit() and noting the
# id it returned; meanwhile a relay worker is killed with SIGKILL (the
# postmaster restarts the whole cluster), the server is stopped with
# -m immediate and started again, and the sink goes down for a few
# seconds.  The emitters reconnect and carry on.
#
# An emitter knows an id is committed only when COMMIT returned.  A
# transaction whose connection died after emit() returned but before
# COMMIT answered has an unknown outcome: afterwards the test looks the id
# up, and those that exist must be delivered like the rest.
#
# At the end: every committed id is in the table and was acknowledged by
# the sink (zero lost), every row in the table is one the emitters saw,
# the sink acknowledged nothing that is not in the table, and duplicates
# are counted and bounded: a message is delivered again only if the sink
# had acknowledged it shortly before a crash (its request was in flight,
# or its result was not recorded or not yet durable: the relay commits
# results asynchronously).  The sink outage alone causes no duplicates.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $EMITTERS = 3;
my $PER_SCRIPT = 20;			# transactions per psql session, on average
my $PACE = 0.2;					# seconds between sessions, on average
my $CRASH_WINDOW = 5.0;			# seconds before a crash an ack may be lost in

my $sink = start_sink();
my $node = new_outbox_node('load', "outbox.workers_per_database = 2\nrestart_after_crash = on\n");
$node->start;
my $u = $sink->{url};
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms)
	VALUES ('load', '$u/ok/load', 2000, 1000, 50, 500);
});
my $batch_size = $node->safe_psql('postgres', 'SHOW outbox.batch_size');
my $workers = $node->safe_psql('postgres', 'SHOW outbox.workers_per_database');

my $tmp = $PostgreSQL::Test::Utils::tmp_check;
my $stopfile = "$tmp/emitters.stop";
unlink $stopfile;
my $parent = $$;

# One emitter: psql sessions of $PER_SCRIPT transactions each, again and
# again until the stop file appears; a session that fails (server gone)
# is followed by a new one.  Its log gets "E id" when emit() returned,
# "C id" when COMMIT returned.  Each transaction works a little after
# emit(), so a crash often finds one between emit() and COMMIT.
sub run_emitter
{
	my ($e, $log) = @_;
	my $psql = $node->installed_command('psql');
	my $connstr = $node->connstr('postgres') . ' application_name=emitter';
	my $seq = 0;

	# random session lengths and pauses keep the emitters out of step
	srand($$);
	open(my $out, '>>', $log) or die "could not open $log: $!";
	$out->autoflush(1);
	while (!-e $stopfile && getppid() == $parent)	# stop with the test
	{
		my $script = '';
		for (1 .. 1 + int(rand(2 * $PER_SCRIPT)))
		{
			$seq++;
			$script .= "BEGIN;\n"
			  . "SELECT outbox.emit('load.test', 'e$e-$seq', '{\"e\": $e, \"seq\": $seq}', destination => 'load') AS id \\gset\n"
			  . "\\echo E :id\n"
			  . "SELECT pg_sleep(0.01) \\gset\n"	# work after emit(), before COMMIT
			  . "COMMIT;\n"
			  . "\\echo C :id\n";
		}
		# from a file: psql may exit (server gone) before reading it all
		open(my $sql, '>', "$log.sql") or die "could not write $log.sql: $!";
		print $sql $script;
		close $sql;
		my ($stdout, $stderr) = ('', '');
		my $ok = IPC::Run::run([ $psql, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $connstr, '-f', "$log.sql" ],
			'<', \undef, '>', \$stdout, '2>', \$stderr);
		print $out $stdout;
		printf $out "X %.3f %s\n", time, join(" | ", split /\n/, $stderr) unless $ok;
		# pace the load (and reconnect shortly when the server is down)
		usleep(rand(2 * $PACE) * 1_000_000);
	}
	close $out;
}

my (@pids, @logs);
for my $e (1 .. $EMITTERS)
{
	my $log = "$tmp/emitter_$e.log";
	unlink $log;
	push @logs, $log;
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		# never return into the test script (its END blocks stop the node)
		eval { run_emitter($e, $log); };
		print STDERR "emitter $e: $@" if $@;
		POSIX::_exit($@ ? 1 : 0);
	}
	push @pids, $pid;
}

# (emitted ids, committed ids) from the emitters' logs, whole lines only
sub emitter_ids
{
	my (%emitted, %committed);
	for my $log (@logs)
	{
		open(my $fh, '<', $log) or next;
		while (my $line = <$fh>)
		{
			last unless $line =~ /\n\z/;
			$emitted{$1} = 1 if $line =~ /^E (\S+)$/;
			$committed{$1} = 1 if $line =~ /^C (\S+)$/;
		}
		close $fh;
	}
	return (\%emitted, \%committed);
}

sub committed_count { my (undef, $c) = emitter_ids(); return scalar(keys %$c); }

# a query's answer, waiting for the server to accept connections again
sub query_when_up
{
	my ($sql) = @_;
	my ($ret, $stdout);
	# psql reads the query from a pipe: when the server goes away while it
	# starts, IPC::Run dies writing to it (broken pipe); that is one more try
	ok(wait_until(sub {
				eval { ($ret, $stdout) = $node->psql('postgres', $sql); 1 }
				  && $ret == 0;
			}, 60),
		'the server accepts connections');
	return $stdout;
}

# more rows are published, and the emitters commit more, than before
sub progress
{
	my ($name) = @_;
	my $published = query_when_up(q{SELECT count(*) FROM outbox.events WHERE status = 'published'});
	my $committed = committed_count();
	ok($node->poll_query_until('postgres', qq{
		SELECT count(*) >= $published + 100 FROM outbox.events WHERE status = 'published'}),
		"$name: delivery goes on");
	ok(wait_until(sub { committed_count() >= $committed + 100 }, 90),
		"$name: the emitters keep committing");
}

my $t0 = time;
progress('start');

my @crashes;

# crash only while emitter sessions are connected
sub emitters_connected
{
	ok($node->poll_query_until('postgres', q{
		SELECT count(*) >= 2 FROM pg_stat_activity WHERE application_name = 'emitter'}),
		'emitter sessions are connected');
}

# 1. SIGKILL of a relay worker: the postmaster restarts the whole cluster
my ($victim) = relay_pids($node, 'postgres');
emitters_connected();
push @crashes, time;
kill 'KILL', $victim;
note("killed relay $victim with SIGKILL");
progress('after SIGKILL of a relay');

# 2. immediate shutdown and restart
emitters_connected();
push @crashes, time;
$node->stop('immediate');
$node->start;
progress('after an immediate stop and restart');

# 3. the sink goes down for a few seconds while the emitters commit
my $committed_before = committed_count();
stop_sink($sink);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM outbox.events WHERE status = 'pending' AND last_error IS NOT NULL}),
	'sink down: deliveries fail');
sleep 3;						# the outage itself
ok(committed_count() > $committed_before, 'sink down: the emitters keep committing');
restart_sink($sink);
progress('after the sink came back');

# stop the emitters and let everything drain
open(my $fh, '>', $stopfile) or die;
close $fh;
waitpid($_, 0) for @pids;
my $emit_secs = time - $t0;
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.events WHERE status <> 'published'}),
	'every row is published in the end');

my ($emitted, $committed) = emitter_ids();
my @unknown = grep { !$committed->{$_} } keys %$emitted;
my %in_table = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', q{SELECT id FROM outbox.events WHERE type = 'load.test'});
my @unknown_committed = grep { $in_table{$_} } @unknown;
my $cut = 0;
for my $log (@logs)
{
	open(my $fh, '<', $log) or die;
	$cut += grep { /^X / } <$fh>;
	close $fh;
}
note("$cut emitter sessions failed (cut by a crash, or could not connect while the server was down)");
cmp_ok($cut, '>', 0, 'the crashes hit emitter sessions');
note(sprintf('%d transactions committed in %.1f s by %d emitters (%.0f/s); %d with unknown outcome, of which %d committed',
	scalar(keys %$committed), $emit_secs, $EMITTERS, scalar(keys %$committed) / $emit_secs,
	scalar(@unknown), scalar(@unknown_committed)));

is(scalar(grep { !$in_table{$_} } keys %$committed), 0, 'every committed id is in the table');
is(scalar(grep { !$emitted->{$_} } keys %in_table), 0, 'every row in the table is one an emitter saw');
assert_zero_lost($sink, 'committed ids', '/ok/load', keys %$committed);
assert_zero_lost($sink, 'unknown-outcome ids that committed', '/ok/load', @unknown_committed)
  if @unknown_committed;

# what the sink acknowledged: when, how often
my (%acks, @ack_times);
for my $r (sink_records($sink))
{
	next unless $r->{answer} >= 200 && $r->{answer} < 300;
	push @{ $acks{ $r->{id} } }, $r->{t};
}
is(scalar(grep { !$in_table{$_} } keys %acks), 0, 'the sink acknowledged only ids that are in the table');

# duplicates: an id acknowledged again must have had its earlier ack
# shortly before a crash
my ($dups, $unexplained, $bound) = (0, 0, 0);
for my $id (keys %acks)
{
	my @t = sort { $a <=> $b } @{ $acks{$id} };
	next if @t < 2;
	$dups += @t - 1;
	$unexplained++
	  unless grep { my $c = $_; $t[0] >= $c - $CRASH_WINDOW && $t[0] <= $c + 1 } @crashes;
}
for my $c (@crashes)
{
	$bound += scalar(grep { my $t = $acks{$_}->[0]; $t >= $c - $CRASH_WINDOW && $t <= $c + 1 } keys %acks);
}
note(sprintf('duplicates: %d over %d crashes (in flight per crash at most batch_size x workers = %d; acknowledged within %.0f s before a crash: %d)',
	$dups, scalar(@crashes), $batch_size * $workers, $CRASH_WINDOW, $bound));
is($unexplained, 0, "every duplicate was acknowledged within $CRASH_WINDOW s before a crash");
cmp_ok($dups, '<=', $bound, 'duplicates <= acknowledgements in the crash windows');

ok(!$node->log_contains('terminated by signal 11'), 'no process crashed by itself');

$node->stop;
stop_sink($sink);
done_testing();
