# A receiver that sheds load with Retry-After pauses the destination as a
# whole, for every relay, and an HTTP-date is understood as well as seconds.
#
# Before, Retry-After delayed only the event whose answer carried it: the
# relay went on sending the destination's other events at once, each to be
# refused in its turn and charged an attempt for it, and a Retry-After in
# the HTTP-date form (RFC 9110 allows both) was ignored altogether.  Now a
# 429 or 5xx with Retry-After opens the destination's circuit for that
# long (up to an hour): nothing is sent until then, the refused event is
# not charged an attempt, and then one probe goes out.  With the circuit
# breaker off (circuit_threshold 0) only the refused event waits, as before.
#
# Each destination below takes one request at a time (max_concurrency 1),
# its receiver refuses the first request to its path, whatever the event,
# and answers 204 after that; five events are emitted in one transaction.
# The first two allow one attempt (max_attempts 1): an event charged for
# the refusal, or for not being sent while the destination waits, would be
# dead-lettered instead of delivered.  Then: a receiver that refuses one
# of several requests in flight (the 204s to the others must not end the
# wait), and a probe after the wait that fails without a Retry-After (the
# circuit pauses again rather than probing at once, probe after probe).
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
my $node = new_outbox_node('retryafter', qq{
outbox.workers_per_database = 2
outbox.circuit_max_pause = '1s'
log_min_messages = warning
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox_pg');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 2 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'both relays run');

my $u = $sink->{url};
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, max_attempts, backoff_base_ms, backoff_max_ms, options) VALUES
		('seconds', '$u/failcount/1/429/seconds?retry_after=3', 1, 1, 50, 100, '{}'),
		('date',    '$u/failcount/1/503/date?retry_after_date=4', 1, 1, 50, 100, '{}'),
		('nocircuit', '$u/failcount/1/429/nocircuit?retry_after=3', 1, 2, 50, 100, '{"circuit_threshold": 0}'),
		('zero',    '$u/failcount/1/429/zero?retry_after=0', 1, 2, 50, 100, '{}');
});

# the requests to a destination's path, in the order they arrived
sub requests
{
	my ($name) = @_;
	return sort { $a->{t} <=> $b->{t} }
	  grep { $_->{path} =~ m{^/failcount/1/\d+/\Q$name\E\?} } sink_records($sink);
}

sub count_requests
{
	my @r = requests(@_);
	return scalar @r;
}

sub delivered
{
	my ($name, $n) = @_;
	return wait_until(sub { scalar(grep { $_->{answer} == 204 } requests($name)) >= $n }, 60);
}

# the gap between the refused request and the next one to the destination
sub gap_after_refusal
{
	my ($name) = @_;
	my @r = requests($name);
	return undef unless @r >= 2 && $r[0]{answer} != 204;
	return $r[1]{t} - $r[0]{t};
}

# 1. Retry-After in seconds: the whole destination waits, the stats say so
my @ids = emit_events($node, 'ra.seconds', 'seconds', 5);
ok(wait_until(sub { count_requests('seconds') >= 1 }, 30), 'seconds: the first request was answered 429');
ok($node->poll_query_until('postgres', q{
	SELECT s.circuit_state = 'open' AND r.circuit_open_until > now() + interval '1 s'
	  FROM outbox.destination_stats AS s
	  JOIN outbox.destination_runtime() AS r USING (destination)
	 WHERE destination = 'seconds'}),
	'seconds: destination_stats shows the circuit open, until the time asked for');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 5 AND count(*) FILTER (WHERE attempts = 0) = 5
	   AND count(*) FILTER (WHERE last_error LIKE 'not sent: the destination asked to wait until % (Retry-After)') = 4
	  FROM outbox.retries WHERE destination = 'seconds'}),
	'seconds: the four events leased with the refused one wait as retries, unsent and not charged, as it does');
ok(delivered('seconds', 5), 'seconds: every event is delivered afterwards');
my $gap = gap_after_refusal('seconds');
ok(defined $gap && $gap >= 2.8,
	sprintf('seconds: no request for the 3 s of Retry-After (the next came after %.2f s)', $gap // -1));
is(count_requests('seconds'), 6, 'seconds: one refused request and five deliveries, no more');
assert_zero_lost($sink, 'seconds', '/failcount/1/429/seconds', @ids);
like(slurp_file($node->logfile),
	qr/WARNING:  outbox_pg destination "seconds" answered 429 with Retry-After: 3 s; circuit opened/,
	'seconds: the log says why the destination is paused');

# 2. an HTTP-date, with a 503
@ids = emit_events($node, 'ra.date', 'date', 5);
ok(delivered('date', 5), 'date: every event is delivered');
$gap = gap_after_refusal('date');
ok(defined $gap && $gap >= 2.5,
	sprintf('date: no request until the date Retry-After named, 3-4 s on (the next came after %.2f s)', $gap // -1));
is(count_requests('date'), 6, 'date: one refused request and five deliveries');
like(slurp_file($node->logfile),
	qr/destination "date" answered 503 with Retry-After: [34] s; circuit opened/,
	'date: the log gives the wait in seconds');

# 3. with the circuit breaker off, only the refused event waits
@ids = emit_events($node, 'ra.nocircuit', 'nocircuit', 5);
ok(delivered('nocircuit', 5), 'nocircuit: every event is delivered');
$gap = gap_after_refusal('nocircuit');
ok(defined $gap && $gap < 2,
	sprintf('nocircuit: the next event went out at once (after %.2f s)', $gap // -1));
my @r = requests('nocircuit');
my $refused_id = $r[0]{id};
my @again = grep { $_->{id} eq $refused_id } @r;
ok(@again == 2 && $again[1]{t} - $again[0]{t} >= 2.8,
	'nocircuit: the refused event itself waited for its Retry-After');

# 4. Retry-After: 0 asks for no wait
emit_events($node, 'ra.zero', 'zero', 5);
ok(delivered('zero', 5), 'zero: every event is delivered');
$gap = gap_after_refusal('zero');
ok(defined $gap && $gap < 1, sprintf('zero: no pause (the next came after %.2f s)', $gap // -1));
# 5. a receiver that refuses one request and lets the others through: the
# answers to requests already in flight do not end the wait, and neither
# relay sends anything new until it is over (events in transactions of 10,
# so that both relays lease)
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, max_attempts) VALUES
		('burst', '$u/failcount/1/429/burst?retry_after=3', 8, 1)});
@ids = ();
push @ids, emit_events($node, 'ra.burst', 'burst', 10) for 1 .. 20;
ok(delivered('burst', 200), 'burst: every event is delivered');
my @b = requests('burst');
my ($refused) = grep { $_->{answer} != 204 } @b;
my @during = grep { $_->{t} > $refused->{t} + 0.5 && $_->{t} < $refused->{t} + 2.8 } @b;
my @soon = grep { $_->{t} >= $refused->{t} && $_->{t} <= $refused->{t} + 0.5 } @b;
note(sprintf('burst: %d requests in all, %d in the half second after the refusal (in flight then)',
	scalar(@b), scalar(@soon)));
is(scalar(@during), 0,
	'burst: no request from 0.5 s to 2.8 s after the refusal, though requests in flight with it were answered 204');
assert_zero_lost($sink, 'burst', '/failcount/1/429/burst', @ids);

# 6. the probe after the wait fails without a Retry-After of its own: the
# circuit pauses again (outbox.circuit_max_pause, 1 s here), not probe
# after probe at once
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, max_attempts) VALUES
		('probe', '$u/failseq/429,503/probe?retry_after=2', 1, 1)});
@ids = emit_events($node, 'ra.probe', 'probe', 3);
ok(wait_until(sub {
	scalar(grep { $_->{answer} == 204 && $_->{path} =~ m{^/failseq/429,503/probe} } sink_records($sink)) >= 3 }, 60),
	'probe: every event is delivered');
my @p = sort { $a->{t} <=> $b->{t} } grep { $_->{path} =~ m{^/failseq/429,503/probe} } sink_records($sink);
ok(@p >= 3 && $p[1]{answer} == 503 && $p[1]{t} - $p[0]{t} >= 1.8,
	sprintf('probe: the probe waited for the Retry-After (%.2f s)', @p >= 2 ? $p[1]{t} - $p[0]{t} : -1));
ok(@p >= 3 && $p[2]{t} - $p[1]{t} >= 0.8,
	sprintf('probe: a failed probe pauses the circuit again (the next request after %.2f s)',
		@p >= 3 ? $p[2]{t} - $p[1]{t} : -1));
assert_zero_lost($sink, 'probe', '/failseq/429,503/probe', @ids);

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox.destination_stats WHERE circuit_state <> 'closed'}), '0',
	'every circuit is closed again');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'dead'}), '0',
	'no event was dead-lettered');

$node->stop;
stop_sink($sink);
done_testing();
