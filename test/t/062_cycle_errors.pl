# A relay cycle that fails is reported the way autovacuum reports a failed
# table: the original error at LOG, with its own SQLSTATE, detail and
# hint, and a context line saying what the relay was doing; the same error
# again within a minute is not logged again; the worker's slot shows it;
# and the text is made safe to log (a control character is escaped).
# Once the cause is gone the relay delivers.  The inbox's cycle errors are
# reported the same way.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);

my $sink = start_sink();
my $node = new_outbox_node('cycle_errors', qq{
outbox.workers_per_database = 1
outbox.lease_margin = 1s
log_error_verbosity = verbose
});
$node->start;
my $u = $sink->{url};

# Every claim fails in a trigger (a claim records its batch in
# outbox.batches); a sequence (not rolled back) counts the failed cycles.
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('ok', '$u/ok/cycle');
	CREATE SEQUENCE tries;
	CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		PERFORM nextval('public.tries');
		RAISE EXCEPTION 'lease refused %', chr(27) || '[31m'
			USING ERRCODE = 'XY123', DETAIL = 'The trigger said no.',
			      HINT = 'Drop the trigger.';
	END \$\$;
	CREATE TRIGGER refuse BEFORE INSERT ON outbox.batches
		FOR EACH ROW EXECUTE FUNCTION refuse();
});
my $log_start = -s $node->logfile;
my ($id) = emit_events($node, 'cycle.failing', 'ok', 1);

sub log_since
{
	return slurp_file($node->logfile, $log_start);
}

ok(wait_until(sub { $node->safe_psql('postgres', 'SELECT last_value >= 4 FROM tries') eq 't' }, 30),
	'the relay keeps trying, a cycle at a time');
my $log = log_since();
my @reports = ($log =~ /^.*LOG:  XY123: lease refused.*$/mg);
is(scalar(@reports), 1, 'four failed cycles, one report: the same error is not logged again within a minute');
like($log, qr/LOG:  XY123: lease refused \\x1b\[31m\n/, 'logged at LOG with its own SQLSTATE, the control character escaped');
like($log, qr/XY123: lease refused.*\n.*DETAIL:  The trigger said no\.\n.*HINT:  Drop the trigger\.\n.*CONTEXT:  PL\/pgSQL function (?:public\.)?refuse\(\)[^\n]*\n(?:\t[^\n]*\n)*\twhile leasing events in database "postgres"\n/,
	'its detail and hint are kept, and the context says what the relay was doing');
unlike($log, qr/\e\[31m/, 'no raw control character reaches the log');
is($node->safe_psql('postgres', q{
	SELECT state || ' | ' || last_error FROM outbox.workers() WHERE database = 'postgres'}),
	'error | lease refused \x1b[31m', 'the slot shows the error');

$node->safe_psql('postgres', 'DROP TRIGGER refuse ON outbox.batches');
is($node->safe_psql('postgres', qq{SELECT outbox.wait_published('$id', '10 s')}), 't',
	'without the trigger the event is delivered');

# the inbox: a failing lease of received messages is one report too
$log_start = -s $node->logfile;
$node->safe_psql('postgres', q{
	SELECT setval('tries', 1, false);
	CREATE TRIGGER refuse BEFORE UPDATE ON inbox.messages
		FOR EACH ROW EXECUTE FUNCTION refuse();
	SELECT inbox.receive('m-1', 'thing.happened', '{}');
});
ok(wait_until(sub { $node->safe_psql('postgres', 'SELECT last_value >= 4 FROM tries') eq 't' }, 30),
	'the inbox keeps trying');
$log = log_since();
@reports = ($log =~ /^.*LOG:  XY123: lease refused.*$/mg);
is(scalar(@reports), 1, 'the inbox reports its failing cycle once');
like($log, qr/CONTEXT:  PL\/pgSQL function (?:public\.)?refuse\(\)[^\n]*\n(?:\t[^\n]*\n)*\twhile leasing inbox messages\n/,
	'with what it was doing');
$node->safe_psql('postgres', 'DROP TRIGGER refuse ON inbox.messages');

# A cycle that fails while it starts the next round of a batch (here the
# renewal of the batch's lease is refused) loses none of the events it
# was starting: the slots they would have taken are free again, and the
# batch is delivered once its lease runs out.  One slot, a receiver that
# answers after 700 ms, a lease of 1 s + 1 s: the second round renews it.
my $slow = start_slow_sink();
$log_start = -s $node->logfile;
$node->safe_psql('postgres', qq{
	UPDATE outbox.destinations SET timeout_ms = 100 WHERE name = 'ok';
	INSERT INTO outbox.destinations (name, url, max_concurrency, timeout_ms)
		VALUES ('one_slot', '$slow->{url}/delay/700/one_slot', 1, 1000);
	SELECT setval('tries', 1, false);
	-- the first UPDATE that moves a lease raises TG_ARGV[0] (its SQLSTATE, TG_ARGV[1])
	CREATE FUNCTION refuse_renewal() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		IF NEW.leased_until <> OLD.leased_until AND nextval('public.tries') = 1 THEN
			RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = TG_ARGV[1];
		END IF;
		RETURN NEW;
	END \$\$;
	CREATE TRIGGER refuse_renewal BEFORE UPDATE ON outbox.batches
		FOR EACH ROW EXECUTE FUNCTION refuse_renewal('renewal refused', 'XY124');
});

# Emit a batch of four events to a destination, see the failure logged,
# then every event delivered and none left counted in flight.
sub delivered_after_failure
{
	my ($dest, $logged, $what) = @_;
	my @ids = emit_events($node, 'slot.kept', $dest, 4);

	ok(wait_until(sub { $node->log_contains($logged, $log_start) }, 20), "$what failed once");
	is($node->safe_psql('postgres', qq{
		SELECT bool_and(outbox.wait_published(id, '30 s'))
		  FROM unnest('{@{[join ',', @ids]}}'::uuid[]) AS id}), 't',
		"$dest: every event of the batch is delivered after it");
	ok(wait_until(sub { $node->safe_psql('postgres', q{
		SELECT sum(in_flight) FROM outbox.workers() WHERE database = 'postgres'}) eq '0' }, 10),
		"$dest: and none is left counted in flight");
}

delivered_after_failure('one_slot', 'XY124: renewal refused', 'the renewal of the batch\'s lease');
$node->safe_psql('postgres', 'DROP TRIGGER refuse_renewal ON outbox.batches');

# The same when the failure comes at the commit of the step that recorded
# a result and took the next events (an ordered destination's: the record
# step starts them): a deferred trigger refuses the renewal's UPDATE at
# commit, after the events were taken for sending.
$log_start = -s $node->logfile;
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, timeout_ms, options)
		VALUES ('one_slot_ordered', '$slow->{url}/delay/700/one_slot_ordered', 1, 1000,
		        '{"ordering": "aggregate"}');
	SELECT setval('tries', 1, false);
	CREATE CONSTRAINT TRIGGER refuse_renewal_at_commit AFTER UPDATE ON outbox.batches
		DEFERRABLE INITIALLY DEFERRED
		FOR EACH ROW EXECUTE FUNCTION refuse_renewal('renewal refused at commit', 'XY125');
});
delivered_after_failure('one_slot_ordered', 'XY125: renewal refused at commit',
	'the commit of a renewal');
$node->safe_psql('postgres', 'DROP TRIGGER refuse_renewal_at_commit ON outbox.batches');

# An answer that comes while the relay's tables are locked (VACUUM FULL,
# LOCK TABLE) is recorded once the lock is gone, not dropped: dropped, its
# batch stayed unacknowledged and was sent again when its lease ran out.
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, timeout_ms)
		VALUES ('locked_out', '$slow->{url}/delay/1500/locked_out', 3000);
});
my ($locked_id) = emit_events($node, 'lock.waited', 'locked_out', 1);
ok(wait_until(sub { (slow_sink_stats($slow)->{names}{locked_out}{in_flight} // 0) == 1 }, 20),
	'the request is out');
$node->safe_psql('postgres', q{
	BEGIN;
	LOCK TABLE outbox.batches IN ACCESS EXCLUSIVE MODE;
	SELECT pg_sleep(3);
	COMMIT;
});
is($node->safe_psql('postgres', qq{SELECT outbox.wait_published('$locked_id', '10 s')}), 't',
	'the answer that came during the lock is recorded after it');
# past the lease (3 s + 1 s) and a sweep: a dropped result would be sent again by now
sleep(3);
is(slow_sink_stats($slow)->{names}{locked_out}{requests}, 1, 'and the event was sent once');
stop_sink($slow);

# A lease step that finds the tables locked is skipped until the lock is
# gone; meanwhile the relays say so (they showed "idle" while the events
# waited).
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url) VALUES ('lease_locked', '$u/lease_locked');
});
my $locker = IPC::Run::start(
	[
		'psql', '-XAtq', '-d', $node->connstr('postgres'),
		'-c', 'BEGIN',
		'-c', 'LOCK TABLE outbox.streams IN EXCLUSIVE MODE',
		'-c', 'SELECT pg_sleep(4)',
		'-c', 'COMMIT'
	],
	'>', \my $locker_out, '2>', \my $locker_err);
ok(wait_until(sub { $node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_locks WHERE relation = 'outbox.streams'::regclass
	   AND mode = 'ExclusiveLock' AND granted}) eq '1' }, 10), 'the streams are locked');
my ($waiting_id) = emit_events($node, 'lock.lease', 'lease_locked', 1);
ok(wait_until(sub { $node->safe_psql('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity
	 WHERE backend_type = 'outbox_pg relay'
	   AND query = 'waiting for a lock on the outbox tables to lease events'}) eq 't' }, 3),
	'the relays say they wait for a lock to lease');
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT state, ',') FROM outbox.workers() WHERE database = 'postgres'
	   AND pid IN (SELECT pid FROM pg_stat_activity
	                WHERE query = 'waiting for a lock on the outbox tables to lease events')}),
	'working', 'as working, not idle');
$locker->finish;
is($node->safe_psql('postgres', qq{SELECT outbox.wait_published('$waiting_id', '15 s')}), 't',
	'once the lock is gone the event is delivered');

# A lease step that fails after it claimed for one destination (the claim
# of the second destination of the pass is refused) rolls that claim back:
# the first destination's events are claimed again, though nothing more is
# emitted to it.
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url) VALUES
		('pair_a', '$u/pair/a'), ('pair_b', '$u/pair/b');
});
for my $d ('pair_a', 'pair_b')
{
	my ($first) = emit_events($node, 'pair.first', $d, 1);
	is($node->safe_psql('postgres', qq{SELECT outbox.wait_published('$first', '10 s')}), 't',
		"$d delivers before the failing claim");
}
$log_start = -s $node->logfile;
$node->safe_psql('postgres', q{
	CREATE SEQUENCE pair_claims;
	CREATE FUNCTION refuse_second_claim() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF nextval('public.pair_claims') = 2 THEN
			RAISE EXCEPTION 'second claim refused' USING ERRCODE = 'XY126';
		END IF;
		RETURN NEW;
	END $$;
	CREATE TRIGGER refuse_second_claim BEFORE INSERT ON outbox.batches
		FOR EACH ROW EXECUTE FUNCTION refuse_second_claim();
});
my @pair = split / /, $node->safe_psql('postgres', q{
	SELECT outbox.emit('pair.second', 'a', '{}', destination => 'pair_a')::text || ' ' ||
	       outbox.emit('pair.second', 'b', '{}', destination => 'pair_b')::text});
ok(wait_until(sub { $node->log_contains('XY126: second claim refused', $log_start) }, 20),
	'the lease step failed at its second claim');
is($node->safe_psql('postgres', qq{
	SELECT bool_and(outbox.wait_published(id, '15 s'))
	  FROM unnest('{@{[join ',', @pair]}}'::uuid[]) AS id}), 't',
	'both destinations\' events are delivered, the one whose claim was rolled back too');
$node->safe_psql('postgres', 'DROP TRIGGER refuse_second_claim ON outbox.batches');

# Relay 0's routing of events emitted without a destination fails (a
# trigger refuses what it writes): it is logged and tried again later,
# and delivery goes on.  It failed the lease step, at every cycle.
$log_start = -s $node->logfile;
# emitted before its route exists: routed later, by relay 0
my $unrouted = $node->safe_psql('postgres', q{SELECT outbox.emit('route.me', 'r', '{}')});
# (one transaction: the route must not exist without the trigger)
$node->safe_psql('postgres', qq{
	BEGIN;
	INSERT INTO outbox.destinations (name, url) VALUES ('routed', '$u/routed');
	INSERT INTO outbox.routes (pattern, destination) VALUES ('route.*', 'routed');
	CREATE FUNCTION refuse_routing() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		RAISE EXCEPTION 'routing refused' USING ERRCODE = 'XY127',
			DETAIL = 'The trigger said no.';
	END \$\$;
	CREATE TRIGGER refuse_routing BEFORE INSERT ON outbox.settled_events
		FOR EACH ROW EXECUTE FUNCTION refuse_routing();
	COMMIT;
});
ok(wait_until(sub { $node->log_contains(
	'outbox_pg routing of events emitted without a destination failed: routing refused', $log_start) }, 20),
	'the routing failed, and said so');
like(log_since(), qr/LOG:  XY127: outbox_pg routing of events emitted without a destination failed: routing refused\n.*DETAIL:  The trigger said no\.\n.*HINT:  Delivery continues; the routing is tried again in 5000 ms\.\n.*CONTEXT:  PL\/pgSQL function (?:public\.)?refuse_routing\(\)/,
	'with its SQLSTATE, detail and context, and what happens next');
my ($beside) = emit_events($node, 'route.beside', 'ok', 1);
is($node->safe_psql('postgres', qq{SELECT outbox.wait_published('$beside', '10 s')}), 't',
	'the relay delivers while its routing fails');
ok(!$node->log_contains('XY127: routing refused', $log_start), 'and no cycle failed');
$node->safe_psql('postgres', 'DROP TRIGGER refuse_routing ON outbox.settled_events');
is($node->safe_psql('postgres', qq{SELECT outbox.wait_published('$unrouted', '20 s')}), 't',
	'the routed event is delivered once the routing succeeds');

# A failing cycle pauses a second before the next, however many commits
# wake the relay meanwhile: each of them cut the pause short, and a busy
# database retried a failing cycle at its commit rate.
$node->safe_psql('postgres', q{
	CREATE SEQUENCE busy_tries;
	CREATE FUNCTION refuse_busy() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM nextval('public.busy_tries');
		RAISE EXCEPTION 'claim refused' USING ERRCODE = 'XY128';
	END $$;
	CREATE TRIGGER refuse_busy BEFORE INSERT ON outbox.batches
		FOR EACH ROW EXECUTE FUNCTION refuse_busy();
});
my $t0 = time;
for my $i (1 .. 60)
{
	emit_events($node, 'busy.commit', 'ok', 1);	# one commit, one wake-up
	usleep(30_000);
}
my $busy_secs = time - $t0;
my $busy_tries = $node->safe_psql('postgres', 'SELECT last_value FROM busy_tries');
$node->safe_psql('postgres', 'DROP TRIGGER refuse_busy ON outbox.batches');
note(sprintf('%d failed cycles in %.1f s of 60 commits', $busy_tries, $busy_secs));
ok($busy_tries <= $busy_secs + 3,
	sprintf('a failing cycle is retried about once a second, not at every commit (%d in %.1f s)',
		$busy_tries, $busy_secs));

ok(!$node->log_contains('terminated by signal'), 'no process crashed');
$node->stop;
stop_sink($sink);
done_testing();
