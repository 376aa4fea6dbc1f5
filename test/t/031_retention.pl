# Retention of published outbox events by relay worker 0: published rows
# older than outbox.retention are deleted in batches of at most
# outbox.retention_batch rows per statement; pending rows (a paused
# destination) and dead letters are never deleted; recently published rows
# stay until they are old enough.  A statement-level trigger records what
# each DELETE removed, so the batch bound and the row statuses are checked
# per statement, not guessed from counts.
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
outbox.retention_batch = 40
});
$node->start;
my $u = $sink->{url};

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, max_attempts, backoff_base_ms, backoff_max_ms, paused) VALUES
		('ok',     '$u/ok/ret', 12, 50, 100, false),
		('dead',   '$u/status/400/ret', 12, 50, 100, false),
		('paused', '$u/ok/paused', 12, 50, 100, true);
	CREATE TABLE deletions (at timestamptz, n int, statuses text[], newest_published timestamptz);
	CREATE FUNCTION log_deletion() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		INSERT INTO public.deletions
		SELECT clock_timestamp(), count(*), array_agg(DISTINCT status), max(published_at) FROM old_rows;
		RETURN NULL;
	END \$\$;
	CREATE TRIGGER log_deletion AFTER DELETE ON outbox.events
		REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION log_deletion();
});

my @ok = emit_events($node, 'ret.ok', 'ok', 300);
emit_events($node, 'ret.dead', 'dead', 20);
emit_events($node, 'ret.paused', 'paused', 20);

ok($node->poll_query_until('postgres', q{
		SELECT count(*) FILTER (WHERE status = 'published') + count(*) FILTER (WHERE status = 'dead') = 320
		  FROM outbox.events}),
	'events published and dead-lettered');
assert_zero_lost($sink, 'retention', '/ok/ret', @ok);

# a failing retention statement (here: its trigger) is logged and does not stop delivery
$node->safe_psql('postgres', q{ALTER TABLE deletions ADD CONSTRAINT boom CHECK (n = 0) NOT VALID});
my @more = emit_events($node, 'ret.more', 'ok', 20);
ok($node->poll_query_until('postgres', q{SELECT count(*) = 320 FROM outbox.events WHERE status = 'published'}),
	'delivery goes on while retention fails');
ok(wait_until(sub { slurp_file($node->logfile) =~ /retention of published events failed/ }, 30),
	'the retention failure is logged');
$node->safe_psql('postgres', q{ALTER TABLE deletions DROP CONSTRAINT boom});

# recently published rows are kept for the retention period
is($node->safe_psql('postgres', q{SELECT count(*) FROM deletions WHERE statuses IS NOT NULL
	AND newest_published > at - interval '3 seconds'}), '0', 'nothing younger than the retention was deleted');

ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM outbox.events WHERE status = 'published'}),
	'every published row is deleted after the retention period');

my $stats = $node->safe_psql('postgres', q{
	SELECT count(*), max(n), sum(n),
	       bool_and(statuses = ARRAY['published']),
	       bool_and(newest_published < at - interval '3 seconds')
	  FROM deletions WHERE n > 0});
my ($stmts, $largest, $total, $only_published, $all_old) = split /\|/, $stats;
note("retention: $total rows in $stmts statements, largest $largest");
is($total, '320', 'all 320 published rows were deleted by retention');
ok($stmts >= 8, "in several batches ($stmts statements)");
ok($largest <= 40, "no batch above outbox.retention_batch (largest $largest)");
is($only_published, 't', 'only published rows were deleted');
is($all_old, 't', 'each deleted row was older than the retention when deleted');

is($node->safe_psql('postgres', q{
		SELECT string_agg(status || '=' || n, ',' ORDER BY status)
		  FROM (SELECT status, count(*) AS n FROM outbox.events GROUP BY status) s}),
	'dead=20,pending=20', 'pending rows and dead letters are kept');

# -1 turns retention off
$node->append_conf('postgresql.conf', "outbox.retention = -1\n");
$node->reload;
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false WHERE name = 'paused'});
$node->safe_psql('postgres', q{SELECT outbox.emit('ret.kick', 'k', '{}', destination => 'ok')});
ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 21 FROM outbox.events WHERE status = 'published'}),
	'the paused events are published once resumed');
sleep(5);
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}),
	'21', 'with outbox.retention = -1 published rows are kept');

$node->stop;
stop_sink($sink);
done_testing();
