# Killing things: a relay worker killed with SIGKILL mid-batch, the whole
# server stopped with -m immediate mid-batch, a relay sent SIGTERM while its
# requests hang — nothing is lost and nothing hangs.  DROP DATABASE of
# another database completes promptly while the relay waits on HTTP, and
# the extension can be dropped and re-created under a running relay.
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
my $node = new_outbox_node('crash', "outbox.workers_per_database = 2\nrestart_after_crash = on\n");
$node->start;
my $u = $sink->{url};

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, backoff_base_ms, backoff_max_ms) VALUES
		('slowish', '$u/delay/100/a', 2000, 20, 50, 500),
		('hang',    '$u/hang/b', 60000, 20, 50, 500);
	UPDATE outbox.destinations SET paused = true WHERE name = 'hang';
});

sub emit_n
{
	my ($dest, $n, $tag) = @_;
	return emit_events($node, "crash.$tag", $dest, $n);
}

sub zero_lost
{
	my ($name, @ids) = @_;
	return assert_zero_lost($sink, $name, '', @ids);
}

sub count_published
{
	my ($tag) = @_;
	return $node->safe_psql('postgres', qq{SELECT count(*) FROM outbox.events WHERE type = 'crash.$tag' AND status = 'published'});
}

# SIGKILL of a relay worker in the middle of a batch
my @ids = emit_n('slowish', 600, 'kill9');
ok(wait_until(sub { count_published('kill9') >= 50 }, 60), 'delivery under way');
my ($victim) = relay_pids($node, 'postgres');
kill 'KILL', $victim;
note("killed relay $victim with SIGKILL");
ok($node->poll_query_until('postgres', q{SELECT count(*) = 600 FROM outbox.events WHERE type = 'crash.kill9' AND status = 'published'}),
	'SIGKILL: every event is published after the restart');
zero_lost('SIGKILL', @ids);

# immediate shutdown of the whole server mid-batch, then restart
@ids = emit_n('slowish', 600, 'immediate');
ok(wait_until(sub { count_published('immediate') >= 50 }, 60), 'delivery under way again');
$node->stop('immediate');
$node->start;
ok($node->poll_query_until('postgres', q{SELECT count(*) = 600 FROM outbox.events WHERE type = 'crash.immediate' AND status = 'published'}),
	'immediate stop: every event is published after the restart');
zero_lost('immediate stop', @ids);

# SIGTERM while every request hangs: the worker exits promptly
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = false WHERE name = 'hang'});
emit_n('hang', 10, 'hang');
ok(wait_until(sub { scalar(grep { $_->{path} eq '/hang/b' } sink_records($sink)) >= 5 }, 30),
	'requests to the hanging destination are in flight');

# DROP DATABASE elsewhere must not wait for the relay's hanging requests
# (the relay waits on its latch, so it answers the ProcSignalBarrier)
$node->safe_psql('postgres', 'CREATE DATABASE scratch');
my $t0 = time;
$node->safe_psql('postgres', 'DROP DATABASE scratch');
my $drop_time = time - $t0;
ok($drop_time < 10, sprintf('DROP DATABASE of another database completes promptly (%.2f s; the requests hang for 60 s)', $drop_time));

my @pids = relay_pids($node, 'postgres');
$t0 = time;
kill 'TERM', @pids;
ok(wait_until(sub { !grep { kill(0, $_) } @pids }, 10), 'SIGTERM: relays with hanging requests exit');
my $exit_time = time - $t0;
ok($exit_time < 5, sprintf('... within %.2f s (the requests hang for 60 s)', $exit_time));
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'the launcher starts new relays');
$node->safe_psql('postgres', q{UPDATE outbox.destinations SET paused = true WHERE name = 'hang'});

# DROP and CREATE EXTENSION under a running relay
@ids = emit_n('slowish', 50, 'before_drop');
$node->safe_psql('postgres', 'DROP EXTENSION outbox_pg');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'relays exit when the extension is dropped');
sleep 2;
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'}),
	'0', 'and are not restarted in a loop');
ok($node->log_contains('is exiting: the extension is not installed'), 'the reason is logged');
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url) VALUES ('again', '$u/ok/again');
});
@ids = emit_n('again', 20, 'after_create');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 20 FROM outbox.events WHERE status = 'published'}),
	'after CREATE EXTENSION the first emit() brings a relay back and events flow');
zero_lost('re-created extension', @ids);

# An inbox handler that crashes the server (here: its worker killed with
# SIGKILL while it runs), again at every attempt.  The lease counts the
# attempt before the handler runs; that count must survive the crash, or
# the message looks new after every restart and crash-loops the server for
# ever.  The relay commits asynchronously, and the WAL writer writes such
# commits out every wal_writer_delay: 10 s here, so only a lease the relay
# flushed itself survives a kill a moment after it.
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET wal_writer_delay = '10s';
	SELECT pg_reload_conf();
	CREATE FUNCTION public.crash_me(m inbox.messages) RETURNS void
	LANGUAGE sql AS $$ SELECT pg_sleep(60) $$;
	SELECT inbox.register_handler('crash.*', 'public.crash_me(inbox.messages)', max_attempts => 2);
	SELECT inbox.receive('crash-1', 'crash.now', '{}');
});
my $crash_status = sub {
	my ($rc, $out) = $node->psql('postgres', q{
		SELECT status || ' ' || attempts FROM inbox.messages WHERE id = 'crash-1'});
	return $rc == 0 ? $out : '';
};
my $kills = 0;
while ($kills < 4)
{
	my $pid;
	last unless wait_until(sub {
		my ($rc, $out) = $node->psql('postgres', q{
			SELECT pid FROM pg_stat_activity
			WHERE backend_type = 'outbox_pg relay' AND wait_event = 'PgSleep'});
		$pid = $out if $rc == 0 && $out ne '';
		return defined $pid || $crash_status->() =~ /^dead/;
	}, 60);
	last unless defined $pid;
	kill 'KILL', $pid;
	$kills++;
	note("killed relay $pid in the inbox handler, kill $kills");
	wait_until(sub { !kill(0, $pid) }, 10);
}
is($kills, 2, 'a handler that crashes the server runs max_attempts times');
ok(wait_until(sub { $crash_status->() eq 'dead 3' }, 30),
	'then its message is dead-lettered: the counted attempts survived the crashes');
$node->safe_psql('postgres', q{
	ALTER SYSTEM RESET wal_writer_delay;
	SELECT pg_reload_conf();
	SELECT inbox.unregister_handler('crash.*');
});

ok(!$node->log_contains('terminated by signal 11'), 'no worker crashed');

$node->stop;
stop_sink($sink);
done_testing();
