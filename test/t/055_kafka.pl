# Kafka through librdkafka (kind kafka, the native-client transport),
# against librdkafka's mock cluster (test/sink/kafka_mock.c) and read
# back with kcat: every event arrives with its key (the aggregate id) and
# headers; an event is published only on its delivery report; errors the
# broker injects are retried and lose nothing; a message too large is
# dead-lettered and a topic the producer may not write to is reported and
# retried; a broker that is down and comes back gets what waited; a relay
# killed with SIGKILL mid-stream loses nothing; an ordered destination
# keeps each aggregate's order.
use strict;
use utf8;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use BrokerTest;
use OutboxTest;
use Encode ();
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

BEGIN { require_packages('librdkafka-dev', 'kcat'); }

my $k = start_kafka_mock('orders', 'small', 'denied', 'ordered', 'stream', 'ce', 'pressure');
note("mock cluster at $k->{bootstrap}");

my $node = new_outbox_node('kafka', "restart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, kind, url, timeout_ms, backoff_base_ms, backoff_max_ms, options) VALUES
		('kafka', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "orders"}'),
		('kafka_small', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "small", "message.max.bytes": 1000}'),
		('kafka_denied', 'kafka', '$k->{url}', 3000, 1000, 2000, '{"topic": "denied", "circuit_threshold": 0}'),
		('kafka_ordered', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "ordered", "ordering": "aggregate", "linger.ms": 0}'),
		('kafka_stream', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "stream", "compression.type": "lz4"}'),
		('kafka_pressure', 'kafka', '$k->{url}', 3000, 100, 1000,
		 '{"topic": "pressure", "ordering": "aggregate", "queue.buffering.max.messages": 5}'),
		('kafka_ce', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "ce", "cloudevents": true, "source": "urn:shop"}');
});

# validation: the allow-list of properties, the url
my ($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'kafka', '$k->{url}', '{"topic": "t", "acks": "1"}')});
like($err, qr/unknown option "acks" for a destination of kind kafka/, 'a property outside the allow-list is refused');
($ret, $out, $err) = $node->psql('postgres',
	q{INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'kafka', 'http://127.0.0.1:9092', '{"topic": "t"}')});
like($err, qr/is not a list of Kafka bootstrap servers/, 'an http url is refused for kind kafka');

sub published
{
	my ($type) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(*) FROM outbox.events WHERE type = '$type' AND status = 'published'});
}

# Every id is in the topic at least once; notes the duplicates.
sub zero_lost
{
	my ($name, $topic, @ids) = @_;
	my %seen;
	$seen{ $_->{headers}{message_id} // '' }++ for kafka_consume($k, $topic);
	my @lost = grep { !$seen{$_} } @ids;
	is(scalar(@lost), 0, "$name: zero lost");
	my $dups = 0;
	$dups += $seen{$_} - 1 for grep { $seen{$_} } @ids;
	note("$name: " . scalar(@ids) . " events, $dups duplicates");
}

# 1. delivery: ids, keys, headers, payload
my $tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
my @ids = split / /, $node->safe_psql('postgres', qq{
	SELECT string_agg(outbox.emit('order.placed', 'acct-' || g,
	                              jsonb_build_object('n', g, 'memo', 'Grüße ✓'),
	                              destination => 'kafka', traceparent => '$tp',
	                              headers => jsonb_build_object('x-tenant', 'tenant-' || g,
	                                                            'message_id', 'spoofed'))::text, ' ' ORDER BY g)
	  FROM generate_series(1, 20) g});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 20 FROM outbox.events WHERE type = 'order.placed' AND status = 'published'}),
	'twenty events published on their delivery reports');
my @msgs = kafka_consume($k, 'orders');
my %by_id = map { $_->{headers}{message_id} => $_ } @msgs;
is(scalar(grep { $by_id{$_} } @ids), 20, 'every event is in the topic, message_id header = event id');
my $m = $by_id{ $ids[0] };
is($m->{key}, 'acct-1', 'the key is the aggregate id');
is($m->{headers}{type}, 'order.placed', 'type header');
is($m->{headers}{content_type}, 'application/json', 'content_type header');
is($m->{headers}{traceparent}, $tp, 'traceparent header');
is($m->{headers}{aggregate_id}, 'acct-1', 'aggregate_id header');
is($m->{headers}{destination}, 'kafka', 'destination header');
is($m->{headers}{'x-tenant'}, 'tenant-1', 'a per-event header is a Kafka header');
is_deeply(decode_json(Encode::encode_utf8($m->{payload})), { n => 1, memo => 'Grüße ✓' },
	'the payload, non-ASCII intact');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE type = 'order.placed' AND attempts <> 1}),
	'0', 'each took one attempt');

# CloudEvents binary mode (Kafka protocol binding)
my ($ce_id) = split / /, $node->safe_psql('postgres', qq{
	SELECT outbox.emit('order.placed', 'acct-7', '{"n": 7}', destination => 'kafka_ce', traceparent => '$tp')});
ok($node->poll_query_until('postgres', qq{SELECT status = 'published' FROM outbox.events WHERE id = '$ce_id'}),
	'cloudevents: published');
($m) = kafka_consume($k, 'ce');
is_deeply([ @{ $m->{headers} }{qw(ce_specversion ce_id ce_source ce_type ce_subject ce_traceparent content-type)} ],
	[ '1.0', $ce_id, 'urn:shop', 'order.placed', 'acct-7', $tp, 'application/json' ],
	'cloudevents: ce_ headers and content-type');
like($m->{headers}{ce_time} // '', qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/, 'cloudevents: ce_time is RFC 3339');

# 2. errors the broker injects (NOT_ENOUGH_REPLICAS, retriable): retried,
# nothing lost
ok(kafka_command($k, 'produce_errors 4 19'), 'the next produce requests fail with NOT_ENOUGH_REPLICAS');
@ids = emit_events($node, 'order.retried', 'kafka', 10);
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 10 FROM outbox.events WHERE type = 'order.retried' AND status = 'published'}),
	'after injected retriable errors, every event is published');
zero_lost('injected errors', 'orders', @ids);

# 2b. a fatal error (the producer fenced: its InitProducerId answered
# INVALID_PRODUCER_EPOCH; librdkafka refuses every produce after it): a new
# producer takes over at the next lease step, not at the next reload of the
# configuration (10 s here, minutes with many destinations)
my $log_offset = -s $node->logfile;
ok(kafka_command($k, 'request_errors 22 1 47'), 'the next InitProducerId answers INVALID_PRODUCER_EPOCH');
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, kind, url, timeout_ms, backoff_base_ms, backoff_max_ms, options) VALUES
		('kafka_fenced', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "orders"}')});
@ids = emit_events($node, 'order.fatal', 'kafka_fenced', 10);
ok($node->wait_for_log(qr/destination "kafka_fenced": its Kafka producer raised a fatal error: _FENCED: Producer fenced/,
	$log_offset), 'the fatal error is logged');
my $fatal_at = Time::HiRes::time();
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 10 FROM outbox.events WHERE type = 'order.fatal' AND status = 'published'}),
	'a new producer publishes every event');
my $fatal_s = Time::HiRes::time() - $fatal_at;
cmp_ok($fatal_s, '<', 5, sprintf('... %.1f s after the fatal error', $fatal_s));
zero_lost('fatal error', 'orders', @ids);

# 3. permanent errors: a message too large is dead-lettered at once, a
# topic the producer is not authorized for is reported and retried
$node->safe_psql('postgres', q{
	SELECT outbox.emit('order.big', 'a-1', jsonb_build_object('blob', repeat('x', 2000)), destination => 'kafka_small')});
ok($node->poll_query_until('postgres', q{SELECT status = 'dead' FROM outbox.events WHERE type = 'order.big'}),
	'a message above message.max.bytes is dead-lettered');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE type = 'order.big'}),
	qr/^message too large for Kafka/, 'with the reason');
# (the broker's answer to the produce requests: librdkafka 2.0.2 lets a
# topic error in metadata time the messages out instead)
ok(kafka_command($k, 'produce_errors 3 29'), 'the next produce requests answer TOPIC_AUTHORIZATION_FAILED');
$node->safe_psql('postgres', q{SELECT outbox.emit('order.denied', 'a-1', '{}', destination => 'kafka_denied')});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'pending' AND attempts >= 2 AND last_error LIKE 'configuration: TOPIC_AUTHORIZATION_FAILED%'
	  FROM outbox.events WHERE type = 'order.denied'}),
	'an unauthorized topic is a configuration failure: reported and retried, not dead-lettered');
note($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE type = 'order.denied'}));
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'order.denied'}),
	'once the broker accepts it, the retry is published');
# the broker refuses a whole record batch (INVALID_RECORD, as a compacted
# topic does for one record without a key): every message of it has the
# error, and the healthy ones were dead-lettered with the one at fault;
# now each is retried, and the destination's circuit is not charged
ok(kafka_command($k, 'produce_errors 1 87'), 'the next produce request answers INVALID_RECORD');
@ids = emit_events($node, 'order.batchmate', 'kafka', 10);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 10 FROM outbox.events WHERE type = 'order.batchmate' AND status = 'published'}),
	'a refused record batch: every message of it is retried and published, none dead-lettered');
my $refused = $node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.events WHERE type = 'order.batchmate' AND attempts = 2});
cmp_ok($refused, '>=', 1, "... $refused of them after one refused attempt");
zero_lost('refused record batch', 'orders', @ids);

# 4. the broker down, then up again
ok(kafka_command($k, 'down'), 'broker down');
@ids = emit_events($node, 'order.outage', 'kafka', 5);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 5 FROM outbox.events
	 WHERE type = 'order.outage' AND status = 'pending' AND last_error IS NOT NULL}),
	'while the broker is down, the events are retried with a reason')
  or diag("the events: "
	  . $node->safe_psql('postgres', q{
		SELECT string_agg(format('%s %s attempts %s next %s error %s', aggregate_id, status, attempts,
		                         next_attempt_at, last_error), E'\n' ORDER BY aggregate_id)
		  FROM outbox.events WHERE type = 'order.outage'})
	  . "\nthe relays: "
	  . $node->safe_psql('postgres', q{SELECT string_agg(format('%s %s in flight %s: %s', pid, state, in_flight, last_error), E'\n') FROM outbox.workers()})
	  . "\nthe destination: "
	  . $node->safe_psql('postgres', q{SELECT row_to_json(r)::text FROM outbox.destination_runtime() r WHERE destination = 'kafka'}));
note($node->safe_psql('postgres', q{SELECT min(last_error) FROM outbox.events WHERE type = 'order.outage'}));
ok(kafka_command($k, 'up'), 'broker up');
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 5 FROM outbox.events WHERE type = 'order.outage' AND status = 'published'}),
	'once the broker is back, every event is published');
zero_lost('broker down and up', 'orders', @ids);

# 5. ordering: each aggregate's events in order in its partition
$node->safe_psql('postgres', q{
	SELECT outbox.emit('order.step', 'agg-' || (g % 3), jsonb_build_object('n', g), destination => 'kafka_ordered')
	  FROM generate_series(1, 30) g});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 30 FROM outbox.events WHERE type = 'order.step' AND status = 'published'}),
	'ordered destination: thirty events published');
my %last;
my $in_order = 1;
for my $msg (kafka_consume($k, 'ordered'))
{
	my $n = decode_json($msg->{payload})->{n};
	$in_order = 0 if defined $last{ $msg->{key} } && $n <= $last{ $msg->{key} };
	$last{ $msg->{key} } = $n;
}
ok($in_order && keys(%last) == 3, 'each aggregate\'s events are in order on its partition');

# 5b. back-pressure: a local queue of 5 messages with 40 aggregates in
# flight; a produce refused as queue-full holds the event and those after
# it, in order, until the next lease step: every event is published, each
# aggregate's in order
@ids = split / /, $node->safe_psql('postgres', q{
	SELECT string_agg(outbox.emit('order.pressed', 'agg-' || (g % 40), jsonb_build_object('n', g),
	                              destination => 'kafka_pressure')::text, ' ' ORDER BY g)
	  FROM generate_series(1, 400) g});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 400 FROM outbox.events WHERE type = 'order.pressed' AND status = 'published'}),
	'queue full (back-pressure): all 400 events published');
%last = ();
$in_order = 1;
my %pressed;
for my $msg (kafka_consume($k, 'pressure'))
{
	my $n = decode_json($msg->{payload})->{n};
	$pressed{ $msg->{headers}{message_id} }++;
	$in_order = 0 if defined $last{ $msg->{key} } && $n <= $last{ $msg->{key} };
	$last{ $msg->{key} } = $n;
}
ok($in_order && keys(%last) == 40, 'back-pressure keeps each aggregate\'s order');
is(scalar(grep { !$pressed{$_} } @ids), 0, 'back-pressure: zero lost');

# 6. SIGKILL of the relay mid-stream: nothing lost
@ids = emit_events($node, 'order.kill9', 'kafka_stream', 600);
ok(wait_until(sub { published('order.kill9') >= 30 }, 60), 'delivery under way');
my ($victim) = relay_pids($node, 'postgres');
kill 'KILL', $victim;
note("killed relay $victim with SIGKILL");
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 600 FROM outbox.events WHERE type = 'order.kill9' AND status = 'published'}),
	'SIGKILL: every event is published after the restart');
zero_lost('SIGKILL', 'stream', @ids);

# 7. SIGTERM (fast stop) while events are in flight: the relay waits for
# their delivery reports within the lease, records them, then exits
@ids = emit_events($node, 'order.stop', 'kafka_stream', 200);
$node->stop('fast');
$node->start;
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 200 FROM outbox.events WHERE type = 'order.stop' AND status = 'published'}),
	'fast stop and start: every event is published');
zero_lost('fast stop', 'stream', @ids);

# ... and with the broker down: the reports (timeouts) come within the
# lease, are recorded as retries before the relay exits, and the events
# are published once the broker is back
ok(kafka_command($k, 'down'), 'broker down again');
my $log_offset = -s $node->logfile;
emit_events($node, 'order.flush', 'kafka', 5);
# produced at once, and reported only when they time out (3 s)
Time::HiRes::sleep(1);
$node->stop('fast');
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/relay waits for \d+ events a broker has not confirmed yet before exiting/,
	'SIGTERM: the relay waits for the broker\'s reports before exiting');
unlike($log, qr/exits with \d+ events unconfirmed/, 'every report came within the lease');
ok(kafka_command($k, 'up'), 'broker up again');
$node->start;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 5 FROM outbox.events WHERE type = 'order.flush' AND status = 'published'}),
	'after the restart every event is published');

# 7b. SIGTERM under a steady load: the broker answers each request 1.5 s
# late and an event is emitted every 200 ms for longer than a lease
# (timeout_ms 3 s + lease_margin 2 s), so some event is outstanding all
# along.  The flush waits for the events outstanding at the SIGTERM (a
# bound kept since the first of them, long past, made it give up at once
# and their events were sent again after the restart), and the
# postmaster's second copy of the SIGTERM does not cut it short.
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, kind, url, timeout_ms, backoff_base_ms, backoff_max_ms, options) VALUES
		('kafka_steady', 'kafka', '$k->{url}', 3000, 100, 1000, '{"topic": "orders"}')});
@ids = emit_events($node, 'order.steady', 'kafka_steady', 1);
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM outbox.events WHERE type = 'order.steady' AND status = 'published'}),
	'steady load: the destination delivers');
ok(kafka_command($k, 'rtt 1500'), 'the broker answers 1.5 s late');
$log_offset = -s $node->logfile;
my $steady_from = Time::HiRes::time();
while (Time::HiRes::time() - $steady_from < 8)
{
	push @ids, emit_events($node, 'order.steady', 'kafka_steady', 1);
	Time::HiRes::sleep(0.2);
}
$node->stop('fast');
$log = slurp_file($node->logfile, $log_offset);
like($log, qr/relay waits for \d+ events a broker has not confirmed yet before exiting/,
	'steady load, SIGTERM: the relay waits for the outstanding events');
unlike($log, qr/exits with \d+ events unconfirmed/,
	'steady load, SIGTERM: every outstanding event\'s report came before the relay exited');
ok(kafka_command($k, 'rtt 0'), 'the broker answers at once again');
$node->start;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = } . scalar(@ids) . q{ FROM outbox.events WHERE type = 'order.steady' AND status = 'published'}),
	'steady load: every event is published after the restart');
{
	my %seen;
	$seen{ $_->{headers}{message_id} // '' }++ for kafka_consume($k, 'orders');
	is(scalar(grep { !$seen{$_} } @ids), 0, 'steady load: zero lost');
	is(scalar(grep { ($seen{$_} // 0) > 1 } @ids), 0,
		'steady load: no event sent twice (its report was recorded before the exit)');
}

# 8. outbox.allowed_hosts applies to the bootstrap servers
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.allowed_hosts = 'kafka.example.com'; SELECT pg_reload_conf()});
$node->safe_psql('postgres', q{SELECT outbox.emit('order.egress', 'a-1', '{}', destination => 'kafka')});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'pending' AND last_error LIKE 'bootstrap server refused: host "127.0.0.1" is not in outbox.allowed_hosts%'
	  FROM outbox.events WHERE type = 'order.egress'}),
	'a bootstrap server outside outbox.allowed_hosts is refused, with the reason');
$node->safe_psql('postgres', qq{ALTER SYSTEM SET outbox.allowed_hosts = '127.0.0.1'; SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'order.egress'}),
	'allowed again: published');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.allowed_hosts; SELECT pg_reload_conf()});

unlike($node->safe_psql('postgres', q{SELECT string_agg(coalesce(last_error, ''), ' ') FROM outbox.events}),
	qr/password/, 'no secret in any error');

$node->stop;
done_testing();
