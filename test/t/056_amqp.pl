# AMQP 0-9-1 through rabbitmq-c with publisher confirms (kind amqp, the
# native-client transport), against a private rabbitmq-server node on
# 127.0.0.1: events arrive in a bound queue with message_id, type,
# content_type, timestamp, delivery_mode 2 and headers (the per-event
# ones too, never replacing the relay's own); an event is published only
# on the broker's confirm; an unroutable message (mandatory, basic.return)
# is retried or dead-lettered as configured; a missing exchange (the broker
# closes the channel) and wrong credentials are reported and retried; a
# window of unconfirmed publishes delivers a burst; a broker restart, a
# memory alarm (connection.blocked) and a relay killed with SIGKILL lose
# nothing, which a consumer that applies each message once with
# inbox.claim() (test/sink/ledger_consumer.py) verifies.
use strict;
use utf8;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use BrokerTest;
use OutboxTest;
use Encode ();
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

BEGIN { require_packages('rabbitmq', 'pika', 'psycopg2'); }

my $SRC = "$FindBin::RealBin/../..";
my $consumer;
# the consumer goes with the test, also when it dies half-way
END { local $?; $consumer->kill_kill if $consumer && $consumer->pumpable; }
my $rmq = start_rabbitmq();
rabbit_api($rmq, 'PUT', '/api/exchanges/%2F/events', { type => 'topic', durable => JSON::PP::true });
for my $q ('payments', 'ledger', 'burst')
{
	rabbit_api($rmq, 'PUT', "/api/queues/%2F/$q", { durable => JSON::PP::true });
}
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/payments', { routing_key => 'payment.#' });
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/ledger', { routing_key => 'ledger.#' });
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/burst', { routing_key => 'burst.#' });
my $url = "amqp://127.0.0.1:$rmq->{amqp}";

my $node = new_outbox_node('amqp', "outbox.workers_per_database = 2\nrestart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.credentials (name, username, password) VALUES
		('rmq', 'guest', 'guest'), ('rmq_wrong', 'guest', 'not-the-password');
	INSERT INTO outbox.destinations (name, kind, url, credentials, timeout_ms, max_concurrency, max_attempts,
	                                 backoff_base_ms, backoff_max_ms, options) VALUES
		('amqp', 'amqp', '$url', 'rmq', 2000, 256, 1000, 100, 1000, '{"exchange": "events"}'),
		('amqp_vhost', 'amqp', '$url/%2F', 'rmq', 2000, 16, 1000, 100, 1000,
		 '{"exchange": "events", "routing_key": "payment.{aggregate_id}"}'),
		('amqp_dead', 'amqp', '$url', 'rmq', 2000, 16, 1000, 100, 1000,
		 '{"exchange": "events", "routing_key": "audit.{aggregate_id}", "unroutable": "dead"}'),
		('amqp_unroutable', 'amqp', '$url', 'rmq', 2000, 16, 1000, 100, 1000,
		 '{"exchange": "events", "routing_key": "nowhere", "circuit_threshold": 0}'),
		('amqp_noexchange', 'amqp', '$url', 'rmq', 2000, 16, 1000, 100, 1000,
		 '{"exchange": "missing", "circuit_threshold": 0}'),
		('amqp_wrong', 'amqp', '$url', 'rmq_wrong', 2000, 16, 1000, 100, 1000,
		 '{"exchange": "events", "circuit_threshold": 0}');
});

# validation
for my $case (
	[ "'http://127.0.0.1:5672'", '{}', qr/is not an AMQP url/, 'an http url' ],
	[ "'amqp://guest:guest\@127.0.0.1:5672'", '{}', qr/user name or password/, 'credentials in the url' ],
	[ "'amqp://127.0.0.1:99999'", '{}', qr/port is not a number from 1 to 65535/, 'a bad port' ],
	[ "'amqp://127.0.0.1/a/b'", '{}', qr/write it as %2F/, 'a vhost with a raw slash' ],
	[ "'$url'", '{"exchange": "no spaces"}', qr/is not a valid exchange name/, 'a bad exchange name' ],
	[ "'$url'", '{"heartbeat": 7200}', qr/heartbeat/, 'a heartbeat out of range' ],
	[ "'$url'", '{"unroutable": "drop"}', qr/option unroutable must be retry or dead/, 'an unknown unroutable policy' ],
	[ "'$url'", '{"vhost": "/"}', qr/unknown option "vhost" for a destination of kind amqp/, 'an option of kind rabbitmq' ])
{
	my ($u, $opts, $re, $what) = @$case;
	my ($ret, $out, $err) = $node->psql('postgres',
		qq{INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'amqp', $u, 'rmq', '$opts')});
	like($err, $re, "refused: $what");
}
my ($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'amqp', '$url', '{}')});
like($err, qr/credentials/, 'refused: no credentials');

sub count_status
{
	my ($dest, $status) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(*) FROM outbox.events WHERE destination = '$dest' AND status = '$status'});
}

sub queue_get
{
	my ($queue, $count) = @_;
	my $res = rabbit_api($rmq, 'POST', "/api/queues/%2F/$queue/get",
		{ count => $count, ackmode => 'ack_requeue_false', encoding => 'auto' });
	return @{ $res->{body} // [] };
}

# 1. delivery: properties, headers, payload
my $tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
my @ids = split / /, $node->safe_psql('postgres', qq{
	SELECT string_agg(outbox.emit('payment.captured', 'acct-' || g,
	                              jsonb_build_object('n', g, 'memo', 'Grüße ✓'),
	                              destination => 'amqp', traceparent => '$tp',
	                              headers => jsonb_build_object('x-tenant', 'tenant-' || g,
	                                                            'aggregate_id', 'spoofed'))::text, ' ' ORDER BY g)
	  FROM generate_series(1, 5) g});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 5 FROM outbox.events WHERE destination = 'amqp' AND status = 'published'}),
	'five events published on their confirms');
my @msgs = queue_get('payments', 10);
is(scalar(@msgs), 5, 'five messages in the bound queue');
my %by_id = map { $_->{properties}{message_id} => $_ } @msgs;
is(scalar(grep { $by_id{$_} } @ids), 5, 'message_id is the event id');
my $m = $by_id{ $ids[0] };
is($m->{routing_key}, 'payment.captured', 'routing key {type} by default');
is($m->{properties}{type}, 'payment.captured', 'type property');
is($m->{properties}{content_type}, 'application/json', 'content_type property');
is($m->{properties}{delivery_mode}, 2, 'persistent');
is($m->{properties}{app_id}, 'outbox_pg', 'app_id');
ok(abs(($m->{properties}{timestamp} // 0) - time) < 600, 'timestamp is the event time');
is($m->{properties}{headers}{destination}, 'amqp', 'header destination');
is($m->{properties}{headers}{aggregate_id}, 'acct-1', 'header aggregate_id (not the spoofed one)');
is($m->{properties}{headers}{traceparent}, $tp, 'header traceparent');
is($m->{properties}{headers}{'x-tenant'}, 'tenant-1', 'per-event header');
is_deeply(decode_json(Encode::encode_utf8($m->{payload})), { n => 1, memo => 'Grüße ✓' }, 'payload, UTF-8 intact');

# the vhost in the url, the routing key template
my $vid = $node->safe_psql('postgres',
	q{SELECT outbox.emit('payment.refunded', 'acct-9', '{}', destination => 'amqp_vhost')});
ok($node->poll_query_until('postgres', "SELECT status = 'published' FROM outbox.events WHERE id = '$vid'"),
	'published through the vhost named in the url');
@msgs = queue_get('payments', 10);
is($msgs[0]{routing_key} // '', 'payment.acct-9', 'routing key template with {aggregate_id}');

# 2. unroutable: dead-lettered or retried as configured
$node->safe_psql('postgres', q{
	SELECT outbox.emit('audit.logged', 'acct-1', '{}', destination => 'amqp_dead');
	SELECT outbox.emit('audit.logged', 'acct-1', '{}', destination => 'amqp_unroutable');
	SELECT outbox.emit('payment.captured', 'acct-1', '{}', destination => 'amqp_noexchange');
	SELECT outbox.emit('payment.captured', 'acct-1', '{}', destination => 'amqp_wrong');
});
ok($node->poll_query_until('postgres',
	q{SELECT status = 'dead' AND last_error LIKE 'unroutable:%NO_ROUTE%' FROM outbox.events WHERE destination = 'amqp_dead'}),
	'unroutable with unroutable dead: dead-lettered with the return reason');
ok($node->poll_query_until('postgres',
	q{SELECT status = 'pending' AND attempts >= 2 AND last_error LIKE 'unroutable:%' FROM outbox.events WHERE destination = 'amqp_unroutable'}),
	'unroutable by default: retried');
ok($node->poll_query_until('postgres',
	q{SELECT status = 'pending' AND attempts >= 2 AND last_error LIKE '%closed the channel: 404%NOT_FOUND%' FROM outbox.events WHERE destination = 'amqp_noexchange'}),
	'a missing exchange: the broker closes the channel, reported and retried');
ok($node->poll_query_until('postgres',
	q{SELECT status = 'pending' AND attempts >= 2 AND last_error LIKE 'login:%' FROM outbox.events WHERE destination = 'amqp_wrong'}),
	'wrong credentials: the login failure is reported and retried');
unlike($node->safe_psql('postgres', q{SELECT string_agg(last_error, ' ') FROM outbox.events}),
	qr/not-the-password/, 'no password in any error');
# the binding that was missing comes: the retried event goes out
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/events/q/payments', { routing_key => 'nowhere' });
ok($node->poll_query_until('postgres',
	q{SELECT status = 'published' FROM outbox.events WHERE destination = 'amqp_unroutable'}),
	'a binding added later: the retried unroutable event is published');
$node->safe_psql('postgres', q{
	UPDATE outbox.destinations SET paused = true WHERE name IN ('amqp_noexchange', 'amqp_wrong');
});

# 3. a burst through the window of unconfirmed publishes (two relays)
my $N = 3000;
my $t0 = time;
$node->safe_psql('postgres', qq{
	SELECT outbox.emit('burst.item', 'agg-' || (g % 50), jsonb_build_object('n', g), destination => 'amqp')
	  FROM generate_series(1, $N) g});
ok($node->poll_query_until('postgres',
	qq{SELECT count(*) = $N FROM outbox.events WHERE type = 'burst.item' AND status = 'published'}),
	"a burst of $N events published");
my $rate = $N / (time - $t0);
note(sprintf("burst: %d events in %.2f s (%.0f events/s, including the emit)", $N, time - $t0, $rate));
my $depth;
wait_until(sub { $depth = rabbit_api($rmq, 'GET', '/api/queues/%2F/burst')->{body}{messages} // 0; $depth >= $N }, 30);
is($depth, $N, "the queue holds all $N (no duplicates without faults)");
rabbit_api($rmq, 'DELETE', '/api/queues/%2F/burst/contents');

# The consumer: applies each message once with inbox.claim() in its own
# transaction, acknowledging the broker after the commit.
$node->safe_psql('postgres', q{
	CREATE TABLE payments (payment_no int PRIMARY KEY, amount int NOT NULL);
	CREATE TABLE ledger (entry bigserial PRIMARY KEY, payment_no int NOT NULL, amount int NOT NULL,
	                     message_id text NOT NULL);
});
my $clog = "$PostgreSQL::Test::Utils::tmp_check/amqp_consumer.log";
my $cerr = "$PostgreSQL::Test::Utils::tmp_check/amqp_consumer.err";
$consumer = IPC::Run::start(
	[
		'/usr/bin/python3', "$SRC/test/sink/ledger_consumer.py", '--amqp-port', $rmq->{amqp},
		'--queue', 'ledger', '--dsn', $node->connstr('postgres'), '--log', $clog
	],
	'>>', $cerr, '2>>', $cerr);
my $paid = 0;

sub pay
{
	my ($n) = @_;
	my $from = $paid + 1;
	$paid += $n;
	$node->safe_psql('postgres', qq{
		INSERT INTO payments SELECT g, 100 + g FROM generate_series($from, $paid) g;
		SELECT outbox.emit('ledger.payment', 'acct-' || (g % 7),
		                   jsonb_build_object('payment_no', g, 'amount', 100 + g), destination => 'amqp')
		  FROM generate_series($from, $paid) g});
}

sub ledger_published
{
	return $node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.events WHERE type = 'ledger.payment' AND status = 'published'});
}

# 4. the broker stops and comes back
stop_rabbitmq($rmq);
note('broker stopped');
pay(200);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM outbox.events WHERE type = 'ledger.payment' AND status = 'pending'
	   AND attempts >= 1 AND last_error IS NOT NULL}),
	'with the broker down, events wait and the failures are recorded');
is(ledger_published(), '0', 'nothing is published while the broker is down');
start_rabbitmq($rmq);
note('broker restarted');
ok(wait_until(sub { ledger_published() == $paid }, 90), 'published after the broker came back');

# 5. a memory alarm: the broker blocks publishers (connection.blocked)
rabbit_ctl($rmq, 'set_vm_memory_high_watermark', '0.000001');
ok(wait_until(sub { (rabbit_api($rmq, 'GET', '/api/nodes')->{body}[0]{mem_alarm} // 0) }, 30),
	'the broker is in a memory alarm');
my $before = ledger_published();
pay(100);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM outbox.events WHERE type = 'ledger.payment' AND status = 'pending'
	   AND last_error LIKE '%blocked publishing%'}),
	'while blocked, nothing is published and the reason is recorded');
is(ledger_published(), $before, 'no event is marked published while the broker does not confirm');
my @relays = relay_pids($node, 'postgres');
my $t_term = time;
kill 'TERM', @relays;
ok(wait_until(sub { !grep { kill 0, $_ } @relays }, 5), 'SIGTERM during the alarm: the relays exit within 5 s');
note(sprintf('relays exited %.2f s after SIGTERM', time - $t_term));
rabbit_ctl($rmq, 'set_vm_memory_high_watermark', '0.4');
ok(wait_until(sub { ledger_published() == $paid }, 90), 'after the alarm cleared, every event is published');

# 6. a relay killed with SIGKILL mid-stream
pay(1000);
wait_until(sub { ledger_published() > $paid - 1000 }, 30);
my $before_kill = ledger_published();
my ($victim) = relay_pids($node, 'postgres');
kill 'KILL', $victim if $victim;
note('killed relay ' . ($victim // 'none') . " after $before_kill of $paid were published");
usleep(500_000);
ok($node->poll_query_until('postgres',
	"SELECT count(*) = $paid FROM outbox.events WHERE type = 'ledger.payment' AND status = 'published'"),
	"all $paid published after the crash restart");

# the consumer applies each payment once
ok(wait_until(sub { $node->safe_psql('postgres', 'SELECT count(DISTINCT payment_no) FROM ledger') >= $paid }, 90),
	'the consumer applied every payment');
# its log line for a message follows the commit: wait for the lines (at
# most 30 s) rather than a fixed second before stopping it (a fixed
# second once left one line unwritten on PostgreSQL 18)
wait_until(sub {
	open(my $lf, '<', $clog) or return 0;
	my $n = grep { /^applied / } <$lf>;
	close $lf;
	return $n >= $paid;
}, 30);
$consumer->kill_kill;
my $ids_text = $node->safe_psql('postgres', q{SELECT string_agg(id::text, ' ') FROM outbox.events WHERE type = 'ledger.payment'});
my %applied;
my $dups = 0;
if (open(my $fh, '<', $clog))
{
	while (<$fh>)
	{
		chomp;
		my ($what, $id) = split / /;
		if ($what eq 'applied') { $applied{$id}++; }
		else { $dups++; }
	}
	close $fh;
}
my @ledger_ids = split / /, $ids_text;
is(scalar(grep { !$applied{$_} } @ledger_ids), 0, "zero lost: all $paid ids reached the consumer");
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger'), $paid, 'the ledger has one entry per payment');
is(scalar(grep { $_ > 1 } values %applied), 0, 'no message applied twice');
note("faults: $paid events, $dups duplicates absorbed by inbox.claim()");

# 8. headers that do not fit one AMQP frame, or a header name longer than
# an AMQP short string: dead-lettered with the reason, not sent (sent, the
# publish failed or the broker closed the connection, and the event was
# retried for ever as a failure of the destination)
my ($too_big, $long_name) = split / /, $node->safe_psql('postgres', q{
	SELECT outbox.emit('payment.headers', 'acct-h', '{}', destination => 'amqp_dead',
	                   headers => (SELECT jsonb_object_agg('x-big-' || g, repeat('v', 8000))
	                                 FROM generate_series(1, 20) g))::text || ' ' ||
	       outbox.emit('payment.headers', 'acct-h', '{}', destination => 'amqp_dead',
	                   headers => jsonb_build_object('x-' || repeat('n', 254), 'v'))::text});
my $fits = $node->safe_psql('postgres',
	q{SELECT outbox.emit('payment.fits', 'acct-f', '{}', destination => 'amqp')});
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM outbox.events WHERE id IN ('$too_big', '$long_name') AND status = 'dead'}),
	'headers beyond one frame, and a header name beyond 255 bytes: dead-lettered');
like($node->safe_psql('postgres', qq{SELECT last_error FROM outbox.events WHERE id = '$too_big'}),
	qr/^headers too large for AMQP: about \d+ bytes of properties, above the frame size \(131072\)$/,
	'with the reason for the size');
is($node->safe_psql('postgres', qq{SELECT last_error FROM outbox.events WHERE id = '$long_name'}),
	'header name too long for AMQP: 256 bytes, above 255', 'and for the name');
ok($node->poll_query_until('postgres', "SELECT status = 'published' FROM outbox.events WHERE id = '$fits'"),
	'an event beside them is published');

# 7. a broker that accepts the connection and never answers: each attempt
# holds the relay for the destination's timeout (the connection is made in
# line), so the next one waits ten times as long from its end.  Counted
# from its start, the wait had run out when the attempt failed, and every
# retry round (here every 0.1-0.2 s) tried again: the relay was held for
# 2 s out of every 2.
my $silent_port = PostgreSQL::Test::Cluster::get_free_port();
my $silent = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $silent_port,
	Listen => 128, ReuseAddr => 1) or die "listen: $!";
my $accepts = "${PostgreSQL::Test::Utils::tmp_check}/silent_accepts";
my $listener = fork();
die "fork: $!" unless defined $listener;
if ($listener == 0)
{
	my @held;
	while (my $conn = $silent->accept)
	{
		push @held, $conn;
		open(my $fh, '>>', $accepts) or exit 1;
		print $fh "accepted\n";
		close $fh;
	}
	exit 0;
}
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, kind, url, credentials, timeout_ms, max_concurrency,
	                                 backoff_base_ms, backoff_max_ms, options)
	VALUES ('amqp_silent', 'amqp', 'amqp://127.0.0.1:$silent_port', 'rmq', 2000, 64, 100, 200,
	        '{"exchange": "events", "circuit_threshold": 0}');
	SELECT outbox.emit('silent.event', 's-' || g, '{}', destination => 'amqp_silent')
	  FROM generate_series(1, 20) g;
});
sleep 9;
my $attempts = () = (-e $accepts ? slurp_file($accepts) : '') =~ /accepted/g;
ok($attempts >= 1 && $attempts <= 3,
	'a broker that never answers: one connection attempt per relay, not one per retry round')
	or diag("$attempts connection attempts in 9 s");
note("$attempts connection attempts in 9 s to a broker that never answers");
my $beside = $node->safe_psql('postgres',
	q{SELECT outbox.emit('payment.beside', 'acct-b', '{}', destination => 'amqp')});
ok($node->poll_query_until('postgres', "SELECT status = 'published' FROM outbox.events WHERE id = '$beside'"),
	'the other destinations are served meanwhile');
$node->safe_psql('postgres', q{SELECT outbox.pause('amqp_silent')});
kill 'KILL', $listener;
waitpid($listener, 0);
close($silent);

# 9. a broker that takes the publishes and confirms nothing (here: its
# process stopped with SIGSTOP, heartbeats off, so the kernel still takes
# the bytes and nothing else notices): each publish is confirmed within the
# destination's timeout or the connection is closed and the event retried.
# Unconfirmed publishes stayed in flight for as long as the connection
# lived, with no error recorded.  Both relays connect first (events one
# transaction at a time until the broker lists a connection of each): a
# relay without one would connect in line and fail its login instead.
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, kind, url, credentials, timeout_ms, max_concurrency,
	                                 max_attempts, backoff_base_ms, backoff_max_ms, options)
	VALUES ('amqp_stalled', 'amqp', '$url', 'rmq', 2000, 64, 1000, 100, 1000,
	        '{"exchange": "events", "heartbeat": 0, "circuit_threshold": 0}')});
my $stalled_conns = sub {
	my $r = rabbit_api($rmq, 'GET', '/api/connections');
	return scalar grep { ($_->{client_properties}{connection_name} // '') =~ /: amqp_stalled$/ }
	  @{ ref $r->{body} eq 'ARRAY' ? $r->{body} : [] };
};
ok(wait_until(sub {
	$node->safe_psql('postgres',
		q{SELECT outbox.emit('payment.stalled', 'acct-s', '{}', destination => 'amqp_stalled')});
	usleep(100_000);
	return $stalled_conns->() == 2;
}, 60), 'both relays are connected');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM outbox.events WHERE type = 'payment.stalled' AND status <> 'published'}),
	'and what they published is confirmed');
my $before_stall = count_status('amqp_stalled', 'published');
my $beam = slurp_file("$rmq->{base}/rabbitmq.pid");
chomp $beam;
# the broker goes on with the test, also when it dies half-way
END { kill 'CONT', $beam if $beam; }
kill 'STOP', $beam;
note("broker process $beam stopped");
$node->safe_psql('postgres', q{
	SELECT outbox.emit('payment.stalled', 'acct-s' || g, '{}', destination => 'amqp_stalled')
	  FROM generate_series(1, 5) g});
# (the error the timeout records is soon replaced by the next attempt's:
# the relay connects again, to a broker that does not answer, and its
# login times out; with heartbeats off, only the confirm timeout closes
# the connection, so either error shows it fired)
my $stalled_error = '';
ok(wait_until(sub {
	$stalled_error = $node->safe_psql('postgres', q{
		SELECT coalesce(string_agg(DISTINCT last_error, ' | '), '') FROM outbox.events
		 WHERE type = 'payment.stalled' AND status = 'pending'});
	return $stalled_error =~ /no confirm from the broker within 2000 ms|login: |connect to /;
}, 20), 'publishes the broker does not confirm fail after the timeout')
  or diag("last_error: $stalled_error");
note("errors recorded: $stalled_error");
is(count_status('amqp_stalled', 'published'), $before_stall, 'none of them is marked published');
kill 'CONT', $beam;
note('broker process continued');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM outbox.events WHERE type = 'payment.stalled' AND status <> 'published'}),
	'once the broker confirms again, they are published');

$node->stop;
finish_rabbitmq($rmq);
done_testing();
