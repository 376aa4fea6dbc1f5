# The wall clock stepped back under running workers (an operator's date,
# NTP correcting a clock that was ahead, a VM restored from a snapshot).
# The workers' timers read the wall clock; a time read before the step lies
# ahead of every reading after it.  Before, a quiet destination's claims
# waited for the 2 ms gathering window to end at the old reading (an hour
# for an hour's step), and so did the inbox's idle recheck and the sweep:
# nothing new was delivered or processed for as long as the step.
#
# The server runs with test/sink/clock_shift.c preloaded, a shim that adds
# the seconds written in a file to the wall clock; the test rewrites it:
# an hour back, then the real time again (a step forward: leases end
# early, which can only send an event again).  CLOCK_MONOTONIC is left
# real, as a real step leaves it.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $shim_dir = PostgreSQL::Test::Utils::tempdir('clock_shift');
my $shim = "$shim_dir/clock_shift.so";
my $cc = `cc -Wall -Werror -shared -fPIC -o $shim $FindBin::RealBin/../sink/clock_shift.c -ldl 2>&1`;
die "cc clock_shift.c: $cc" if $? != 0;

my $sink = start_sink();
my $u = $sink->{url};
my $offset_file = "$shim_dir/shift";

sub set_offset
{
	my ($offset) = @_;
	open(my $fh, '>', "$offset_file.new") or die "$offset_file: $!";
	print $fh "$offset\n";
	close $fh;
	rename("$offset_file.new", $offset_file) or die "rename: $!";
}
set_offset('0');

my $node = new_outbox_node('clock', q{
outbox.workers_per_database = 1
});
{
	# only the server runs with the fake clock
	local $ENV{LD_PRELOAD} = $shim;
	local $ENV{CLOCK_SHIFT_FILE} = $offset_file;
	$node->start;
}
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('quiet', '$u/ok/quiet'),
		('held', '$u/failcount/1/429/held?retry_after=5');
	CREATE TABLE public.applied (message_id text PRIMARY KEY, at timestamptz DEFAULT now());
	CREATE FUNCTION public.apply(m inbox.messages) RETURNS void LANGUAGE sql
	  AS \$\$ INSERT INTO public.applied (message_id) VALUES (m.id) \$\$;
	SELECT inbox.register_handler('clock.*', 'public.apply(inbox.messages)');
});

sub published
{
	my ($ids) = @_;
	my $list = join(',', map { "'$_'" } @$ids);
	return $node->safe_psql('postgres',
		qq{SELECT count(*) FROM outbox.events WHERE id::text IN ($list) AND status = 'published'});
}

sub deliver_and_process
{
	my ($label, $n) = @_;
	my @ids;

	# one event at a time, each in its own quiet spell: every claim goes
	# through the gathering window (an emit() names its destination, so
	# its commit's wake-up asks for no sweep, which would skip the window)
	for my $i (1 .. $n)
	{
		push @ids, emit_events($node, 'clock.x', 'quiet', 1);
		select(undef, undef, undef, 0.3);
	}
	my $t0 = time;
	ok(wait_until(sub { published(\@ids) == $n }, 30),
		"$label: $n events to a quiet destination published within 30 s");
	for my $i (1 .. $n)
	{
		$node->safe_psql('postgres', qq{SELECT inbox.receive('$label-$i', 'clock.tick', '{}')});
		select(undef, undef, undef, 0.3);
	}
	ok(wait_until(sub {
		$node->safe_psql('postgres', qq{SELECT count(*) FROM public.applied WHERE message_id LIKE '$label-%'}) == $n }, 30),
		"$label: $n inbox messages processed within 30 s");
	note(sprintf('%s: done %d s after the last one', $label, time - $t0));
	return @ids;
}

my @before = deliver_and_process('before', 3);
my $before_now = $node->safe_psql('postgres', 'SELECT extract(epoch FROM now())::bigint');

# the receiver asks to wait 5 s (Retry-After): the destination's circuit
# is held for every relay
my @held = emit_events($node, 'clock.held', 'held', 1);
ok(wait_until(sub { grep { $_->{path} =~ m{^/failcount/1/429/held} } sink_records($sink) }, 30),
	'held: the receiver answered 429 with Retry-After: 5');

# an hour back: the workers' last readings are an hour ahead
set_offset('-3600');
ok(wait_until(sub {
	$node->safe_psql('postgres', 'SELECT extract(epoch FROM now())::bigint') < $before_now - 3000 }, 10),
	'the server reads a clock an hour back');
ok(wait_until(sub {
	$node->safe_psql('postgres', q{
		SELECT extract(epoch FROM state_change)::bigint FROM pg_stat_activity
		 WHERE backend_type = 'outbox_pg relay'}) < $before_now - 3000 }, 10),
	'... and so does the relay, started before the step');
my @back = deliver_and_process('back', 3);
# the circuit's hold ends in its time; the event answered 429 waits for
# the retry time stored with it (next_attempt_at, compared with now() in
# SQL), which the step put an hour further away: not handled, documented
my @held_after = emit_events($node, 'clock.held', 'held', 2);
ok(wait_until(sub { published(\@held_after) == 2 }, 30),
	'held: the 5 s wait ended in its time, not an hour later: 2 new events published');
push @held, @held_after;

# forward again: leases taken an hour ago end at once; nothing is lost
set_offset('0');
ok(wait_until(sub {
	$node->safe_psql('postgres', 'SELECT extract(epoch FROM now())::bigint') >= $before_now }, 10),
	'the server reads the real time again');
my @forward = deliver_and_process('forward', 3);

assert_zero_lost($sink, 'quiet', '/ok/quiet', @before, @back, @forward);
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.events WHERE status <> 'published'}),
	'every event published, the held one once the clock is back');
assert_zero_lost($sink, 'held', '/failcount/1/429/held', @held);
ok(!$node->log_contains('terminated by signal'), 'no process crashed');

$node->stop;
stop_sink($sink);
done_testing();
