# A long-held snapshot must not stall delivery (issue #21).  An open-loop
# emitter (pgbench -R) commits one event per transaction at
# OUTBOX_SNAPSHOT_RATE events/s (1,000) to one destination, relayed by two
# workers into the fast sink.  In the middle of the run one session holds a
# REPEATABLE READ snapshot for OUTBOX_SNAPSHOT_SECS (60): first one that has
# read only an application table (a long report, a forgotten BEGIN), then,
# after a short gap, one like pg_dump's for OUTBOX_SNAPSHOT_DUMP_SECS (half
# of it): ACCESS SHARE on every table of the outbox schema and a read of
# outbox.events.  During each hold the backlog is sampled every second
# through the public monitoring functions: outbox.metrics()'s oldest
# pending age must stay under 5 s, and the pending count at the end of the
# hold must be below one second's worth of events.  Afterwards nothing is
# lost: every event the emitter committed is in outbox.events, published,
# and was acknowledged by the sink (duplicates are at-least-once and only
# noted); the sink received no id that was never committed.
#
# Loose bounds, not a benchmark (test/bench/snapshot measures).  Only public
# SQL is used (emit, metrics, health, outbox.events, wait_published), so the
# test means the same before and after the insert-only store.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $RATE = $ENV{OUTBOX_SNAPSHOT_RATE} // 1000;
my $SECS = $ENV{OUTBOX_SNAPSHOT_SECS} // 60;
my $DUMP_SECS = $ENV{OUTBOX_SNAPSHOT_DUMP_SECS} // int($SECS / 2);
my $LEAD = 10;			# steady state before the first hold
my $GAP = 5;			# after each hold
my $MAX_AGE = 5;		# seconds, the issue's bound
my $TOTAL = $LEAD + $SECS + $GAP + $DUMP_SECS + $GAP;

my $sink = start_fast_sink();
# every emit() is a statement: do not log them all
my $node = new_outbox_node('snapshot', "outbox.workers_per_database = 2\nlog_statement = none\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, max_concurrency)
	VALUES ('snap', '$sink->{url}/snap', 64);
	CREATE TABLE report (n int);
	INSERT INTO report VALUES (1);
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'two relay workers run');
my @relays = relay_pids($node, 'postgres');

# user + system CPU seconds of the relay workers, from /proc
sub relay_cpu
{
	my $t = 0;
	for my $pid (@relays)
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;
		my ($rest) = (<$fh> =~ /\)\s(.*)$/);
		close $fh;
		my @f = split ' ', $rest;
		$t += ($f[11] + $f[12]) / 100.0;	# USER_HZ is 100 on Linux
	}
	return $t;
}

# requests the fast sink has logged so far
sub sink_lines
{
	open(my $fh, '<', $sink->{log}) or return 0;
	my $n = 0;
	$n++ while <$fh>;
	close $fh;
	return $n;
}

# the open-loop emitter: pgbench starts each transaction on its schedule,
# whether or not the previous ones are done
my $script = "$PostgreSQL::Test::Utils::tmp_check/snapshot_emit.sql";
open(my $fh, '>', $script) or die "could not write $script: $!";
print $fh "SELECT outbox.emit('snap.tick', (random() * 1000)::int::text, "
  . "jsonb_build_object('c', :client_id), destination => 'snap');\n";
close $fh;
my ($bench_out, $bench_err) = ('', '');
my $t_start = time;
my $bench = IPC::Run::start(
	[ $node->installed_command('pgbench'), '-n', '-h', $node->host, '-p', $node->port,
	  '-c', 4, '-j', 2, '-R', $RATE, '-T', $TOTAL, '-f', $script, 'postgres' ],
	'>', \$bench_out, '2>', \$bench_err);

my $mon = $node->background_psql('postgres');
$mon->set_query_timer_restart();

# one sample: seconds since the start, oldest pending age (s), pending
# events, health status, relay CPU (s), sink requests
sub sample
{
	my $metrics = $mon->query_safe(q{
		SELECT m FROM regexp_split_to_table(outbox.metrics(), E'\n') AS m
		 WHERE m ~ '^outbox_(oldest_pending_age_seconds|pending_events)\{'});
	my ($age) = $metrics =~ /^outbox_oldest_pending_age_seconds\{[^}]*destination="snap"[^}]*\} (\S+)$/m;
	my ($pending) = $metrics =~ /^outbox_pending_events\{[^}]*destination="snap"[^}]*\} (\S+)$/m;
	my $health = $mon->query_safe('SELECT status FROM outbox.health()');
	return { t => time - $t_start, age => $age // 0, pending => $pending // 0,
		health => $health, cpu => relay_cpu(), sink => sink_lines() };
}

# sample each second until the deadline; returns the samples
sub watch
{
	my ($until) = @_;
	my @s;
	while (time < $until)
	{
		my $next = time + 1;
		push @s, sample();
		my $wait = $next - time;
		usleep(int($wait * 1e6)) if $wait > 0;
	}
	return @s;
}

sub summary
{
	my ($name, @s) = @_;
	my ($max_age, $max_pending) = (0, 0);
	for (@s)
	{
		$max_age = $_->{age} if $_->{age} > $max_age;
		$max_pending = $_->{pending} if $_->{pending} > $max_pending;
	}
	my $secs = $s[-1]{t} - $s[0]{t};
	my $delivered = $secs > 0 ? ($s[-1]{sink} - $s[0]{sink}) / $secs : 0;
	my $cpu = $secs > 0 ? 100 * ($s[-1]{cpu} - $s[0]{cpu}) / $secs : 0;
	note(sprintf('%s: %d samples, oldest pending age max %.3f s, pending max %d, at the end %d; '
		  . 'delivered %.0f/s, relay CPU %.0f %% of a core; health %s',
		  $name, scalar(@s), $max_age, $max_pending, $s[-1]{pending}, $delivered, $cpu,
		  join(',', sort keys %{ { map { $_->{health} => 1 } @s } })));
	for my $i (grep { $_ % 10 == 9 } 0 .. $#s)
	{
		my $w = $s[ $i - 9 ];
		note(sprintf('  %s t=%3.0f s: age %.3f s, pending %d, delivered %.0f/s, relay CPU %.0f %%',
			  $name, $s[$i]{t}, $s[$i]{age}, $s[$i]{pending},
			  ($s[$i]{sink} - $w->{sink}) / ($s[$i]{t} - $w->{t}),
			  100 * ($s[$i]{cpu} - $w->{cpu}) / ($s[$i]{t} - $w->{t})));
	}
	return ($max_age, $s[-1]{pending});
}

# a held snapshot pins the xmin horizon: its backend_xmin stays as it was
sub holds_horizon
{
	my ($pid, $xmin) = @_;
	return $node->safe_psql('postgres',
		"SELECT backend_xmin = '$xmin' FROM pg_stat_activity WHERE pid = $pid") eq 't';
}

sub hold
{
	my ($name, $secs, $sql) = @_;
	my $h = $node->background_psql('postgres');
	$h->set_query_timer_restart();
	my $pid = $h->query_safe('SELECT pg_backend_pid()');
	$h->query_safe("BEGIN ISOLATION LEVEL REPEATABLE READ; $sql");
	my $xmin = $node->safe_psql('postgres', "SELECT backend_xmin FROM pg_stat_activity WHERE pid = $pid");
	isnt($xmin, '', "$name: the held transaction has a snapshot");
	my @s = watch(time + $secs);
	# a slow monitoring query would leave the hold unobserved
	cmp_ok(scalar(@s), '>=', $secs / 2, "$name: metrics() and health() answered at least every 2 s");
	ok(holds_horizon($pid, $xmin), "$name: its snapshot was held for the whole $secs s");
	my ($max_age, $pending) = summary($name, @s);
	ok($max_age < $MAX_AGE, "$name: oldest pending age stayed under $MAX_AGE s (max $max_age s)");
	ok($pending < $RATE, "$name: backlog at the end below one second's worth ($pending < $RATE)");
	$h->query_safe('COMMIT');
	$h->quit;
	return;
}

summary('before', watch($t_start + $LEAD));
cmp_ok(time - $t_start, '<', $LEAD + 5, 'the first hold starts on time, under load');

hold('report snapshot', $SECS, 'SELECT n FROM report');

summary('after the report', watch(time + $GAP));

# like pg_dump: a lock on every table of the outbox schema, then a read
# of the tables' rows (pg_dump copies tables; it does not read the view
# outbox.events, whose per-row state an old snapshot makes slow to derive)
hold('dump-like snapshot', $DUMP_SECS, q{
	DO $$
	DECLARE
		t regclass;
	BEGIN
		FOR t IN SELECT c.oid FROM pg_class c
		          WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p')
		          ORDER BY c.oid
		LOOP
			EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', t);
		END LOOP;
	END $$;
	SELECT (SELECT count(*) FROM outbox.log) + (SELECT count(*) FROM outbox.retries)
	       + (SELECT count(*) FROM outbox.dead_events);}) if $DUMP_SECS > 0;

$bench->finish;
is($?, 0, 'the emitter ran to its end') or diag($bench_err);
my ($processed) = $bench_out =~ /number of transactions actually processed: (\d+)/;
my ($failed) = $bench_out =~ /number of failed transactions: (\d+)/;
note(sprintf('emitter: %d transactions in %d s (%.0f/s offered %d/s), %d failed',
	  $processed // 0, $TOTAL, ($processed // 0) / $TOTAL, $RATE, $failed // 0));
ok(($processed // 0) >= 0.5 * $RATE * $TOTAL,
	'the emitter kept at least half its rate (else the machine, not the relay, was measured)');

is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE type = 'snap.tick'}),
	$processed, 'every committed emit() is an event');
my $last = $node->safe_psql('postgres', q{
	SELECT id FROM outbox.events WHERE type = 'snap.tick' ORDER BY created_at DESC, id DESC LIMIT 1});
is($node->safe_psql('postgres', "SELECT outbox.wait_published('$last', '60s')"), 't',
	'the last event is published');
# a deadline, not poll_query_until's attempt count: while the relay is
# far behind each look at the view can take seconds
my $left;
ok(wait_until(sub {
		$left = $node->safe_psql('postgres', q{
			SELECT count(*) FROM outbox.events WHERE type = 'snap.tick' AND status <> 'published'});
		$left == 0 }, 120),
	'every event is published') or diag("$left events not published 120 s after the emitter stopped");

# the sink's log is written in blocks: wait until it has them all
my @ids = split /\n/, $node->safe_psql('postgres', q{SELECT id FROM outbox.events WHERE type = 'snap.tick'});
my $acked;
wait_until(sub { $acked = fast_sink_ids($sink); !grep { !$acked->{$_} } @ids }, 30);
my @lost = grep { !$acked->{$_} } @ids;
is(scalar(@lost), 0, 'zero lost: the sink acknowledged every event') or diag("lost e.g. @lost[0 .. 4]");
my %known = map { $_ => 1 } @ids;
my @unknown = grep { !$known{$_} } keys %$acked;
is(scalar(@unknown), 0, 'the sink received no event that was not committed');
my $dups = 0;
$dups += $acked->{$_} - 1 for @ids;
note(sprintf('%d events, %d duplicates (at-least-once), %.1f s in all', scalar(@ids), $dups, time - $t_start));

$mon->quit;
$node->stop;
stop_sink($sink);
done_testing();
