# Events emitted in a prepared transaction (two-phase commit): nothing is
# delivered before COMMIT PREPARED, everything after it, and nothing after
# ROLLBACK PREPARED.  COMMIT PREPARED runs no callback of ours, so no
# commit wakes the relays: the PREPARE bumps the prepared generation and
# the relays' periodic sweep looks at the log while prepared transactions
# exist or were prepared since (delivery.c).  With 1,000 other
# destinations, so that the sweep is the light one otherwise; an ordinary
# commit next to a prepared transaction is delivered at once (the
# prepared xid sits in the claim's snapshot and holds nothing back).
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $sink = start_sink();
my $u = $sink->{url};
my $node = new_outbox_node('twophase', q{
outbox.poll_interval = '1s'
outbox.workers_per_database = 2
max_prepared_transactions = 10
});
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES
		('tp', '$u/ok/tp'), ('plain', '$u/ok/plain'), ('quiet', '$u/ok/quiet');
	INSERT INTO outbox.destinations (name, url)
	SELECT 'd' || g, '$u/ok/d' || g FROM generate_series(1, 1000) g;
});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}),
	'two relay workers run');

# a first event each, so that every stream has a position
my @warm = emit_events($node, 'warm.up', 'tp', 1);
push @warm, emit_events($node, 'warm.up', 'plain', 1);
ok(wait_until(sub { my $ids = sink_ids($sink); !grep { !$ids->{$_} } @warm }, 60),
	'ordinary events are delivered');

sub prepare_emit
{
	my ($gid, $dest, $n) = @_;
	my $ids = $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT string_agg(outbox.emit('tp.event', '$gid-' || g, '{}', destination => '$dest')::text, ' ')
		  FROM generate_series(1, $n) g;
		PREPARE TRANSACTION '$gid';
	});
	my @ids = grep { /\S/ } split /\s+/, $ids;
	is(scalar(@ids), $n, "$gid: $n events emitted in a transaction that was prepared");
	return @ids;
}

sub delivered
{
	my @ids = @_;
	my $got = sink_ids($sink);
	return scalar(grep { $got->{$_} } @ids);
}

# 1. prepared, then committed a few sweeps later
my @a = prepare_emit('a', 'tp', 5);
sleep 3;
is(delivered(@a), 0, 'a: nothing is delivered while the transaction is prepared');

# an ordinary commit meanwhile is delivered at once, to the same destination
my $t0 = time;
my @b = emit_events($node, 'tp.plain', 'tp', 3);
ok(wait_until(sub { delivered(@b) == 3 }, 30),
	'an ordinary commit to the same destination is delivered while a transaction is prepared');
note(sprintf('ordinary commit next to a prepared transaction: delivered after %.2f s', time - $t0));

$node->safe_psql('postgres', q{COMMIT PREPARED 'a'});
$t0 = time;
ok(wait_until(sub { delivered(@a) == 5 }, 60), 'a: every event is delivered after COMMIT PREPARED');
note(sprintf('a: delivered %.2f s after COMMIT PREPARED', time - $t0));

# 2. prepared and committed at once, between two sweeps, on a destination
# that has no other traffic
my @c = prepare_emit('c', 'quiet', 4);
$node->safe_psql('postgres', q{COMMIT PREPARED 'c'});
$t0 = time;
ok(wait_until(sub { delivered(@c) == 4 }, 60),
	'c: prepared and committed at once, on a quiet destination: delivered');
note(sprintf('c: delivered %.2f s after COMMIT PREPARED', time - $t0));

# 3. rolled back: never delivered, and nothing is left pending
my @r = prepare_emit('r', 'tp', 3);
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'r'});
my @after = emit_events($node, 'tp.after', 'tp', 1);
ok(wait_until(sub { delivered(@after) == 1 }, 30), 'an event after the rollback is delivered');
sleep 3;
is(delivered(@r), 0, 'r: nothing of a rolled-back prepared transaction is delivered');

# 4. prepared for longer than many sweeps, then committed by another
# session while the relays are restarted in between
my @l = prepare_emit('l', 'plain', 2);
sleep 2;
$node->restart;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL}),
	'the relays run again after a restart');
is(delivered(@l), 0, 'l: the prepared transaction survives the restart undelivered');
$node->safe_psql('postgres', q{COMMIT PREPARED 'l'});
ok(wait_until(sub { delivered(@l) == 2 }, 60), 'l: delivered after COMMIT PREPARED following a restart');

is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_prepared_xacts}), '0',
	'no prepared transaction is left');
assert_zero_lost($sink, 'two-phase', '/ok/', @warm, @a, @b, @c, @after, @l);
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE status <> 'published'}),
	'0', 'nothing is left pending');

$node->stop;

# 5. committed while every full sweep fails, on one relay with a
# lock_timeout: a session waits for an ACCESS EXCLUSIVE lock on the log's
# tables behind the prepared transaction and holds it for 5 s after COMMIT
# PREPARED, and the sweeps that read the log fail.  A failed sweep is
# tried again and looks at the log once it can.  It forgot what it was
# asked for before it ran, and these events waited for their
# destination's next emit().  (With a second relay, its own sweep found
# them; a reload of the configuration is followed by a full sweep.)
my $one = new_outbox_node('twophase_one', q{
outbox.poll_interval = '1s'
outbox.workers_per_database = 1
outbox.lease_margin = '1s'
max_prepared_transactions = 10
lock_timeout = '100ms'
});
$one->start;
$one->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms) VALUES ('quiet', '$u/ok/quiet1', 1000);
});
my @warm1 = emit_events($one, 'warm.up', 'quiet', 1);
ok(wait_until(sub { delivered(@warm1) == 1 }, 60), 'f: the relay delivers');
# past the relay's one recovery sweep (its first load, plus the longest
# lease and a second), which looks at the log too
sleep 4;
my $fids = $one->safe_psql('postgres', q{
	BEGIN;
	SELECT string_agg(outbox.emit('tp.event', 'f-' || g, '{}', destination => 'quiet')::text, ' ')
	  FROM generate_series(1, 3) g;
	PREPARE TRANSACTION 'f';
});
my @f = grep { /\S/ } split /\s+/, $fids;
is(scalar(@f), 3, 'f: 3 events emitted in a transaction that was prepared');
my $log_start = -s $one->logfile;
my $locker = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $one->connstr('postgres'), '-c', q{
		SET lock_timeout = 0;
		BEGIN;
		LOCK TABLE outbox.log IN ACCESS EXCLUSIVE MODE;
		SELECT pg_sleep(5);
		COMMIT;
	} ], '>', \my $locker_out, '2>', \my $locker_err);
ok($one->poll_query_until('postgres', q{
	SELECT EXISTS (SELECT 1 FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
	                WHERE c.relnamespace = 'outbox'::regnamespace AND c.relname LIKE 'log\\_%'
	                  AND l.mode = 'AccessExclusiveLock' AND NOT l.granted)}),
	'f: a session waits to lock the log');
$one->safe_psql('postgres', q{COMMIT PREPARED 'f'});
ok($one->poll_query_until('postgres', q{
	SELECT count(*) = 3 FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
	 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relname LIKE 'log\\_%'
	   AND l.mode = 'AccessExclusiveLock' AND l.granted}),
	'f: and holds the lock after COMMIT PREPARED');
$locker->finish;
is($?, 0, 'f: the lock is released') or diag($locker_err);
like(slurp_file($one->logfile, $log_start),
	qr/LOG:  outbox_pg sweep for due events failed: canceling statement due to lock timeout/,
	'f: a sweep failed meanwhile');
$t0 = time;
ok(wait_until(sub { delivered(@f) == 3 }, 20),
	'f: committed while the sweeps failed, delivered once they run');
note(sprintf('f: delivered %.2f s after the lock', time - $t0));
assert_zero_lost($sink, 'two-phase, failed sweeps', '/ok/quiet1', @warm1, @f);
$one->stop;
stop_sink($sink);
done_testing();
