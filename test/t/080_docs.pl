# The documentation cannot rot: every ```sql block of README.md and
# docs/*.md runs, in order, in a database of its own per file (with the
# extension created first unless the file creates it), and must succeed;
# a block marked ```sql norun (a signature listing, not a statement) is
# only counted.  The few objects an example assumes (the application's
# payments table, its roles) are created first, below.  Every relative
# link of the Markdown files must name a file that exists and, with an
# anchor, a heading that file has.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use File::Basename qw(dirname);
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = "$FindBin::RealBin/../..";

# what an example takes for granted, per file
my %prelude = (
	'README.md' => q{
		CREATE TABLE payments (id bigint PRIMARY KEY, amount numeric);
	},
	'docs/sql-api.md' => q{
		CREATE TABLE payments (id bigint PRIMARY KEY, amount numeric);
	},
	'docs/inbox.md' => q{
		CREATE SCHEMA app;
		CREATE TABLE app.ledger (message_id text PRIMARY KEY, amount numeric);
	},
	'docs/relay.md' => q{
		INSERT INTO outbox.destinations (name, url)
			VALUES ('billing', 'http://127.0.0.1:9/billing');
	},
	'docs/security.md' => q{
		DO $$
		DECLARE
			r text;
		BEGIN
			FOREACH r IN ARRAY ARRAY['app', 'ops', 'prometheus'] LOOP
				IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
					EXECUTE format('CREATE ROLE %I', r);
				END IF;
			END LOOP;
		END $$;
	},
);

# ```sql blocks of a file: [line, info, text]
sub sql_blocks
{
	my ($path) = @_;
	my @blocks;
	my ($in, $start, $info, $text) = (0);
	open my $fh, '<', $path or die "$path: $!";
	while (my $l = <$fh>)
	{
		if (!$in && $l =~ /^```sql\b(.*)$/)
		{
			($in, $start, $info, $text) = (1, $., $1, '');
		}
		elsif ($in && $l =~ /^```\s*$/)
		{
			push @blocks, [ $start, $info, $text ];
			$in = 0;
		}
		elsif ($in)
		{
			$text .= $l;
		}
	}
	close $fh;
	return @blocks;
}

# GitHub's anchor for a heading
sub slug
{
	my ($h) = @_;
	$h = lc $h;
	$h =~ s/[^\w\- ]//g;
	$h =~ s/ /-/g;
	return $h;
}

my %slugs_of;
sub slugs
{
	my ($path) = @_;
	return $slugs_of{$path} if $slugs_of{$path};
	my %s;
	my $in = 0;
	open my $fh, '<:encoding(UTF-8)', $path or die "$path: $!";
	while (my $l = <$fh>)
	{
		$in = !$in if $l =~ /^```/;
		next if $in;
		$s{ slug($1) } = 1 if $l =~ /^#+ (.*?)\s*$/;
	}
	close $fh;
	return $slugs_of{$path} = \%s;
}

my @files = ('README.md', map { s{^\Q$root\E/}{}r } sort glob("$root/docs/*.md"));
ok(@files >= 10, 'the reference is in docs/ (' . scalar(@files) . ' files)');

my $node = new_outbox_node('docs', '');
$node->start;

my $n = 0;
foreach my $file (@files)
{
	my @blocks = sql_blocks("$root/$file");
	next unless @blocks;
	my $db = 'docs_' . ($n++);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION outbox_pg')
	  unless grep { $_->[2] =~ /CREATE EXTENSION outbox_pg/ } @blocks;
	$node->safe_psql($db, $prelude{$file}) if $prelude{$file};
	foreach my $b (@blocks)
	{
		my ($line, $info, $sql) = @$b;
		if ($info =~ /\bnorun\b/)
		{
			note("$file:$line: not run (marked norun)");
			next;
		}
		my ($ret, $stdout, $stderr) = $node->psql($db, $sql,
			extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
		is($ret, 0, "$file:$line runs") or diag($stderr);
	}
}

# relative links and their anchors, in every Markdown file users read
my @md = (@files, 'clients/node/README.md',
	map { s{^\Q$root\E/}{}r } glob("$root/examples/*/README.md"));
my @broken;
my $links = 0;
foreach my $file (@md)
{
	open my $fh, '<:encoding(UTF-8)', "$root/$file" or die "$file: $!";
	my $in = 0;
	while (my $l = <$fh>)
	{
		$in = !$in if $l =~ /^```/;
		next if $in;
		while ($l =~ /\]\(([^)\s]+)\)/g)
		{
			my $target = $1;
			next if $target =~ m{^[a-z]+:};
			$links++;
			my ($path, $anchor) = split /#/, $target, 2;
			my $resolved =
			  $path eq '' ? "$root/$file" : dirname("$root/$file") . "/$path";
			if (!-e $resolved)
			{
				push @broken, "$file:$.: $target (no such file)";
			}
			elsif (defined $anchor && $resolved =~ /\.md$/
				&& !slugs($resolved)->{$anchor})
			{
				push @broken, "$file:$.: $target (no such heading)";
			}
		}
	}
	close $fh;
}
ok($links > 20, "relative links found ($links)");
is_deeply(\@broken, [], 'every relative link resolves');

$node->stop;
done_testing();
