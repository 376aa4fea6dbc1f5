# Failover: a primary with a streaming standby.  On the standby (in
# recovery) no outbox_pg process runs and outbox.workers() is empty.  The
# primary emits 10,000 events to a slow sink (20 ms an answer, 8 at a
# time: about 400 a second, so the crash comes mid-delivery); once the standby has caught
# up and delivery is under way, the primary is stopped with -m immediate
# and the standby promoted.  The promoted standby starts relaying by itself
# and every id reaches the sink (duplicates allowed, counted).
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $N = 10000;
my $sink = start_sink();
my $u = $sink->{url};

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'outbox_pg'
max_worker_processes = 32
outbox.poll_interval = '200ms'
outbox.discovery_interval = 1
outbox.lease_margin = '2s'
outbox.workers_per_database = 2
log_min_messages = log
});
$primary->start;
$primary->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, backoff_base_ms, backoff_max_ms)
	VALUES ('slow', '$u/delay/20/ha', 2000, 8, 50, 500);
});
$primary->backup('bk');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

# the standby: nothing runs, nothing is claimed
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
ok($primary->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox_pg launcher'}),
	'the primary runs the launcher');
sleep 2;    # more than the discovery interval: a launcher would have acted
is($standby->safe_psql('postgres', q{
	SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'outbox_pg%'}),
	'0', 'standby: no outbox_pg launcher or relay runs');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM outbox.workers()'),
	'0', 'standby: outbox.workers() is empty');
my ($ret, $out, $err) = $standby->psql('postgres', q{SELECT outbox.emit('ha.x', '1', '{}', destination => 'slow')});
ok($ret != 0 && $err =~ /read-only transaction/, 'standby: emit() is refused as read-only');

# 10,000 events in one transaction; the standby receives them
my $t0 = time;
my @ids = emit_events($primary, 'ha.failover', 'slow', $N);
is(scalar(@ids), $N, "$N events emitted");
$primary->wait_for_catchup($standby);
note(sprintf('emitted and replicated in %.2f s', time - $t0));

# crash the primary while delivery is under way
# (watched at the sink: the 10,000 events of one transaction are one batch,
# shown published only once the whole batch is acknowledged)
ok(wait_until(sub {
	scalar(grep { $_->{answer} >= 200 && $_->{answer} < 300 } sink_records($sink)) >= 300 }, 120),
	'delivery under way on the primary');
$primary->stop('immediate');
my $acked_before = scalar(grep { $_->{answer} >= 200 && $_->{answer} < 300 } sink_records($sink));
note("the sink acknowledged $acked_before requests before the primary stopped");
ok($acked_before < $N, 'events were still pending when the primary stopped');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'outbox_pg%'}),
	'0', 'still no relay on the standby before promotion');

# promotion: the relay starts by itself and delivers the rest
$t0 = time;
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the standby is promoted');
ok($standby->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'a relay starts on the promoted standby without a restart');
ok($standby->poll_query_until('postgres', qq{
	SELECT count(*) = $N FROM outbox.events WHERE type = 'ha.failover' AND status = 'published'}),
	'every event is published by the promoted standby');
note(sprintf('the promoted standby finished in %.2f s', time - $t0));
is($standby->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status <> 'published'}),
	'0', 'nothing pending or dead after the failover');
assert_zero_lost($sink, 'failover', '/delay/20/ha', @ids);
ok(!$standby->log_contains('terminated by signal'), 'no process crashed on the promoted standby');

$standby->stop;
stop_sink($sink);
done_testing();
