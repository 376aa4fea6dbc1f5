# A backlog of 200,000 events drains with flat relay memory (issue #13).
# The events are emitted while their destination is paused (through
# outbox.emit(), in transactions of 1,000), then the destination is resumed and
# the default number of relay workers drains it into the fast sink.  The
# relay's anonymous resident memory (RssAnon) is sampled near the start,
# in the middle and at the end of the drain: the end may not exceed the
# middle by more than 4 MB (the per-cycle and per-event memory contexts
# are reset and deleted; nothing may grow with the number of events sent).
# RssAnon has short peaks of a few MB that come back down (a large
# statement result, malloc keeping freed blocks for a while), so each
# point is the lowest of several samples: what stays, not what passes.
# The highest sample is reported and capped too.  Every event is
# published and reached the sink.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $N = 200_000;
my $CHUNK = 50_000;
my $GROWTH_KB = 4096;
my $PEAK_KB = 32768;

my $sink = start_fast_sink();
my $node = new_outbox_node('backlog');

# glibc's malloc raises its mmap threshold after a large block is freed,
# and from then on keeps such blocks in the heap: RssAnon steps up once by
# the size of the largest transient allocation (about 3 MB here) and stays
# there although nothing is in use.  A fixed threshold returns large
# blocks at once, so RssAnon shows what the relay holds; a leak of a few
# bytes per event would otherwise hide inside that step.
$ENV{MALLOC_MMAP_THRESHOLD_} = 128 * 1024;
$node->start;
delete $ENV{MALLOC_MMAP_THRESHOLD_};
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, paused) VALUES ('bulk', '$sink->{url}/bulk', true);
});

my $t0 = time;
for (my $done = 0; $done < $N; $done += $CHUNK)
{
	# in transactions of 1,000 events: since 0.4.0 a claim takes whole
	# transactions, so one transaction's events are in the relay at once
	# (docs/relay.md, "Known limits"); 50,000 in one made it peak at 250 MB
	$node->safe_psql('postgres', qq{
		DO \$\$
		BEGIN
			FOR i IN 0 .. $CHUNK / 1000 - 1 LOOP
				PERFORM count(outbox.emit('bulk.test', g::text, jsonb_build_object('n', g), destination => 'bulk'))
				   FROM generate_series($done + i * 1000 + 1, $done + (i + 1) * 1000) AS g;
				COMMIT;
			END LOOP;
		END \$\$});
}
my $emit_secs = time - $t0;
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'pending'}),
	$N, "$N events pending");
note(sprintf('emitted %d events in %.1f s (%.0f/s)', $N, $emit_secs, $N / $emit_secs));

my @pids = relay_pids($node, 'postgres');
my $workers = $node->safe_psql('postgres', 'SHOW outbox.workers_per_database');
is(scalar(@pids), $workers, "the default number of relay workers runs ($workers)");

sub sum_rss { my $t = 0; $t += rss_anon_kb($_) for @pids; return $t; }

# published so far; every call also samples the relays' memory
my @samples;
sub published
{
	my $n = $node->safe_psql('postgres', q{SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'});
	push @samples, [ $n, sum_rss() ];
	return $n;
}

my %rss = (idle => sum_rss());

# the lowest RssAnon among the samples taken while published was in [lo, hi)
sub floor_between
{
	my ($lo, $hi) = @_;
	my @in = map { $_->[1] } grep { $_->[0] >= $lo && $_->[0] < $hi } @samples;
	return (sort { $a <=> $b } @in)[0];
}
$t0 = time;
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false WHERE name = 'bulk'});

# start: 5-15 % of the drain; middle: 45-55 %; end: once drained
my ($start_at, $middle_at);
ok(wait_until(sub { published() >= $N * 0.05 }, 120), 'the drain is under way');
$start_at = time;
ok(wait_until(sub { published() >= $N * 0.5 }, 120), 'half the backlog is published');
$middle_at = time;
ok(wait_until(sub { published() >= $N }, 120), 'every event is acknowledged');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.events WHERE status = 'pending'}),
	'the backlog is drained');
my $drain_secs = time - $t0;
$rss{start} = floor_between($N * 0.05, $N * 0.15);
$rss{middle} = floor_between($N * 0.45, $N * 0.55);
my @end;
for (1 .. 10)
{
	push @end, sum_rss();
	usleep(100_000);			# samples over a second of the idle relay
}
$rss{end} = (sort { $a <=> $b } @end)[0];
$rss{peak} = (sort { $b <=> $a } map { $_->[1] } @samples, map { [ 0, $_ ] } @end)[0];

note(sprintf('drained %d events in %.1f s: %.0f events/s (%.0f/s between 5 %% and 50 %%)',
	$N, $drain_secs, $N / $drain_secs, $N * 0.45 / ($middle_at - $start_at)));
note(sprintf('relay RssAnon (kB, %d worker(s)): idle %d, start %d, middle %d, end %d; highest sample %d',
	scalar(@pids), $rss{idle}, $rss{start}, $rss{middle}, $rss{end}, $rss{peak}));
# the course of the drain, at every tenth of it
my ($next, @course) = (0);
for my $s (@samples)
{
	next if $s->[0] < $next;
	push @course, sprintf('%d%%: %d', 100 * $s->[0] / $N, $s->[1]);
	$next = (int(10 * $s->[0] / $N) + 1) * $N / 10;
}
note('relay RssAnon (kB) during the drain: ' . join(', ', @course));
cmp_ok($rss{end}, '<=', $rss{middle} + $GROWTH_KB,
	sprintf('relay memory is flat: end <= middle + %d kB (grew %d kB)', $GROWTH_KB, $rss{end} - $rss{middle}));
cmp_ok($rss{peak}, '<=', $PEAK_KB, "relay memory never exceeded $PEAK_KB kB");
is(join(' ', sort(relay_pids($node, 'postgres'))), join(' ', sort(@pids)), 'the same relay workers did the whole drain');

is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}),
	$N, 'every event is published');
ok(wait_until(sub { scalar(keys %{ fast_sink_ids($sink) }) >= $N }, 10), 'the sink has written every id');
my $ids = fast_sink_ids($sink);
my @missing = grep { !$ids->{$_} } split /\n/,
  $node->safe_psql('postgres', q{SELECT id FROM outbox.events});
is(scalar(@missing), 0, 'every event reached the sink');
my $requests = 0;
$requests += $_ for values %$ids;
note(sprintf('%d requests for %d events', $requests, $N));

$node->stop;
stop_sink($sink);
done_testing();
