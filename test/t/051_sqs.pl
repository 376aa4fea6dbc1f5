# SQS against a real SQS-compatible endpoint (npm local-aws-sqs): events
# arrive in the queue with their attributes, singly and in batches; FIFO
# deduplication holds when the relay sends the same events again (and a
# standard queue, as the control, shows the duplicates).  Batch partial
# failures (a 200 carrying failed entries, which the emulator cannot be
# made to produce) are answered by the botocore receiver in its partial
# mode: only the failed entries are sent again.
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

BEGIN { require_packages('botocore', 'local-aws-sqs'); }

my $sqs = start_local_sqs([ 'orders', 0 ], [ 'single', 0 ], [ 'orders.fifo', 1 ], [ 'ce', 0 ]);
my $sink = start_aws_sink();
my $acct = "$sqs->{url}123456789012";
my $node = new_outbox_node('sqs');
$node->start;

my ($key, $secret) = (AWS_KEY, AWS_SECRET);
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key) VALUES ('aws', '$key', '$secret');
	INSERT INTO outbox.destinations (name, kind, url, credentials, max_concurrency, backoff_base_ms, backoff_max_ms, options) VALUES
		('orders', 'sqs', '$sqs->{url}', 'aws', 40, 100, 1000, '{"queue_url": "$acct/orders", "region": "us-east-1"}'),
		('single', 'sqs', '$sqs->{url}', 'aws', 40, 100, 1000, '{"queue_url": "$acct/single", "region": "us-east-1", "batch_size": 1}'),
		('fifo',   'sqs', '$sqs->{url}', 'aws', 40, 100, 1000, '{"queue_url": "$acct/orders.fifo", "region": "us-east-1"}'),
		('partial', 'sqs', '$sink->{url}', 'aws', 40, 100, 1000, '{"queue_url": "http://127.0.0.1:$sink->{port}/123456789012/partial", "region": "us-east-1"}'),
		('ce',     'sqs', '$sqs->{url}', 'aws', 40, 100, 1000, '{"queue_url": "$acct/ce", "region": "us-east-1", "body": "cloudevents"}');
});

sub emit_to
{
	my ($dest, $n) = @_;
	my $ids = $node->safe_psql('postgres', qq{
		SELECT string_agg(outbox.emit('payment.captured', 'acct-' || (g % 5),
		                              jsonb_build_object('n', g, 'memo', 'Zahlung für Müller ✓'),
		                              destination => '$dest')::text, ' ')
		  FROM generate_series(1, $n) g});
	return split / /, $ids;
}

sub published
{
	my ($dest, $n) = @_;
	return $node->poll_query_until('postgres',
		qq{SELECT count(*) = $n FROM outbox.events WHERE destination = '$dest' AND status = 'published'});
}

# Every message in a queue (received with a long visibility timeout, so
# each is seen once), as message_id attribute => [bodies].
sub drain
{
	my ($queue) = @_;
	my %got;
	for (1 .. 200)
	{
		my $r = sqs_call($sqs, 'ReceiveMessage', {
			QueueUrl => "$acct/$queue", MaxNumberOfMessages => 10, VisibilityTimeout => 600,
			MessageAttributeNames => ['All'], AttributeNames => ['All'], WaitTimeSeconds => 0 });
		my @m = @{ $r->{Messages} // [] };
		last unless @m;
		for my $m (@m)
		{
			my $id = $m->{MessageAttributes}{message_id}{StringValue} // 'none';
			push @{ $got{$id} }, $m;
		}
	}
	return \%got;
}

# standard queue, batches
my @ids = emit_to('orders', 57);
ok(published('orders', 57), '57 events published to a standard queue in batches');
my $got = drain('orders');
is(scalar(grep { $got->{$_} } @ids), 57, 'every one is in the queue');
is(scalar(grep { @{ $got->{$_} } > 1 } @ids), 0, 'once each');
my $m = $got->{ $ids[0] }[0];
is($m->{MessageAttributes}{event_type}{StringValue}, 'payment.captured', 'event_type attribute');
is($m->{MessageAttributes}{aggregate_id}{StringValue}, 'acct-1', 'aggregate_id attribute');
is_deeply(decode_json(Encode::encode_utf8($m->{Body})), { n => 1, memo => 'Zahlung für Müller ✓' },
	'the body is the payload, non-ASCII intact');

# single sends
@ids = emit_to('single', 12);
ok(published('single', 12), '12 events published with SendMessage');
$got = drain('single');
is(scalar(grep { $got->{$_} && @{ $got->{$_} } == 1 } @ids), 12, 'each in the queue once');

# The relay sends a destination's batches claimed after seq $after again,
# as after lost acknowledgements: their acknowledgements are gone and their
# leases ran out, so the relay recovers them.
sub lose_acks
{
	my ($dest, $after) = @_;
	$node->safe_psql('postgres', qq{
		UPDATE outbox.batches SET leased_until = now() - interval '1 s'
		 WHERE destination = '$dest' AND seq > $after;
		DELETE FROM outbox.batch_acks WHERE destination = '$dest' AND seq > $after});
}

sub last_seq
{
	my ($dest) = @_;
	return $node->safe_psql('postgres', qq{SELECT max(seq) FROM outbox.batches WHERE destination = '$dest'});
}

# FIFO: the relay sends everything again; the queue deduplicates by
# MessageDeduplicationId = message id
@ids = emit_to('fifo', 30);
ok(published('fifo', 30), '30 events published to a FIFO queue');
lose_acks('fifo', 0);
ok(published('fifo', 30), 'all 30 sent again with the same message ids');
$got = drain('orders.fifo');
is(scalar(grep { $got->{$_} } @ids), 30, 'the FIFO queue has every event');
is(scalar(grep { @{ $got->{$_} } > 1 } @ids), 0, 'and none twice: FIFO deduplication held');
my @groups = map { $got->{$_}[0]{Attributes}{MessageGroupId} // '' } grep { $got->{$_} } @ids;
is(join(',', sort keys %{ { map { $_ => 1 } @groups } }), 'acct-0,acct-1,acct-2,acct-3,acct-4',
	'MessageGroupId is the aggregate id');

# control: the same re-send to a standard queue does duplicate
my $seq = last_seq('orders');
@ids = emit_to('orders', 5);
ok(published('orders', 5 + 57), 'five more to the standard queue');
lose_acks('orders', $seq);
ok(published('orders', 62), 'sent again');
$got = drain('orders');
is(scalar(grep { $got->{$_} && @{ $got->{$_} } == 2 } @ids), 5,
	'a standard queue receives them twice (the dedupe above is the FIFO queue\'s doing)');

# partial failure inside a 200: the odd entries of each batch fail once
@ids = emit_to('partial', 20);
ok(published('partial', 20), 'a batch with failed entries is completed by retrying those entries');
my %sends;
for my $r (aws_records($sink))
{
	$sends{ $_->{attributes}{message_id} }++ for @{ $r->{entries} };
}
my $twice = grep { ($sends{$_} // 0) == 2 } @ids;
my $once = grep { ($sends{$_} // 0) == 1 } @ids;
is($twice + $once, 20, 'each entry sent once or twice');
ok($twice >= 5 && $once >= 5, "only the failed entries were sent again ($twice of 20)");
is($node->safe_psql('postgres', q{SELECT max(attempts) FROM outbox.events WHERE destination = 'partial'}),
	'2', 'a failed entry costs its own event one more attempt');

# body = 'cloudevents': a consumer reads id, type, source, subject and
# time from the body, without asking for message attributes
@ids = emit_to('ce', 15);
ok(published('ce', 15), '15 events published with CloudEvents bodies');
my %bare;
for (1 .. 50)
{
	my $r = sqs_call($sqs, 'ReceiveMessage', {
		QueueUrl => "$acct/ce", MaxNumberOfMessages => 10, VisibilityTimeout => 600, WaitTimeSeconds => 0 });
	my @m = @{ $r->{Messages} // [] };
	last unless @m;
	for my $m (@m)
	{
		my $ev = eval { decode_json(Encode::encode_utf8($m->{Body})) } // {};
		push @{ $bare{ $ev->{id} // 'none' } }, { ev => $ev, attrs => $m->{MessageAttributes} };
	}
}
is(scalar(grep { $bare{$_} && @{ $bare{$_} } == 1 } @ids), 15,
	'received without message attributes, each body names its event id');
my %rows = map { split /\|/, $_, 2 } split /\n/, Encode::decode_utf8($node->safe_psql('postgres', q{
	SELECT id || '|' || jsonb_build_object('type', type, 'subject', aggregate_id, 'data', payload,
	         'time', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text
	  FROM outbox.events WHERE destination = 'ce'}));
my @wrong;
for my $id (@ids)
{
	my $ev = $bare{$id} ? $bare{$id}[0]{ev} : {};
	my $want = decode_json(Encode::encode_utf8($rows{$id} // '{}'));
	$want->{$_} = $_ eq 'specversion' ? '1.0' : $_ eq 'source' ? 'urn:outbox_pg:postgres' : 'application/json'
	  for qw(specversion source datacontenttype);
	$want->{id} = $id;
	push @wrong, $id unless JSON::PP->new->canonical->encode($ev) eq JSON::PP->new->canonical->encode($want);
}
is_deeply(\@wrong, [], 'each body is the CloudEvent: specversion, id, source, type, subject, time, datacontenttype, and the payload (non-ASCII intact) as data')
  or diag(explain($bare{ $wrong[0] }));
ok(!(grep { $_->[0]{attrs} } map { $bare{$_} } grep { $bare{$_} } @ids),
	'(no attributes were asked for)');

# An answer nested deeper than any SQS answer (a 200 whose body opens
# 30,000 arrays), or with a number no numeric holds (1e999999), is "not
# JSON" for that request, not an error of the relay's record step: the
# JSON parser recurses per level and stops at the stack's limit, and
# jsonb_in raised on the number; either failed the whole step (every
# result recorded with it was sent again, and these events were never
# recorded).
my $log_start = -s $node->logfile;
for my $q ('deep', 'bignum')
{
	$node->safe_psql('postgres', qq{
		INSERT INTO outbox.destinations (name, kind, url, credentials, max_attempts, options) VALUES
			('$q', 'sqs', '$sink->{url}', 'aws', 1,
			 '{"queue_url": "http://127.0.0.1:$sink->{port}/123456789012/$q", "region": "us-east-1"}')});
	emit_to($q, 4);
	ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = 4 FROM outbox.events WHERE destination = '$q' AND status = 'dead'}),
		"$q: the answer dead-letters its events (max_attempts 1)");
	like($node->safe_psql('postgres', qq{
		SELECT string_agg(DISTINCT last_error, ' | ') FROM outbox.events WHERE destination = '$q'}),
		qr/^HTTP 200: error: the response is not JSON$/, "$q: as an answer that is not JSON");
}
ok(!$node->log_contains('stack depth limit exceeded|overflows numeric format|while recording results', $log_start),
	'the relay\'s step did not fail');

stop_local_sqs($sqs);
$node->stop;
stop_aws_sink($sink);
done_testing();
