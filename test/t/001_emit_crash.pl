# Events committed with outbox.emit() survive a crash of the server; events
# of a transaction that was in flight at the crash never appear.  Also: the
# library works when only loaded on demand (no shared_preload_libraries).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'outbox_pg'");
$node->start;

$node->safe_psql('postgres', q{
	CREATE EXTENSION outbox_pg;
	CREATE TABLE payments (id int PRIMARY KEY, amount numeric);
});

# 200 committed transactions, each with its business row and its event
$node->safe_psql('postgres', q{
	DO $$
	BEGIN
		FOR i IN 1..200 LOOP
			INSERT INTO payments VALUES (i, i);
			PERFORM outbox.emit('payment.created', i::text, jsonb_build_object('amount', i));
			COMMIT;
		END LOOP;
	END
	$$;
});

# a transaction left open at the moment of the crash
my $inflight = $node->background_psql('postgres');
$inflight->query_safe(q{
	BEGIN;
	INSERT INTO payments VALUES (1001, 1);
	SELECT outbox.emit('payment.created', '1001', '{}');
});

$node->stop('immediate');
$inflight->{run}->kill_kill;
$node->start;

is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.events'),
	'200', 'every committed event survived the crash');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM payments p JOIN outbox.events e ON e.aggregate_id = p.id::text
}), '200', 'each event matches its business row');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.events WHERE aggregate_id = '1001'}),
	'0', 'the in-flight transaction left no event');
is($node->safe_psql('postgres', q{SELECT count(DISTINCT id) FROM outbox.events}),
	'200', 'message ids are unique');

# without shared_preload_libraries the functions still work (loaded on demand)
$node->stop;
$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$node->start;
is($node->safe_psql('postgres', q{
	SELECT outbox.emit('payment.created', '201', '{}') IS NOT NULL
}), 't', 'emit works when the library is loaded on demand');
is($node->safe_psql('postgres', q{SELECT inbox.claim('x')::text || inbox.claim('x')::text}),
	'truefalse', 'claim works when the library is loaded on demand');

$node->stop;
done_testing();
