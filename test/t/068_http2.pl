# HTTP/2 and TLS to webhook receivers (issue #20), against nginx with a
# throwaway certificate (outbox.ca_file trusts it).  Its receivers read
# each request's body and answer 204 (nginx proxies to a plain server),
# but "early" answers before reading it, as nginx's "return" does.
#   - https, http_version auto (the default): HTTP/2 with libcurl 8.0 or
#     later, a burst of 100 concurrent requests multiplexed over few
#     connections (one each without the wait for a multiplexing
#     connection); HTTP/1.1 with an older libcurl (http.c says why);
#   - https, http_version '2': HTTP/2 whatever the libcurl;
#   - https, http_version '1.1': HTTP/1.1 only;
#   - plain http, http_version '2': HTTP/2 without TLS (h2c, prior
#     knowledge), multiplexed too; refused (0A000) before libcurl 8.0;
#   - plain http, auto: HTTP/1.1, as before;
#   - an early answer is delivered once, with no retry;
#   - a 200 whose body is over outbox.max_response_size (10 MB from the
#     sink, streamed through nginx, 20 at once): each is read to its end
#     and thrown away, every event is delivered once, multiplexed too;
#   - TLS is verified: a host name the certificate does not name fails
#     with the reason and stays pending, nothing marked published.
# Against a healthy receiver no event needs a second attempt.  nginx logs
# each request's port, protocol and connection number.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

for my $cmd ('nginx', 'openssl')
{
	plan skip_all => "$cmd is not installed (test/install-deps installs it)"
	  unless grep { -x "$_/$cmd" } split(/:/, "$ENV{PATH}:/usr/sbin:/sbin");
}
my ($nginx) = grep { -x $_ } map { "$_/nginx" } split(/:/, "$ENV{PATH}:/usr/sbin:/sbin");

# a throwaway certificate for 127.0.0.1 (and no other name), its own CA
my $dir = "$PostgreSQL::Test::Utils::tmp_check/nginx_h2";
mkdir $dir;
mkdir "$dir/$_" for qw(body proxy fastcgi uwsgi scgi);
my ($out, $err) = ('', '');
IPC::Run::run([ 'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
		'-keyout', "$dir/key.pem", '-out', "$dir/cert.pem", '-subj', '/CN=outbox_pg test',
		'-addext', 'subjectAltName=IP:127.0.0.1' ], '>', \$out, '2>', \$err)
  or die "openssl: $err";

# nginx 1.25.1 moved HTTP/2 from the listen directive to "http2 on"
my $version = '';
IPC::Run::run([ $nginx, '-v' ], '>', \$out, '2>', \$version);
my ($maj, $min, $pat) = $version =~ m{nginx/(\d+)\.(\d+)\.(\d+)} or die "nginx -v: $version";
my $new_h2 = ($maj * 1_000_000 + $min * 1000 + $pat) >= 1_025_001;
# a TLS port per https destination: libcurl shares a host's connections
# between the destinations sending to it, whatever version each asks for
my %tls = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(auto h2 h11 early batch big);
# answers 200 with a 10 MB body to /big/...
my $sink = start_sink();
my ($h2c, $plain) = map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 2;

# the libcurl the relay runs with (the one it was built against)
my $vernum = '';
IPC::Run::run([ 'curl-config', '--vernum' ], '>', \$vernum) or die 'curl-config failed';
my $sound = hex($vernum) >= 0x080000;
note(sprintf('libcurl %x: HTTP/2 by default %s', hex($vernum), $sound ? 'yes' : 'no (8.0 or later needed)'));
my $h2_listen = $new_h2 ? '' : ' http2';
my $h2_on = $new_h2 ? 'http2 on;' : '';
open(my $fh, '>', "$dir/nginx.conf") or die;
print $fh <<"EOF";
daemon off;
master_process off;
worker_processes 1;
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 1024; }
http {
	log_format h2 '\$server_port \$server_protocol \$connection \$request_method \$uri';
	access_log off;
	client_body_temp_path $dir/body;
	proxy_temp_path $dir/proxy;
	fastcgi_temp_path $dir/fastcgi;
	uwsgi_temp_path $dir/uwsgi;
	scgi_temp_path $dir/scgi;
	client_max_body_size 16m;
	keepalive_requests 100000;
	ssl_certificate $dir/cert.pem;
	ssl_certificate_key $dir/key.pem;
@{[ join('', map { "
	server {
		listen 127.0.0.1:$tls{$_} ssl$h2_listen;
		access_log $dir/access.log h2;
		$h2_on
		location / { proxy_pass http://127.0.0.1:$plain; }
		location /early { return 204; }
		location /big { proxy_buffering off; proxy_pass http://127.0.0.1:$sink->{port}; }
	}" } sort keys %tls) ]}
	server {
		listen 127.0.0.1:$h2c$h2_listen;
		access_log $dir/access.log h2;
		$h2_on
		location / { proxy_pass http://127.0.0.1:$plain; }
	}
	server {
		listen 127.0.0.1:$plain;
		location / { return 204; }
		location /plain { access_log $dir/access.log h2; return 204; }
	}
}
EOF
close $fh;
my $nginx_out = '';
my $nginx_h = IPC::Run::start([ $nginx, '-p', $dir, '-c', "$dir/nginx.conf" ],
	'>', \$nginx_out, '2>', \$nginx_out);
ok(wait_until(sub { -s "$dir/nginx.pid" }, 15), 'nginx started') or diag($nginx_out);
END { $nginx_h->kill_kill if $nginx_h; }

my $node = new_outbox_node('h2', "outbox.ca_file = '$dir/cert.pem'\n");
$node->start;
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox_pg;
	INSERT INTO outbox.destinations (name, url, max_concurrency, options) VALUES
		('tls_auto', 'https://127.0.0.1:$tls{auto}/auto', 100, '{}'),
		('tls_2', 'https://127.0.0.1:$tls{h2}/h2', 100, '{"http_version": "2"}'),
		('tls_11', 'https://127.0.0.1:$tls{h11}/h11', 100, '{"http_version": "1.1"}'),
		('tls_early', 'https://127.0.0.1:$tls{early}/early', 100, '{}'),
		('plain', 'http://127.0.0.1:$plain/plain', 16, '{}'),
		('tls_batch', 'https://127.0.0.1:$tls{batch}/batch', 16, '{"batch": "cloudevents", "batch_size": 10}'),
		('tls_big', 'https://127.0.0.1:$tls{big}/big/h2', 20, '{}');
});

# HTTP/2 without TLS needs libcurl 8.0 (its reuse of such a connection)
my $auto = $sound ? 'HTTP/2.0' : 'HTTP/1.1';
my @cases = ([ 'tls_auto', '/auto', $auto ], [ 'tls_2', '/h2', 'HTTP/2.0' ],
	[ 'tls_11', '/h11', 'HTTP/1.1' ], [ 'tls_early', '/early', $auto ],
	[ 'plain', '/plain', 'HTTP/1.1' ], [ 'tls_batch', '/batch', $auto ],
	[ 'tls_big', '/big/h2', $auto, 20 ]);
my ($rc, $stdout, $stderr) = $node->psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, max_concurrency, options) VALUES
		('h2c', 'http://127.0.0.1:$h2c/h2c', 100, '{"http_version": "2"}')});
if ($sound)
{
	is($rc, 0, 'http_version 2 over plain http is accepted') or diag($stderr);
	push @cases, [ 'h2c', '/h2c', 'HTTP/2.0' ];
}
else
{
	like($stderr, qr/is 2 over plain http, which needs libcurl 8\.0 or later/,
		'http_version 2 over plain http is refused with an old libcurl, with the reason');
}

# What nginx logged for a path: { protocol => count } and the connections.
sub served
{
	my ($uri) = @_;
	my (%proto, %conn);
	open(my $log, '<', "$dir/access.log") or return ({}, 0);
	while (my $line = <$log>)
	{
		my ($port, $p, $c, $m, $u) = split ' ', $line;
		next unless defined $u && $u eq $uri;
		$proto{$p}++;
		$conn{"$port/$c"}++;
	}
	close $log;
	return (\%proto, scalar(keys %conn));
}

sub published
{
	my ($dest) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(*) FROM outbox.events WHERE destination = '$dest' AND status = 'published'});
}

# One transaction of n events to each destination: the relay claims them
# together and starts up to max_concurrency at once.
for my $case (@cases)
{
	my ($dest, $uri, $want, $n) = @$case;
	$n //= 600;
	emit_events($node, "h2.$dest", $dest, $n);
	ok($node->poll_query_until('postgres',
		qq{SELECT count(*) = $n FROM outbox.events WHERE destination = '$dest' AND status = 'published'}),
		"$dest: $n events published");
	my ($proto, $conns) = served($uri);
	my $requests = 0;
	$requests += $_ for values %$proto;
	is_deeply([ keys %$proto ], [$want], "$dest: every request was $want")
	  or diag(explain($proto));
	note("$dest: $requests requests over $conns connections");
	is($node->safe_psql('postgres',
		qq{SELECT count(*) FROM outbox.events WHERE destination = '$dest' AND attempts > 1}),
		0, "$dest: no event needed a second attempt");
	if ($want eq 'HTTP/2.0')
	{
		# 100 streams per connection (libcurl's default), a burst of 100:
		# one connection, a second at most while the first is set up
		cmp_ok($conns, '<=', 3, "$dest: multiplexed over few connections ($conns)");
	}
}

# TLS verification stays on: the certificate names 127.0.0.1, not localhost
$node->safe_psql('postgres', qq{
	INSERT INTO outbox.destinations (name, url, timeout_ms) VALUES
		('tls_wrong_name', 'https://localhost:$tls{auto}/wrong', 2000);
	SELECT outbox.emit('h2.wrong', 'a-1', '{}', destination => 'tls_wrong_name');
});
ok($node->poll_query_until('postgres', q{
	SELECT attempts >= 1 AND status = 'pending' AND last_error ~* 'certificate|SSL'
	  FROM outbox.events WHERE destination = 'tls_wrong_name'}),
	'a certificate that does not name the host: not delivered, retried with the reason');
note($node->safe_psql('postgres', q{SELECT last_error FROM outbox.events WHERE destination = 'tls_wrong_name'}));
my ($wrong) = served('/wrong');
is(scalar(keys %$wrong), 0, 'and nginx received no request for it');

$node->stop;
stop_sink($sink);
done_testing();
