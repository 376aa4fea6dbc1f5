# Operability with a real relay and the sink: outbox.health(),
# outbox.destination_stats, outbox.workers() and outbox.metrics() in each
# state they report (no relay, healthy, dead letters present, destination
# down, paused); redrive re-delivers exactly the selected dead letters with
# the same ids; purge removes only dead letters; wait_published(); the
# server log warns about an old backlog and an open circuit without
# flooding; the metrics text is parsed by the Python prometheus_client
# parser, scraped through psql by a pg_monitor member.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use IPC::Run;
use JSON::PP;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $sink = start_sink();
my $u = $sink->{url};
# no database is relayed at first
my $node = new_outbox_node('operations', qq{
outbox.databases = 'nothing_here'
outbox.workers_per_database = 2
outbox.pending_age_warning = '3s'
outbox.pending_age_critical = '1h'
log_min_messages = warning
});
$node->start;

sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(qq{
	CREATE EXTENSION outbox_pg;
	CREATE ROLE mon LOGIN IN ROLE pg_monitor;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms, options) VALUES
		('good', '$u/ok/good', 2000, 10, 50, 200, '{}'),
		('bad',  '$u/status/422/bad', 2000, 10, 50, 200, '{}'),
		('flip', '$u/status/422/flip', 2000, 10, 50, 200, '{}'),
		('down', '$u/status/503/down', 2000, 1000, 50, 200, '{"circuit_threshold": 3}');
});

# The metrics as a pg_monitor member scrapes them with psql, parsed by
# prometheus_client: family name => [ [labels hash, value], ... ]
sub scrape
{
	my $text = $node->safe_psql('postgres', 'SELECT outbox.metrics()', extra_params => [ '-U', 'mon' ]);
	my ($out, $err) = ('', '');
	my $py = q{
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.setdefault(s.name, []).append([s.labels, s.value])
    out.setdefault('__types__', []).append([fam.name, fam.type])
print(json.dumps(out))
};
	my $ok = IPC::Run::run([ 'python3', '-c', $py ], '<', \"$text\n", '>', \$out, '2>', \$err);
	return ($ok, $ok ? decode_json($out) : { error => $err });
}

sub metric
{
	my ($m, $name, %labels) = @_;
	for my $s (@{ $m->{$name} // [] })
	{
		my $match = 1;
		$match &&= ($s->[0]{$_} // '') eq $labels{$_} for keys %labels;
		return $s->[1] if $match;
	}
	return undef;
}

sub health { return sql(q{SELECT status || ': ' || array_to_string(reasons, ' | ') FROM outbox.health()}); }

# --- no relay worker -----------------------------------------------------
like(health(), qr/^critical: critical: no relay worker is running for database "postgres"/,
	'no relay: health is critical and says why');
is(sql(q{SELECT count(*) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}), '0',
	'no relay: workers() shows none running');
my ($ok, $m) = scrape();
ok($ok, 'metrics text parses as Prometheus exposition format') or diag($m->{error});
is(metric($m, 'outbox_health_status', database => 'postgres'), 2, 'no relay: outbox_health_status is 2');
is(metric($m, 'outbox_relay_workers', state => 'idle') + metric($m, 'outbox_relay_workers', state => 'working'), 0,
	'no relay: no idle or working relay in the metrics');

# --- healthy ---------------------------------------------------------------
$node->append_conf('postgresql.conf', "outbox.databases = '*'\n");
$node->reload;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL AND state IN ('idle', 'working')}),
	'healthy: two relays run');
my @good = emit_events($node, 'ops.good', 'good', 20);
is(sql(qq{SELECT outbox.wait_published('$good[-1]', '20 seconds')}), 't', 'wait_published returns true once published');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 20 FROM outbox.events WHERE destination = 'good' AND status = 'published'}),
	'healthy: all published');
is(health(), 'ok: ', 'healthy: health is ok with no reasons');
is(sql(q{SELECT pending || ' ' || published || ' ' || dead || ' ' || in_flight || ' ' || circuit_state || ' '
           || (recent_2xx = 20) || ' ' || (last_success_at IS NOT NULL) || ' ' || (last_error_at IS NULL)
           || ' ' || (recent_latency_avg_ms >= 0)
         FROM outbox.destination_stats WHERE destination = 'good'}),
	'0 20 0 0 closed true true true true', 'healthy: destination_stats of the destination');
is(sql(q{SELECT sum(published) >= 20 FROM outbox.workers() WHERE database = 'postgres'}), 't',
	'healthy: workers() counts the published events');
($ok, $m) = scrape();
ok($ok, 'healthy: metrics parse') or diag($m->{error});
is(metric($m, 'outbox_health_status'), 0, 'healthy: outbox_health_status is 0');
is(metric($m, 'outbox_published_total', destination => 'good'), 20, 'healthy: outbox_published_total counts acknowledgements');
is(metric($m, 'outbox_http_responses_total', destination => 'good', class => '2xx'), 20, 'healthy: 2xx responses counted');
is(metric($m, 'outbox_http_request_duration_seconds_count', destination => 'good'), 20, 'healthy: latency summary count');
is(metric($m, 'outbox_pending_events', destination => 'good'), 0, 'healthy: nothing pending');
is(metric($m, 'outbox_relay_workers', state => 'idle') + metric($m, 'outbox_relay_workers', state => 'working'), 2,
	'healthy: two relays in the metrics');
my %types = map { $_->[0] => $_->[1] } @{ $m->{__types__} };
is($types{outbox_published}, 'counter', 'counters are typed counter (parser strips _total)');
is($types{outbox_http_request_duration_seconds}, 'summary', 'latency is a summary');

# --- dead letters present, redrive and purge -------------------------------
my @bad = emit_events($node, 'ops.bad', 'bad', 3);
my @flip_a = emit_events($node, 'a.flip', 'flip', 3);
my @flip_b = emit_events($node, 'b.flip', 'flip', 2);
ok($node->poll_query_until('postgres', q{SELECT count(*) = 8 FROM outbox.events WHERE status = 'dead'}),
	'dead letters: 422s are dead-lettered');
is(sql(q{SELECT dead || ' ' || pending || ' ' || recent_4xx || ' ' || (oldest_dead_age >= '0')
         FROM outbox.destination_stats WHERE destination = 'bad'}),
	'3 0 3 true', 'dead letters: destination_stats shows them');
like(health(), qr/^warn: warn: 8 dead letter\(s\)/, 'dead letters: health warns');
($ok, $m) = scrape();
is(metric($m, 'outbox_dead_letters', destination => 'flip'), 5, 'dead letters: outbox_dead_letters');
is(metric($m, 'outbox_dead_lettered_total', destination => 'bad'), 3, 'dead letters: outbox_dead_lettered_total');

# the destination is fixed; only the a.* ones are redriven
sql(qq{UPDATE outbox.destinations SET url = '$u/ok/flip' WHERE name = 'flip'});
is(sql(q{SELECT outbox.redrive_dead(destination => 'flip', type => 'a.*')}), '3', 'redrive: a filter selects three');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 3 FROM outbox.events WHERE destination = 'flip' AND status = 'published'}),
	'redrive: the three are published');
my $flip_ok = sink_ids($sink, '/ok/flip');
is_deeply([ sort keys %$flip_ok ], [ sort @flip_a ], 'redrive: exactly the selected messages re-delivered, with the same ids');
is(sql(q{SELECT count(*) FROM outbox.events WHERE destination = 'flip' AND status = 'dead'}), '2', 'redrive: the others stay dead');
is(sql(qq{SELECT outbox.redrive('$flip_b[0]')}), 't', 'redrive one');
is(sql(qq{SELECT outbox.wait_published('$flip_b[0]', '20 seconds')}), 't', 'redrive one: published');
$flip_ok = sink_ids($sink, '/ok/flip');
is_deeply([ sort keys %$flip_ok ], [ sort(@flip_a, $flip_b[0]) ], 'redrive one: that one arrives too, same id');
is(sql(qq{SELECT outbox.wait_published('$bad[0]', '1 second')}), 'f', 'wait_published is false for a dead letter');

my $before = sql(q{SELECT count(*) FILTER (WHERE status = 'published') || ' ' || count(*) FILTER (WHERE status = 'pending') FROM outbox.events});
is(sql(q{SELECT outbox.purge_dead(destination => 'bad')}), '3', 'purge: three dead letters of one destination');
is(sql(q{SELECT count(*) FILTER (WHERE status = 'published') || ' ' || count(*) FILTER (WHERE status = 'pending') FROM outbox.events}),
	$before, 'purge: published and pending events untouched');
is(sql(q{SELECT count(*) FROM outbox.events WHERE status = 'dead'}), '1', 'purge: the other dead letter remains');
sql(q{SELECT outbox.purge_dead(all_dead => true)});
is(health(), 'ok: ', 'after the purge, health is ok again');

# --- destination down ------------------------------------------------------
my $log_offset = -s $node->logfile;
my @down = emit_events($node, 'ops.down', 'down', 10);
ok($node->poll_query_until('postgres', q{SELECT circuit_state IN ('open', 'half-open') FROM outbox.destination_stats WHERE destination = 'down'}),
	'down: the circuit opens');
is(sql(q{SELECT pending || ' ' || (recent_5xx >= 3) || ' ' || (last_error_at IS NOT NULL) || ' ' || (last_success_at IS NULL)
         FROM outbox.destination_stats WHERE destination = 'down'}),
	'10 true true true', 'down: destination_stats shows the failures');
like(health(), qr/^warn: .*destination "down" is failing: its circuit is (open|half-open)/, 'down: health warns');
($ok, $m) = scrape();
is(metric($m, 'outbox_circuit_open', destination => 'down'), 1, 'down: outbox_circuit_open is 1');
is(metric($m, 'outbox_circuit_open', destination => 'good'), 0, 'down: the healthy destination\'s circuit is closed');
ok(wait_until(sub { $node->log_contains(qr/WARNING:  outbox_pg destination "down" failed \d+ times in a row; circuit opened/, $log_offset) }, 20),
	'down: the circuit opening is a WARNING in the log');
# the backlog check waits 1,000 times what its last run took (housekeeping.c):
# on a busy machine a check of 34 ms put the next one 34 s later
ok(wait_until(sub { $node->log_contains(qr/WARNING:  outbox_pg: the oldest pending event in database "postgres" is \d+ s old/, $log_offset) }, 90),
	'down: an old backlog is a WARNING in the log');
like(health(), qr/warn: the oldest pending event of destination "down" is \d+ s old/, 'down: health reports the age too');
sleep 3;
my $log = slurp_file($node->logfile, $log_offset);
my $opened = () = $log =~ /circuit opened/g;
my $aged = () = $log =~ /the oldest pending event in database/g;
is($opened, 1, 'down: the circuit opening is logged once, not by every relay or probe');
is($aged, 1, 'down: the backlog warning is not repeated within a minute');

# --- paused ----------------------------------------------------------------
sql(q{SELECT outbox.pause('down')});
ok($node->poll_query_until('postgres', q{SELECT in_flight = 0 AND paused FROM outbox.destination_stats WHERE destination = 'down'}),
	'paused: shown, and nothing in flight');
like(health(), qr/warn: destination "down" is paused/, 'paused: health says so');
($ok, $m) = scrape();
is(metric($m, 'outbox_destination_paused', destination => 'down'), 1, 'paused: outbox_destination_paused is 1');
my $requests = scalar(grep { $_->{path} =~ m{^/status/503/down} } sink_records($sink));
sleep 1;
is(scalar(grep { $_->{path} =~ m{^/status/503/down} } sink_records($sink)), $requests, 'paused: no more requests');
is(sql(qq{SELECT outbox.wait_published('$down[0]', '200 milliseconds')}), 'f', 'wait_published times out while paused');

# the destination comes back: resume, everything is delivered, the log
# says the backlog and the circuit recovered
sql(qq{UPDATE outbox.destinations SET url = '$u/ok/down' WHERE name = 'down'});
sql(q{SELECT outbox.resume('down')});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 10 FROM outbox.events WHERE destination = 'down' AND status = 'published'}),
	'resumed: everything is published');
assert_zero_lost($sink, 'down and back', '/ok/down', @down);
ok($node->poll_query_until('postgres', q{SELECT circuit_state = 'closed' AND NOT paused FROM outbox.destination_stats WHERE destination = 'down'}),
	'resumed: the circuit is closed');
ok(wait_until(sub { $node->log_contains(qr/pending events in database "postgres" are younger than outbox.pending_age_warning again/, $log_offset) }, 90),
	'resumed: the log says the backlog recovered');
ok($node->log_contains(qr/destination "down" is healthy again; circuit closed/, $log_offset), 'resumed: and the circuit closed');
ok($node->poll_query_until('postgres', q{SELECT status = 'ok' FROM outbox.health()}), 'resumed: health is ok');

# a monitoring role reads no payloads or secrets
my ($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT payload FROM outbox.events', extra_params => [ '-U', 'mon' ]);
like($stderr, qr/permission denied for view events/, 'pg_monitor member: no payloads');
($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT bearer_token FROM outbox.destinations', extra_params => [ '-U', 'mon' ]);
like($stderr, qr/permission denied for table destinations/, 'pg_monitor member: no secrets');

$node->stop;
stop_sink($sink);

# --- the library not preloaded at all --------------------------------------
my $plain = PostgreSQL::Test::Cluster->new('not_preloaded');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', q{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('d', 'http://127.0.0.1:9/');
	SELECT outbox.emit('t', '1', '{}', destination => 'd');
});
like($plain->safe_psql('postgres', q{SELECT status || ': ' || array_to_string(reasons, ' | ') FROM outbox.health()}),
	qr/^critical: critical: outbox_pg is not in shared_preload_libraries, so no relay runs/,
	'not preloaded: health is critical and says why');
is($plain->safe_psql('postgres', q{SELECT pending || ' ' || in_flight || ' ' || circuit_state FROM outbox.destination_stats}),
	'1 0 closed', 'not preloaded: destination_stats still reads the backlog');
like($plain->safe_psql('postgres', q{SELECT outbox.metrics()}),
	qr/^outbox_health_status\{database="postgres"\} 2$/m, 'not preloaded: metrics report critical');
$plain->stop;
done_testing();
