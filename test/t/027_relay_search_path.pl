# The relay and the inbox worker under a hostile default search_path: the
# database's search_path puts a hostile role's schema first, the schema of
# the regression test search_path (test/sql/search_path.sql), which shadows the
# functions, operators, aggregates and type names the extension uses.  The
# workers deliver (acknowledged, retried, dead-lettered, routed later,
# ordered), expire published events, warn about a backlog and run inbox
# handlers, and none of the hostile objects runs.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = start_sink();
my $u = $sink->{url};
my $node = new_outbox_node('relay_search_path', qq{
outbox.retention = '1s'
outbox.pending_age_warning = '1s'
outbox.redelivery_window = '1s'
outbox.inbox_retention = '1s'
});
$node->start;

# the hostile schema, exactly as the regression test builds it
my $script = slurp_file("$FindBin::RealBin/../sql/search_path.sql");
my ($hostile) = $script =~ /^(-- BEGIN hostile schema.*?^-- END hostile schema)$/ms;
ok(defined $hostile, 'the hostile schema is read from test/sql/search_path.sql');

# every statement of the test itself runs with a safe search_path
sub sql
{
	my ($stmt) = @_;
	return $node->safe_psql('postgres', "SET search_path = pg_catalog, public;\n$stmt");
}

sub poll
{
	my ($query) = @_;
	return wait_until(sub { sql($query) eq 't' }, 60);
}

$node->safe_psql('postgres', 'CREATE EXTENSION outbox_pg');
$node->safe_psql('postgres', $hostile);
sql(qq{
	INSERT INTO outbox.destinations (name, url, backoff_base_ms, backoff_max_ms, max_attempts, options) VALUES
		('sp_ok', '$u/ok/sp', 10, 20, 3, '{"ordering": "aggregate"}'),
		('sp_retry', '$u/failfirst/1/503/sp', 10, 20, 3, '{}'),
		('sp_dead', '$u/status/400/sp', 10, 20, 3, '{}');
	CREATE TABLE public.sp_handled (id text PRIMARY KEY);
	CREATE FUNCTION public.sp_handler(m inbox.messages) RETURNS void
	LANGUAGE sql SET search_path = pg_catalog
	AS \$\$ INSERT INTO public.sp_handled VALUES (m.id) \$\$;
	SELECT inbox.register_handler('sp.*', 'public.sp_handler(inbox.messages)');
});

# the database's default search_path is now the hostile one; the trap works
# for a new session
$node->safe_psql('postgres',
	q{ALTER DATABASE postgres SET search_path = hostile, pg_catalog, public});
is($node->safe_psql('postgres', q{SHOW search_path}), 'hostile, pg_catalog, public',
	'new sessions get the hostile search_path');
$node->safe_psql('postgres', q{SELECT lower('CONTROL')});
is(sql(q{SELECT string_agg(fn, ',') FROM hostile.hits}), 'lower',
	'an unqualified call in such a session is hostile');
sql(q{TRUNCATE hostile.hits});

# relays started from now on connect with the hostile default
my $t0 = sql(q{SELECT clock_timestamp()});
sql(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
       WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'});
ok(poll(qq{SELECT count(*) = 1 FROM pg_stat_activity
             WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'
               AND backend_start > '$t0'}), 'a relay runs again');

my $ids = sql(q{
	SELECT string_agg(outbox.emit('sp.ok', 'agg' || (g % 2), jsonb_build_object('g', g),
	                              destination => 'sp_ok')::text, ' ')
	  FROM generate_series(1, 10) g});
my @ok = split / /, $ids;
my $retry = sql(q{SELECT outbox.emit('sp.retry', '1', '{}', destination => 'sp_retry')});
my $dead = sql(q{SELECT outbox.emit('sp.dead', '1', '{}', destination => 'sp_dead')});
my $later = sql(q{SELECT outbox.emit('sp.later', '1', '{}')});
sql(q{INSERT INTO outbox.routes (pattern, destination) VALUES ('sp.later', 'sp_ok')});
sql(q{SELECT inbox.receive('sp-m' || g, 'sp.m', '{}', aggregate_id => 'a') FROM generate_series(1, 5) g});
sql(q{SELECT inbox.claim('sp-claim', 'c', '2 s')});

ok(poll(qq{SELECT NOT EXISTS (SELECT 1 FROM outbox.events WHERE status = 'pending')
             AND EXISTS (SELECT 1 FROM outbox.events WHERE id = '$dead' AND status = 'dead')}),
	'every event is done: published (some after a retry) or dead-lettered');
ok(wait_until(sub { (sink_ids($sink, '/failfirst/')->{$retry} // 0) >= 2 }, 30), 'the retried event was sent again');
ok(poll(q{SELECT count(*) = 5 FROM public.sp_handled}), 'inbox handlers ran');
ok(wait_until(sub { sink_ids($sink, '/ok/sp')->{$later} }, 30), 'an event routed after it was emitted is delivered');
ok(poll(q{SELECT NOT EXISTS (SELECT 1 FROM outbox.events WHERE status = 'published')}),
	'retention removes published events');
ok(poll(q{SELECT NOT EXISTS (SELECT 1 FROM inbox.claims)
             AND NOT EXISTS (SELECT 1 FROM inbox.messages WHERE status = 'processed')}),
	'inbox retention removes expired claims and processed messages');
assert_zero_lost($sink, 'ordered destination', '/ok/sp', @ok, $later);

is(sql(q{SELECT coalesce(string_agg(DISTINCT fn, ', '), 'none') FROM hostile.hits}), 'none',
	'no hostile function, operator, aggregate or type ran in the workers');
is(sql(q{SELECT last_value FROM hostile.hit_count}), '1', '(only the control, before)');

$node->stop;
stop_sink($sink);
done_testing();
