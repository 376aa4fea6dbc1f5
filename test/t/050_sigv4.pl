# SigV4 correctness: every SNS and SQS request the relay sends (single and
# batch, FIFO, with a session token, with non-ASCII payloads) verifies
# against botocore's own SigV4 implementation in test/sink/aws_sink.py; a
# wrong secret is rejected (so the verifier can fail), and so is a request
# with libcurl 7.88's empty-header quirk.  Also: message attributes, FIFO
# group and deduplication ids, per-entry results of batches, the size
# limits that dead-letter a message before sending, and per-event headers
# as message attributes (or a dead letter when they cannot be).
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

BEGIN { require_packages('botocore'); }

my $sink = start_aws_sink();
my $u = $sink->{url};
my $q = "http://127.0.0.1:$sink->{port}/123456789012";
my $node = new_outbox_node('sigv4', "outbox.max_payload_size = '2MB'\n");
$node->start;

my ($key, $secret) = (AWS_KEY, AWS_SECRET);
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key, aws_session_token) VALUES
		('aws', '$key', '$secret', NULL),
		('aws_token', '$key', '$secret', 'FQoGZXIvYXdzEJr//////////wEaDOtoken+/='),
		('aws_wrong', '$key', 'not-the-secret', NULL);
	INSERT INTO outbox.destinations (name, kind, url, credentials, max_concurrency, backoff_base_ms, backoff_max_ms, options) VALUES
		('sns_single', 'sns', '$u', 'aws', 40, 100, 1000, '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:single", "batch_size": 1}'),
		('sns_batch',  'sns', '$u', 'aws', 40, 100, 1000, '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:batch-partial-poison"}'),
		('sns_fifo',   'sns', '$u', 'aws_token', 40, 100, 1000, '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:orders.fifo"}'),
		('sqs_single', 'sqs', '$u', 'aws', 40, 100, 1000, '{"queue_url": "$q/single", "region": "us-east-1", "batch_size": 1}'),
		('sqs_batch',  'sqs', '$u', 'aws', 40, 100, 1000, '{"queue_url": "$q/batch-partial-poison", "region": "us-east-1"}'),
		('sqs_fifo',   'sqs', '$u', 'aws_token', 40, 100, 1000, '{"queue_url": "$q/orders.fifo", "region": "us-east-1"}'),
		('sqs_wrong',  'sqs', '$u', 'aws_wrong', 40, 100, 1000, '{"queue_url": "$q/wrong", "region": "us-east-1"}');
});

# configuration errors are caught when the destination is written
my ($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', '$u?a=1', 'aws', '{"queue_url": "$q/x", "region": "us-east-1"}')});
like($err, qr/must not have a query string/, 'a query string is refused (libcurl 7.88 signs it unsorted)');
($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', '$u', 'aws', '{"queue_url": "$q/x"}')});
like($err, qr/has no AWS region/, 'a local endpoint needs a region');
($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'sns', '$u', '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:t"}')});
like($err, qr/needs credentials/, 'credentials are required');
($ret, $out, $err) = $node->psql('postgres',
	qq{INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sns', '$u', 'aws', '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:t", "batch_size": 11}')});
like($err, qr/batch_size must be an integer from 1 to 10/, 'batch_size is bounded by the API');

my $tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my %expect;    # id => [destination, payload hash, aggregate id]

sub emit_batch
{
	my ($dest, $n, $tag) = @_;
	my $rows = $node->safe_psql('postgres', qq{
		SELECT e.id || '|' || e.agg || '|' || e.payload::text FROM (
			SELECT outbox.emit('pay.$tag', agg, payload, destination => '$dest', traceparent => '$tp') AS id, agg, payload
			  FROM (SELECT CASE WHEN g % 3 = 0 THEN 'kundin-ü-' || g ELSE 'acct-' || (g % 4) END AS agg,
			               jsonb_build_object('n', g, 'text', 'naïve café – 日本語 ✓ 🚀', 'note',
			                                  CASE WHEN g = 4 THEN 'poison' ELSE 'fine' END) AS payload
			          FROM generate_series(1, $n) g) s) e});
	my @ids;
	$rows = Encode::decode_utf8($rows);
	for my $line (split /\n/, $rows)
	{
		my ($id, $agg, $payload) = split /\|/, $line, 3;
		$expect{$id} = [ $dest, decode_json(Encode::encode_utf8($payload)), $agg ];
		push @ids, $id;
	}
	return @ids;
}

my %ids;
for my $d (qw(sns_single sns_batch sns_fifo sqs_single sqs_batch sqs_fifo sqs_wrong))
{
	$ids{$d} = [ emit_batch($d, 23, $d) ];
}

# the poison entries (payload note "poison") of the two batch destinations
# fail with SenderFault true; everything else is published
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 23 * 6 - 2 FROM outbox.events WHERE status = 'published'}),
	'every event of the six good destinations is published, poison entries aside');
is($node->safe_psql('postgres', q{
	SELECT string_agg(destination || ':' || status, ',' ORDER BY destination) FROM outbox.events
	 WHERE payload ->> 'note' = 'poison' AND destination LIKE '%batch'}),
	'sns_batch:dead,sqs_batch:dead', 'an entry failing with SenderFault true inside a 200 is dead-lettered');
like($node->safe_psql('postgres', q{
	SELECT last_error FROM outbox.events WHERE payload ->> 'note' = 'poison' AND destination = 'sqs_batch'}),
	qr/SendMessageBatch entry failed \(sender fault\): InvalidParameterValue/, 'with the entry\'s code as the reason');

my @recs = aws_records($sink);
my @good = grep { $_->{name} ne 'wrong' } @recs;
ok(scalar(@good) >= 30, scalar(@good) . ' requests to verify');
my @bad = grep { !$_->{verified} } @good;
is(scalar(@bad), 0, 'every request of the relay verifies with botocore')
  or diag(explain([ map { $_->{reason} } @bad ]));

my %actions;
$actions{"$_->{service}:$_->{action}"}++ for @good;
ok($actions{'sns:Publish'} && $actions{'sns:PublishBatch'}, 'SNS Publish and PublishBatch requests were made');
ok($actions{'sqs:SendMessage'} && $actions{'sqs:SendMessageBatch'}, 'SQS SendMessage and SendMessageBatch requests were made');
my ($biggest) = sort { $b <=> $a } map { scalar @{ $_->{entries} } } @good;
is($biggest, 10, 'batches carry up to 10 entries');
ok(!(grep { $_->{action} =~ /Batch/ && @{ $_->{entries} } < 2 } @good), 'batch calls are used only for several messages');
ok(!(grep { $_->{service} eq 'sns' && !$_->{body_ascii} } @good), 'SNS bodies are percent-encoded ASCII');
ok((grep { $_->{service} eq 'sqs' && !$_->{body_ascii} } @good), 'SQS bodies carry raw UTF-8, and still verify');
ok(!(grep { $_->{service} eq 'sqs' && $_->{content_type} ne 'application/x-amz-json-1.0' } @good), 'SQS content type');
ok((grep { grep { $_ eq 'x-amz-security-token' } @{ $_->{signed_headers} } } @good),
	'the session token is sent and signed');

# every entry, as received
my (%received, $attr_ok, $payload_ok, $fifo_ok, $fifo_n, $nonfifo_clean);
$attr_ok = $payload_ok = $fifo_ok = $nonfifo_clean = 1;
$fifo_n = 0;
for my $r (@good)
{
	for my $e (@{ $r->{entries} })
	{
		my $id = $e->{attributes}{message_id};
		my $x = $expect{$id} or next;
		$received{$id}++;
		$attr_ok = 0 unless $e->{attributes}{event_type} eq "pay.$x->[0]" && $e->{attributes}{traceparent} eq $tp
		  && $e->{attributes}{aggregate_id} eq $x->[2];
		$attr_ok = 0 if defined $e->{id} && $e->{id} ne $id;
		$payload_ok = 0 unless JSON::PP->new->canonical->encode(decode_json(Encode::encode_utf8($e->{body})))
		  eq JSON::PP->new->canonical->encode($x->[1]);
		if ($x->[0] =~ /fifo/)
		{
			$fifo_n++;
			$fifo_ok = 0 unless $e->{dedup} eq $id;
			my $want = $x->[2] =~ /^[\x21-\x7e]+$/ ? $x->[2] : undef;
			$fifo_ok = 0 if defined $want && $e->{group} ne $want;
			$fifo_ok = 0 if !defined $want && $e->{group} !~ /^[0-9a-f]{64}$/;
		}
		elsif (defined $e->{group} || defined $e->{dedup}) { $nonfifo_clean = 0; }
	}
}
is(scalar(grep { $expect{$_}[0] ne 'sqs_wrong' && !$received{$_} } keys %expect), 0, 'every event arrived');
ok($attr_ok, 'attributes: event_type, message_id (and batch entry Id), aggregate_id, traceparent');
ok($payload_ok, 'non-ASCII payloads arrive intact');
ok($fifo_n > 0 && $fifo_ok, 'FIFO: MessageDeduplicationId = message id, MessageGroupId = aggregate id (hashed when not ASCII)');
ok($nonfifo_clean, 'no FIFO fields for standard topics and queues');
my $partial_retried = grep { $_->{nth} && $_->{nth} == 2 && $_->{result} eq 'ok' }
  map { @{ $_->{entries} } } grep { $_->{name} =~ /partial/ } @good;
ok($partial_retried > 0, "entries that failed inside a 200 were retried on their own ($partial_retried)");

# a wrong secret: the verifier rejects, the relay keeps retrying
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 23 FROM outbox.events WHERE destination = 'sqs_wrong' AND attempts >= 1 AND last_status = 403}),
	'a wrong secret is rejected');
my @wrong = grep { $_->{name} eq 'wrong' } @recs;
ok(@wrong && !(grep { $_->{verified} } @wrong), 'the verifier rejects every request signed with the wrong secret');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'sqs_wrong' AND status = 'pending'}),
	'23', 'and they stay pending (a credential error is retried)');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE destination = 'sqs_wrong' LIMIT 1}),
	qr/SignatureDoesNotMatch/, 'with the AWS error code in last_error');
unlike($node->safe_psql('postgres', q{SELECT string_agg(coalesce(last_error, ''), ' ') FROM outbox.events}),
	qr/\Q$secret\E|not-the-secret/, 'no secret ever appears in an error');

# the libcurl 7.88 quirk the requests avoid: an empty header is signed but
# not sent (curl issue 11664, fixed in 8.3.0; 17 and 18 come with 8.x)
my $curl_out = `curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 aws:amz:us-east-1:sqs --user '$key:$secret' -H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: AmazonSQS.SendMessage' -H 'Expect:' -d '{"QueueUrl":"$q/curl","MessageBody":"x"}' $u 2>&1`;
my @libcurl = `curl --version` =~ m{libcurl/(\d+)\.(\d+)};
if (@libcurl && $libcurl[0] * 100 + $libcurl[1] >= 803)
{
	is($curl_out, '200', 'curl with an "Expect:" header passes verification: this libcurl signs what it sends');
}
else
{
	is($curl_out, '403', 'curl with an "Expect:" header fails verification: the quirk is real and the verifier sees it');
}

# size limits, checked before sending
my $before = scalar(aws_records($sink));
$node->safe_psql('postgres', q{
	SELECT outbox.emit('big.sns', 'a', jsonb_build_object('s', repeat('x', 262144)), destination => 'sns_single');
	SELECT outbox.emit('big.sqs.ok', 'a', jsonb_build_object('s', repeat('é', 200000)), destination => 'sqs_single');
	SELECT outbox.emit('big.sqs', 'a', jsonb_build_object('s', repeat('x', 1048576)), destination => 'sqs_batch');
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 3 FROM outbox.events WHERE type LIKE 'big.%' AND status <> 'pending'}),
	'oversized messages are decided at once');
is($node->safe_psql('postgres', q{SELECT string_agg(type || ':' || status || ':' || attempts, ',' ORDER BY type) FROM outbox.events WHERE type LIKE 'big.%'}),
	'big.sns:dead:1,big.sqs:dead:1,big.sqs.ok:published:1', 'over the limit: dead after one attempt; 400 kB of UTF-8 to SQS is fine');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE type = 'big.sns'}),
	qr/message too large for SNS: \d+ bytes with its attributes, the limit is 262144; not sent/, 'with a clear reason');
ok(!(grep { grep { ($_->{attributes}{event_type} // '') =~ /^big\.s(ns|qs)$/ } @{ $_->{entries} } } aws_records($sink)),
	'an oversized message is never sent');

# per-event headers are message attributes; headers that cannot be (more
# than AWS's 10 attributes with the relay's own, a name AWS refuses, the
# name of one of the relay's attributes) are refused before sending with
# the reason, never dropped silently
$node->safe_psql('postgres', q{
	SELECT outbox.emit('hdr.sqs', 'a', '{}', destination => 'sqs_single',
	                   headers => '{"x-tenant": "t1", "region.code": "eu"}');
	SELECT outbox.emit('hdr.sns', 'a', '{}', destination => 'sns_single', headers => '{"x-tenant": "t2"}');
	SELECT outbox.emit('hdr.many', 'a', '{}', destination => 'sqs_batch',
	                   headers => (SELECT jsonb_object_agg('h' || g, 'v') FROM generate_series(1, 8) g));
	SELECT outbox.emit('hdr.name', 'a', '{}', destination => 'sns_single', headers => '{"AWS.trace": "v"}');
	SELECT outbox.emit('hdr.own', 'a', '{}', destination => 'sqs_single', headers => '{"event_type": "spoof"}');
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 5 FROM outbox.events WHERE type LIKE 'hdr.%' AND status <> 'pending'}),
	'events with headers are decided');
is($node->safe_psql('postgres', q{SELECT string_agg(type || ':' || status || ':' || attempts, ',' ORDER BY type) FROM outbox.events WHERE type LIKE 'hdr.%'}),
	'hdr.many:dead:1,hdr.name:dead:1,hdr.own:dead:1,hdr.sns:published:1,hdr.sqs:published:1',
	'headers that fit are sent; the others are dead letters after one attempt');
is($node->safe_psql('postgres', q{SELECT string_agg(type || ': ' || last_error, E'\n' ORDER BY type) FROM outbox.events WHERE type LIKE 'hdr.%' AND status = 'dead'}),
	join("\n",
		'hdr.many: too many headers for SQS: 8 headers and 3 attributes of the relay\'s own make 11 message attributes, the limit is 10; not sent',
		'hdr.name: header "AWS.trace" is not a valid SNS message attribute name; not sent',
		'hdr.own: header "event_type" has the name of an attribute the relay sets itself; not sent'),
	'each with its reason');
my %hdr = map { ($_->{attributes}{event_type} // '') => $_->{attributes} } map { @{ $_->{entries} } } aws_records($sink);
is_deeply([ @{ $hdr{'hdr.sqs'} // {} }{qw(x-tenant region.code aggregate_id)} ], [ 't1', 'eu', 'a' ],
	'SQS: per-event headers arrive as String attributes, next to the relay\'s own');
is($hdr{'hdr.sns'}{'x-tenant'}, 't2', 'SNS too');
ok(!(grep { $hdr{"hdr.$_"} } qw(many name own)), 'a refused message is never sent');

# options.body = 'cloudevents': the body is the event as a CloudEvents JSON
# object (id, source, type, subject, time, traceparent, data), the
# attributes are as before, and the size limits count that body
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, kind, url, credentials, max_concurrency, backoff_base_ms, backoff_max_ms, options) VALUES
		('sns_ce',  'sns', '$u', 'aws', 40, 100, 1000, '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:ce", "body": "cloudevents"}'),
		('sqs_ce',  'sqs', '$u', 'aws', 40, 100, 1000, '{"queue_url": "$q/ce", "region": "us-east-1", "body": "cloudevents", "source": "urn:shop:café"}'),
		('sns_big', 'sns', '$u', 'aws', 40, 100, 1000, '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:big", "batch_size": 1}'),
		('sns_big_ce', 'sns', '$u', 'aws', 40, 100, 1000, '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:bigce", "batch_size": 1, "body": "cloudevents"}');
});
$before = scalar(aws_records($sink));
emit_batch($_, 7, $_) for qw(sns_ce sqs_ce);
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 14 FROM outbox.events WHERE destination IN ('sns_ce', 'sqs_ce') AND status = 'published'}),
	'body = cloudevents: 14 events published to SNS and SQS');
my @ce_recs = grep { $_->{name} eq 'ce' } (aws_records($sink))[ $before .. scalar(aws_records($sink)) - 1 ];
is(scalar(grep { !$_->{verified} } @ce_recs), 0, 'every request with a CloudEvents body verifies with botocore');
ok((grep { $_->{action} eq 'PublishBatch' } @ce_recs) && (grep { $_->{action} eq 'SendMessageBatch' } @ce_recs),
	'in batches, for both services');
my %ce_seen;
my @ce_bad;
for my $e (map { @{ $_->{entries} } } @ce_recs)
{
	my $id = $e->{attributes}{message_id} // '';
	my $x = $expect{$id} or next;
	$ce_seen{$id}++;
	my $ev = eval { decode_json(Encode::encode_utf8($e->{body})) } // {};
	my $source = $x->[0] eq 'sqs_ce' ? 'urn:shop:café' : 'urn:outbox_pg:postgres';
	my $time = $node->safe_psql('postgres', qq{
		SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') FROM outbox.events WHERE id = '$id'});
	my %want = (specversion => '1.0', id => $id, source => $source, type => "pay.$x->[0]",
		subject => $x->[2], time => $time, traceparent => $tp, datacontenttype => 'application/json');
	my @wrong = grep { ($ev->{$_} // '') ne $want{$_} } sort keys %want;
	push @wrong, 'data' unless JSON::PP->new->canonical->encode($ev->{data} // {}) eq
	  JSON::PP->new->canonical->encode($x->[1]);
	push @wrong, 'attributes' unless ($e->{attributes}{event_type} // '') eq "pay.$x->[0]"
	  && ($e->{attributes}{aggregate_id} // '') eq $x->[2] && ($e->{attributes}{traceparent} // '') eq $tp;
	push @ce_bad, "$x->[0] $id: @wrong" if @wrong;
}
is(scalar(keys %ce_seen), 14, 'every event arrived with a CloudEvents body');
is_deeply(\@ce_bad, [], 'each body is the event: specversion, id, source, type, subject (non-ASCII as UTF-8), time, traceparent, datacontenttype and the payload as data; the attributes are still sent');

# a payload that fits SNS's 256 KiB with its attributes, but not once
# wrapped in a CloudEvent: published as a bare payload, dead-lettered
# before sending as a CloudEvent
my $pad = 262144 - 200 - length('{"s": ""}');
$node->safe_psql('postgres', qq{
	SELECT outbox.emit('edge', 'a', jsonb_build_object('s', repeat('x', $pad)), destination => 'sns_big');
	SELECT outbox.emit('edge', 'a', jsonb_build_object('s', repeat('x', $pad)), destination => 'sns_big_ce');
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.events WHERE destination LIKE 'sns_big%' AND status <> 'pending'}),
	'the edge-sized messages are decided');
is($node->safe_psql('postgres', q{SELECT string_agg(destination || ':' || status || ':' || attempts, ',' ORDER BY destination) FROM outbox.events WHERE destination LIKE 'sns_big%'}),
	'sns_big:published:1,sns_big_ce:dead:1', 'the size limit counts the body as sent: the CloudEvent is too large');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE destination = 'sns_big_ce'}),
	qr/message too large for SNS: 262\d\d\d bytes with its attributes, the limit is 262144; not sent/, 'with the CloudEvent\'s size');
ok(!(grep { $_->{name} eq 'bigce' } aws_records($sink)), 'and it is never sent');

$node->stop;
stop_aws_sink($sink);
done_testing();
