# Fuzzing every SQL entry point of the extension for crashes.
#
# The functions are discovered from the catalog: every function and
# procedure in the schemas outbox and inbox except trigger functions, so
# entry points added later are fuzzed without changing this file.  Each is
# called as superuser with random arguments chosen per argument type:
# NULLs, empty values, huge text, huge and deeply nested jsonb, extreme
# numbers, intervals and timestamps, arrays with NULLs, and text with
# invalid UTF-8 bytes in a SQL_ASCII database.  Errors are expected and
# fine; a crash is not: after every batch the server must still accept
# connections and its log must not show a process terminated by a signal.
#
# Reproducible: the seed is printed; OUTBOX_FUZZ_SEED sets it and
# OUTBOX_FUZZ_SECONDS the time budget (default 30 s).  Interval arguments
# of functions that wait (name containing "wait" or "sleep") are clamped
# to a fraction of a second, and every statement runs under a 3 s
# statement_timeout, so nothing just sits there.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $seed = $ENV{OUTBOX_FUZZ_SEED} // 20261202;
my $seconds = $ENV{OUTBOX_FUZZ_SECONDS} // 30;
diag("fuzz seed $seed (set OUTBOX_FUZZ_SEED to reproduce), $seconds s");
srand($seed);

my $node = new_outbox_node('fuzz', qq{
outbox.allowed_hosts = '127.0.0.1'
restart_after_crash = off
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE DATABASE fuzz_ascii TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'});
for my $db ('postgres', 'fuzz_ascii')
{
	# a destination nobody listens on, and some state for the functions to find
	$node->safe_psql($db, q{
		CREATE EXTENSION outbox_pg;
		INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms)
		VALUES ('d1', 'http://127.0.0.1:9/fuzz', 200, 3, 10);
		INSERT INTO outbox.routes (pattern, destination) VALUES ('fuzz.*', 'd1');
		SELECT outbox.emit('fuzz.seed', g::text, '{"a": 1}') FROM generate_series(1, 20) g;
		SELECT inbox.claim('seed-' || g) FROM generate_series(1, 5) g;
	});
}

# entry points: name, argument types, procedure?, variadic?
my @functions;
for my $line (split /\n/, $node->safe_psql('postgres', q{
	SELECT p.oid::regprocedure::text || '|' || quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '|' || p.prokind::text || '|'
	       || (p.provariadic <> 0)::text || '|'
	       || coalesce((SELECT string_agg(format_type(t, NULL), ';' ORDER BY i)
	                      FROM unnest(p.proargtypes) WITH ORDINALITY AS a(t, i)), '')
	  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
	 WHERE n.nspname IN ('outbox', 'inbox')
	   AND p.prokind IN ('f', 'p')
	   AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
	 ORDER BY 1}))
{
	my ($sig, $name, $kind, $variadic, $types) = split /\|/, $line, 5;
	push @functions, { sig => $sig, name => $name, proc => $kind eq 'p',
		variadic => $variadic eq 't', types => [ grep { $_ ne '' } split /;/, $types ] };
}
note('fuzzing ' . scalar(@functions) . ' entry points: ' . join(', ', map { $_->{sig} } @functions));
ok(scalar(@functions) >= 8, 'entry points discovered from the catalog');

sub pick { return $_[ int(rand(scalar @_)) ]; }

sub random_word
{
	my @c = ('a' .. 'z', 'A' .. 'Z', '0' .. '9', '.', '_', '-', '*', ' ', '/', ':', '%');
	return join('', map { pick(@c) } 1 .. (1 + int(rand(40))));
}

# invalid UTF-8 (and other odd bytes), only meaningful in SQL_ASCII
sub invalid_utf8
{
	return pick(q{E'\\xff\\xfe'}, q{E'\\xc3\\x28'}, q{E'ok\\xe2\\x82'}, q{E'\\xed\\xa0\\x80'},
		q{E'\\xf8\\x88\\x80\\x80\\x80'}, q{E'order.\\x80created'}, q{E'\\x01\\x02\\x7f'});
}

sub text_value
{
	my ($ascii) = @_;
	my @v = (q{''}, q{'a'}, q{'*'}, q{'d1'}, q{'fuzz.x'}, q{'default'}, q{' '}, q{'%s%n%x'},
		q{'d1; DROP TABLE outbox.events'}, q{'http://127.0.0.1:9/x'}, q{'ü€😀'},
		"'" . random_word() . "'", "'" . random_word() . "'",
		q{repeat('x', 256)}, q{repeat('y', 1100)}, q{repeat('z', 70000)},
		q{'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'}, q{'00-00000000000000000000000000000000-0000000000000000-00'});
	push @v, q{repeat('h', 3000000)} if rand() < 0.05;
	push @v, invalid_utf8(), invalid_utf8() if $ascii;
	return pick(@v);
}

sub jsonb_value
{
	my ($ascii) = @_;
	my @v = (q{'{}'}, q{'[]'}, q{'null'}, q{'0'}, q{'"s"'}, q{'{"a": {"b": [1, 2, null]}}'},
		q{'{"X-Trace": "v"}'}, q{'{"X-A": 1}'}, q{'{"": ""}'}, q{'{"X-Bad": "a\r\nInjected: 1"}'},
		q{'{"content-type": "text/plain"}'}, q{'{"Host": "evil"}'}, q{'{"circuit_threshold": -1}'},
		q{'{"source": null}'}, q{'{"k": 1e308}'}, q{'{"k": -0.0}'},
		q{(repeat('[', 3000) || repeat(']', 3000))::jsonb},
		q{(repeat('{"a":', 2000) || '1' || repeat('}', 2000))::jsonb},
		q{jsonb_build_object('k', repeat('x', 300000))},
		q{(SELECT jsonb_object_agg('H' || g, g::text) FROM generate_series(1, 5000) g)});
	push @v, q{jsonb_build_object('big', repeat('x', 20000000))} if rand() < 0.03;
	push @v, q{(repeat('[', 200000) || repeat(']', 200000))::jsonb} if rand() < 0.05;
	push @v, q{jsonb_build_object('bad', } . invalid_utf8() . q{::text)} if $ascii;
	return pick(@v);
}

sub scalar_value
{
	my ($type, $fname, $ascii) = @_;
	return 'NULL' if rand() < 0.15;
	if ($type =~ /^(text|character varying|name|"char"|character)$/) { return text_value($ascii); }
	if ($type eq 'jsonb' || $type eq 'json') { return jsonb_value($ascii); }
	if ($type =~ /^(integer|smallint|bigint)$/)
	{
		return pick('0', '1', '-1', '2', '16', '1000', '2147483647', '-2147483648', '32767', '-32768',
			'9223372036854775807', '-9223372036854775808', int(rand(200)) - 50);
	}
	if ($type =~ /^(double precision|real|numeric)$/)
	{
		return pick(q{'NaN'}, q{'Infinity'}, q{'-Infinity'}, '0', '-1', '0.5', '1', '1e308', '-1e-308', '2');
	}
	if ($type eq 'boolean') { return pick('true', 'false'); }
	if ($type eq 'interval')
	{
		return pick(q{'0'}, q{'1 microsecond'}, q{'-1 second'}, q{'0.05 s'}, q{'0.2 s'})
		  if $fname =~ /wait|sleep/;
		return pick(q{'0'}, q{'1 microsecond'}, q{'-1 day'}, q{'1 second'}, q{'1 hour'}, q{'100 years'},
			q{'178000000 years'}, q{'-178000000 years'}, q{'1 mon -30 days'}, q{'2147483647 days'});
	}
	if ($type =~ /^timestamp/ || $type eq 'date')
	{
		return pick(q{now()}, q{'infinity'}, q{'-infinity'}, q{'4713-01-01 BC'}, q{'294276-12-31 23:00:00'},
			q{'2000-01-01'}, q{now() + '1 hour'}, q{now() - '10 years'::interval});
	}
	if ($type eq 'uuid')
	{
		return pick(q{gen_random_uuid()}, q{'00000000-0000-0000-0000-000000000000'},
			q{(SELECT id FROM outbox.events ORDER BY random() LIMIT 1)}, q{'ffffffff-ffff-ffff-ffff-ffffffffffff'});
	}
	if ($type eq 'bytea') { return pick(q{'\\x'}, q{'\\xdeadbeef'}, q{decode(repeat('ff', 100000), 'hex')}); }
	if ($type =~ /^(regclass|oid|regtype|regproc)$/) { return pick('0', q{'outbox.events'::regclass::oid}, '4294967295'); }
	return 'NULL';
}

sub value
{
	my ($type, $fname, $ascii) = @_;
	if ($type =~ /^(.*)\[\]$/)
	{
		my $elem = $1;
		my $r = rand();
		return "NULL::$type" if $r < 0.1;
		return "'{}'::$type" if $r < 0.2;
		return "ARRAY[NULL]::$type" if $r < 0.3;
		return "array_fill(" . scalar_value($elem, $fname, $ascii) . "::$elem, ARRAY[2, 2])" if $r < 0.4;
		return "array_fill(" . scalar_value($elem, $fname, $ascii) . "::$elem, ARRAY[" . pick(1, 100, 20000) . "])" if $r < 0.55;
		my @elems = map { rand() < 0.2 ? 'NULL' : scalar_value($elem, $fname, $ascii) } 1 .. (1 + int(rand(5)));
		return 'ARRAY[' . join(', ', map { "($_)::$elem" } @elems) . "]::$type";
	}
	my $v = scalar_value($type, $fname, $ascii);
	return "($v)::$type";
}

sub call_sql
{
	my ($f, $ascii) = @_;
	my @args = map { value($_, $f->{name}, $ascii) } @{ $f->{types} };
	$args[-1] = "VARIADIC $args[-1]" if $f->{variadic} && @args;
	my $call = "$f->{name}(" . join(', ', @args) . ')';
	return "CALL $call;" if $f->{proc};
	return "SELECT count(*) FROM (SELECT $call) AS fuzz;";
}

my ($calls, $errors, $batches) = (0, 0, 0);
my %called;
my $crashed;
my $t0 = time;
while (time - $t0 < $seconds)
{
	my $ascii = rand() < 0.35;
	my $db = $ascii ? 'fuzz_ascii' : 'postgres';
	my @stmts;
	for (1 .. 20)
	{
		my $f = pick(@functions);
		$called{ $f->{sig} }++;
		push @stmts, call_sql($f, $ascii);
	}
	my $script = "SET statement_timeout = '3s';\nSET lock_timeout = '1s';\n" . join("\n", @stmts) . "\n";
	my ($stdout, $stderr) = ('', '');
	$node->psql($db, $script, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
	$calls += scalar(@stmts);
	$batches++;
	$errors += () = $stderr =~ /ERROR:/g;
	my ($ok, $o, $e) = (1, '', '');
	my $alive = $node->psql('postgres', 'SELECT 1', stdout => \$o, stderr => \$e);
	if ($alive != 0 || $o ne '1' || $stderr =~ /server closed the connection unexpectedly|connection to server .* failed/
		|| $node->log_contains('terminated by signal'))
	{
		$crashed = "database $db, batch $batches:\n$script\n--- stderr:\n$stderr";
		last;
	}
}
my $elapsed = time - $t0;
note(sprintf('%d calls in %d batches, %.1f s, %d errors (expected), seed %d', $calls, $batches, $elapsed, $errors, $seed));
note("calls per entry point: " . join(', ', map { "$_ $called{$_}" } sort keys %called));

ok(!defined $crashed, 'no call crashed the server') or diag("crash reproduction (seed $seed):\n$crashed");
ok($calls >= 200, "enough calls made ($calls)");
ok($errors > 0 && $errors < $calls, 'the fuzzer reached both errors and successes');
is(scalar(grep { !$called{ $_->{sig} } } @functions), 0, 'every entry point was called');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server still accepts connections');
ok(!$node->log_contains('terminated by signal'), 'no process was terminated by a signal');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox_pg relay'}),
	'the relays still run');

$node->stop;
done_testing();
