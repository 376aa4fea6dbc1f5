# Hostile destinations (test/sink/hostile.py): an endless body, megabytes
# of header lines, one megabyte-long header line, a response dripped one
# byte per second, a reply that is not HTTP, and https:// to a plain-HTTP
# port.  For each, the relay survives (same pids, no crash), records a clear
# error on the row, retries and dead-letters per the destination's policy,
# and a healthy destination keeps flowing meanwhile.  (The endless body
# comes after a 200: past outbox.max_response_size a webhook's answer is
# read to its end and thrown away, and this one never ends, so the 200
# does not count.)
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $sink = start_sink();
my $u = $sink->{url};

my $hport = PostgreSQL::Test::Cluster::get_free_port();
my $hlog = "$PostgreSQL::Test::Utils::tmp_check/hostile_$hport.jsonl";
my $hout = '';
my $hostile = IPC::Run::start(
	[ 'python3', "$FindBin::RealBin/../sink/hostile.py", '--port', $hport, '--log', $hlog, '--header-mb', 4 ],
	'>', \$hout, '2>', \$hout);
OutboxTest::_wait_port($hport, 1);
my $h = "http://127.0.0.1:$hport";

my $node = new_outbox_node('hostile', "outbox.workers_per_database = 2\n");
$node->start;

# max_attempts 2: each hostile event is tried twice, then dead-lettered
my %cases = (
	endless     => [ "$h/endless/a",     qr/^response body larger than outbox\.max_response_size \(\d+ bytes\) did not end: Operation timed out/ ],
	hugeheaders => [ "$h/hugeheaders/b", qr/^Too large response headers/ ],
	longheader  => [ "$h/longheader/c",  qr/^response header line longer than libcurl's limit/ ],
	drip        => [ "$h/drip/d",        qr/^Operation timed out after 2\d\d\d milliseconds/ ],
	garbage     => [ "$h/garbage/e",     qr/^Received HTTP\/0\.9 when not allowed/ ],
	tls         => [ "https://127.0.0.1:$sink->{port}/ok/tls", qr/SSL routines::wrong version number/ ],
);
my $values = join(",\n", map { "('$_', '$cases{$_}[0]', 2000, 2, 50, 200)" } sort keys %cases);
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms)
	VALUES $values,
	       ('healthy', '$u/ok/healthy', 2000, 10, 50, 200);
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'two relays run');
my @pids = sort(relay_pids($node, 'postgres'));

my $t0 = time;
emit_events($node, "hostile.$_", $_, 3) for sort keys %cases;
my @healthy;
for my $round (1 .. 5)
{
	push @healthy, emit_events($node, 'healthy.x', 'healthy', 40);
	select(undef, undef, undef, 0.3);
}
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 200 FROM outbox.events WHERE destination = 'healthy' AND status = 'published'}),
	'the healthy destination keeps flowing');
my $healthy_time = time - $t0;
ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'drip' AND status = 'pending'}) > 0,
	'... while the hostile destinations are still being tried');
note(sprintf('healthy destination: 200 events in %.2f s', $healthy_time));
assert_zero_lost($sink, 'healthy', '/ok/healthy', @healthy);

ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 18 FROM outbox.events WHERE type LIKE 'hostile.%' AND status = 'dead'}),
	'every hostile event is dead-lettered after its attempts');
for my $name (sort keys %cases)
{
	my $rows = $node->safe_psql('postgres', qq{
		SELECT attempts || '|' || coalesce(last_status::text, '-') || '|' || coalesce(last_error, '')
		  FROM outbox.events WHERE destination = '$name' ORDER BY id});
	my @rows = split /\n/, $rows;
	note("$name: $rows[0]");
	my $pattern = $cases{$name}[1];
	is(scalar(grep { my ($a, $s, $e) = split /\|/, $_, 3; $a == 2 && $e =~ $pattern } @rows), 3,
		"$name: tried twice, then dead with a clear error");
}
my @requests = map { decode_json_line($_) } read_lines($hlog);
ok(scalar(grep { $_ =~ m{^/drip/} } @requests) >= 6, 'the dripping destination was really tried (and given up on)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'tls'}), '3', 'TLS case emitted');
is(scalar(grep { $_->{path} eq '/ok/tls' } sink_records($sink)), 0, 'a TLS handshake to a plain port never becomes a request');

is(join(' ', sort(relay_pids($node, 'postgres'))), join(' ', @pids), 'the relays survived: same pids');
ok(!$node->log_contains('terminated by signal'), 'no process crashed');
for my $pid (@pids)
{
	open(my $fh, '<', "/proc/$pid/status") or next;
	my ($kb) = map { /^VmRSS:\s+(\d+)/ ? $1 : () } <$fh>;
	close $fh;
	note("relay $pid RSS $kb kB");
	ok($kb < 200 * 1024, "relay $pid stays small after megabytes of hostile input ($kb kB)");
}

sub read_lines
{
	my ($file) = @_;
	open(my $fh, '<', $file) or return ();
	my @lines = grep { $_ ne '' } map { chomp; $_ } <$fh>;
	close $fh;
	return @lines;
}

sub decode_json_line
{
	my ($line) = @_;
	return $line =~ /"path": "([^"]*)"/ ? $1 : '';
}

$node->stop;
$hostile->kill_kill;
stop_sink($sink);
done_testing();
