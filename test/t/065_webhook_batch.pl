# Batched webhooks (options.batch, issue #17): one request carries several
# events, as a CloudEvents batch (application/cloudevents-batch+json) or a
# plain JSON array, within batch_size events and batch_max_bytes bytes;
# the signature covers the whole body and webhook-id names the batch; a
# 2xx acknowledges every event of it and a 400 dead-letters every event
# of it; an event with per-event headers goes in a batch of its own with
# its headers.  The sink parses each batch and logs one line per event.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $sink = start_sink();
my $node = new_outbox_node('batch', '');
$node->start;
my $secret = secret();
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, signing_secrets, max_concurrency, options) VALUES
		('ce', '$sink->{url}/ok/ce', ARRAY['$secret'], 64,
		 '{"batch": "cloudevents", "batch_size": 50}'),
		('arr', '$sink->{url}/ok/arr', ARRAY['$secret'], 64,
		 '{"batch": "array", "batch_max_bytes": 2048}'),
		('bad', '$sink->{url}/status/400/bad', NULL, 64, '{"batch": "array"}'),
		('single', '$sink->{url}/ok/single', NULL, 64, '{}');
});
ok($node->poll_query_until('postgres', q{SELECT count(*) > 0 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'the relay runs');

# every event of one transaction is claimed together: full batches
my $pad = 'p' x 300;
my @ce = split / /, $node->safe_psql('postgres', q{
	SELECT string_agg(outbox.emit('batch.ce', 'agg-' || (g % 7), jsonb_build_object('n', g, 'text', 'caf' || chr(233)),
	                              destination => 'ce')::text, ' ')
	  FROM generate_series(1, 500) g});
my @arr = split / /, $node->safe_psql('postgres', qq{
	SELECT string_agg(outbox.emit('batch.arr', CASE WHEN g % 2 = 0 THEN 'a' || g END,
	                              jsonb_build_object('n', g, 'pad', '$pad'),
	                              destination => 'arr')::text, ' ')
	  FROM generate_series(1, 200) g});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 700 FROM outbox.events WHERE destination IN ('ce', 'arr') AND status = 'published'}),
	'every batched event is published');

my @records = sink_records($sink);
my @ce_recs = grep { $_->{path} eq '/ok/ce' } @records;
my @arr_recs = grep { $_->{path} eq '/ok/arr' } @records;
assert_zero_lost($sink, 'cloudevents batches', '/ok/ce', @ce);
assert_zero_lost($sink, 'array batches', '/ok/arr', @arr);

# CloudEvents batches
is(scalar(grep { $_->{format} ne 'batch-cloudevents' } @ce_recs), 0, 'cloudevents: every request is a CloudEvents batch');
is(scalar(grep { !$_->{ce_ok} } @ce_recs), 0, 'cloudevents: every event has specversion, id, type, source');
is(scalar(grep { !$_->{sig_ok} } @ce_recs), 0, 'cloudevents: every batch signature verifies (over the whole body)');
my %ce_sizes;
$ce_sizes{ $_->{headers}{'webhook-id'} } = $_->{batch} for @ce_recs;
my @sizes = values %ce_sizes;
my ($max) = sort { $b <=> $a } @sizes;
ok($max > 1 && $max <= 50, "cloudevents: batches of up to batch_size events (largest $max)");
ok(scalar(@sizes) < 500 / 2, 'cloudevents: ' . scalar(@sizes) . ' requests for 500 events');
is(scalar(grep { $_ !~ /^batch_[0-9a-f]{32}$/ } keys %ce_sizes), 0, 'cloudevents: webhook-id names the batch');
is(scalar(grep { ($_->{headers}{'idempotency-key'} // '') ne $_->{headers}{'webhook-id'} } @ce_recs), 0,
	'cloudevents: Idempotency-Key is the batch id');
is(scalar(grep { exists $_->{headers}{'ce-id'} } @ce_recs), 0, 'cloudevents: no ce-* headers in batch mode');
like($ce_recs[0]{headers}{'content-type'}, qr{^application/cloudevents-batch\+json}, 'cloudevents: content type');
my %by_id = map { $_->{id} => $_ } @ce_recs;
my $n1 = $node->safe_psql('postgres', q{SELECT id FROM outbox.events WHERE destination = 'ce' AND payload->>'n' = '1'});
is($by_id{$n1}{type}, 'batch.ce', 'cloudevents: type intact');
is($by_id{$n1}{subject}, 'agg-1', 'cloudevents: subject is the aggregate id');
is($by_id{$n1}{data}{text}, "caf\x{e9}", 'cloudevents: non-ASCII data intact');

# plain array batches within batch_max_bytes
is(scalar(grep { $_->{format} ne 'batch-array' } @arr_recs), 0, 'array: every request is an array batch');
is(scalar(grep { !$_->{ce_ok} } @arr_recs), 0, 'array: every element has exactly id, type, aggregate_id, time, traceparent, payload');
is(scalar(grep { !$_->{sig_ok} } @arr_recs), 0, 'array: every signature verifies');
is(scalar(grep { $_->{headers}{'content-length'} > 2048 } @arr_recs), 0, 'array: no body over batch_max_bytes');
my %arr_sizes;
$arr_sizes{ $_->{headers}{'webhook-id'} } = $_->{batch} for @arr_recs;
my ($amax) = sort { $b <=> $a } values %arr_sizes;
ok($amax >= 3, "array: several events per request within 2048 bytes (largest $amax)");
my %arr_by_id = map { $_->{id} => $_ } @arr_recs;
my $odd = $node->safe_psql('postgres', q{SELECT id FROM outbox.events WHERE destination = 'arr' AND payload->>'n' = '3'});
my $even = $node->safe_psql('postgres', q{SELECT id FROM outbox.events WHERE destination = 'arr' AND payload->>'n' = '4'});
ok(!defined $arr_by_id{$odd}{subject}, 'array: aggregate_id null when none');
is($arr_by_id{$even}{subject}, 'a4', 'array: aggregate_id');
is($arr_by_id{$even}{data}{pad}, $pad, 'array: payload intact');

# a 400 dead-letters every event of the batch with the answer
my @bad = split / /, $node->safe_psql('postgres', q{
	SELECT string_agg(outbox.emit('batch.bad', NULL, jsonb_build_object('n', g), destination => 'bad')::text, ' ')
	  FROM generate_series(1, 30) g});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 30 FROM outbox.dead_events WHERE destination = 'bad'}),
	'a rejected batch: every event is a dead letter');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.dead_events WHERE destination = 'bad' AND last_status = 400
	   AND last_error LIKE 'HTTP 400: failing on purpose%'}), '30', '... each with the batch\'s answer');
my $bad_requests = grep { $_->{path} eq '/status/400/bad' } sink_records($sink);
ok($bad_requests == 30 && scalar(keys %{ { map { $_->{headers}{'webhook-id'} => 1 } grep { $_->{path} eq '/status/400/bad' } sink_records($sink) } }) < 30,
	'... sent in batches, each event once');

# per-event headers: that event alone, its headers as HTTP headers
$node->safe_psql('postgres', q{
	SELECT outbox.emit('batch.h', 'h' || g, jsonb_build_object('n', g), destination => 'ce',
	                   headers => CASE WHEN g = 5 THEN '{"X-Tenant": "t-5"}'::jsonb END)
	  FROM generate_series(1, 10) g});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 510 FROM outbox.events WHERE destination = 'ce' AND status = 'published'}),
	'events with and without per-event headers are published');
my @h = grep { $_->{path} eq '/ok/ce' && ($_->{type} // '') eq 'batch.h' } sink_records($sink);
my @tenant = grep { ($_->{headers}{'x-tenant'} // '') eq 't-5' } @h;
is(scalar(@tenant), 1, 'the event with headers arrives once with them');
is($tenant[0]{batch}, 1, '... in a batch of its own');
is($tenant[0]{subject}, 'h5', '... and it is that event');
is(scalar(grep { exists $_->{headers}{'x-tenant'} } @h), 1, 'no other event carries its headers');

# without the option nothing changes: one event per request, binary mode
$node->safe_psql('postgres', q{
	SELECT outbox.emit('batch.single', 's' || g, '{}', destination => 'single') FROM generate_series(1, 5) g});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 5 FROM outbox.events WHERE destination = 'single' AND status = 'published'}),
	'an unbatched destination is published');
my @single = grep { $_->{path} eq '/ok/single' } sink_records($sink);
is(scalar(grep { $_->{format} ne 'binary' || defined $_->{batch} } @single), 0, '... one binary-mode event per request');

$node->stop;
stop_sink($sink);
done_testing();
