# Helpers for the broker TAP tests (050-059): the botocore SigV4 verifier
# (test/sink/aws_sink.py), the local-aws-sqs emulator, a private RabbitMQ
# node with the management plugin, a webhook receiver that parses
# requests with the JavaScript CloudEvents SDK (test/sink/ce_receiver.js),
# and librdkafka's mock Kafka cluster (test/sink/kafka_mock.c) read back
# with kcat, all on 127.0.0.1.
#
# The packages come from test/install-deps (python3-botocore,
# rabbitmq-server, python3-pika, python3-psycopg2, librdkafka-dev, kcat,
# npm local-aws-sqs and cloudevents under /opt/outbox_pg-test/node).  A
# test skips, naming the package, only when
# one is missing; CI installs them all, so in CI every test runs.
package BrokerTest;

use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path remove_tree);
use HTTP::Tiny;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use OutboxTest ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use Exporter 'import';
our @EXPORT = qw(require_packages start_aws_sink stop_aws_sink aws_records start_local_sqs
  stop_local_sqs sqs_call start_ce_receiver stop_ce_receiver ce_records start_rabbitmq stop_rabbitmq finish_rabbitmq rabbit_api rabbit_ctl
  start_kafka_mock kafka_command kafka_consume
  AWS_KEY AWS_SECRET NODE_PREFIX);

my $SRC = abs_path(dirname(__FILE__) . '/../..');

# Everything started here is stopped when the test ends, failed or not
# (also when the test is interrupted).
my (@handles, @rabbits);
$SIG{TERM} = $SIG{INT} = sub { exit 1; };

END
{
	local $?;
	for my $h (@handles) { eval { $h->kill_kill if $h->pumpable; }; }
	for my $r (@rabbits) { eval { finish_rabbitmq($r) if $r->{running}; }; }
}

use constant AWS_KEY => 'AKIDOUTBOXPGTEST';
use constant AWS_SECRET => 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYtest/key=';
use constant NODE_PREFIX => '/opt/outbox_pg-test/node';

# Skip the whole file, saying which package is missing, unless every
# check passes.  Checks: 'botocore', 'pika', 'psycopg2', 'rabbitmq',
# 'local-aws-sqs', 'cloudevents', 'librdkafka-dev', 'kcat'.
sub require_packages
{
	my @missing;
	for my $p (@_)
	{
		my $ok;
		if ($p eq 'botocore' || $p eq 'pika' || $p eq 'psycopg2')
		{
			$ok = system("/usr/bin/python3 -c 'import $p' >/dev/null 2>&1") == 0;
		}
		elsif ($p eq 'rabbitmq')
		{
			$ok = -x '/usr/lib/rabbitmq/bin/rabbitmq-server' || -x '/usr/sbin/rabbitmq-server';
		}
		elsif ($p eq 'librdkafka-dev')
		{
			$ok = -f '/usr/include/librdkafka/rdkafka_mock.h';
		}
		elsif ($p eq 'kcat')
		{
			$ok = -x '/usr/bin/kcat';
		}
		elsif ($p eq 'local-aws-sqs' || $p eq 'cloudevents')
		{
			$ok = -f NODE_PREFIX . "/node_modules/$p/package.json"
			  && system('node --version >/dev/null 2>&1') == 0;
		}
		push @missing, $p unless $ok;
	}
	plan skip_all => 'not installed (run test/install-deps as root): ' . join(', ', @missing)
	  if @missing;
}

sub _wait_port
{
	my ($port, $up, $seconds) = @_;
	my $deadline = time + ($seconds // 15);
	while (time < $deadline)
	{
		my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp');
		if ($s) { close $s; return 1 if $up; }
		else { return 1 if !$up; }
		usleep(50_000);
	}
	return 0;
}

# The botocore SigV4 verifier, answering SNS and SQS.
sub start_aws_sink
{
	my (%opt) = @_;
	my $port = $opt{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $log = "$PostgreSQL::Test::Utils::tmp_check/aws_sink_$port.jsonl";
	my $out = '';
	my $h = IPC::Run::start(
		[
			'/usr/bin/python3', "$SRC/test/sink/aws_sink.py", '--port', $port,
			'--log', $log, '--access-key', AWS_KEY, '--secret', AWS_SECRET,
			'--region', 'us-east-1'
		],
		'>', \$out, '2>', \$out);
	push @handles, $h;
	_wait_port($port, 1) or die "aws_sink did not start: $out";
	return { port => $port, log => $log, handle => $h, url => "http://127.0.0.1:$port/" };
}

sub stop_aws_sink
{
	my ($sink) = @_;
	$sink->{handle}->kill_kill;
	_wait_port($sink->{port}, 0);
}

# Every request the verifier received, in order (same log format as the
# webhook sink's).
sub aws_records
{
	my ($sink) = @_;
	return OutboxTest::sink_records($sink);
}

# local-aws-sqs from npm, with the given queues ([name, fifo?] pairs).
sub start_local_sqs
{
	my (@queues) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $qjson = encode_json([
		map {
			$_->[1]
			  ? { QueueName => $_->[0], Attributes => { FifoQueue => 'true', ContentBasedDeduplication => 'false' } }
			  : { QueueName => $_->[0] }
		} @queues ]);
	my $script = qq{
		const { createSqsServer } = require('local-aws-sqs');
		createSqsServer({ port: $port, hostname: '127.0.0.1', baseUrl: '/',
		                  emulateQueueCreationLifecycle: false, queues: $qjson })
		  .then(() => console.log('listening'));
	};
	my $out = '';
	local $ENV{NODE_PATH} = NODE_PREFIX . '/node_modules';
	my $h = IPC::Run::start([ 'node', '-e', $script ], '>', \$out, '2>', \$out);
	push @handles, $h;
	_wait_port($port, 1) or die "local-aws-sqs did not start: $out";
	return { port => $port, handle => $h, url => "http://127.0.0.1:$port/", out => \$out };
}

sub stop_local_sqs
{
	my ($sqs) = @_;
	$sqs->{handle}->kill_kill;
	_wait_port($sqs->{port}, 0);
}

# One SQS JSON-protocol call (unsigned: the emulator does not check).
sub sqs_call
{
	my ($sqs, $action, $body) = @_;
	my $res = HTTP::Tiny->new(timeout => 30)->post(
		$sqs->{url},
		{
			headers => {
				'Content-Type' => 'application/x-amz-json-1.0',
				'X-Amz-Target' => "AmazonSQS.$action"
			},
			content => encode_json($body)
		});
	die "SQS $action failed: $res->{status} $res->{content}" unless $res->{success};
	return $res->{content} eq '' ? {} : decode_json($res->{content});
}

# The webhook receiver that hands every request to the CloudEvents SDK's
# HTTP.toEvent and logs what it parsed, one JSON object per line.
sub start_ce_receiver
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $log = "$PostgreSQL::Test::Utils::tmp_check/ce_receiver_$port.jsonl";
	my $out = '';
	local $ENV{NODE_PATH} = NODE_PREFIX . '/node_modules';
	my $h = IPC::Run::start([ 'node', "$SRC/test/sink/ce_receiver.js", $port, $log ],
		'>', \$out, '2>', \$out);
	push @handles, $h;
	_wait_port($port, 1) or die "ce_receiver did not start: $out";
	return { port => $port, log => $log, handle => $h, url => "http://127.0.0.1:$port/", out => \$out };
}

sub stop_ce_receiver
{
	my ($r) = @_;
	$r->{handle}->kill_kill;
	_wait_port($r->{port}, 0);
}

# What the SDK made of each request so far, in order (decoded JSON).
sub ce_records
{
	my ($r) = @_;
	open(my $fh, '<', $r->{log}) or return ();
	my @recs = map { JSON::PP->new->utf8->decode($_) } grep { /\S/ } <$fh>;
	close $fh;
	return @recs;
}

# A private RabbitMQ node: its own ports, node name, data directory and
# config, listening on 127.0.0.1 only, management plugin enabled.  Runs as
# the invoking (postgres) user with a private HOME (for the Erlang
# cookie).  The Debian system service is not used.  start_rabbitmq(undef,
# tls => 1) adds an AMQPS listener ($rmq->{amqps}) with a throwaway
# certificate for the name localhost only ($rmq->{cert}, also its CA).
sub start_rabbitmq
{
	my ($rmq, %opt) = @_;
	if (!$rmq)
	{
		my $base = "$PostgreSQL::Test::Utils::tmp_check/rabbitmq";
		remove_tree($base);
		make_path("$base/home", "$base/mnesia", "$base/log");
		chmod 0700, "$base/home";
		my $amqp = PostgreSQL::Test::Cluster::get_free_port();
		my $mgmt = PostgreSQL::Test::Cluster::get_free_port();
		my $dist = PostgreSQL::Test::Cluster::get_free_port();
		my $epmd = PostgreSQL::Test::Cluster::get_free_port();
		open(my $fh, '>', "$base/rabbitmq.conf") or die;
		print $fh "listeners.tcp.1 = 127.0.0.1:$amqp\n",
		  "management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = $mgmt\n",
		  "loopback_users.guest = true\n";
		my $amqps;
		if ($opt{tls})
		{
			$amqps = PostgreSQL::Test::Cluster::get_free_port();
			my $err = '';
			IPC::Run::run([ 'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
					'-keyout', "$base/key.pem", '-out', "$base/cert.pem", '-subj', '/CN=localhost',
					'-addext', 'subjectAltName=DNS:localhost' ], '>', \$err, '2>', \$err)
			  or die "openssl: $err";
			print $fh "listeners.ssl.1 = 127.0.0.1:$amqps\n",
			  "ssl_options.cacertfile = $base/cert.pem\n",
			  "ssl_options.certfile = $base/cert.pem\n",
			  "ssl_options.keyfile = $base/key.pem\n",
			  "ssl_options.verify = verify_none\n",
			  "ssl_options.fail_if_no_peer_cert = false\n";
		}
		close $fh;
		open($fh, '>', "$base/enabled_plugins") or die;
		print $fh "[rabbitmq_management].\n";
		close $fh;
		open($fh, '>', "$base/home/.erlang.cookie") or die;
		print $fh "OUTBOXPGTESTCOOKIE" . int(rand(1e9)) . "\n";
		close $fh;
		chmod 0400, "$base/home/.erlang.cookie";
		$rmq = {
			base => $base, amqp => $amqp, mgmt => $mgmt, dist => $dist, epmd => $epmd,
			($opt{tls} ? (amqps => $amqps, cert => "$base/cert.pem") : ()),
			node => "outboxpg$mgmt\@localhost",
			url => "http://127.0.0.1:$mgmt",
		};
	}
	my %env = (
		HOME => "$rmq->{base}/home",
		RABBITMQ_NODENAME => $rmq->{node},
		RABBITMQ_CONFIG_FILE => "$rmq->{base}/rabbitmq",
		RABBITMQ_ENABLED_PLUGINS_FILE => "$rmq->{base}/enabled_plugins",
		RABBITMQ_MNESIA_BASE => "$rmq->{base}/mnesia",
		RABBITMQ_LOG_BASE => "$rmq->{base}/log",
		RABBITMQ_DIST_PORT => $rmq->{dist},
		ERL_EPMD_ADDRESS => '127.0.0.1',
		ERL_EPMD_PORT => $rmq->{epmd},
		RABBITMQ_PID_FILE => "$rmq->{base}/rabbitmq.pid",
		RABBITMQ_CONF_ENV_FILE => "$rmq->{base}/none.env",
	);
	local @ENV{ keys %env } = values %env;
	my $server = -x '/usr/lib/rabbitmq/bin/rabbitmq-server'
	  ? '/usr/lib/rabbitmq/bin/rabbitmq-server' : '/usr/sbin/rabbitmq-server';
	my $out = '';
	$rmq->{env} = \%env;
	$rmq->{handle} = IPC::Run::start([$server], '>', "$rmq->{base}/log/stdout.log", '2>&1');
	push @rabbits, $rmq unless grep { $_ == $rmq } @rabbits;
	$rmq->{running} = 1;
	my $deadline = time + 60;
	my $ok = 0;
	while (time < $deadline)
	{
		my $r = rabbit_api($rmq, 'GET', '/api/overview');
		if ($r->{status} == 200) { $ok = 1; last; }
		usleep(200_000);
	}
	die "RabbitMQ did not start; see $rmq->{base}/log" unless $ok;
	return $rmq;
}

sub stop_rabbitmq
{
	my ($rmq) = @_;
	local @ENV{ keys %{ $rmq->{env} } } = values %{ $rmq->{env} };
	my $ctl = -x '/usr/lib/rabbitmq/bin/rabbitmqctl'
	  ? '/usr/lib/rabbitmq/bin/rabbitmqctl' : '/usr/sbin/rabbitmqctl';
	system($ctl, '-n', $rmq->{node}, 'stop');
	$rmq->{handle}->finish if $rmq->{handle};
	$rmq->{running} = 0;
	_wait_port($rmq->{mgmt}, 0, 30);
	_wait_port($rmq->{amqp}, 0, 30);
}

# rabbitmqctl against the node (set_vm_memory_high_watermark ...); dies
# when it fails.
sub rabbit_ctl
{
	my ($rmq, @args) = @_;
	local @ENV{ keys %{ $rmq->{env} } } = values %{ $rmq->{env} };
	my $ctl = -x '/usr/lib/rabbitmq/bin/rabbitmqctl'
	  ? '/usr/lib/rabbitmq/bin/rabbitmqctl' : '/usr/sbin/rabbitmqctl';
	system($ctl, '-q', '-n', $rmq->{node}, @args) == 0
	  or die "rabbitmqctl @args failed";
}

# Stop the node and the private epmd it started (its own port).
sub finish_rabbitmq
{
	my ($rmq) = @_;
	stop_rabbitmq($rmq) if $rmq->{running};
	local @ENV{ keys %{ $rmq->{env} } } = values %{ $rmq->{env} };
	system("epmd -port $rmq->{epmd} -kill >/dev/null 2>&1");
}

# A management API call as guest; returns { status, body (decoded) }.
sub rabbit_api
{
	my ($rmq, $method, $path, $body) = @_;
	my $res = HTTP::Tiny->new(timeout => 30)->request(
		$method,
		"$rmq->{url}$path",
		{
			headers => {
				Authorization => 'Basic ' . encode_base64('guest:guest', ''),
				'Content-Type' => 'application/json'
			},
			defined $body ? (content => encode_json($body)) : ()
		});
	my $decoded = eval { decode_json($res->{content}) };
	return { status => $res->{status}, body => $decoded, raw => $res->{content} };
}

# librdkafka's mock cluster (test/sink/kafka_mock.c, built here with the
# system compiler) with the given topics: returns its bootstrap address
# and the paths of its command FIFO and acknowledgements.
sub start_kafka_mock
{
	my (@topics) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir('kafka_mock');
	my $bin = "$dir/kafka_mock";
	my $cc = `cc -Wall -Werror -o $bin $SRC/test/sink/kafka_mock.c -lrdkafka 2>&1`;
	die "could not build kafka_mock: $cc" if $?;
	system('mkfifo', "$dir/commands") == 0 or die "mkfifo failed";
	my $out = '';
	my $h = IPC::Run::start([ $bin, "$dir/state", "$dir/commands", join(',', @topics) ],
		'>', \$out, '2>', \$out);
	push @handles, $h;
	my $deadline = time + 15;
	while (time < $deadline && !(-s "$dir/state")) { usleep(50_000); }
	open(my $f, '<', "$dir/state") or die "kafka_mock did not start: $out";
	my $bootstrap = <$f>;
	close $f;
	chomp $bootstrap;
	return { bootstrap => $bootstrap, dir => $dir, handle => $h, commands => 0,
		url => "kafka://$bootstrap", out => \$out };
}

# Send a command to the mock (see kafka_mock.c) and wait until it took
# effect.
sub kafka_command
{
	my ($k, $command) = @_;
	open(my $f, '>', "$k->{dir}/commands") or die "command FIFO: $!";
	print $f "$command\n";
	close $f;
	my $n = ++$k->{commands};
	my $deadline = time + 15;
	while (time < $deadline)
	{
		if (open(my $a, '<', "$k->{dir}/state.ack"))
		{
			my @lines = <$a>;
			close $a;
			return $lines[ $n - 1 ] =~ /^ok/ ? 1 : 0 if @lines >= $n;
		}
		usleep(20_000);
	}
	die "kafka_mock did not take command $command";
}

# Every message of a topic, from the beginning, read with kcat: a list of
# {partition, offset, key, payload, headers => {name => value}}, in
# partition and offset order.
sub kafka_consume
{
	my ($k, $topic) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'kcat', '-C', '-b', $k->{bootstrap}, '-t', $topic, '-o', 'beginning',
			'-e', '-J', '-q', '-m', '10' ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60))
	  or die "kcat failed: $err";
	my @msgs;
	for my $line (split /\n/, $out)
	{
		next unless $line =~ /^\{/;
		my $m = decode_json($line);
		my %h = @{ $m->{headers} // [] };
		$m->{headers} = \%h;
		push @msgs, $m;
	}
	return sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} } @msgs;
}

1;
