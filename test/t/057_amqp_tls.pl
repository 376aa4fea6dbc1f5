# AMQP over TLS (kind amqp, amqps://), against a private rabbitmq-server
# node with a TLS listener and a throwaway certificate for the name
# localhost (outbox.ca_file trusts it):
#   - a burst through the window of unconfirmed publishes arrives whole
#     in the bound queue, each message once, published on its confirm;
#   - the certificate is verified: the same listener reached as
#     127.0.0.1, a name the certificate does not carry, is refused, the
#     event stays pending with the reason, and nothing reaches the queue;
#   - amqp:// (no TLS) to the TLS port fails and is retried, nothing lost.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use BrokerTest;
use OutboxTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

BEGIN { require_packages('rabbitmq'); }
plan skip_all => 'openssl is not installed (test/install-deps installs it)'
  unless grep { -x "$_/openssl" } split(/:/, $ENV{PATH});

my $rmq = start_rabbitmq(undef, tls => 1);
END { finish_rabbitmq($rmq) if $rmq; }
rabbit_api($rmq, 'PUT', '/api/exchanges/%2F/events', { type => 'topic', durable => JSON::PP::true });
rabbit_api($rmq, 'PUT', '/api/queues/%2F/secure', { durable => JSON::PP::true });
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/secure', { routing_key => 'secure.#' });

my $node = new_outbox_node('amqps', "outbox.ca_file = '$rmq->{cert}'\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.credentials (name, username, password) VALUES ('rmq', 'guest', 'guest');
	INSERT INTO outbox.destinations (name, kind, url, credentials, timeout_ms, max_concurrency, max_attempts,
	                                 backoff_base_ms, backoff_max_ms, options) VALUES
		('amqps', 'amqp', 'amqps://localhost:$rmq->{amqps}', 'rmq', 3000, 64, 1000, 100, 1000,
		 '{"exchange": "events"}'),
		('amqps_by_ip', 'amqp', 'amqps://127.0.0.1:$rmq->{amqps}', 'rmq', 3000, 16, 1000, 100, 1000,
		 '{"exchange": "events", "circuit_threshold": 0}'),
		('amqp_to_tls', 'amqp', 'amqp://127.0.0.1:$rmq->{amqps}', 'rmq', 1000, 16, 1000, 100, 1000,
		 '{"exchange": "events", "circuit_threshold": 0}');
});

sub queue_messages
{
	my $res = rabbit_api($rmq, 'POST', '/api/queues/%2F/secure/get',
		{ count => 10000, ackmode => 'ack_requeue_false', encoding => 'auto' });
	return @{ $res->{body} // [] };
}

# 1. a burst of 2,000 over TLS
my @ids = split / /, $node->safe_psql('postgres', q{
	SELECT string_agg(outbox.emit('secure.paid', 'acct-' || (g % 50), jsonb_build_object('n', g),
	                              destination => 'amqps')::text, ' ' ORDER BY g)
	  FROM generate_series(1, 2000) g});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 2000 FROM outbox.events WHERE destination = 'amqps' AND status = 'published'}),
	'2,000 events published over TLS on their confirms');
my %seen;
$seen{ $_->{properties}{message_id} }++ for queue_messages();
is(scalar(grep { !$seen{$_} } @ids), 0, 'every event is in the queue');
is(scalar(grep { $_ > 1 } values %seen), 0, 'each once');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM outbox.events WHERE destination = 'amqps' AND attempts > 1}),
	0, 'no event needed a second attempt');

# 2. the certificate names localhost, not 127.0.0.1
$node->safe_psql('postgres', q{SELECT outbox.emit('secure.by_ip', 'a-1', '{}', destination => 'amqps_by_ip')});
ok($node->poll_query_until('postgres', q{
	SELECT attempts >= 2 AND status = 'pending' AND last_error IS NOT NULL
	  FROM outbox.events WHERE destination = 'amqps_by_ip'}),
	'a certificate that does not name the host: refused, retried with the reason');
my $reason = $node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE destination = 'amqps_by_ip'});
note("amqps to 127.0.0.1: $reason");
like($reason, qr/connect to 127\.0\.0\.1:\d+: .*(SSL|ssl|certificate|hostname|verif)/, 'the reason is the TLS check');

# 3. plain AMQP to the TLS listener
$node->safe_psql('postgres', q{SELECT outbox.emit('secure.plain', 'a-1', '{}', destination => 'amqp_to_tls')});
ok($node->poll_query_until('postgres', q{
	SELECT attempts >= 2 AND status = 'pending' AND last_error IS NOT NULL
	  FROM outbox.events WHERE destination = 'amqp_to_tls'}),
	'amqp:// to a TLS port fails and is retried');
note('amqp to the TLS port: ' . $node->safe_psql('postgres',
	q{SELECT last_error FROM outbox.events WHERE destination = 'amqp_to_tls'}));
is(scalar(queue_messages()), 0, 'nothing reached the queue from either');

$node->stop;
done_testing();
