# Delivery under faults: every emitted id reaches the sink at least once
# (zero lost) through 500s, 429 with Retry-After, hanging responses past the
# timeout, connection resets, and the sink going down and coming back.
# Permanent failures go to the dead letters; a slow destination does not
# delay a healthy one; redirects and oversized responses are refused.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $sink = start_sink();
my $node = new_outbox_node('faults', "outbox.workers_per_database = 2\noutbox.allowed_hosts = '127.0.0.1'\n");
$node->start;
my $u = $sink->{url};

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms) VALUES
		('flaky500',  '$u/failfirst/2/500/a', 2000, 10, 50, 200),
		('breaker',   '$u/failfirst/1/500/l', 2000, 10, 50, 200),
		('outage',    '$u/status/503/m', 2000, 1000, 50, 200),
		('limited',   '$u/failfirst/1/429/b?retry_after=2', 2000, 10, 50, 200),
		('hanging',   '$u/hangfirst/1/c', 500, 10, 50, 200),
		('resetting', '$u/resetfirst/1/d', 2000, 10, 50, 200),
		('rejecting', '$u/status/422/e', 2000, 10, 50, 200),
		('broken',    '$u/status/503/f', 2000, 3, 50, 200),
		('redirect',  '$u/redirect/g', 2000, 1, 50, 200),
		('big',       '$u/big/h', 2000, 2, 50, 200),
		('slow',      '$u/delay/3000/i', 10000, 10, 50, 200),
		('healthy',   '$u/ok/j', 2000, 10, 50, 200),
		('downtime',  '$u/ok/k', 1000, 100, 50, 500),
		('forbidden', 'http://localhost:$sink->{port}/ok/n', 1000, 2, 50, 200);
	UPDATE outbox.destinations SET max_concurrency = 2 WHERE name = 'slow';
	-- per-message retries without the destination-wide circuit breaker
	-- ('broken': with a circuit, a destination that fails everything is an
	-- outage, which uses up no attempts; see 025_circuit_recovery.pl)
	UPDATE outbox.destinations SET options = '{"circuit_threshold": 0}'
	 WHERE name IN ('flaky500', 'limited', 'hanging', 'resetting', 'broken');
});

sub emit_n { return emit_events($node, 'fault.test', @_); }

sub published
{
	my ($dest, $n) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = $n FROM outbox.events WHERE destination = '$dest' AND status = 'published'});
}

sub zero_lost { return assert_zero_lost($sink, @_); }

my @ids = emit_n('flaky500', 20);
ok(published('flaky500', 20), '500s: all published after retries');
zero_lost('500s', '/failfirst/2/500', @ids);
# counted by the sink: since 0.4.0 a published event's row keeps no
# attempt count (the store writes only failures, and forgets them once
# the retry is acknowledged)
my %ids_seen;
$ids_seen{ $_->{id} }++ for grep { $_->{path} =~ m{^/failfirst/2/500} } sink_records($sink);
is(join(',', sort { $a <=> $b } keys %{ { map { $_ => 1 } values %ids_seen } }), '3',
	'500s: each took exactly three attempts');
is(scalar(keys %ids_seen), 20, 'the message id is the same in every attempt');

# the circuit breaker: a destination failing every request is backed off
# as a whole (one probe at a time) instead of being hammered by every
# message's own retries.  Before it opens the 10 events fail at most
# circuit_threshold (5) rounds; once it is open only probes go out (after
# 1 s, then every 2 s: outbox.circuit_max_pause).
emit_n('outage', 10);
ok($node->poll_query_until('postgres', q{
	SELECT circuit_state IN ('open', 'half-open') FROM outbox.destination_stats WHERE destination = 'outage'}),
	'outage: the circuit opens');
my $outage_before = scalar(grep { $_->{path} =~ m{^/status/503/m} } sink_records($sink));
ok($outage_before <= 60,
	"outage: $outage_before requests before the circuit opened (at most 5 rounds of the 10 events, and stragglers)");
sleep 3;
my $outage_requests = scalar(grep { $_->{path} =~ m{^/status/503/m} } sink_records($sink)) - $outage_before;
ok($outage_requests <= 4,
	"outage: only probes while it is open ($outage_requests requests in 3 s; per-message retries alone would make ~200)");
is($node->safe_psql('postgres', q{SELECT max(attempts) <= 5 AND count(*) FILTER (WHERE status = 'dead') = 0
                                    FROM outbox.events WHERE destination = 'outage'}),
	't', 'outage: the open circuit uses up no attempts');
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = true WHERE name = 'outage'});

# ... and closes again when a probe succeeds; nothing is lost
@ids = emit_n('breaker', 10);
ok(published('breaker', 10), 'breaker: everything is published once a probe succeeds');
zero_lost('breaker', '/failfirst/1/500/l', @ids);

@ids = emit_n('limited', 5);
ok(published('limited', 5), '429: published after Retry-After');
zero_lost('429', '/failfirst/1/429', @ids);
my %first;
my $honoured = 1;
for my $r (grep { $_->{path} =~ m{^/failfirst/1/429} } sink_records($sink))
{
	if (!exists $first{ $r->{id} }) { $first{ $r->{id} } = $r->{t}; next; }
	$honoured = 0 if $r->{t} - $first{ $r->{id} } < 1.9;
}
ok($honoured, '429: the retry waited for Retry-After (2 s) although the backoff was 50 ms');

@ids = emit_n('hanging', 5);
ok(published('hanging', 5), 'hanging responses: published after the timeout and a retry');
zero_lost('timeouts', '/hangfirst', @ids);

@ids = emit_n('resetting', 5);
ok(published('resetting', 5), 'connection resets: published after a retry');
zero_lost('resets', '/resetfirst', @ids);

emit_n('rejecting', 3);
ok($node->poll_query_until('postgres', q{
	SELECT bool_and(status = 'dead' AND attempts = 1 AND last_status = 422) AND count(*) = 3
	  FROM outbox.events WHERE destination = 'rejecting'}), '4xx: dead letter after one attempt, status kept');

emit_n('broken', 3);
ok($node->poll_query_until('postgres', q{
	SELECT bool_and(status = 'dead' AND attempts = 3 AND last_status = 503 AND last_error LIKE 'HTTP 503%') AND count(*) = 3
	  FROM outbox.events WHERE destination = 'broken'}), '5xx: dead letter after max_attempts, last error kept');

emit_n('redirect', 1);
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' AND last_status = 302 AND last_error LIKE '%redirects are not followed%'
	  FROM outbox.events WHERE destination = 'redirect'}), 'redirects are refused, not followed');
is(scalar(grep { $_->{path} eq '/ok' } sink_records($sink)), 0, 'the redirect target was never requested');

# a 200 with a 10 MB body, over outbox.max_response_size: read to its end
# (the rest thrown away), the 200 counts (it was re-sent and dead-lettered
# before)
emit_n('big', 1);
ok($node->poll_query_until('postgres', q{
	SELECT status = 'published' AND attempts = 1
	  FROM outbox.events WHERE destination = 'big'}), 'a 200 with an oversized body is delivered once it has ended');
is(scalar(grep { $_->{path} =~ m{^/big/h} } sink_records($sink)), 1, 'an oversized 200 is not sent again');

# a slow destination does not delay a healthy one
emit_n('slow', 10);
my $t0 = time;
@ids = emit_n('healthy', 50);
ok(published('healthy', 50), 'healthy destination published');
my $healthy_time = time - $t0;
note(sprintf('healthy destination: 50 events in %.2f s while the slow one works', $healthy_time));
ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'slow' AND status = 'published'}) < 10,
	'the healthy destination finished while the slow one was still working');
ok(published('slow', 10), 'the slow destination finishes too');

# a host outside outbox.allowed_hosts is never contacted
emit_n('forbidden', 1);
ok($node->poll_query_until('postgres', q{
	SELECT status = 'dead' AND last_error = 'host "localhost" is not in outbox.allowed_hosts'
	  FROM outbox.events WHERE destination = 'forbidden'}), 'a host not on the allow-list is refused');
is(scalar(grep { $_->{path} eq '/ok/n' } sink_records($sink)), 0, 'and never contacted');

# the sink goes down for a while, then comes back
stop_sink($sink);
@ids = emit_n('downtime', 100);
sleep 3;
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'downtime' AND status = 'published'}),
	'0', 'nothing is published while the sink is down');
ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'downtime' AND status = 'pending' AND last_error IS NOT NULL}) > 0,
	'the connection errors are recorded on the rows');
restart_sink($sink);
ok(published('downtime', 100), 'everything is published once the sink is back');
zero_lost('sink down', '/ok/k', @ids);
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE destination = 'downtime' AND status = 'dead'}),
	'0', 'nothing was dead-lettered by the outage');

$node->stop;
stop_sink($sink);
done_testing();
