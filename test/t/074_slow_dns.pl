# A destination whose name resolves slowly (a DNS server that is down or
# far away: here an LD_PRELOAD shim, test/sink/slow_resolver.c, makes
# getaddrinfo() of one name take 10 s).  libcurl resolves in a thread of
# its own; a request that times out while resolving must not wait for that
# thread, or the relay, and every other destination with it, is held until
# the lookup returns, again at every retry.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $dir = PostgreSQL::Test::Utils::tempdir('slow_resolver');
my $shim = "$dir/slow_resolver.so";
my $cc = `cc -Wall -Werror -shared -fPIC -o $shim $FindBin::RealBin/../sink/slow_resolver.c -ldl 2>&1`;
die "could not build the resolver shim: $cc" if $?;

my $sink = start_sink();
my $node = new_outbox_node('slow_dns', "outbox.workers_per_database = 1\n");
{
	local $ENV{LD_PRELOAD} = $shim;
	local $ENV{SLOW_RESOLVER_NAME} = 'slow.test';
	local $ENV{SLOW_RESOLVER_SECONDS} = '10';
	$node->start;
}
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms) VALUES
		('slow_dns', 'http://slow.test:$sink->{port}/ok/slow', 1000, 100, 100, 200),
		('healthy', '$sink->{url}/ok/healthy', 2000, 100, 100, 200);
	SELECT outbox.emit('dns.slow', 'a', '{}', destination => 'slow_dns');
});
ok($node->poll_query_until('postgres', q{
	SELECT last_error IS NOT NULL FROM outbox.events WHERE type = 'dns.slow'}),
	'the slow lookup times out');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE type = 'dns.slow'}),
	qr/Resolving timed out|timed out/i, 'with the reason');

# while the slow destination retries (each try a lookup of 10 s), the
# healthy one is served at once, every time
my @took;
for my $i (1 .. 3)
{
	my $t0 = time;
	my $id = $node->safe_psql('postgres',
		qq{SELECT outbox.emit('dns.healthy', 'h$i', '{}', destination => 'healthy')});
	$node->poll_query_until('postgres', qq{SELECT status = 'published' FROM outbox.events WHERE id = '$id'});
	push @took, time - $t0;
	sleep 1;
}
note(sprintf('healthy events published after %s s', join(', ', map { sprintf('%.2f', $_) } @took)));
cmp_ok((sort { $b <=> $a } @took)[0], '<', 3,
	'a destination beside one whose lookups hang is not held (slowest of 3 under 3 s)');
ok(!$node->log_contains('terminated by signal'), 'no process crashed');

$node->stop;
stop_sink($sink);
done_testing();
