# Shared helpers for outbox_pg's TAP tests: a node with the extension
# preloaded, the Python webhook sink, and reading what the sink received.
package OutboxTest;

use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IO::Socket::INET;
use IO::Socket::IP;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use Exporter 'import';
our @EXPORT = qw(new_outbox_node start_sink stop_sink restart_sink sink_records deliver_one
  sink_ids wait_until relay_pids secret emit_events assert_zero_lost
  start_fast_sink fast_sink_ids start_slow_sink slow_sink_stats rss_anon_kb
  start_counting_node statement_calls);

my $SRC = abs_path(dirname(__FILE__) . '/../..');

# A Standard Webhooks secret shared by the relay and the sink.
sub secret { return 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'; }

sub new_outbox_node
{
	my ($name, $extra) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => 0);
	$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'outbox_pg'
max_worker_processes = 32
outbox.poll_interval = '200ms'
outbox.discovery_interval = 1
outbox.lease_margin = '2s'
log_min_messages = log
} . ($extra // ''));
	return $node;
}

# A node started with pg_stat_statements counting every statement, the
# relay's SPI ones too (track = all), both extensions created in postgres.
sub start_counting_node
{
	my ($name, $extra) = @_;
	my $node = new_outbox_node($name, ($extra // '') . qq{
shared_preload_libraries = 'outbox_pg, pg_stat_statements'
pg_stat_statements.track = 'all'
});
	$node->start;
	$node->safe_psql('postgres', q{
	CREATE EXTENSION pg_stat_statements;
	CREATE EXTENSION outbox_pg;});
	return $node;
}

# Calls of the statements whose text is LIKE the pattern, since the last
# pg_stat_statements_reset().
sub statement_calls
{
	my ($node, $like) = @_;
	return $node->safe_psql('postgres', qq{
	SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '$like'});
}

sub _wait_port
{
	my ($port, $up, $host) = @_;
	my $deadline = time + 15;
	while (time < $deadline)
	{
		my $s = IO::Socket::IP->new(PeerHost => $host // '127.0.0.1', PeerPort => $port, Proto => 'tcp');
		if ($s) { close $s; return 1 if $up; }
		else { return 1 if !$up; }
		usleep(50_000);
	}
	die "sink port $port did not " . ($up ? 'open' : 'close');
}

sub start_sink
{
	my (%opt) = @_;
	my $port = $opt{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $log = $opt{log} // "$PostgreSQL::Test::Utils::tmp_check/sink_$port.jsonl";
	my $host = $opt{host} // '127.0.0.1';
	my $out = '';
	my $h = IPC::Run::start(
		[ 'python3', "$SRC/test/sink/sink.py", '--port', $port, '--log', $log, '--secret', secret(),
		  '--host', $host ],
		'>', \$out, '2>', \$out);
	_wait_port($port, 1, $host);
	my $urlhost = $host =~ /:/ ? "[$host]" : $host;
	return { port => $port, log => $log, handle => $h, host => $host,
		url => "http://$urlhost:$port" };
}

sub stop_sink
{
	my ($sink) = @_;
	$sink->{handle}->kill_kill;
	_wait_port($sink->{port}, 0, $sink->{host});
}

sub restart_sink
{
	my ($sink) = @_;
	my $new = start_sink(port => $sink->{port}, log => $sink->{log}, host => $sink->{host});
	$sink->{handle} = $new->{handle};
	return $sink;
}

# The fast sink (test/sink/fast_sink.py) for volume tests: 204 to
# everything, one line per request with the message id.  stop_sink()
# stops it.
sub start_fast_sink
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $log = "$PostgreSQL::Test::Utils::tmp_check/fast_sink_$port.log";
	my $out = '';
	my $h = IPC::Run::start(
		[ 'python3', "$SRC/test/sink/fast_sink.py", '--port', $port, '--log', $log ],
		'>', \$out, '2>', \$out);
	_wait_port($port, 1);
	return { port => $port, log => $log, handle => $h, url => "http://127.0.0.1:$port" };
}

# Message id => number of requests the fast sink received for it.
sub fast_sink_ids
{
	my ($sink) = @_;
	my %ids;
	open(my $fh, '<', $sink->{log}) or return \%ids;
	while (my $line = <$fh>)
	{
		last unless $line =~ /\n\z/;
		chomp $line;
		$ids{$line}++;
	}
	close $fh;
	return \%ids;
}

# The slow receiver (test/sink/slow_sink.py) for concurrency tests:
# /delay/<ms>/<name> answers 204 after <ms>, and the receiver counts the
# requests it has in flight by name.  stop_sink() stops it.
sub start_slow_sink
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $stats = "$PostgreSQL::Test::Utils::tmp_check/slow_sink_$port.json";
	my $out = '';
	my $h = IPC::Run::start(
		[ 'python3', "$SRC/test/sink/slow_sink.py", '--port', $port, '--stats', $stats ],
		'>', \$out, '2>', \$out);
	_wait_port($port, 1);
	return { port => $port, stats => $stats, handle => $h, url => "http://127.0.0.1:$port" };
}

# What the slow receiver measured (see slow_sink.py): a hash with
# connections, max_connections and names => { name => { requests,
# in_flight, max_in_flight, first, last } }; empty before its first report.
sub slow_sink_stats
{
	my ($sink) = @_;
	open(my $fh, '<', $sink->{stats}) or return { names => {} };
	local $/;
	my $json = <$fh>;
	close $fh;
	return decode_json($json);
}

# A process's anonymous resident memory (RssAnon), in kB.
sub rss_anon_kb
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/status") or die "could not read /proc/$pid/status: $!";
	my ($kb) = map { /^RssAnon:\s+(\d+) kB/ ? $1 : () } <$fh>;
	close $fh;
	return $kb;
}

# Every request the sink received, in order.
sub sink_records
{
	my ($sink) = @_;
	my @records;
	open(my $fh, '<', $sink->{log}) or return ();
	while (my $line = <$fh>)
	{
		# the sink may be writing the last line right now: only whole lines
		last unless $line =~ /\n\z/;
		chomp $line;
		push @records, decode_json($line) if $line ne '';
	}
	close $fh;
	return @records;
}

# Message id => number of requests received for it, optionally by path prefix.
sub sink_ids
{
	my ($sink, $prefix) = @_;
	my %ids;
	for my $r (sink_records($sink))
	{
		next if defined $prefix && index($r->{path}, $prefix) != 0;
		$ids{ $r->{id} }++;
	}
	return \%ids;
}

# Poll a Perl condition until it holds or the deadline passes.
sub wait_until
{
	my ($cond, $seconds) = @_;
	my $deadline = time + ($seconds // 60);
	while (time < $deadline)
	{
		return 1 if $cond->();
		usleep(50_000);
	}
	return 0;
}

# Emit n events of a type to a destination; returns their message ids.
sub emit_events
{
	my ($node, $type, $dest, $n) = @_;
	my $ids = $node->safe_psql('postgres', qq{
		SELECT string_agg(outbox.emit('$type', g::text, jsonb_build_object('n', g),
		                              destination => '$dest')::text, ' ')
		  FROM generate_series(1, $n) g});
	return split / /, $ids;
}

# Emit one event of a type to a destination and wait (up to seconds) until
# the sink has a request for it; returns that request's record, or undef.
sub deliver_one
{
	my ($node, $sink, $type, $dest, $seconds) = @_;
	my ($id) = emit_events($node, $type, $dest, 1);
	my $found;
	wait_until(sub {
		($found) = grep { ($_->{id} // '') eq $id } sink_records($sink);
		return defined $found;
	}, $seconds);
	return $found;
}

# Every id was acknowledged (2xx) by the sink at least once, on a path
# starting with prefix ('' for any); notes the requests and the duplicates
# (ids acknowledged more than once).
sub assert_zero_lost
{
	my ($sink, $name, $prefix, @ids) = @_;
	my (%acked, $requests);
	for my $r (sink_records($sink))
	{
		next unless index($r->{path}, $prefix) == 0;
		$requests++;
		$acked{ $r->{id} }++ if $r->{answer} >= 200 && $r->{answer} < 300;
	}
	my @lost = grep { !$acked{$_} } @ids;
	is(scalar(@lost), 0, "$name: zero lost");
	my $dups = 0;
	$dups += $acked{$_} - 1 for grep { $acked{$_} } @ids;
	note("$name: " . scalar(@ids) . " events, $requests requests, $dups duplicates");
}

sub relay_pids
{
	my ($node, $db) = @_;
	my $pids = $node->safe_psql('postgres', qq{
		SELECT string_agg(pid::text, ' ') FROM pg_stat_activity
		 WHERE backend_type = 'outbox_pg relay' AND datname = '$db'});
	return grep { $_ ne '' } split / /, $pids;
}

1;
