#!/bin/sh
# Builds @outbox-pg/client and runs its tests (node's own test runner, TAP
# output), or with --examples builds the example applications
# (../../examples/*, their packages installed with "npm ci") and runs
# theirs, against a throwaway PostgreSQL cluster with outbox_pg preloaded:
# initdb in a temporary directory, a free port on 127.0.0.1, CREATE
# EXTENSION outbox_pg, the tests with PGHOST/PGPORT/PGUSER/PGDATABASE set,
# then the cluster is stopped and removed.  Run as a user initdb accepts
# (not root); test/run runs it as postgres after "npm ci" (suites "node"
# and "examples").
#
#   PG_CONFIG  the PostgreSQL whose initdb/postgres to use (default: pg_config
#              on PATH); outbox_pg must be installed there
#   NODE       the node binary (default: node on PATH)
#   TESTS      the compiled test files (default: every build/test/*.test.[c]js,
#              or with --examples every examples/*/dist/test/*.test.js)
set -eu

cd "$(dirname "$0")/.."
NODE=${NODE:-node}
PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=$("$PG_CONFIG" --bindir)

echo "# node $("$NODE" --version), $("$bindir/postgres" --version)"

# the package (dist/: ESM, and CommonJS in dist/cjs/) and the tests
# (build/), which import the package by its name, so they see what an
# application sees
"$NODE" node_modules/typescript/bin/tsc -p tsconfig.json
"$NODE" node_modules/typescript/bin/tsc -p tsconfig.cjs.json
"$NODE" scripts/cjs-package.mjs

# or the example applications, which use the client through a file:
# dependency on this directory
tests="build/test/*.test.js build/test/*.test.cjs"
if [ "${1:-}" = --examples ]; then
	tests=
	for ex in ../../examples/*; do
		if [ ! -d "$ex/node_modules" ]; then
			echo "$ex: run npm ci there first"
			exit 1
		fi
		"$NODE" "$ex/node_modules/typescript/bin/tsc" -p "$ex/tsconfig.json"
		tests="$tests $(echo "$ex"/dist/test/*.test.js)"
	done
else
	"$NODE" node_modules/typescript/bin/tsc -p tsconfig.test.json
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/outbox_pg_node.XXXXXX")
data=$tmp/data
cleanup() {
	if [ -f "$data/postmaster.pid" ]; then
		"$bindir/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$bindir/initdb" -D "$data" -U postgres -A trust -N -E UTF8 --locale=C >"$tmp/initdb.log" 2>&1 || {
	cat "$tmp/initdb.log"
	exit 1
}
cat >>"$data/postgresql.conf" <<EOF
shared_preload_libraries = 'outbox_pg'
max_worker_processes = 16
listen_addresses = '127.0.0.1'
unix_socket_directories = '$tmp'
fsync = off
outbox.poll_interval = '200ms'
outbox.discovery_interval = 1
# relays for the tests' database and the example's only (the client's
# tests create others)
outbox.databases = 'postgres, nestjs_payments'
log_min_messages = warning
EOF

# a free port: the kernel picks one; another process may take it before
# the server binds it, so a failed start tries another
free_port() {
	"$NODE" -e 'const s = require("net").createServer();
		s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}
started=
for try in 1 2 3; do
	port=$(free_port)
	if "$bindir/pg_ctl" -D "$data" -l "$tmp/server.log" -o "-p $port" -w -t 60 start >/dev/null 2>&1; then
		started=1
		break
	fi
done
if [ -z "$started" ]; then
	echo "the test cluster did not start:"
	tail -20 "$tmp/server.log"
	exit 1
fi

export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
"$bindir/psql" -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION outbox_pg' >/dev/null

# node's own runner; TAP whatever the version's default reporter
rc=0
"$NODE" --test --test-reporter=tap ${TESTS:-$tests} || rc=$?
if [ $rc != 0 ]; then
	echo "# server log (last 30 lines):"
	tail -30 "$tmp/server.log" | sed 's/^/# /'
fi
exit $rc
