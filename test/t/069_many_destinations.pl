# Many destinations (issue #19): the relays' runtime state of each
# destination — its circuit breaker, its shared max_concurrency, its
# statistics — lives in a shared hash of outbox.max_destinations entries
# (default 4,096; it was a fixed array of 512).  With 1,000 destinations
# and two relay workers:
#   a. a trickle destination (an event every 50 ms) is delivered while a
#      backlog of 60,000 events of another destination drains: every
#      trickle event arrives, commit to arrival p99 under 2 s; the whole
#      backlog arrives, each id at least once;
#   b. 3,000 events spread over the 1,000 destinations are delivered, and
#      outbox.destination_runtime() has a row for each destination;
#   c. a destination whose port refuses connections, added beside them
#      (more than the old 512 in use), gets its circuit opened (its
#      events are emitted one at a time: a retry would wait for the
#      poll);
#   e. adding, pausing and deleting a destination takes effect well
#      within the poll interval (60 s here: the configuration generation,
#      not the poll, brings the change; 064 tests that in depth).
# Then a node with outbox.max_destinations = 64 (the minimum):
#   d. 100 destinations with events: every event is delivered, at most 64
#      have runtime rows, and the LOG says so with a hint naming the
#      setting;
#   e. the relays let the entries of deleted destinations go: after the
#      100 are deleted, 60 new ones each get a runtime row.
# Assertions are on loose bounds, never on tight timings.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use IPC::Run;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# far below the poll interval (60 s) and the relays' periodic reload
my $DEADLINE = 15;

my $sink = start_sink();
my $fast = start_fast_sink();
my $u = $sink->{url};
my $node = new_outbox_node('many', q{
outbox.poll_interval = '60s'
outbox.workers_per_database = 2
});
$node->start;

sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url)
	SELECT 'd' || lpad(g::text, 4, '0'), '$u/ok/d' || lpad(g::text, 4, '0')
	  FROM generate_series(1, 1000) g;
	INSERT INTO outbox.destinations (name, url) VALUES
		('bulk', '$fast->{url}/bulk'),
		('trickle', '$u/ok/trickle');
	CREATE TABLE trickle_stop (stop bool);
});
is(sql('SHOW outbox.max_destinations'), '4096', 'outbox.max_destinations defaults to 4096');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers()
	 WHERE database = 'postgres' AND pid IS NOT NULL AND state IN ('idle', 'working')}),
	'two relays run');

# ---- a. a trickle beside a backlog, among 1,000 destinations ----
# The trickle commits an event every 50 ms, with its commit time in the
# payload, until told to stop: once the backlog has arrived.
my $trickle = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', q{
		DO $$
		DECLARE
			stop_at timestamptz := clock_timestamp() + interval '120 seconds';
			i int := 0;
		BEGIN
			WHILE clock_timestamp() < stop_at AND NOT EXISTS (SELECT FROM trickle_stop) LOOP
				PERFORM pg_catalog.pg_sleep(0.05);
				i := i + 1;
				PERFORM outbox.emit('many.trickle', i::text,
				                    jsonb_build_object('i', i, 'at', extract(epoch FROM clock_timestamp())),
				                    destination => 'trickle');
				COMMIT;
			END LOOP;
		END $$;} ],
	'>', \my $trickle_out, '2>', \my $trickle_err);

# the backlog: 60,000 events in transactions of 500
my $t0 = time;
sql(q{
	DO $$
	BEGIN
		FOR t IN 0 .. 119 LOOP
			PERFORM outbox.emit('many.bulk', (t * 500 + g)::text, '{}', destination => 'bulk')
			   FROM generate_series(1, 500) g;
			COMMIT;
		END LOOP;
	END $$;});
my @bulk_ids = split / /, sql(q{
	SELECT string_agg(id::text, ' ') FROM outbox.events WHERE destination = 'bulk'});
is(scalar(@bulk_ids), 60000, 'bulk: 60,000 events emitted');
my %want = map { $_ => 1 } @bulk_ids;
my $arrived = sub { scalar(grep { $want{$_} } keys %{ fast_sink_ids($fast) }) };
my $drained = 0;
my $deadline = time + 180;
while (time < $deadline)
{
	last if ($drained = $arrived->()) >= 60000;
	usleep(500_000);
}
my $drain_secs = time - $t0;
sql('INSERT INTO trickle_stop VALUES (true)');
$trickle->finish;
is($trickle_err, '', 'trickle: the emitter ran without error');
is($drained, 60000, sprintf('bulk: every one of the 60,000 ids arrived (drained %.1f s after the first commit)', $drain_secs));

my @trickle_ids = split / /, sql(q{
	SELECT string_agg(id::text, ' ') FROM outbox.events WHERE destination = 'trickle'});
cmp_ok(scalar(@trickle_ids), '>=', 20, 'trickle: ' . scalar(@trickle_ids) . ' events emitted while the backlog drained');
my %trickle_want = map { $_ => 1 } @trickle_ids;
ok(wait_until(sub {
	my %got = map { $_->{id} => 1 } grep { $_->{path} eq '/ok/trickle' } sink_records($sink);
	return !grep { !$got{$_} } @trickle_ids;
}, 60), 'trickle: every event arrived');
assert_zero_lost($sink, 'trickle', '/ok/trickle', @trickle_ids);
my (%first, @latency);
for my $r (sink_records($sink))
{
	next unless $r->{path} eq '/ok/trickle' && $trickle_want{ $r->{id} // '' };
	next if exists $first{ $r->{id} };
	$first{ $r->{id} } = 1;
	push @latency, $r->{t} - $r->{data}{at};
}
@latency = sort { $a <=> $b } @latency;
my $p99 = $latency[ int(0.99 * @latency + 0.999999) - 1 ];
my $p50 = $latency[ int(0.5 * @latency) ];
note(sprintf('trickle: %d events, commit to arrival p50 %.3f s, p99 %.3f s, max %.3f s',
	scalar(@latency), $p50, $p99, $latency[-1]));
cmp_ok($p99, '<', 2.0, sprintf('trickle: p99 commit to arrival under 2 s (%.3f s)', $p99));

# ---- b. events spread over the 1,000 destinations ----
my @spread = split / /, sql(q{
	SELECT string_agg(outbox.emit('many.spread', g::text, '{}',
	                              destination => 'd' || lpad((1 + g % 1000)::text, 4, '0'))::text, ' ')
	  FROM generate_series(1, 3000) g});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 3000 FROM outbox.events WHERE type = 'many.spread' AND status = 'published'}),
	'spread: 3,000 events over 1,000 destinations published');
assert_zero_lost($sink, 'spread', '/ok/d', @spread);
is(sql(q{
	SELECT count(*) FROM outbox.destination_runtime()
	 WHERE destination ~ '^d[0-9]{4}$' AND published_total >= 3}), '1000',
	'spread: destination_runtime() has a row for each of the 1,000 destinations');

# ---- c. a circuit beyond the old 512 entries ----
my $closed_port = PostgreSQL::Test::Cluster::get_free_port();
sql(qq{
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, options)
	VALUES ('refused', 'http://127.0.0.1:$closed_port/refused', 1000, 1000, '{"circuit_threshold": 2}')});
my $circuit = '';
for my $i (1 .. 50)
{
	emit_events($node, 'many.refused', 'refused', 1);
	usleep(200_000);
	$circuit = sql(q{
		SELECT circuit_state FROM outbox.destination_runtime() WHERE destination = 'refused'});
	last if $circuit eq 'open' || $circuit eq 'half-open';
}
like($circuit, qr/^(open|half-open)$/, 'refused: its circuit opens');
cmp_ok(sql('SELECT count(*) FROM outbox.destination_runtime()'), '>', 1000,
	'refused: ... with more than 1,000 destinations in shared memory');
sql(q{DELETE FROM outbox.destinations WHERE name = 'refused'});

# ---- e. changes at scale, well within the poll interval ----
# One event; wait (up to the deadline) until the sink has it; returns its
# request's record, or undef.
sub deliver
{
	my ($dest) = @_;
	return deliver_one($node, $sink, 'many.change', $dest, $DEADLINE);
}

sql(qq{INSERT INTO outbox.destinations (name, url) VALUES ('added', '$u/ok/added')});
my $r = deliver('added');
ok(defined $r && $r->{path} eq '/ok/added', 'added: an added destination is delivered at once');

sql(q{SELECT outbox.pause('d0007')});
my ($held) = emit_events($node, 'many.change', 'd0007', 1);
ok(defined deliver('added'), 'paused: a later event of another destination is delivered');
is(sql(qq{SELECT status || ':' || attempts FROM outbox.events WHERE id = '$held'}), 'pending:0',
	'paused: the paused destination\'s event is not leased');
sql(q{SELECT outbox.resume('d0007')});
ok(wait_until(sub { grep { ($_->{id} // '') eq $held } sink_records($sink) }, $DEADLINE),
	'paused: resumed, its event is delivered at once');

my $gone = sql(q{
	BEGIN;
	SELECT outbox.emit('many.change', 'g1', '{}', destination => 'd0009');
	DELETE FROM outbox.destinations WHERE name = 'd0009';
	COMMIT;});
ok(defined deliver('added'), 'deleted: a later event of another destination is delivered');
is(sql(qq{SELECT status || ':' || attempts FROM outbox.events WHERE id = '$gone'}), 'pending:0',
	'deleted: the deleted destination\'s event is not leased');

$node->stop;

# ---- d. and e. outbox.max_destinations = 64 ----
my $small = new_outbox_node('few', q{
outbox.max_destinations = 64
outbox.workers_per_database = 2
});
$small->start;
sub ssql { return $small->safe_psql('postgres', $_[0]); }
ssql(qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url)
	SELECT 'm' || lpad(g::text, 3, '0'), '$u/ok/m' || lpad(g::text, 3, '0')
	  FROM generate_series(1, 100) g;
});
ok($small->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers()
	 WHERE database = 'postgres' AND pid IS NOT NULL AND state IN ('idle', 'working')}),
	'64: two relays run');
my @m = split / /, ssql(q{
	SELECT string_agg(outbox.emit('few.m', g::text, '{}',
	                              destination => 'm' || lpad((1 + g % 100)::text, 3, '0'))::text, ' ')
	  FROM generate_series(1, 200) g});
ok($small->poll_query_until('postgres', q{
	SELECT count(*) = 200 FROM outbox.events WHERE type = 'few.m' AND status = 'published'}),
	'64: 200 events over 100 destinations published');
assert_zero_lost($sink, '64', '/ok/m', @m);
is(ssql('SELECT count(*) FROM outbox.destination_runtime()'), '64',
	'64: 64 destinations have runtime state, no more');
ok($small->log_contains(qr/LOG:  destination "m\d+" is relayed without runtime statistics or circuit breaker/),
	'64: the destinations without runtime state are logged');
ok($small->log_contains(qr/HINT:  Raise outbox\.max_destinations/),
	'64: ... with a hint naming outbox.max_destinations');

# the 100 go, 60 others come: the relays let the old entries go, and the
# new destinations take them
ssql(qq{
	BEGIN;
	DELETE FROM outbox.destinations WHERE name LIKE 'm%';
	INSERT INTO outbox.destinations (name, url)
	SELECT 'n' || lpad(g::text, 3, '0'), '$u/ok/n' || lpad(g::text, 3, '0')
	  FROM generate_series(1, 60) g;
	COMMIT;
});
my @n = split / /, ssql(q{
	SELECT string_agg(outbox.emit('few.n', g::text, '{}',
	                              destination => 'n' || lpad((1 + g % 60)::text, 3, '0'))::text, ' ')
	  FROM generate_series(1, 120) g});
ok($small->poll_query_until('postgres', q{
	SELECT count(*) = 120 FROM outbox.events WHERE type = 'few.n' AND status = 'published'}),
	'64: 120 events over 60 new destinations published');
assert_zero_lost($sink, '64 new', '/ok/n', @n);
ok($small->poll_query_until('postgres', q{
	SELECT count(*) = 60 FROM outbox.destination_runtime() WHERE destination LIKE 'n%'}),
	'64: each of the 60 new destinations has runtime state: the deleted ones\' entries were let go');
cmp_ok(ssql('SELECT count(*) FROM outbox.destination_runtime()'), '<=', 64,
	'64: still no more than 64 entries');

$small->stop;
stop_sink($sink);
stop_sink($fast);
done_testing();
