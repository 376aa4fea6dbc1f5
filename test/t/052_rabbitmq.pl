# RabbitMQ through the management API publish endpoint, against a private
# rabbitmq-server node on 127.0.0.1: events arrive in a bound queue with
# message_id, type, content_type, delivery_mode and headers (the
# per-event ones too, never replacing the relay's own); only
# {"routed": true} acknowledges, so an unroutable routing key is reported
# and retried (or dead-lettered when configured so); a missing exchange
# and wrong credentials are reported and retried.
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

BEGIN { require_packages('rabbitmq'); }

my $rmq = start_rabbitmq();
is(rabbit_api($rmq, 'PUT', '/api/exchanges/%2F/events', { type => 'topic', durable => JSON::PP::true })->{status},
	201, 'exchange declared');
rabbit_api($rmq, 'PUT', '/api/queues/%2F/payments', { durable => JSON::PP::true });
is(rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/payments', { routing_key => 'payment.#' })->{status},
	201, 'queue bound for payment.#');

my $node = new_outbox_node('rabbitmq');
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.credentials (name, username, password) VALUES
		('rmq', 'guest', 'guest'), ('rmq_wrong', 'guest', 'not-the-password');
	INSERT INTO outbox.destinations (name, kind, url, credentials, backoff_base_ms, backoff_max_ms, options) VALUES
		('rabbit', 'rabbitmq', '$rmq->{url}', 'rmq', 100, 1000, '{"exchange": "events"}'),
		('rabbit_dead', 'rabbitmq', '$rmq->{url}/', 'rmq', 100, 1000, '{"exchange": "events", "routing_key": "audit.{aggregate_id}", "unroutable": "dead"}'),
		('rabbit_noexchange', 'rabbitmq', '$rmq->{url}', 'rmq', 100, 1000, '{"exchange": "missing"}'),
		('rabbit_wrong', 'rabbitmq', '$rmq->{url}', 'rmq_wrong', 100, 1000, '{"exchange": "events"}');
});
my ($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'rabbitmq', '$rmq->{url}', 'rmq', '{"unroutable": "drop"}')});
like($err, qr/option unroutable must be retry or dead/, 'options are validated');

my $tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
my $ids = $node->safe_psql('postgres', qq{
	SELECT string_agg(outbox.emit('payment.captured', 'acct-' || g,
	                              jsonb_build_object('n', g, 'memo', 'Grüße ✓'),
	                              destination => 'rabbit', traceparent => '$tp',
	                              headers => jsonb_build_object('x-tenant', 'tenant-' || g,
	                                                            'aggregate_id', 'spoofed'))::text, ' ' ORDER BY g)
	  FROM generate_series(1, 5) g});
my @ids = split / /, $ids;
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 5 FROM outbox.events WHERE destination = 'rabbit' AND status = 'published'}),
	'five events published (routed: true)');
my $res = rabbit_api($rmq, 'POST', '/api/queues/%2F/payments/get',
	{ count => 10, ackmode => 'ack_requeue_false', encoding => 'auto' });
my @msgs = @{ $res->{body} // [] };
is(scalar(@msgs), 5, 'five messages in the bound queue');
my %by_id = map { $_->{properties}{message_id} => $_ } @msgs;
is(scalar(grep { $by_id{$_} } @ids), 5, 'message_id is the event id');
my $m = $by_id{ $ids[0] };
is($m->{properties}{type}, 'payment.captured', 'type is the event type');
is($m->{properties}{content_type}, 'application/json', 'content_type');
is($m->{properties}{delivery_mode}, 2, 'persistent (delivery_mode 2)');
is($m->{properties}{app_id}, 'outbox_pg', 'app_id');
is($m->{properties}{headers}{traceparent}, $tp, 'traceparent header');
is($m->{properties}{headers}{aggregate_id}, 'acct-1', 'aggregate_id header (a per-event header of that name does not replace it)');
is($m->{properties}{headers}{'x-tenant'}, 'tenant-1', 'a per-event header is a message header');
is($m->{routing_key}, 'payment.captured', 'routing key from the event type');
is_deeply(decode_json(Encode::encode_utf8($m->{payload})), { n => 1, memo => 'Grüße ✓' }, 'the payload, non-ASCII intact');

# unroutable: reported and retried by default
$node->safe_psql('postgres', q{SELECT outbox.emit('audit.login', 'u-1', '{}', destination => 'rabbit')});
ok($node->poll_query_until('postgres', q{
	SELECT attempts >= 2 AND status = 'pending' AND last_error LIKE 'unroutable:%'
	  FROM outbox.events WHERE type = 'audit.login'}),
	'an unroutable message is reported (routed: false) and retried');
# a binding added later recovers it
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/payments', { routing_key => 'audit.login' });
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'audit.login'}),
	'once a queue is bound, the retry is routed and published');

# unroutable = dead; routing key template
$node->safe_psql('postgres', q{
	SELECT outbox.emit('x.y', 'nobody', '{}', destination => 'rabbit_dead')});
ok($node->poll_query_until('postgres', q{SELECT status = 'dead' AND attempts = 1 FROM outbox.events WHERE type = 'x.y'}),
	'with unroutable = dead, dead-lettered at once');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE type = 'x.y'}),
	qr/^unroutable: /, 'with the reason');
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/payments', { routing_key => 'audit.acct-9' });
$node->safe_psql('postgres', q{SELECT outbox.emit('x.z', 'acct-9', '{}', destination => 'rabbit_dead')});
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'x.z'}),
	'the routing key template audit.{aggregate_id} routes by aggregate');

# missing exchange, wrong password: configuration errors, retried
$node->safe_psql('postgres', q{
	SELECT outbox.emit('payment.a', '1', '{}', destination => 'rabbit_noexchange');
	SELECT outbox.emit('payment.b', '1', '{}', destination => 'rabbit_wrong')});
ok($node->poll_query_until('postgres', q{
	SELECT bool_and(status = 'pending' AND attempts >= 2) AND count(*) = 2
	  FROM outbox.events WHERE type IN ('payment.a', 'payment.b')}),
	'a missing exchange and a wrong password are retried, not dead-lettered');
# (RabbitMQ 3.10 answers 400 "NOT_FOUND - no exchange ...", 4.x 404
# "exchange_not_found")
like($node->safe_psql('postgres', q{SELECT last_status || ' ' || last_error FROM outbox.events WHERE type = 'payment.a'}),
	qr/^(400 .*NOT_FOUND|404 .*not_found)/, 'a missing exchange is reported as such');
is($node->safe_psql('postgres', q{SELECT last_status FROM outbox.events WHERE type = 'payment.b'}),
	'401', 'a wrong password too');
unlike($node->safe_psql('postgres', q{SELECT string_agg(coalesce(last_error, ''), ' ') FROM outbox.events}),
	qr/not-the-password|guest:/, 'no password in any error');

$node->stop;
finish_rabbitmq($rmq);
done_testing();
