# The relay keeps its destinations loaded across lease steps and loads
# them again when a commit changed outbox.destinations,
# outbox.credentials or outbox.routes (issue #19).  The poll interval is
# 60 s here, longer than every deadline below, so only the configuration
# generation bumped at commit can make a change reach the relay in time:
# a url, headers, paused, credentials, an added or deleted destination,
# TRUNCATE, a route; a rolled-back change has no effect and a change in a
# long transaction none until it commits.  Then the relays' CPU with
# 1,000 paused destinations and a short poll: no longer a load of every
# destination at every step.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use MIME::Base64 qw(decode_base64);
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# far below the poll interval (60 s) and the relay's periodic reload
my $DEADLINE = 15;

my $sink = start_sink();
my $node = new_outbox_node('confcache', qq{
outbox.poll_interval = '60s'
outbox.workers_per_database = 2
});
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES
		('a', '$sink->{url}/ok/a1'),
		('other', '$sink->{url}/ok/other');
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE pid IS NOT NULL}),
	'both relays run');

# One event; wait (up to the deadline) until the sink has a request for
# it; returns that request's record, or undef.
sub deliver
{
	my ($dest) = @_;
	return deliver_one($node, $sink, 'cc.event', $dest, $DEADLINE);
}

# An event that must not be leased: emitted to dest, then an event of
# 'other' is delivered (so the relays have run a lease step since);
# returns the first event's status:attempts.
sub not_leased
{
	my ($id) = @_;
	ok(defined deliver('other'), 'a later event of another destination is delivered');
	return $node->safe_psql('postgres', qq{
		SELECT status || ':' || attempts FROM outbox.events WHERE id = '$id'});
}

my $r = deliver('a');
ok(defined $r && $r->{path} eq '/ok/a1', 'first event goes to the first url');

# url
$node->safe_psql('postgres', qq{UPDATE outbox.destinations SET url = '$sink->{url}/ok/a2' WHERE name = 'a'});
$r = deliver('a');
ok(defined $r && $r->{path} eq '/ok/a2', 'a changed url takes effect at once');

# headers
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET headers = '{"X-Tenant": "t2"}' WHERE name = 'a'});
$r = deliver('a');
is(defined $r ? $r->{headers}{'x-tenant'} : undef, 't2', 'changed headers take effect at once');

# rolled back: no effect
$node->safe_psql('postgres', qq{
	BEGIN;
	UPDATE outbox.destinations SET url = '$sink->{url}/ok/rolled', headers = '{}' WHERE name = 'a';
	ROLLBACK;});
$r = deliver('a');
ok(defined $r && $r->{path} eq '/ok/a2' && ($r->{headers}{'x-tenant'} // '') eq 't2',
	'a rolled-back change has no effect');

# a long transaction: nothing until it commits, then at once
my $long = $node->background_psql('postgres');
$long->query_safe(qq{BEGIN; UPDATE outbox.destinations SET url = '$sink->{url}/ok/long' WHERE name = 'a';});
$r = deliver('a');
ok(defined $r && $r->{path} eq '/ok/a2', 'an uncommitted change has no effect');
$long->query_safe('COMMIT');
$long->quit;
$r = deliver('a');
ok(defined $r && $r->{path} eq '/ok/long', 'the long transaction\'s change takes effect at its commit');

# paused, then resumed
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = true WHERE name = 'a'});
my ($held) = emit_events($node, 'cc.event', 'a', 1);
is(not_leased($held), 'pending:0', 'a paused destination\'s event is not leased');
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false WHERE name = 'a'});
ok(wait_until(sub { grep { ($_->{id} // '') eq $held } sink_records($sink) }, $DEADLINE),
	'resumed, its event is delivered at once');

# credentials (a RabbitMQ destination: basic authentication)
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.credentials (name, username, password) VALUES ('rc', 'user1', 'pass1');
	INSERT INTO outbox.destinations (name, kind, url, credentials, max_attempts, options)
	VALUES ('rmq', 'rabbitmq', '$sink->{url}', 'rc', 1, '{"exchange": "events"}');
});
sub basic_user
{
	my ($rec) = @_;
	return undef unless defined $rec && defined $rec->{headers}{authorization};
	my ($b64) = $rec->{headers}{authorization} =~ /^Basic (\S+)$/;
	return defined $b64 ? decode_base64($b64) : undef;
}
# The sink does not answer like a broker and its log has no message ids
# for this kind: wait for the next request to the publish path (the event
# goes dead after it, max_attempts 1).
sub deliver_rmq
{
	my $before = grep { $_->{path} =~ m{^/api/exchanges/} } sink_records($sink);
	my @recs;
	emit_events($node, 'cc.event', 'rmq', 1);
	wait_until(sub {
		@recs = grep { $_->{path} =~ m{^/api/exchanges/} } sink_records($sink);
		return @recs > $before;
	}, $DEADLINE);
	return @recs > $before ? $recs[-1] : undef;
}
is(basic_user(deliver_rmq()), 'user1:pass1', 'a new destination with credentials is used at once');
$node->safe_psql('postgres', q{UPDATE outbox.credentials SET username = 'user2', password = 'pass2' WHERE name = 'rc'});
is(basic_user(deliver_rmq()), 'user2:pass2', 'changed credentials take effect at once');

# added destination
$node->safe_psql('postgres', qq{INSERT INTO outbox.destinations (name, url) VALUES ('b', '$sink->{url}/ok/b')});
$r = deliver('b');
ok(defined $r && $r->{path} eq '/ok/b', 'an added destination is delivered at once');

# a route added: emit() routes by it, the relay delivers
$node->safe_psql('postgres', q{INSERT INTO outbox.routes (pattern, destination) VALUES ('cc.routed.*', 'b')});
my $rid = $node->safe_psql('postgres', q{SELECT outbox.emit('cc.routed.x', 'r1', '{}')});
ok(wait_until(sub { grep { ($_->{id} // '') eq $rid && $_->{path} eq '/ok/b' } sink_records($sink) }, $DEADLINE),
	'an added route is used at once');
$node->safe_psql('postgres', q{DELETE FROM outbox.routes});

# deleted destination: an event emitted in the transaction that deletes
# it is never leased (a stale cache would send it to /ok/b)
my $gone = $node->safe_psql('postgres', q{
	BEGIN;
	SELECT outbox.emit('cc.event', 'g1', '{}', destination => 'b');
	DELETE FROM outbox.destinations WHERE name = 'b';
	COMMIT;});
is(not_leased($gone), 'pending:0', 'a deleted destination\'s events are not leased');

# TRUNCATE: the same for every destination
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false});
my $trunc = $node->safe_psql('postgres', q{
	BEGIN;
	SELECT outbox.emit('cc.event', 't1', '{}', destination => 'a');
	TRUNCATE outbox.destinations CASCADE;
	INSERT INTO outbox.destinations (name, url) VALUES ('other', 'http://127.0.0.1:} . $sink->{port} . q{/ok/other2');
	COMMIT;});
is(not_leased($trunc), 'pending:0', 'after TRUNCATE the old destinations are gone for the relay');
ok((grep { $_->{path} eq '/ok/other2' } sink_records($sink)) >= 1, 'and the row added after it is used');

# ---- a retry comes due long before the next poll (60 s) ----
# The relay that wrote the retry wakes for it: three attempts 100 and 200
# ms apart, answered 503, 503, 204, take well under the deadline.
$node->safe_psql('postgres', q{INSERT INTO outbox.destinations (name, url, backoff_base_ms) VALUES ('again', 'http://127.0.0.1:} . $sink->{port} . q{/failfirst/2/503/again', 100)});
my ($again) = emit_events($node, 'cc.event', 'again', 1);
my $t_again = time;
ok(wait_until(sub { grep { ($_->{id} // '') eq $again && $_->{answer} == 204 } sink_records($sink) }, $DEADLINE),
	'a retry due before the next poll is sent when due, not at the poll');
note(sprintf('two retries 100 and 200 ms apart (plus jitter) answered after %.2f s', time - $t_again));

# ---- an ordered destination's events committed while its batch is out ----
# An ordered destination has one batch in flight at a time, so an event
# that commits while the first is being sent cannot be claimed then; it
# must be claimed once that batch is acknowledged, not at a sweep (the
# periodic one no longer reads the log: this waited for the safety net's
# reload, 10 s here, and forever with fewer changes; it failed 029 in CI).
# Each request takes 1 s here.
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, options)
	VALUES ('inorder', '$sink->{url}/delay/1000/inorder', '{"ordering": "aggregate"}')});
my ($first) = emit_events($node, 'cc.event', 'inorder', 1);
ok($node->poll_query_until('postgres', qq{
	SELECT leased_until IS NOT NULL FROM outbox.events WHERE id = '$first'}),
	'an ordered destination\'s first event is being sent');
my ($second) = emit_events($node, 'cc.event', 'inorder', 1);
my $t_second = time;
ok(wait_until(sub { my $r = sink_ids($sink, '/delay/1000/inorder'); $r->{$first} && $r->{$second} }, 5),
	'an event committed while its ordered destination\'s batch was in flight is delivered after it');
note(sprintf('the second event arrived %.2f s after its commit (the first took 1 s)', time - $t_second));

# ---- CPU with 1,000 paused destinations, then 1,000 idle ones ----
# A paused destination costs a relay nothing per lease step: no load, no
# claim, and the sweep does not look at it.  (Before the cache every step
# loaded and validated all 1,000, four times a second at this poll: about
# 6 times the CPU.)  An idle destination that is not paused costs no
# claim; it costs the periodic sweep a few index probes, run by the first
# relay worker only (issue #19).
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.poll_interval = '250ms'});
$node->safe_psql('postgres', q{SELECT pg_reload_conf()});
my $added_at = $node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, paused)
	SELECT 'idle' || g, '$sink->{url}/ok/idle' || g, true FROM generate_series(1, 1000) g;
	SELECT clock_timestamp();
});
ok(defined deliver('other'), 'the relays loaded 1,000 destinations');
# both relays have run a lease step since (last_cycle_at) and are idle
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM outbox.workers()
	 WHERE pid IS NOT NULL AND state = 'idle' AND last_cycle_at > '$added_at'}),
	'both relays are idle');

sub cpu_ticks
{
	my $ticks = 0;
	for my $pid (@_)
	{
		open(my $fh, '<', "/proc/$pid/stat") or die "could not read /proc/$pid/stat: $!";
		my $stat = <$fh>;
		close $fh;
		$stat =~ s/^.*\) //s;
		my @f = split / /, $stat;
		$ticks += $f[11] + $f[12];	# utime + stime (fields 14 and 15)
	}
	return $ticks;
}
my @pids = relay_pids($node, 'postgres');
is(scalar(@pids), 2, 'two relay processes');
my $hz = `getconf CLK_TCK` + 0 || 100;

# the relays' share of a core over 10 s
sub relay_share
{
	my $t0 = time;
	my $c0 = cpu_ticks(@pids);
	sleep 10;
	return (cpu_ticks(@pids) - $c0) / $hz / (time - $t0);
}
my $share = relay_share();
note(sprintf('relay CPU with 1,000 paused destinations, poll 250 ms: %.2f %% of a core (2 relays, 10 s)',
	100 * $share));
cmp_ok($share, '<', 0.05, 'paused destinations cost the relays (almost) nothing');

# the same destinations idle, not paused, at the default poll interval (1 s)
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET outbox.poll_interval = '1s';
	SELECT pg_reload_conf();
	UPDATE outbox.destinations SET paused = false WHERE name LIKE 'idle%'});
ok(defined deliver('other'), 'the relays loaded the resumed destinations');
sleep 2;
$share = relay_share();
note(sprintf('relay CPU with 1,000 idle destinations, poll 1 s: %.2f %% of a core (2 relays, 10 s)',
	100 * $share));
cmp_ok($share, '<', 0.05, 'idle destinations cost the relays little: no claim, a sweep a second');

$node->stop;
stop_sink($sink);
done_testing();
