# Upgrades and pg_dump.
#
#  - Rolling upgrade: the current library runs against an extension still at
#    0.1.0.  emit() keeps working; the relay delivers nothing and says why
#    (state "waiting for update", last_error, one log line).
#  - ALTER EXTENSION outbox_pg UPDATE while a session keeps emitting and a
#    relay of another database delivers to a slow sink: afterwards every
#    event of both databases reaches the sink (zero lost).
#  - A fresh install of the default version and an upgraded 0.1.0 install
#    have identical extension objects (definitions, columns, constraints,
#    indexes, triggers, ACLs, comments, pg_dump configuration); so does an
#    install of 0.2.0 updated, which warns about a destination 0.2.0
#    accepted and the checks of 0.3.0 refuse.
#  - 0.3.0 -> 0.4.0: the rows of outbox.events in every state (backlog,
#    leased, retrying, dead, published, an ordered aggregate behind a
#    retrying head, one behind a dead letter) keep their status through the
#    view outbox.events, each id once; the relay then delivers every pending
#    one, the ordered aggregate in order.
#  - pg_dump of a database with the extension restored into a fresh
#    database keeps destinations, routes, pending and dead events and
#    claims, drops published events, and the restored database's relay
#    delivers the pending events; restored with the log before the
#    destinations, too.
#  - 0.4.0 objects with this library: deleting a destination is refused
#    until the update; after it, deleted and created again, the destination
#    delivers its pending events.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Emit n events in a database; returns their message ids.
sub emit_in
{
	my ($db, $type, $dest, $n) = @_;
	our $node;
	my $ids = $node->safe_psql($db, qq{
		SELECT string_agg(outbox.emit('$type', g::text, jsonb_build_object('n', g),
		                              destination => '$dest')::text, ' ')
		  FROM generate_series(1, $n) g});
	return split / /, $ids;
}

my $sink = start_sink();
my $u = $sink->{url};
our $node = new_outbox_node('upgrade');
$node->start;
my $default_version = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'outbox_pg'});
note("default version $default_version");
isnt($default_version, '0.1.0', 'the default version is newer than 0.1.0');

$node->safe_psql('postgres', 'CREATE DATABASE up');
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('up', qq{
	CREATE EXTENSION outbox_pg VERSION '0.1.0';
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, backoff_base_ms, backoff_max_ms)
	VALUES ('slow', '$u/delay/20/up', 2000, 16, 50, 500);
});
$node->safe_psql('other', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, backoff_base_ms, backoff_max_ms)
	VALUES ('slow', '$u/delay/50/other', 2000, 4, 50, 500);
});

# rolling upgrade: new library, old SQL objects
my @up_before = emit_in('up', 'up.before', 'slow', 300);
is(scalar(@up_before), 300, 'emit() works while the extension is still at 0.1.0');
ok($node->poll_query_until('up', q{
	SELECT count(*) > 0 FROM outbox.workers()
	 WHERE database = 'up' AND state = 'waiting for update'
	   AND last_error LIKE 'extension outbox_pg is at version 0.1.0, the library at % run ALTER EXTENSION outbox_pg UPDATE'}),
	'the relay of the outdated database waits and says why');
ok($node->log_contains(qr/relay for database "up" is waiting: extension outbox_pg is at version 0.1.0/),
	'the server log says so');
sleep 1;
is($node->safe_psql('up', q{SELECT count(*) FROM outbox.events WHERE status <> 'pending'}),
	'0', 'nothing is delivered from the outdated database');

# the other database delivers while the upgrade happens
my @other = emit_in('other', 'other.load', 'slow', 400);
ok($node->poll_query_until('other', q{SELECT count(*) > 0 FROM outbox.events WHERE status = 'published'}),
	'the other database delivers meanwhile');

# a session keeps emitting, one event per transaction, during the UPDATE
my ($emit_out, $emit_err) = ('', '');
my $emitter = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('up'), '-c', q{
		DO $$
		BEGIN
			FOR i IN 1..600 LOOP
				PERFORM outbox.emit('up.during', i::text, jsonb_build_object('n', i), destination => 'slow');
				COMMIT;
				PERFORM pg_sleep(0.005);
			END LOOP;
		END $$;} ],
	'>', \$emit_out, '2>', \$emit_err);
ok($node->poll_query_until('up', q{SELECT count(*) >= 50 FROM outbox.events WHERE type = 'up.during'}),
	'the emitter is running');
$node->safe_psql('up', 'ALTER EXTENSION outbox_pg UPDATE');
is($node->safe_psql('up', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_pg'}),
	$default_version, "ALTER EXTENSION UPDATE reached $default_version while events were emitted");
ok($node->safe_psql('up', q{SELECT count(*) FROM outbox.events WHERE type = 'up.during'}) < 600,
	'the update ran while the emitter was still emitting');
$emitter->finish;
is($emitter->result(0), 0, 'the emitter never failed') or diag($emit_err);
my @up_after = emit_in('up', 'up.after', 'slow', 100);

ok($node->poll_query_until('up', q{
	SELECT count(*) = 1000 AND bool_and(status = 'published') FROM outbox.events}),
	'after the update every event of the upgraded database is published');
ok($node->poll_query_until('other', q{
	SELECT count(*) = 400 AND bool_and(status = 'published') FROM outbox.events}),
	'and every event of the other database');
my @up_all = split /\n/, $node->safe_psql('up', 'SELECT id FROM outbox.events');
assert_zero_lost($sink, 'upgraded database', '/delay/20/up', @up_all);
assert_zero_lost($sink, 'other database', '/delay/50/other', @other);
ok($node->poll_query_until('up', q{
	SELECT count(*) > 0 AND bool_and(state <> 'waiting for update') FROM outbox.workers() WHERE database = 'up'}),
	'the relay no longer waits');

# 0.3.0 -> 0.4.0 (issue #21): outbox.events becomes a view over the
# insert-only store; the update moves the 0.3 rows in every state.  The
# library is already 0.4, so the relay of this database waits and the
# states stay put until the update.
$node->safe_psql('postgres', 'CREATE DATABASE states');
$node->safe_psql('states', qq{
	CREATE EXTENSION outbox_pg VERSION '0.3.0';
	INSERT INTO outbox.destinations (name, url, timeout_ms, backoff_base_ms, backoff_max_ms)
	VALUES ('st', '$u/ok/states', 1000, 50, 200);
	INSERT INTO outbox.destinations (name, url, timeout_ms, backoff_base_ms, backoff_max_ms, options)
	VALUES ('st-ord', '$u/ok/states-ord', 1000, 50, 200, '{"ordering": "aggregate"}');
});
my @st_backlog = emit_in('states', 'st.backlog', 'st', 200);
my @st_leased = emit_in('states', 'st.leased', 'st', 5);
my @st_retry = emit_in('states', 'st.retry', 'st', 5);
my @st_dead = emit_in('states', 'st.dead', 'st', 3);
my @st_published = emit_in('states', 'st.published', 'st', 5);
# ordered: aggregate A's head is retrying (its successors wait behind it),
# B is plain, C's head is dead (policy block: its successors are blocked)
my @st_ord;
for my $ev ([ 'A', 1 ], [ 'B', 1 ], [ 'A', 2 ], [ 'C', 1 ], [ 'A', 3 ], [ 'B', 2 ], [ 'C', 2 ], [ 'C', 3 ])
{
	push @st_ord, $node->safe_psql('states', qq{
		SELECT outbox.emit('st.ord.$ev->[0]', '$ev->[0]', jsonb_build_object('n', $ev->[1]),
		                   destination => 'st-ord')});
}
sub idlist { return join(',', map { "'$_'" } @_); }
$node->safe_psql('states', sprintf(q{
	UPDATE outbox.events SET attempts = 1, leased_until = now() + interval '8 seconds' WHERE id IN (%s);
	UPDATE outbox.events SET attempts = 2, next_attempt_at = now() + interval '8 seconds',
	       last_status = 503, last_error = 'HTTP 503: busy' WHERE id IN (%s);
	UPDATE outbox.events SET status = 'dead', attempts = 5, last_status = 422,
	       last_error = 'HTTP 422: rejected' WHERE id IN (%s);
	UPDATE outbox.events SET status = 'published', attempts = 1, last_status = 204,
	       published_at = now() WHERE id IN (%s);
	UPDATE outbox.events SET attempts = 1, next_attempt_at = now() + interval '8 seconds',
	       last_status = 500, last_error = 'boom' WHERE id = '%s';
	UPDATE outbox.events SET status = 'dead', attempts = 1, last_status = 410,
	       last_error = 'HTTP 410: gone' WHERE id = '%s';},
	idlist(@st_leased), idlist(@st_retry), idlist(@st_dead), idlist(@st_published),
	$st_ord[0], $st_ord[3]));
# paused until the checks of the moved rows are done: the relay of this
# database resumes at the update, and the ordered destination's plain
# aggregate B is due at once (CI once saw it published between the update
# and the first check)
$node->safe_psql('states', q{UPDATE outbox.destinations SET paused = true});
my $st_states_sql = q{
	SELECT string_agg(status || ' ' || n, ', ' ORDER BY status)
	  FROM (SELECT status, count(*) AS n FROM outbox.events GROUP BY status) s};
my $st_before = $node->safe_psql('states', $st_states_sql);
is($st_before, 'dead 4, pending 217, published 5', 'the 0.3 table holds every state');
my $st_ids_before = $node->safe_psql('states', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.events});
$node->safe_psql('states', 'ALTER EXTENSION outbox_pg UPDATE');
is($node->safe_psql('states', $st_states_sql), $st_before,
	'after the update: every event has its status, through the view outbox.events');
is($node->safe_psql('states', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.events}),
	$st_ids_before, 'every id exactly once');
is($node->safe_psql('states', q{
	SELECT (SELECT count(*) FROM outbox.log) || ' log, ' ||
	       -- (C's successors may reach retries too: the relay's claim holds them there)
	       (SELECT count(*) FROM outbox.retries WHERE type <> 'st.ord.C') || ' retries, ' ||
	       (SELECT count(*) FROM outbox.dead_events) || ' dead, ' ||
	       (SELECT count(*) FROM outbox.events_0_3 WHERE published_at IS NOT NULL) || ' history'}),
	'204 log, 13 retries, 4 dead, 5 history',
	'backlog and the unblocked successors to the log, attempted/leased and held ones to retries, dead letters moved, published kept');
is($node->safe_psql('states', q{
	SELECT string_agg(aggregate_id || ' waiting ' || waiting, ',') FROM outbox.blocked_aggregates}),
	'C waiting 2', 'the aggregate behind a dead letter is blocked');
is($node->safe_psql('states', q{SELECT count(*) FROM outbox.dead_letters()}), '4',
	'the dead letters are listed');

# with the relay, the destinations resumed: everything pending is
# delivered, A in order, C once released
$node->safe_psql('states', q{UPDATE outbox.destinations SET paused = false});
my @st_pending = (@st_backlog, @st_leased, @st_retry, grep { $_ ne $st_ord[3] } @st_ord);
ok($node->poll_query_until('states', q{
	SELECT count(*) FILTER (WHERE status = 'pending') = 2 FROM outbox.events}),
	'the relay delivers every pending event but the blocked ones');
is($node->safe_psql('states', q{SELECT outbox.release_aggregate('st-ord', 'C')}), '1',
	'the blocked aggregate is released');
ok($node->poll_query_until('states', q{
	SELECT count(*) FILTER (WHERE status = 'pending') = 0 FROM outbox.events}),
	'and then its events too');
assert_zero_lost($sink, 'moved backlog', '/ok/states', @st_pending);
is($node->safe_psql('states', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.events}),
	$st_ids_before, 'every id is still there once delivered (moved copies too)');
is($node->safe_psql('states', $st_states_sql), 'dead 4, published 222',
	'and published, but the dead letters');
my %st_pos = map { $st_ord[$_] => $_ } 0 .. $#st_ord;
my @a_order;
for my $r (sink_records($sink))
{
	next unless index($r->{path}, '/ok/states-ord') == 0 && $r->{answer} >= 200 && $r->{answer} < 300;
	my $i = $st_pos{ $r->{id} };
	push @a_order, $i if defined $i && grep { $_ == $i } (0, 2, 4);
}
my %seen;
@a_order = grep { !$seen{$_}++ } @a_order;
is(join(',', @a_order), '0,2,4', 'aggregate A is delivered in order across the update');

# schema equivalence: fresh install vs upgraded install
my $catalog_sql = q{
WITH ext AS (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'outbox_pg'),
m AS (
	SELECT d.classid, d.objid, d.objsubid FROM pg_catalog.pg_depend d, ext
	 WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (SELECT c.oid FROM m JOIN pg_catalog.pg_class c ON m.classid = 'pg_catalog.pg_class'::regclass AND c.oid = m.objid)
SELECT line FROM (
	SELECT 'member ' || pg_catalog.pg_describe_object(classid, objid, objsubid) AS line FROM m
	UNION ALL
	SELECT 'function ' || p.oid::regprocedure || ' acl=' || coalesce(p.proacl::text, '-')
	       || ' comment=' || coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), '-') || E'\n'
	       || CASE WHEN p.prokind = 'a' THEN 'aggregate' ELSE pg_catalog.pg_get_functiondef(p.oid) END
	  FROM m JOIN pg_catalog.pg_proc p ON m.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = m.objid
	UNION ALL
	SELECT 'relation ' || c.oid::regclass || ' kind=' || c.relkind::text || ' persistence=' || c.relpersistence::text
	       || ' acl=' || coalesce(c.relacl::text, '-') || ' options=' || coalesce(c.reloptions::text, '-')
	       || ' rls=' || c.relrowsecurity || ' comment=' || coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '-')
	  FROM rels JOIN pg_catalog.pg_class c USING (oid)
	UNION ALL
	SELECT 'column ' || a.attrelid::regclass || ' #' || a.attnum || ' ' || a.attname || ' '
	       || pg_catalog.format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
	       || coalesce(' default ' || pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), '')
	       || ' identity=' || a.attidentity::text || ' generated=' || a.attgenerated::text || ' collation=' || a.attcollation
	       || ' acl=' || coalesce(a.attacl::text, '-') || ' comment=' || coalesce(pg_catalog.col_description(a.attrelid, a.attnum), '-')
	  FROM rels JOIN pg_catalog.pg_attribute a ON a.attrelid = rels.oid AND a.attnum > 0 AND NOT a.attisdropped
	  LEFT JOIN pg_catalog.pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
	UNION ALL
	SELECT 'constraint ' || co.conrelid::regclass || ' ' || co.conname || ' ' || pg_catalog.pg_get_constraintdef(co.oid)
	       || ' deferrable=' || co.condeferrable || ' valid=' || co.convalidated
	  FROM rels JOIN pg_catalog.pg_constraint co ON co.conrelid = rels.oid
	UNION ALL
	SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid) || ' valid=' || i.indisvalid
	  FROM rels JOIN pg_catalog.pg_index i ON i.indrelid = rels.oid
	UNION ALL
	SELECT 'trigger ' || pg_catalog.pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
	  FROM rels JOIN pg_catalog.pg_trigger t ON t.tgrelid = rels.oid AND NOT t.tgisinternal
	UNION ALL
	SELECT 'policy ' || po.polrelid::regclass || ' ' || po.polname || ' ' || po.polcmd::text || ' '
	       || coalesce(pg_catalog.pg_get_expr(po.polqual, po.polrelid), '-') || ' '
	       || coalesce(pg_catalog.pg_get_expr(po.polwithcheck, po.polrelid), '-')
	  FROM rels JOIN pg_catalog.pg_policy po ON po.polrelid = rels.oid
	UNION ALL
	SELECT 'view ' || c.oid::regclass || E'\n' || pg_catalog.pg_get_viewdef(c.oid)
	  FROM rels JOIN pg_catalog.pg_class c USING (oid) WHERE c.relkind IN ('v', 'm')
	UNION ALL
	SELECT 'sequence ' || s.seqrelid::regclass || ' ' || pg_catalog.format_type(s.seqtypid, NULL) || ' '
	       || s.seqstart || ' ' || s.seqincrement || ' ' || s.seqmin || ' ' || s.seqmax || ' ' || s.seqcache || ' ' || s.seqcycle
	  FROM rels JOIN pg_catalog.pg_sequence s ON s.seqrelid = rels.oid
	UNION ALL
	SELECT 'schema ' || n.nspname || ' acl=' || coalesce(n.nspacl::text, '-')
	       || ' comment=' || coalesce(pg_catalog.obj_description(n.oid, 'pg_namespace'), '-')
	  FROM m JOIN pg_catalog.pg_namespace n ON m.classid = 'pg_catalog.pg_namespace'::regclass AND n.oid = m.objid
	UNION ALL
	SELECT 'type ' || pg_catalog.format_type(t.oid, NULL) || ' ' || t.typtype::text || ' acl=' || coalesce(t.typacl::text, '-')
	       || coalesce(' labels=' || (SELECT pg_catalog.string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
	                                    FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid), '')
	       || coalesce(' attributes=' || (SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ',' ORDER BY a.attnum)
	                                        FROM pg_catalog.pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped), '')
	  FROM m JOIN pg_catalog.pg_type t ON m.classid = 'pg_catalog.pg_type'::regclass AND t.oid = m.objid
	UNION ALL
	SELECT 'event trigger ' || ev.evtname || ' ' || ev.evtevent || ' ' || ev.evtfoid::regproc || ' '
	       || coalesce(ev.evttags::text, '-') || ' enabled=' || ev.evtenabled::text
	  FROM m JOIN pg_catalog.pg_event_trigger ev ON m.classid = 'pg_catalog.pg_event_trigger'::regclass AND ev.oid = m.objid
	UNION ALL
	SELECT 'dumped ' || c.cfg::regclass || ' ' || coalesce(c.cond, '-')
	  FROM pg_catalog.pg_extension x,
	       LATERAL ROWS FROM (pg_catalog.unnest(x.extconfig), pg_catalog.unnest(x.extcondition)) AS c(cfg, cond)
	 WHERE x.extname = 'outbox_pg'
) s
ORDER BY line};
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION outbox_pg');
my @fresh = split /\n(?=\S)/, $node->safe_psql('fresh', $catalog_sql);
my @upgraded = split /\n(?=\S)/, $node->safe_psql('up', $catalog_sql);
my %in_fresh = map { $_ => 1 } @fresh;
my %in_upgraded = map { $_ => 1 } @upgraded;
ok(scalar(@fresh) > 50, 'the catalog query sees the extension objects (' . scalar(@fresh) . ' lines)');
is(join("\n", grep { !$in_upgraded{$_} } @fresh), '', 'nothing of a fresh install is missing or different after the upgrade');
is(join("\n", grep { !$in_fresh{$_} } @upgraded), '', 'nothing extra or different in the upgraded install');

# an install of 0.2.0 updated to the default version: the same catalog
# too; the update names each destination 0.2.0 accepted that the checks of
# 0.3.0 refuse, and the destination stays
$node->safe_psql('postgres', 'CREATE DATABASE up020');
$node->safe_psql('up020', qq{
	CREATE EXTENSION outbox_pg VERSION '0.2.0';
	INSERT INTO outbox.destinations (name, url, options) VALUES ('legacy', '$u/ok/legacy', '{"colour": "blue"}');
});
my ($up_ret, $up_out, $up_err) = $node->psql('up020', 'ALTER EXTENSION outbox_pg UPDATE');
is($up_ret, 0, 'ALTER EXTENSION UPDATE from 0.2.0 succeeds') or diag($up_err);
like($up_err, qr/WARNING:  unknown option "colour" for a destination of kind webhook/,
	'the update warns about a destination the checks of 0.3.0 refuse');
like($up_err, qr/Destination "legacy" was written by a version that did not check this/,
	'and names it');
is($node->safe_psql('up020', q{SELECT extversion || ' ' || (SELECT count(*) FROM outbox.destinations) FROM pg_extension WHERE extname = 'outbox_pg'}),
	"$default_version 1", "0.2.0 updated to $default_version, the destination kept");
my @from020 = split /\n(?=\S)/, $node->safe_psql('up020', $catalog_sql);
my %in_from020 = map { $_ => 1 } @from020;
is(join("\n", grep { !$in_from020{$_} } @fresh), '', 'nothing of a fresh install is missing or different after an update from 0.2.0');
is(join("\n", grep { !$in_fresh{$_} } @from020), '', 'nothing extra or different after an update from 0.2.0');

# options added since (the CloudEvents ones) are checked after the update
# by the same C code as in a fresh install: 0.2.0's trigger, which listed
# each kind's options in SQL, is gone
($up_ret, $up_out, $up_err) = $node->psql('up020', qq{
	INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key) VALUES ('aws', 'AKIDUPGRADE', 'upgrade-secret');
	INSERT INTO outbox.destinations (name, url, options) VALUES ('ce_hook', '$u/ok/ce', '{"percent_encoding": "avoid"}');
	INSERT INTO outbox.destinations (name, kind, url, credentials, options)
	VALUES ('ce_sqs', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/123456789012/q', 'aws', '{"body": "cloudevents", "source": "urn:shop"}')});
is($up_ret, 0, 'after the update from 0.2.0, percent_encoding and body are accepted') or diag($up_err);
($up_ret, $up_out, $up_err) = $node->psql('up020',
	qq{INSERT INTO outbox.destinations (name, url, options) VALUES ('ce_bad', '$u/ok/ce', '{"percent_encoding": "auto"}')});
like($up_err, qr/ERROR:  option percent_encoding must be allow or avoid/, 'and a bad value is refused');

# an install of 0.4.0 with this library (the window before ALTER EXTENSION
# UPDATE): 0.4.0's foreign key deletes a destination's stream with it, and
# its pending events would show as published once the name came back, so
# the delete is refused until the update; after it, the delete keeps the
# stream and the name created again delivers every pending event
$node->safe_psql('postgres', 'CREATE DATABASE up040');
$node->safe_psql('up040', qq{
	CREATE EXTENSION outbox_pg VERSION '0.4.0';
	INSERT INTO outbox.destinations (name, url, paused) VALUES ('window', '$u/ok/window-old', true);
});
my @window = emit_in('up040', 'window.e', 'window', 50);
my ($w_ret, $w_out, $w_err) = $node->psql('up040', q{DELETE FROM outbox.destinations WHERE name = 'window'});
isnt($w_ret, 0, 'at 0.4.0 objects, deleting a destination is refused');
like($w_err, qr/cannot delete destinations while extension outbox_pg is at version 0\.4\.0/, 'and says why');
like($w_err, qr/HINT:  Run ALTER EXTENSION outbox_pg UPDATE first\./, 'and what to do');
($w_ret, $w_out, $w_err) = $node->psql('up040', q{TRUNCATE outbox.destinations CASCADE});
isnt($w_ret, 0, 'so is TRUNCATE ... CASCADE');
is($node->safe_psql('up040', q{SELECT count(*) FROM outbox.events WHERE status = 'pending'}),
	'50', 'the 50 events are still pending');
# inbox.receive() writes the inbox.messages of before 0.5.1 (one column
# fewer) until the update, and the update gives its message a count of
# finished attempts
is($node->safe_psql('up040', q{SELECT inbox.receive('window-m1', 'window.m', '{}')}), 't',
	'at 0.4.0 objects, inbox.receive() works');
# and the inbox waits for the update with the relay (its statements name
# 0.5.1's column; the 0.5.1 library's first build ran them and failed
# every cycle): the message is not looked at (it has no handler, and a
# look records why), and nothing fails
my $window_log = -s $node->logfile;
sleep(2);
is($node->safe_psql('up040', q{
	SELECT attempts || ' ' || coalesce(last_error, '-') FROM inbox.messages WHERE id = 'window-m1'}),
	'0 -', 'at 0.4.0 objects, the inbox waits');
unlike(slurp_file($node->logfile, $window_log), qr/finished_attempts/,
	'and no inbox cycle fails meanwhile');
# before 0.5.1 a look that found no handler counted as an attempt: the
# update gives such a message its attempts back; a message that failed in
# its handler keeps its count, as finished attempts
$node->safe_psql('up040', q{
	UPDATE inbox.messages SET attempts = 5, last_error = 'no inbox handler matches message type "window.m"',
	       next_attempt_at = now() + interval '1 hour'
	 WHERE id = 'window-m1';
	SELECT inbox.receive('window-m2', 'window.m', '{}');
	UPDATE inbox.messages SET attempts = 2, last_error = 'P0001: boom', next_attempt_at = now() + interval '1 hour'
	 WHERE id = 'window-m2';
});
$node->safe_psql('up040', 'ALTER EXTENSION outbox_pg UPDATE');
is($node->safe_psql('up040', q{
	SELECT string_agg(id || ' ' || status || ' ' || attempts || ' ' || finished_attempts, ', ' ORDER BY id)
	  FROM inbox.messages WHERE id LIKE 'window-m%'}),
	'window-m1 pending 0 0, window-m2 pending 2 2',
	'updated: the looks without a handler are given back, the handler\'s failures kept as finished');
my @from040 = split /\n(?=\S)/, $node->safe_psql('up040', $catalog_sql);
my %in_from040 = map { $_ => 1 } @from040;
is(join("\n", grep { !$in_from040{$_} } @fresh), '', 'nothing of a fresh install is missing or different after an update from 0.4.0');
is(join("\n", grep { !$in_fresh{$_} } @from040), '', 'nothing extra or different after an update from 0.4.0');
$node->safe_psql('up040', qq{
	BEGIN;
	DELETE FROM outbox.destinations WHERE name = 'window';
	INSERT INTO outbox.destinations (name, url) VALUES ('window', '$u/ok/window');
	COMMIT;
});
ok($node->poll_query_until('up040', q{
	SELECT count(*) = 50 FROM outbox.events WHERE type = 'window.e' AND status = 'published'}),
	'updated, deleted and created again: the 50 pending events are delivered');
assert_zero_lost($sink, 'destination created again after the update', '/ok/window', @window);

# pg_dump and restore into a fresh database
$node->safe_psql('up', qq{
	INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms)
	VALUES ('later', '$u/ok/restored', 1000, 5, 50, 200),
	       ('rejecting', '$u/status/422/dump', 1000, 5, 50, 200);
	INSERT INTO outbox.routes (pattern, destination, priority) VALUES ('dump.*', 'later', 10);
	UPDATE outbox.destinations SET paused = true WHERE name = 'later';
	-- restored through the trigger's checks, which read its credentials
	INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key)
	VALUES ('aws', 'AKIDUPGRADE', 'upgrade-secret');
	INSERT INTO outbox.destinations (name, kind, url, credentials, options, paused)
	VALUES ('queue', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/123456789012/q', 'aws', '{"batch_size": 5}', true);
});
my @dead = emit_in('up', 'dump.dead', 'rejecting', 3);
ok($node->poll_query_until('up', q{SELECT count(*) = 3 FROM outbox.events WHERE status = 'dead'}),
	'dead events exist before the dump');
my @pending = emit_in('up', 'dump.pending', 'later', 200);
$node->safe_psql('up', q{
	SELECT inbox.claim('message-' || g) FROM generate_series(1, 25) g;
	SELECT inbox.claim('other-message', 'consumer-b');
});
my $state_sql = q{
	SELECT (SELECT string_agg(name || ' ' || url || ' ' || paused, ',' ORDER BY name) FROM outbox.destinations) || ' | ' ||
	       (SELECT string_agg(pattern || ' ' || destination || ' ' || priority, ',' ORDER BY pattern) FROM outbox.routes) || ' | ' ||
	       (SELECT count(*) FILTER (WHERE status = 'pending') || ' pending ' ||
	               count(*) FILTER (WHERE status = 'dead') || ' dead ' ||
	               md5(string_agg(id::text || type || payload::text || status || attempts, ',' ORDER BY id))
	          FROM outbox.events WHERE status <> 'published') || ' | ' ||
	       (SELECT count(*) || ' claims ' || md5(string_agg(consumer || message_id || expires_at, ',' ORDER BY consumer, message_id))
	          FROM inbox.claims)};
my $before = $node->safe_psql('up', $state_sql);
my $published_before = $node->safe_psql('up', q{SELECT count(*) FROM outbox.events WHERE status = 'published'});
ok($published_before > 0, "$published_before published events before the dump");

my $dump = "$PostgreSQL::Test::Utils::tmp_check/up.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('up') ], 'pg_dump of the database');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ], 'pg_restore into a fresh database');
is($node->safe_psql('restored', $state_sql), $before,
	'destinations, routes, pending and dead events and claims are restored');
is($node->safe_psql('restored', q{SELECT count(*) FROM outbox.events WHERE status = 'published'}),
	'0', 'published events are not dumped');
is($node->safe_psql('restored', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_pg'}),
	$default_version, 'the restored extension is at the default version');

# the restored database's relay delivers the pending events
$node->safe_psql('restored', q{UPDATE outbox.destinations SET paused = false WHERE name = 'later'});
ok($node->poll_query_until('restored', q{
	SELECT count(*) = 200 FROM outbox.events WHERE status = 'published'}),
	'the restored database delivers its pending events');
assert_zero_lost($sink, 'restored database', '/ok/restored', @pending);

# restored in another order, the log's rows before the destinations (as
# pg_restore -j or -L may): a destination's first stream starts before
# every event (0.5.0), so its restored rows are delivered all the same
# (0.4.0 started it at the restore, and they showed as published unsent)
my $list_out = `pg_restore -l '$dump'`;
my @lines = split /\n/, $list_out;
my @log_data = grep { /TABLE DATA outbox log_\d/ } @lines;
my @reordered;
for my $line (@lines)
{
	next if grep { $_ eq $line } @log_data;
	push @reordered, @log_data if $line =~ /TABLE DATA outbox destinations /;
	push @reordered, $line;
}
is(scalar(@log_data), 3, 'the dump holds the data of the three log slots');
my $list = "$PostgreSQL::Test::Utils::tmp_check/reordered.list";
open(my $fh, '>', $list) or die "could not write $list: $!";
print $fh join("\n", @reordered), "\n";
close $fh;
$node->safe_psql('postgres', 'CREATE DATABASE reordered');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-L', $list, '-d', $node->connstr('reordered'), $dump ],
	'pg_restore with the log restored before the destinations');
is($node->safe_psql('reordered', $state_sql), $before,
	'restored in that order: the same destinations, routes, pending and dead events and claims');
$node->safe_psql('reordered', qq{
	UPDATE outbox.destinations SET url = '$u/ok/reordered', paused = false WHERE name = 'later'});
ok($node->poll_query_until('reordered', q{
	SELECT count(*) = 200 FROM outbox.events WHERE status = 'published'}),
	'restored in that order, the pending events are delivered');
assert_zero_lost($sink, 'reordered restore', '/ok/reordered', @pending);

is($node->safe_psql('up', q{SELECT count(*) FROM outbox.events WHERE status = 'pending'}),
	'200', 'the original database still holds its own paused events');
ok(!$node->log_contains('terminated by signal'), 'no process crashed');

$node->stop;
stop_sink($sink);
done_testing();
