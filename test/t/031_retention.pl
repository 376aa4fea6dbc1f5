# Retention on the insert-only store: relay worker 0 rotates the event log
# every outbox.retention / 2 and truncates the slot that becomes current
# once every destination has acknowledged its rows (README.store, 3.1), so
# published events are gone after one to one and a half retention periods,
# in whole slots, never row by row.  Pending events (a paused destination)
# and dead letters are never lost: the paused destination's backlog is
# spilled to outbox.retries so that it does not hold the log, and dead
# letters live in outbox.dead_events.  A failing rotation is logged and
# does not stop delivery.  outbox.retention = -1 never rotates.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = start_sink();
my $node = new_outbox_node('retention', qq{
outbox.workers_per_database = 2
outbox.retention = '3s'
});
$node->start;
my $u = $sink->{url};

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, max_attempts, backoff_base_ms, backoff_max_ms, paused) VALUES
		('ok',     '$u/ok/ret', 12, 50, 100, false),
		('dead',   '$u/status/400/ret', 12, 50, 100, false),
		('paused', '$u/ok/paused', 12, 50, 100, true);
	CREATE TABLE truncations (at timestamptz, slot text, rows bigint, newest timestamptz);
	CREATE FUNCTION log_truncation() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		EXECUTE format('INSERT INTO public.truncations SELECT clock_timestamp(), %L, count(*), max(created_at) FROM outbox.%I',
		               TG_TABLE_NAME, TG_TABLE_NAME);
		RETURN NULL;
	END \$\$;
	CREATE TRIGGER log_truncation BEFORE TRUNCATE ON outbox.log_0 FOR EACH STATEMENT EXECUTE FUNCTION log_truncation();
	CREATE TRIGGER log_truncation BEFORE TRUNCATE ON outbox.log_1 FOR EACH STATEMENT EXECUTE FUNCTION log_truncation();
	CREATE TRIGGER log_truncation BEFORE TRUNCATE ON outbox.log_2 FOR EACH STATEMENT EXECUTE FUNCTION log_truncation();
});

my @ok = emit_events($node, 'ret.ok', 'ok', 300);
emit_events($node, 'ret.dead', 'dead', 20);
emit_events($node, 'ret.paused', 'paused', 20);

ok($node->poll_query_until('postgres', q{
		SELECT count(*) FILTER (WHERE status = 'published') + count(*) FILTER (WHERE status = 'dead') = 320
		  FROM outbox.events}),
	'events published and dead-lettered');
assert_zero_lost($sink, 'retention', '/ok/ret', @ok);

# a failing rotation (here: its truncate trigger) is logged and does not stop delivery
$node->safe_psql('postgres', q{ALTER TABLE truncations ADD CONSTRAINT boom CHECK (rows < 0) NOT VALID});
my @more = emit_events($node, 'ret.more', 'ok', 20);
ok($node->poll_query_until('postgres', q{SELECT count(*) = 20 FROM outbox.events WHERE type = 'ret.more' AND status = 'published'}),
	'delivery goes on while the rotation fails');
ok(wait_until(sub { slurp_file($node->logfile) =~ /rotation of the event log failed/ }, 30),
	'the rotation failure is logged');
$node->safe_psql('postgres', q{ALTER TABLE truncations DROP CONSTRAINT boom});

ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM outbox.log WHERE type IN ('ret.ok', 'ret.more', 'ret.dead')}),
	'every published (and dead) event left the log after the retention period');

my $stats = $node->safe_psql('postgres', q{
	SELECT count(*), coalesce(sum(rows), 0),
	       bool_and(newest IS NULL OR newest < at - interval '3 seconds')
	  FROM truncations});
my ($truncs, $total, $all_old) = split /\|/, $stats;
note("rotation: $total rows in $truncs truncations");
ok($truncs >= 2, "in several rotations ($truncs truncations)");
is($total, '360', 'every emitted row was truncated once (300 + 20 + 20 delivered, 20 dead)');
is($all_old, 't', 'no truncated row was younger than the retention');

is($node->safe_psql('postgres', q{
		SELECT string_agg(status || '=' || n, ',' ORDER BY status)
		  FROM (SELECT status, count(*) AS n FROM outbox.events WHERE type IN ('ret.dead', 'ret.paused')
		         GROUP BY status) s}),
	'dead=20,pending=20', 'pending events (paused destination) and dead letters are kept');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.retries WHERE destination = 'paused'}),
	'20', 'the paused backlog was spilled to outbox.retries');

# a reader holding a lock on the log, as pg_dump does, blocks the
# rotation: health() says so once that has lasted longer than the
# retention, and the warning clears when the reader has ended
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox.log;');
emit_events($node, 'ret.held', 'ok', 5);
ok($node->poll_query_until('postgres', q{
		SELECT EXISTS (SELECT 1 FROM unnest((outbox.health()).reasons) AS r
		                WHERE r LIKE 'warn: the event log has not been rotated for %')}),
	'health() warns while a reader\'s lock blocks the rotation');
note('health: ' . $node->safe_psql('postgres', q{SELECT reasons FROM outbox.health()}));
like($node->safe_psql('postgres', q{SELECT state FROM outbox._log_rotation()}),
	qr/^(locked|unacknowledged: paused)$/, 'the rotation names why it waits');
$reader->query_safe('COMMIT');
$reader->quit;
ok($node->poll_query_until('postgres', q{
		SELECT NOT EXISTS (SELECT 1 FROM unnest((outbox.health()).reasons) AS r
		                    WHERE r LIKE '%has not been rotated%')
		   AND (SELECT state FROM outbox._log_rotation()) IN ('rotated', 'wait')}),
	'the warning clears once the reader has ended');

# -1 turns retention off
$node->append_conf('postgresql.conf', "outbox.retention = -1\n");
$node->reload;
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false WHERE name = 'paused'});
$node->safe_psql('postgres', q{SELECT outbox.emit('ret.kick', 'k', '{}', destination => 'ok')});
ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM outbox.retries WHERE destination = 'paused'}),
	'the spilled events are delivered once the destination is resumed');
ok(wait_until(sub { my %ids = map { $_->{id} => 1 } grep { $_->{path} =~ m{/ok/paused} } sink_records($sink);
		scalar(keys %ids) == 20 }, 30),
	'the sink received each of the 20 paused events');
ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM outbox.events WHERE type = 'ret.kick' AND status = 'published'}),
	'a new event is published');
my $before = $node->safe_psql('postgres', q{SELECT count(*) FROM truncations});
sleep(5);
is($node->safe_psql('postgres', q{SELECT count(*) FROM truncations}), $before,
	'with outbox.retention = -1 the log is not rotated');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.log WHERE type = 'ret.kick'}),
	'1', 'and the published event stays in the log');

$node->stop;
stop_sink($sink);
done_testing();
