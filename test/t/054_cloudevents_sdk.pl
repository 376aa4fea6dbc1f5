# CloudEvents against the official JavaScript SDK (npm cloudevents,
# HTTP.toEvent, in test/sink/ce_receiver.js): what a consumer using it
# reads of each webhook request.
#
# Binary mode percent-encodes ce-* values outside printable ASCII (and
# space, '"', '%'), as the HTTP binding says; the SDK never decodes them,
# so its subject and type are the encoded text: the pitfall, shown here
# both with the default and with percent_encoding = 'allow'.  With
# percent_encoding = 'avoid' such an event is sent structured and the SDK
# reads the exact text, while an event that needs no encoding stays
# binary; format = 'structured' sends every event structured.  Ids, type,
# source, time, traceparent and data are checked on every request.
use strict;
use utf8;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use BrokerTest;
use OutboxTest;
use Encode ();
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

BEGIN { require_packages('cloudevents'); }

my $rcv = start_ce_receiver();
my $u = $rcv->{url};
my $node = new_outbox_node('cloudevents');
$node->start;

$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, format, backoff_base_ms, options) VALUES
		('plain',      '${u}plain',      'binary',     100, '{}'),
		('allow',      '${u}allow',      'binary',     100, '{"percent_encoding": "allow"}'),
		('avoid',      '${u}avoid',      'binary',     100, '{"percent_encoding": "avoid"}'),
		('structured', '${u}structured', 'structured', 100, '{}'),
		('avoid_src',  '${u}avoid_src',  'binary',     100, '{"percent_encoding": "avoid", "source": "urn:shop:café"}');
});

# the same four events to each destination
my $tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my @cases = (
	[ 'umlaut', 'order.placed', 'café n°1', { memo => 'Zahlung für Müller ✓', n => 1 } ],
	[ 'ascii', 'order.placed', 'acct-42', { n => 2 } ],
	[ 'space', 'order.placed', 'order 7 "50%"', { n => 3 } ],
	[ 'type', 'bestellung.gebührenfrei', 'acct-43', { n => 4, s => '日本語' } ],
);
my %sent;    # destination => case => { id, time }
for my $d (qw(plain allow avoid structured avoid_src))
{
	for my $c (@cases)
	{
		my ($tag, $type, $agg, $payload) = @$c;
		my $json = JSON::PP->new->canonical->encode($payload);
		my $row = Encode::decode_utf8($node->safe_psql('postgres', Encode::encode_utf8(qq{
			SELECT outbox.emit(\$t\$$type\$t\$, \$a\$$agg\$a\$, \$p\$$json\$p\$::jsonb,
			                   destination => '$d', traceparent => '$tp')})));
		$sent{$d}{$tag} = { id => $row };
	}
}
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 20 FROM outbox.events WHERE status = 'published'}),
	'20 events published');
for my $d (keys %sent)
{
	for my $tag (keys %{ $sent{$d} })
	{
		$sent{$d}{$tag}{time} = $node->safe_psql('postgres', qq{
			SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
			  FROM outbox.events WHERE id = '$sent{$d}{$tag}{id}'});
	}
}

# what the SDK parsed, by message id
my %got;
push @{ $got{ $_->{id} // 'none' } }, $_ for ce_records($rcv);
is(scalar(grep { $_->{error} } map { @$_ } values %got), 0, 'the SDK accepted every request')
  or diag(explain([ grep { $_->{error} } map { @$_ } values %got ]));
is(scalar(map { @$_ } values %got), 20, 'one request per event');

# The binding's encoding: bytes outside printable ASCII, space, '"' and '%'.
sub pct
{
	my ($s) = @_;
	my $b = Encode::encode_utf8($s);
	$b =~ s/([^\x21-\x7e]|["%])/sprintf('%%%02X', ord($1))/ge;
	return $b;
}

# the SDK's view of one event
sub sdk
{
	my ($d, $tag) = @_;
	my $r = $got{ $sent{$d}{$tag}{id} } or return {};
	return $r->[0];
}

# every request: id, source, time, traceparent, data
my $intact = 1;
for my $d (keys %sent)
{
	my $source = $d eq 'avoid_src' ? 'urn:shop:café' : 'urn:outbox_pg:postgres';
	for my $c (@cases)
	{
		my ($tag, $type, $agg, $payload) = @$c;
		my $e = sdk($d, $tag);
		my @bad;
		push @bad, 'id' unless ($e->{id} // '') eq $sent{$d}{$tag}{id};
		push @bad, 'specversion' unless ($e->{specversion} // '') eq '1.0';
		push @bad, 'time' unless ($e->{time} // '') =~ /^\Q$sent{$d}{$tag}{time}\E(\.\d+)?Z$/;
		push @bad, 'traceparent' unless ($e->{traceparent} // '') eq $tp;
		push @bad, 'data' unless JSON::PP->new->canonical->encode($e->{data} // {}) eq
		  JSON::PP->new->canonical->encode($payload);
		push @bad, 'datacontenttype' unless ($e->{datacontenttype} // '') eq 'application/json';
		# a source that needs encoding goes structured under 'avoid' (avoid_src)
		push @bad, 'source' unless ($e->{source} // '') eq $source;
		if (@bad)
		{
			$intact = 0;
			diag("$d/$tag: " . join(', ', @bad) . ': ' . explain($e));
		}
	}
}
ok($intact, 'every event: id, specversion, source, time, traceparent and data intact, in every mode');

# the pitfall: binary mode with the default, and with 'allow'
for my $d (qw(plain allow))
{
	is(join(',', map { sdk($d, $_->[0])->{mode} // '-' } @cases), 'binary,binary,binary,binary',
		"$d: every event in binary mode");
	is(sdk($d, 'umlaut')->{subject}, pct('café n°1'),
		"$d: the SDK yields the non-ASCII subject percent-encoded (caf%C3%A9 n%C2%B01), not decoded");
	isnt(sdk($d, 'umlaut')->{subject}, 'café n°1', "$d: so not the subject that was emitted");
	is(sdk($d, 'space')->{subject}, 'order%207%20%2250%25%22', "$d: space, '\"' and '%' too");
	is(sdk($d, 'type')->{type}, 'bestellung.geb%C3%BChrenfrei', "$d: and a non-ASCII type");
	is(sdk($d, 'ascii')->{subject}, 'acct-42', "$d: an ASCII subject is unchanged");
}

# 'avoid': exact text, structured only where needed
is(join(',', map { sdk('avoid', $_->[0])->{mode} // '-' } @cases), 'structured,binary,structured,structured',
	'avoid: the events whose subject or type needs encoding are structured, the other binary');
is(sdk('avoid', 'umlaut')->{subject}, 'café n°1', 'avoid: the SDK yields the exact non-ASCII subject');
is(sdk('avoid', 'space')->{subject}, 'order 7 "50%"', "avoid: and space, '\"', '%'");
is(sdk('avoid', 'type')->{type}, 'bestellung.gebührenfrei', 'avoid: and the exact non-ASCII type');
is(sdk('avoid', 'ascii')->{subject}, 'acct-42', 'avoid: the binary event reads the same');
is(sdk('avoid', 'umlaut')->{content_type}, 'application/cloudevents+json; charset=utf-8',
	'avoid: structured events are application/cloudevents+json');
is(sdk('avoid', 'ascii')->{content_type}, 'application/json', 'avoid: binary events are application/json');

# structured: always, exact
is(join(',', map { sdk('structured', $_->[0])->{mode} // '-' } @cases),
	'structured,structured,structured,structured', 'structured: every event structured');
is_deeply([ map { sdk('structured', $_->[0])->{subject} } @cases ], [ map { $_->[2] } @cases ],
	'structured: the SDK yields every subject exactly');
is(sdk('structured', 'type')->{type}, 'bestellung.gebührenfrei', 'structured: and the type');

# a source that needs encoding: every event structured under 'avoid'
is(join(',', map { sdk('avoid_src', $_->[0])->{mode} // '-' } @cases),
	'structured,structured,structured,structured', 'avoid with a non-ASCII source: every event structured');
is(sdk('avoid_src', 'ascii')->{source}, 'urn:shop:café', 'and the SDK yields the source exactly');

$node->stop;
stop_ce_receiver($rcv);
done_testing();
