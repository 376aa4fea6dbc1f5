# What a destination says is stored and logged safely (peertext.c).
#
# The sink (test/sink/sink.py, /echo/...) answers 400 with bodies a
# careless or hostile peer sends: every request header echoed (a bearer
# token, an API key header, basic credentials from outbox.credentials and
# from the URL's userinfo, and the Standard Webhooks secret), an SNS
# error quoting the session token and access key id, a secret across the
# stored limit, a multibyte character across it, invalid UTF-8,
# ESC/ANSI sequences with NUL, CR and CSI.  In a UTF8, a SQL_ASCII and a
# LATIN1 database the events are dead-lettered with their errors; then:
#  - no secret (raw, base64, "user:pass") is in any column of
#    outbox.events, outbox.dead_letters(), outbox.workers(),
#    outbox.destination_stats, nor in the server log;
#  - last_error has no control character, fits the stored bound, and in
#    SQL_ASCII is plain ASCII;
#  - pg_dump -Fc and pg_restore into a new UTF8 database bring back every
#    event and destination (the bug: a dump that restores no events).
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# every text the tests read comes back as UTF-8, whatever the database
$ENV{PGCLIENTENCODING} = 'UTF8';

my $sink = start_sink();
my $u = $sink->{url};
my $port = $sink->{port};

my $bearer = 'tok-BEARER-9f8e7d6c5b4a';
my $api_key = 'key-HEADER-0a1b2c3d4e';
my $rmq_user = 'outbox-user';
my $rmq_pass = 'pw-RABBIT-77aa88bb';
my $url_user = 'urluser';
my $url_pass = 'pw-URL-5566ccdd';
my $aws_key_id = 'AKIAPEERTEXT0001';
my $aws_secret = 'secret-AWS-aabbccddeeff';
my $aws_token = 'token-AWS-0011223344';
my $signing = secret();
(my $signing_key = $signing) =~ s/^whsec_//;

# every form a secret must not be stored or logged in
my %forbidden = (
	'bearer token' => $bearer,
	'API key header' => $api_key,
	'RabbitMQ password' => $rmq_pass,
	'RabbitMQ basic credentials' => encode_base64("$rmq_user:$rmq_pass", ''),
	'RabbitMQ user:pass' => "$rmq_user:$rmq_pass",
	'URL password' => $url_pass,
	'URL basic credentials' => encode_base64("$url_user:$url_pass", ''),
	'AWS access key id' => $aws_key_id,
	'AWS secret key' => $aws_secret,
	'AWS session token' => $aws_token,
	'signing secret' => $signing,
	'signing key' => $signing_key,
	# the first 10 characters: what a cut after the limit would leave
	'start of the bearer token' => substr($bearer, 0, 10),
	'start of the basic credentials' => substr(encode_base64("$rmq_user:$rmq_pass", ''), 0, 10),
);

sub no_secret_in
{
	my ($what, $text) = @_;
	my @found = grep { index($text, $forbidden{$_}) >= 0 } sort keys %forbidden;
	is(join(', ', @found), '', "no secret in $what");
}

my $node = new_outbox_node('peer_text');
$node->start;

my @dbs = ([ 'utf8db', 'UTF8' ], [ 'asciidb', 'SQL_ASCII' ], [ 'latin1db', 'LATIN1' ]);
my %destinations = (
	headers    => "$u/echo/400/headers/h",
	userinfo   => "http://$url_user:$url_pass\@127.0.0.1:$port/echo/400/headers/u",
	bearer_cut => "$u/echo/400/at/228/b",
	straddle   => "$u/echo/400/straddle/243/s",
	invalid    => "$u/echo/400/invalid/i",
	ansi       => "$u/echo/400/ansi/a",
);
my $ndest = keys(%destinations) + 3;

for my $db (@dbs)
{
	my ($name, $encoding) = @$db;

	$node->safe_psql('postgres', qq{
		CREATE DATABASE $name ENCODING '$encoding' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'});
	my $values = join(",\n", map { "('$_', '$destinations{$_}')" } sort keys %destinations);
	# the test's own statements are not what is checked in the log
	$node->safe_psql($name, qq{
		SET log_statement = 'none';
		CREATE EXTENSION outbox_pg;
		INSERT INTO outbox.destinations (name, url) VALUES $values;
		UPDATE outbox.destinations
		   SET headers = '{"X-Api-Key": "$api_key"}', bearer_token = '$bearer',
		       signing_secrets = ARRAY['$signing']
		 WHERE name IN ('headers', 'bearer_cut');
		INSERT INTO outbox.credentials (name, username, password)
		VALUES ('rmq', '$rmq_user', '$rmq_pass');
		INSERT INTO outbox.destinations (name, kind, url, credentials)
		VALUES ('rabbit', 'rabbitmq', '$u/echo/400/headers/r', 'rmq'),
		       ('rabbit_cut', 'rabbitmq', '$u/echo/400/at/228/rc', 'rmq');
		INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key, aws_session_token)
		VALUES ('aws', '$aws_key_id', '$aws_secret', '$aws_token');
		INSERT INTO outbox.destinations (name, kind, url, credentials, options)
		VALUES ('sns', 'sns', '$u/echo/400/awsxml/n', 'aws',
		        '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders"}');
	});
	$node->safe_psql($name, qq{
		SELECT outbox.emit('peer.text', d.name, '{"n": 1}', destination => d.name)
		  FROM outbox.destinations d});
	ok($node->poll_query_until($name, qq{
		SELECT count(*) = $ndest FROM outbox.events WHERE status = 'dead'}),
		"$encoding: every event is dead-lettered with the peer's answer");

	my $errors = $node->safe_psql($name, q{
		SELECT string_agg(destination || ': ' || last_error, E'\n' ORDER BY destination)
		  FROM outbox.events});
	note("$encoding:\n$errors");

	# no secret anywhere the extension stores or shows peer text
	no_secret_in("$encoding outbox.events", $node->safe_psql($name,
		q{SELECT string_agg(row_to_json(e)::text, E'\n') FROM outbox.events e}));
	no_secret_in("$encoding outbox.dead_letters()", $node->safe_psql($name,
		q{SELECT string_agg(row_to_json(d)::text, E'\n') FROM outbox.dead_letters() d}));
	no_secret_in("$encoding outbox.workers()", $node->safe_psql($name,
		q{SELECT coalesce(string_agg(row_to_json(w)::text, E'\n'), '') FROM outbox.workers() w}));
	no_secret_in("$encoding outbox.destination_stats", $node->safe_psql($name,
		q{SELECT coalesce(string_agg(row_to_json(s)::text, E'\n'), '') FROM outbox.destination_stats s}));

	# the echoes were redacted, not lost: the rest of the answer is there
	like($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'headers'}),
		qr/^HTTP 400: \{"error": "rejected", "authorization": "\[redacted\]", "x-api-key": "\[redacted\]", "signing_secret": "\[redacted\]", "signing_key": "\[redacted\]", "request_headers": /,
		"$encoding: the echoed bearer token, API key and signing secret are redacted");
	like($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'userinfo'}),
		qr/"authorization": "Basic \[redacted\]"/,
		"$encoding: the URL's userinfo echoed as basic credentials is redacted");
	like($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'rabbit'}),
		qr/^HTTP 400: .*"authorization": "Basic \[redacted\]"/,
		"$encoding: RabbitMQ basic credentials echoed are redacted");
	like($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'sns'}),
		qr{^HTTP 400: InvalidParameter: token \[redacted\] auth AWS4-HMAC-SHA256 Credential=\[redacted\]/},
		"$encoding: an AWS error quoting the session token and access key id is redacted");
	like($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'bearer_cut'}),
		qr/^HTTP 400: \.{228}\[redacted\] was re$/,
		"$encoding: a token across the stored limit is redacted whole");
	like($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'rabbit_cut'}),
		qr/^HTTP 400: \.{228}Basic \[redacted\] $/,
		"$encoding: basic credentials across the stored limit are redacted whole");

	# bounded, no control characters, the character across the limit left out whole
	is($node->safe_psql($name, q{
		SELECT count(*) FROM outbox.events
		 WHERE octet_length(last_error) > 255
		    OR last_error ~ '[\x01-\x08\x0b-\x1f\x7f]'}),
		'0', "$encoding: every last_error fits 255 bytes and has no control character");
	is($node->safe_psql($name, q{
		SELECT octet_length(last_error) || ' ' || (last_error = 'HTTP 400: ' || repeat('x', 243))
		  FROM outbox.events WHERE destination = 'straddle'}),
		'253 true', "$encoding: a multibyte character across the limit is left out whole");
	is($node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'ansi'}),
		'HTTP 400: \x1b[31mALERT\x1b[0m \x1b]0;title\x07 cr\rret nul\x00byte \u009b2J csi \u202e rlo',
		"$encoding: ESC, BEL, CR, NUL, CSI and RLO are escaped");
	my $latin = $encoding eq 'UTF8' ? "\x{e9}" : $encoding eq 'LATIN1' ? "\x{e9}" : '\u00e9';
	my $invalid = $node->safe_psql($name, q{SELECT last_error FROM outbox.events WHERE destination = 'invalid'});
	utf8::decode($invalid);
	is($invalid,
		"HTTP 400: bad \\xff\\xfe lone \\xc3( cut \\xe2\\x82 overlong \\xc0\\xaf surrogate \\xed\\xa0\\x80 latin $latin end",
		"$encoding: invalid UTF-8 is escaped, a representable character kept");
	if ($encoding eq 'SQL_ASCII')
	{
		is($node->safe_psql($name, q{
			SELECT count(*) FROM outbox.events WHERE last_error !~ '^[\x09\x0a\x20-\x7e]*$'}),
			'0', 'SQL_ASCII: every last_error is plain ASCII');
	}

	# dump and restore into a new UTF8 database: everything comes back
	my $state_sql = q{
		SELECT (SELECT string_agg(name || ' ' || kind, ',' ORDER BY name) FROM outbox.destinations) || ' | ' ||
		       (SELECT count(*) || ' ' || string_agg(id::text || ' ' || status || ' ' || last_error, E'\n' ORDER BY id)
		          FROM outbox.events)};
	my $before = $node->safe_psql($name, $state_sql);
	my $dump = "$PostgreSQL::Test::Utils::tmp_check/$name.dump";
	$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr($name) ],
		"$encoding: pg_dump");
	$node->safe_psql('postgres', qq{
		CREATE DATABASE ${name}_restored ENCODING 'UTF8' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'});
	$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr("${name}_restored"), $dump ],
		"$encoding: pg_restore into a new UTF8 database");
	is($node->safe_psql("${name}_restored", $state_sql), $before,
		"$encoding: every event and destination is restored");
	no_secret_in("$encoding restored outbox.events", $node->safe_psql("${name}_restored",
		q{SELECT string_agg(row_to_json(e)::text, E'\n') FROM outbox.events e}));
}

# the server log: no secret, no raw escape character
my $log = slurp_file($node->logfile);
no_secret_in('the server log', $log);
ok($log !~ /\x1b/, 'no raw ESC in the server log');
ok(!$node->log_contains('terminated by signal'), 'no process crashed');

$node->stop;
stop_sink($sink);
done_testing();
