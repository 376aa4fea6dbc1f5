# The whole loop, with faults: application transactions write a payment
# and emit its event; the relay publishes to RabbitMQ; a consumer process
# (test/sink/ledger_consumer.py) reads the queue and, in one transaction,
# calls inbox.claim() and writes the ledger, acknowledging the broker only
# after the commit.  Meanwhile the broker is stopped and restarted, a relay
# worker is killed, and the consumer itself dies once between its commit
# and its ack.  Every event is delivered at least once, the ledger has
# exactly one row per payment, and the inbox absorbed the duplicates.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use BrokerTest;
use OutboxTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

BEGIN { require_packages('rabbitmq', 'pika', 'psycopg2'); }

my $N_PER_PHASE = 100;
my $N = 3 * $N_PER_PHASE;
my $SRC = "$FindBin::RealBin/../..";

my $rmq = start_rabbitmq();
rabbit_api($rmq, 'PUT', '/api/exchanges/%2F/payments', { type => 'direct', durable => JSON::PP::true });
rabbit_api($rmq, 'PUT', '/api/queues/%2F/ledger', { durable => JSON::PP::true });
rabbit_api($rmq, 'POST', '/api/bindings/%2F/e/payments/q/ledger', { routing_key => 'payment.captured' });

my $node = new_outbox_node('e2e', "outbox.workers_per_database = 2\nrestart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.credentials (name, username, password) VALUES ('rmq', 'guest', 'guest');
	INSERT INTO outbox.destinations (name, kind, url, credentials, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms, options)
	VALUES ('ledger', 'rabbitmq', '$rmq->{url}', 'rmq', 2000, 1000, 100, 1000,
	        '{"exchange": "payments", "circuit_threshold": 0}');
	INSERT INTO outbox.routes (pattern, destination) VALUES ('payment.*', 'ledger');
	CREATE TABLE payments (payment_no int PRIMARY KEY, amount int NOT NULL);
	-- no unique constraint: exactly-once is the inbox's doing
	CREATE TABLE ledger (entry bigserial PRIMARY KEY, payment_no int NOT NULL, amount int NOT NULL,
	                     message_id text NOT NULL);
	-- the consumer runs as an application role: EXECUTE on inbox.claim and its own table
	CREATE ROLE ledger_app LOGIN;
	GRANT USAGE ON SCHEMA inbox TO ledger_app;
	GRANT EXECUTE ON FUNCTION inbox.claim(text, text, interval) TO ledger_app;
	GRANT SELECT, INSERT ON ledger TO ledger_app;
	GRANT USAGE ON SEQUENCE ledger_entry_seq TO ledger_app;
});

my $clog = "$PostgreSQL::Test::Utils::tmp_check/consumer.log";
my $cerr = "$PostgreSQL::Test::Utils::tmp_check/consumer.err";
my $dsn = $node->connstr('postgres') . ' user=ledger_app';

sub start_consumer
{
	my (@extra) = @_;
	return IPC::Run::start(
		[
			'/usr/bin/python3', "$SRC/test/sink/ledger_consumer.py",
			'--amqp-port', $rmq->{amqp}, '--queue', 'ledger', '--dsn', $dsn, '--log', $clog, @extra
		],
		'>>', $cerr, '2>>', $cerr);
}

# payments in application transactions, one event each
sub pay
{
	my ($from, $to) = @_;
	my $sql = '';
	for my $i ($from .. $to)
	{
		my $amount = 100 + $i;
		$sql .= "BEGIN; INSERT INTO payments VALUES ($i, $amount);"
		  . " SELECT outbox.emit('payment.captured', 'acct-' || ($i % 7), jsonb_build_object('payment_no', $i, 'amount', $amount)); COMMIT;\n";
	}
	$node->safe_psql('postgres', $sql);
}

sub consumer_lines
{
	open(my $fh, '<', $clog) or return ();
	my @l = <$fh>;
	close $fh;
	chomp @l;
	return @l;
}

sub published { return $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}); }

# phase 1: all healthy, but the consumer dies after its first commit, before the ack
my $consumer = start_consumer('--crash-after-commit', 1);
pay(1, $N_PER_PHASE);
ok(wait_until(sub { !$consumer->pumpable }, 30), 'the consumer died between a commit and its ack');
$consumer->finish;
$consumer = start_consumer();
ok(wait_until(sub { published() >= $N_PER_PHASE }, 60), 'phase 1 published');

# phase 2: the broker goes away while payments are made, then comes back
stop_rabbitmq($rmq);
note('broker stopped');
pay($N_PER_PHASE + 1, 2 * $N_PER_PHASE);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM outbox.events WHERE status = 'pending' AND attempts >= 1 AND last_error IS NOT NULL}),
	'with the broker down, events wait and the failures are recorded');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'dead'}), '0', 'nothing is dead-lettered');
start_rabbitmq($rmq);
note('broker restarted');
ok(wait_until(sub { published() >= 2 * $N_PER_PHASE }, 60), 'phase 2 published after the broker came back');

# phase 3: a relay worker is killed while it delivers
pay(2 * $N_PER_PHASE + 1, $N);
my ($victim) = relay_pids($node, 'postgres');
kill 'KILL', $victim if $victim;
note('killed relay ' . ($victim // 'none'));
usleep(500_000);
ok($node->poll_query_until('postgres', "SELECT count(*) = $N FROM outbox.events WHERE status = 'published'"),
	"all $N events published after the relay restarted");

# the consumer catches up
ok(wait_until(sub { $node->safe_psql('postgres', 'SELECT count(*) FROM ledger') >= $N
	  && $node->safe_psql('postgres', q{SELECT count(*) FROM inbox.claims WHERE consumer = 'ledger'}) >= $N }, 60),
	'the consumer applied every payment');
sleep 1;    # let redeliveries in flight arrive
$consumer->kill_kill;

my @lines = consumer_lines();
my %applied;
my $dups = 0;
for (@lines)
{
	my ($what, $id) = split / /;
	if ($what eq 'applied') { $applied{$id}++; }
	else { $dups++; }
}
my $ids = $node->safe_psql('postgres', q{SELECT string_agg(id::text, ' ') FROM outbox.events});
my @ids = split / /, $ids;
is(scalar(@ids), $N, "$N events emitted");
is(scalar(grep { $applied{$_} } @ids), $N, 'every event was delivered at least once');
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger'), $N, "the ledger has exactly $N entries");
is($node->safe_psql('postgres', 'SELECT count(DISTINCT payment_no) FROM ledger'), $N, 'one per payment');
is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger l JOIN payments p USING (payment_no) WHERE l.amount = p.amount'),
	$N, 'with the right amounts');
is(scalar(grep { $_ > 1 } values %applied), 0, 'no message was applied twice');
ok($dups >= 1, "duplicates were absorbed by the inbox: $dups");
note("end to end: $N events, " . scalar(@lines) . " deliveries to the consumer, $dups duplicates absorbed by inbox.claim()");

$node->stop;
finish_rabbitmq($rmq);
done_testing();
