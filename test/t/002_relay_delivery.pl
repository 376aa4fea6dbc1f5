# The relay delivers committed events over HTTP — and only those — with the
# CloudEvents attributes, the Standard Webhooks signature (verified by the
# sink, independently) and the trace context; it is woken at commit; with
# several workers each event is delivered exactly once when nothing fails;
# two databases are relayed at once.
use strict;
use utf8;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $sink = start_sink();
# a server time zone off UTC by a fraction of an hour: ce-time must not follow it
my $node = new_outbox_node('delivery', "outbox.workers_per_database = 3\ntimezone = 'Asia/Kolkata'\n");
$node->start;

my $secret = secret();
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, signing_secrets, bearer_token, headers)
	VALUES ('hook', '$sink->{url}/ok/hook', ARRAY['whsec_c29tZS1vbGQtc2VjcmV0', '$secret'],
	        'tok-123', '{"X-Env": "test", "X-Blank": ""}');
	INSERT INTO outbox.destinations (name, url, format)
	VALUES ('structured', '$sink->{url}/ok/structured', 'structured');
	INSERT INTO outbox.routes (pattern, destination) VALUES ('order.*', 'hook');
});

ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 3 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'three relay workers run for the database, visible in pg_stat_activity');

# commit: delivered with every attribute
my $id = $node->safe_psql('postgres', q{
	BEGIN;
	SELECT outbox.emit('order.created', 'o-ü 1', '{"amount": 10, "note": "naïve"}',
	                   headers => '{"X-Tenant": "acme", "X-Empty": ""}',
	                   traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
	COMMIT;
});
ok($node->poll_query_until('postgres', qq{SELECT status = 'published' FROM outbox.events WHERE id = '$id'}),
	'committed event is published');
my ($rec) = grep { $_->{id} eq $id } sink_records($sink);
ok($rec, 'the sink received it');
is($rec->{type}, 'order.created', 'ce-type');
is($rec->{subject}, 'o-ü 1', 'ce-subject, percent-encoded on the wire, decodes to the aggregate id');
is($rec->{headers}{'ce-subject'}, 'o-%C3%BC%201', 'ce-subject is percent-encoded');
ok($rec->{ce_ok}, 'CloudEvents binary mode attributes are valid');
is($rec->{format}, 'binary', 'binary mode by default');
is($rec->{headers}{'ce-source'}, 'urn:outbox_pg:postgres', 'ce-source');
ok(!exists $rec->{headers}{'ce-datacontenttype'}, 'no ce-datacontenttype in binary mode');
is_deeply($rec->{data}, { amount => 10, note => 'naïve' }, 'the body is the payload');
is($rec->{headers}{'idempotency-key'}, $id, 'Idempotency-Key is the message id');
is($rec->{headers}{'webhook-id'}, $id, 'webhook-id is the message id');
ok($rec->{sig_ok}, 'the Standard Webhooks signature verifies (second of two secrets)');
like($rec->{headers}{'webhook-signature'}, qr/^v1,\S+ v1,\S+$/, 'one signature per secret');
is($rec->{headers}{traceparent}, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'traceparent forwarded');
is($rec->{headers}{'ce-traceparent'}, $rec->{headers}{traceparent}, 'ce-traceparent too');
is($rec->{headers}{authorization}, 'Bearer tok-123', 'bearer token');
is($rec->{headers}{'x-env'}, 'test', 'destination header');
is($rec->{headers}{'x-blank'}, '', 'a destination header with an empty value is sent, empty');
is($rec->{headers}{'x-tenant'}, 'acme', 'event header');
is($rec->{headers}{'x-empty'}, '', 'an event header with an empty value is sent, empty (curl dropped it)');
like($rec->{time}, qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$/, 'ce-time is RFC 3339 UTC');
is($rec->{time}, $node->safe_psql('postgres', qq{
	SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
	  FROM outbox.events WHERE id = '$id'}),
	'ce-time is the event\'s created_at in UTC, to the microsecond');

# a traceparent stored by 0.4.0, which let any text follow a later version's
# fields (emit() and the insert trigger refuse it now): written straight
# into the event's log slot, it is left out of the request, not sent as a
# header line of its own.  store_bad_traceparent($dest): such an event for
# $dest, written straight into the log slot beside an emitted one; its id.
sub store_bad_traceparent
{
	my ($dest) = @_;
	my $bad_id = $node->safe_psql('postgres', 'SELECT gen_random_uuid()');

	# into the slot the marker emitted in the same transaction went to
	$node->safe_psql('postgres', qq{
		DO \$\$
		DECLARE
		    marker uuid := outbox.emit('order.marker0', 'o-t', '{}');
		    s int;
		BEGIN
		    SELECT slot INTO s FROM outbox.log WHERE id = marker;
		    EXECUTE format('INSERT INTO outbox.log_%s (id, xid, type, payload, traceparent, destination, created_at)
		                    VALUES (%L, pg_current_xact_id(), %L, %L, %L, %L, now())',
		                   s, '$bad_id', 'order.trace', '{}',
		                   E'01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\\r\\nX-Injected: 1', '$dest');
		END \$\$;
	});
	return $bad_id;
}
my $bad = store_bad_traceparent('hook');
ok(wait_until(sub { scalar(grep { ($_->{id} // '') eq $bad } sink_records($sink)) > 0 }, 30),
	'an event with a stored traceparent that is no longer valid is delivered');
my ($badrec) = grep { ($_->{id} // '') eq $bad } sink_records($sink);
ok(!exists $badrec->{headers}{traceparent} && !exists $badrec->{headers}{'ce-traceparent'}
	  && !exists $badrec->{headers}{'x-injected'},
	'without the traceparent, and with no header line of its making');

# rollback: nothing is sent
my $before = scalar(sink_records($sink));
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outbox.emit('order.cancelled', 'o-2', '{}');
	ROLLBACK;
});
$node->safe_psql('postgres', q{SELECT outbox.emit('order.marker', 'o-3', '{}')});
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'order.marker'}),
	'a later committed event is published');
ok(!(grep { ($_->{type} // '') eq 'order.cancelled' } sink_records($sink)), 'the rolled-back event was never sent');

# structured mode
$id = $node->safe_psql('postgres', q{SELECT outbox.emit('user.created', 'u-1', '{"name": "Ana"}', destination => 'structured')});
ok($node->poll_query_until('postgres', qq{SELECT status = 'published' FROM outbox.events WHERE id = '$id'}),
	'structured-mode event is published');
($rec) = grep { $_->{id} eq $id } sink_records($sink);
is($rec->{format}, 'structured', 'structured mode');
ok($rec->{ce_ok}, 'structured CloudEvent is valid');
is_deeply($rec->{data}, { name => 'Ana' }, 'payload under data');

# the stored traceparent that is no longer valid is left out of a
# structured event's body too (a valid one is in it)
$bad = store_bad_traceparent('structured');
my $good = $node->safe_psql('postgres', q{SELECT outbox.emit('order.trace', 'o-t', '{}', destination => 'structured',
	traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')});
ok(wait_until(sub { my %seen = map { ($_->{id} // '') => 1 } sink_records($sink); $seen{$bad} && $seen{$good} }, 30),
	'structured events with an invalid and a valid stored traceparent are delivered');
($badrec) = grep { ($_->{id} // '') eq $bad } sink_records($sink);
my ($goodrec) = grep { ($_->{id} // '') eq $good } sink_records($sink);
ok(!$badrec->{body_traceparent} && $goodrec->{body_traceparent},
	'the invalid traceparent is not in the structured body, the valid one is');

# wake at commit: with a 60 s poll only the commit wake can deliver quickly
$node->append_conf('postgresql.conf', "outbox.poll_interval = '60s'\n");
$node->reload;
sleep 1;
my @lat;
for my $i (1 .. 5)
{
	my $t0 = time;
	my $wid = $node->safe_psql('postgres', "SELECT outbox.emit('order.woken', '$i', '{}')");
	wait_until(sub { grep { $_->{id} eq $wid } sink_records($sink) }, 10);
	push @lat, time - $t0;
}
my @sorted = sort { $a <=> $b } @lat;
note(sprintf("commit-to-sink with a 60 s poll: median %.1f ms", 1000 * $sorted[2]));
ok($sorted[2] < 2.0, 'events arrive within moments of the commit, not at the next poll');

# several workers: every event exactly once
$node->safe_psql('postgres', q{SELECT outbox.emit('order.bulk', g::text, jsonb_build_object('n', g)) FROM generate_series(1, 2000) g});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2000 FROM outbox.events WHERE type = 'order.bulk' AND status = 'published'}),
	'2000 events published by three workers');
my %seen;
$seen{ $_->{id} }++ for grep { ($_->{type} // '') eq 'order.bulk' } sink_records($sink);
is(scalar(keys %seen), 2000, 'the sink received all 2000');
is(scalar(grep { $_ > 1 } values %seen), 0, 'none twice when nothing fails');
my $workers = $node->safe_psql('postgres', q{SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay'});
is($workers, '3', 'still three workers');

# two databases relayed at once
$node->safe_psql('postgres', 'CREATE DATABASE second');
$node->safe_psql('second', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('hook2', '$sink->{url}/ok/second');
	INSERT INTO outbox.routes (pattern, destination) VALUES ('*', 'hook2');
});
$node->safe_psql('second', q{SELECT outbox.emit('invoice.created', g::text, '{}') FROM generate_series(1, 50) g});
$node->safe_psql('postgres', q{SELECT outbox.emit('order.more', g::text, '{}') FROM generate_series(1, 50) g});
ok($node->poll_query_until('second', q{SELECT count(*) = 50 FROM outbox.events WHERE status = 'published'}),
	'the second database is relayed');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 50 FROM outbox.events WHERE type = 'order.more' AND status = 'published'}),
	'and the first one at the same time');
is(scalar(grep { $_->{path} eq '/ok/second' } sink_records($sink)), 50, 'the second database sent to its own destination');

# bad configuration: a clear log line, and the relays keep running
my @before = sort(relay_pids($node, 'postgres'));
$node->append_conf('postgresql.conf', qq{outbox.databases = '"unterminated'\n});
$node->reload;
ok(wait_until(sub { $node->log_contains('invalid list syntax in outbox.databases') }, 30),
	'an unparsable outbox.databases is reported in the log');
sleep 2;
is(join(' ', sort(relay_pids($node, 'postgres'))), join(' ', @before),
	'and the relays keep running as they were');
$node->safe_psql('postgres', q{SELECT outbox.emit('order.after_bad_config', '1', '{}')});
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'order.after_bad_config'}),
	'events still flow');

# the same value at server start: no database is relayed (never the
# default "*" in its place), and the log says why
$node->restart;
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT outbox.emit('order.bad_at_start', '1', '{}')});
ok(wait_until(sub { $node->log_contains('invalid list syntax in outbox.databases', $log_offset) }, 30),
	'an unparsable outbox.databases at server start is reported by the launcher');
sleep 2;
is(scalar(relay_pids($node, 'postgres')), 0, 'and no database is relayed');
is($node->safe_psql('postgres', q{SHOW outbox.databases}), '"unterminated',
	'the setting keeps the configured value instead of the default');
$node->append_conf('postgresql.conf', qq{outbox.databases = '*'\n});
$node->reload;
ok($node->poll_query_until('postgres', q{SELECT status = 'published' FROM outbox.events WHERE type = 'order.bad_at_start'}),
	'fixed and reloaded: the relays start and deliver');

$node->stop;
stop_sink($sink);
done_testing();
