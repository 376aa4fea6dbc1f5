# Egress: URL forms against outbox.allowed_hosts with real traffic.
#
# The whole test (cluster, relay, sinks) runs inside a private network
# namespace whose only interface is lo, so nothing can leave the machine
# even if the check is wrong.  lo there also carries 169.254.169.254 and
# fd00:ec2::254, and a private /etc/hosts (bind-mounted in a private
# mount namespace; the system's file is not touched) maps test names to
# them, so the open-socket check is exercised against the metadata
# addresses for real.  Sinks listen on 127.0.0.1, 127.0.0.2, [::1] and
# the two metadata addresses.
use strict;
use warnings;

BEGIN
{
	# Re-run this script inside the namespaces: an outer user namespace
	# (root there, to set up lo and the mount) and an inner one that maps
	# our own uid back, since PostgreSQL refuses to run as root.
	if (!$ENV{OUTBOX_EGRESS_NETNS})
	{
		require File::Temp;
		my $uid = $<;
		my $gid = $( + 0;
		if (system('unshare -Urnm true >/dev/null 2>&1') != 0)
		{
			print "1..0 # SKIP user and network namespaces are not available here\n";
			exit 0;
		}
		my ($fh, $hosts) = File::Temp::tempfile('outbox_egress_hosts_XXXXXX', TMPDIR => 1, UNLINK => 0);
		print $fh "127.0.0.1 localhost\n::1 localhost\n"
		  . "127.0.0.2 sink2.test\n"
		  . "169.254.169.254 meta.test\n"
		  . "fd00:ec2::254 meta6.test\n";
		close $fh;
		chmod 0644, $hosts;
		# bash -c SCRIPT NAME HOSTS UID GID PERL ARGS...
		my $setup = q{
			set -e
			PATH="$PATH:/usr/sbin:/sbin"
			hosts=$1 uid=$2 gid=$3
			shift 3
			ip link set lo up
			ip addr add 169.254.169.254/32 dev lo
			ip addr add fd00:ec2::254/128 dev lo
			mount --bind "$hosts" /etc/hosts
			rm -f "$hosts"
			exec unshare -U --map-user="$uid" --map-group="$gid" -- "$@"
		};
		$ENV{OUTBOX_EGRESS_NETNS} = 1;
		exec('unshare', '-Urnm', '--', 'bash', '-c', $setup, 'egress-netns', $hosts,
			$uid, $gid, $^X, (map { "-I$_" } grep { !ref } @INC), $0, @ARGV)
		  or die "could not exec unshare: $!";
	}
}

use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# only lo, in a namespace of our own
my $links = `PATH="\$PATH:/usr/sbin:/sbin" ip -o link show`;
my @links = ($links =~ /^\d+:\s+(\S+?)[:@]/mg);
is_deeply(\@links, ['lo'], 'the test runs in a network namespace with lo only');

my $s1 = start_sink(host => '127.0.0.1');
my $s2 = start_sink(host => '127.0.0.2');
my $s6 = start_sink(host => '::1');
my $meta = start_sink(host => '169.254.169.254');
my $meta6 = start_sink(host => 'fd00:ec2::254');
my ($p1, $p2, $p6, $pm, $pm6) = map { $_->{port} } ($s1, $s2, $s6, $meta, $meta6);

my $node = new_outbox_node('egress',
	"outbox.allowed_hosts = '127.0.0.1, sink2.test, [::1]:$p6, meta.test, meta6.test'\n");
$node->start;

# name, URL, max_attempts: refusals are retried, so refused destinations
# that should die at once get 1
my @dests = (
	[ 'plain',      "http://127.0.0.1:$p1/ok/plain",                 1 ],
	[ 'decimal',    "http://2130706433:$p1/ok/decimal",              1 ],
	[ 'octal',      "http://0177.0.0.1:$p1/ok/octal",                1 ],
	[ 'hex',        "http://0x7f.1:$p1/ok/hex",                      1 ],
	[ 'userinfo',   "http://127.0.0.1\@127.0.0.2:$p2/ok/userinfo",   1 ],
	[ 'byname',     "http://sink2.test:$p2/ok/byname",               1 ],
	[ 'byaddress',  "http://127.0.0.2:$p2/ok/byaddress",             1 ],
	[ 'dotname',    "http://SINK2.test.:$p2/ok/dotname",             1 ],
	[ 'v6',         "http://[::1]:$p6/ok/v6",                        1 ],
	[ 'v6long',     "http://[0:0:0:0:0:0:0:1]:$p6/ok/v6long",        1 ],
	[ 'v6port',     "http://[::1]:$p1/ok/v6port",                    1 ],
	[ 'metaaddr',   "http://169.254.169.254:$pm/ok/metaaddr",        1 ],
	[ 'metadec',    "http://2852039166:$pm/ok/metadec",              1 ],
	[ 'metamapped', "http://[::ffff:169.254.169.254]:$pm/ok/metamapped", 1 ],
	[ 'metaname',   "http://meta.test:$pm/ok/metaname",              1000 ],
	[ 'meta6name',  "http://meta6.test:$pm6/ok/meta6name",           1 ],
	[ 'redirect',   "http://127.0.0.1:$p1/redirect/r?to=http://127.0.0.2:$p2/ok/target", 1 ]);

$node->safe_psql('postgres', 'CREATE EXTENSION outbox_pg');
for my $d (@dests)
{
	$node->safe_psql('postgres', qq{
		INSERT INTO outbox.destinations (name, url, timeout_ms, max_attempts, backoff_base_ms, backoff_max_ms, options)
		VALUES ('$d->[0]', '$d->[1]', 2000, $d->[2], 50, 200, '{"circuit_threshold": 0}')});
	emit_events($node, 'egress.test', $d->[0], 1);
}

sub settled
{
	my ($dest) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT status IN ('published', 'dead') FROM outbox.events WHERE destination = '$dest'});
}

# status|last_status|last_error of the destination's event (since 0.4.0 a
# published event keeps no last_status: the store writes only failures)
sub row
{
	my ($dest) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT status || '|' || coalesce(last_status::text, '') || '|' || coalesce(last_error, '')
		  FROM outbox.events WHERE destination = '$dest'});
}

sub requests
{
	my ($sink) = @_;
	my @records = sink_records($sink);
	return scalar(@records);
}

sub received
{
	my ($sink, $path) = @_;
	return scalar(grep { $_->{path} eq $path } sink_records($sink));
}

# allowed: the numeric forms of 127.0.0.1, a listed name, IPv6 in any spelling
for my $d (qw(plain decimal octal hex))
{
	ok(settled($d), "$d settled");
	is(row($d), 'published||', "$d: published");
	is(received($s1, "/ok/$d"), 1, "$d: received on 127.0.0.1");
}
for my $d (qw(v6 v6long))
{
	ok(settled($d), "$d settled");
	is(row($d), 'published||', "$d: published");
	is(received($s6, "/ok/$d"), 1, "$d: received on [::1]");
}
ok(settled('byname'), 'byname settled');
is(row('byname'), 'published||', 'a listed name that resolves to 127.0.0.2 is published');
is(received($s2, '/ok/byname'), 1, 'and received on 127.0.0.2');

# refused before any connection
my %refused = (
	userinfo   => 'host "127.0.0.2" is not in outbox.allowed_hosts',
	byaddress  => 'host "127.0.0.2" is not in outbox.allowed_hosts',
	v6port     => qq{port $p1 of host "[::1]" is not in outbox.allowed_hosts},
	metaaddr   => 'address 169.254.169.254 is link-local or a cloud metadata address and is not named in outbox.allowed_hosts',
	metadec    => 'address 169.254.169.254 is link-local or a cloud metadata address and is not named in outbox.allowed_hosts',
	metamapped => 'address 169.254.169.254 is link-local or a cloud metadata address and is not named in outbox.allowed_hosts');
for my $d (sort keys %refused)
{
	ok(settled($d), "$d settled");
	is(row($d), "dead||$refused{$d}", "$d: refused with the reason, no HTTP status");
}
is(received($s2, '/ok/userinfo') + received($s2, '/ok/byaddress'), 0,
	'the refused 127.0.0.2 destinations were never contacted');
is(received($s6, "/ok/v6port") + received($s1, "/ok/v6port"), 0, 'nor the wrong port');

# a listed name resolving to a metadata address: refused at connect time,
# from curl's open-socket callback, before a socket exists
ok($node->poll_query_until('postgres', q{
	SELECT status = 'pending' AND attempts >= 2 AND last_status IS NULL
	   AND last_error = 'address 169.254.169.254 is link-local or a cloud metadata address and is not named in outbox.allowed_hosts'
	  FROM outbox.events WHERE destination = 'metaname'}),
	'a listed name resolving to 169.254.169.254 is refused at connect time (and retried)');
ok(settled('meta6name'), 'meta6name settled');
is(row('meta6name'),
	'dead||address fd00:ec2::254 is link-local or a cloud metadata address and is not named in outbox.allowed_hosts',
	'a listed name resolving to fd00:ec2::254 is refused at connect time');
is(requests($meta) + requests($meta6), 0,
	'the metadata sinks received nothing');

# one trailing dot and upper case still match the listed name (the
# resolver here has no entry for the dotted form, so it fails there)
ok(settled('dotname'), 'dotname settled');
like(row('dotname'), qr/^dead\|\|Could not resolve host: sink2\.test\./i,
	'SINK2.test. passes the allow-list and fails only in the resolver');

# redirects are not followed
ok(settled('redirect'), 'redirect settled');
like(row('redirect'), qr/^dead\|302\|/, 'a 302 is recorded as the final answer');
is(received($s2, '/ok/target'), 0, 'the redirect target was never requested');

# naming the metadata address lets the retried event through: the setting
# is read again on reload, and the refusal was retried, not dead
$node->safe_psql('postgres', qq{
	ALTER SYSTEM SET outbox.allowed_hosts = '127.0.0.1, sink2.test, [::1]:$p6, meta.test, meta6.test, 169.254.169.254:$pm';
	SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres', q{
	SELECT status = 'published' FROM outbox.events WHERE destination = 'metaname'}),
	'once 169.254.169.254 is named, the event is published');
is(received($meta, '/ok/metaname'), 1, 'and received on 169.254.169.254');

# an empty list allows any host, but still not the metadata addresses
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET outbox.allowed_hosts = '';
	SELECT pg_reload_conf()});
$node->safe_psql('postgres', q{
	UPDATE outbox.destinations SET max_attempts = 1000 WHERE name IN ('byaddress', 'meta6name')});
my ($open_id) = emit_events($node, 'egress.test', 'byaddress', 1);
ok($node->poll_query_until('postgres', qq{
	SELECT status = 'published' FROM outbox.events WHERE id = '$open_id'}),
	'with an empty list, 127.0.0.2 is allowed');
my ($meta6_id) = emit_events($node, 'egress.test', 'meta6name', 1);
ok($node->poll_query_until('postgres', qq{
	SELECT attempts >= 2 AND last_error LIKE 'address fd00:ec2::254 is link-local%'
	  FROM outbox.events WHERE id = '$meta6_id'}),
	'with an empty list, a name resolving to fd00:ec2::254 is still refused');
is(requests($meta6), 0, 'the IPv6 metadata sink received nothing');

# a bad list is refused when it is set, and the old one stays
my ($ok, $out, $err) = $node->psql('postgres',
	q{ALTER SYSTEM SET outbox.allowed_hosts = 'sink2.test, http://evil.test/'});
like($err, qr/Entry "http:\/\/evil\.test\/" is a URL/, 'a bad entry is refused by ALTER SYSTEM');

$node->stop;
stop_sink($_) for ($s1, $s2, $s6, $meta, $meta6);
done_testing();
