#!/usr/bin/env python3
"""emit() and claim() against their plain-SQL baselines, side by side.

Starts a throwaway cluster, then runs pgbench for each cell
(clients x synchronous_commit) and each variant, interleaving the variants
round by round so machine noise hits all of them alike.  Every run starts
from empty tables.  Prints the median transactions/s per cell and the
ratios of those medians, and the median of the ratios within each round
(robust to the machine's speed drifting between rounds).  A benchmark, not a test: it never fails on a timing.

Variants
  insert   prepared plain INSERT of the same row into a table shaped like
           the log slot emit() writes (LIKE outbox.log_0 INCLUDING ALL: same
           columns, constraints and indexes; 0.4.0), id from
           gen_random_uuid(), xid from pg_current_xact_id()
  emit     SELECT outbox.emit(...) of the same event (routed by type)
  pgq      SELECT pgq.insert_event(...) (PgQ 3 from Debian)
  upsert   prepared INSERT ... ON CONFLICT DO NOTHING into a table shaped
           like inbox.claims
  claim    SELECT inbox.claim(...)

Environment: BENCH_SECONDS (default 5), BENCH_ROUNDS (default 3),
BENCH_CLIENTS (default "1 8"), PG_BIN (default: the newest installed
/usr/lib/postgresql/N/bin).
"""
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# the major test/bench/run chose (PG_BIN), else the newest installed
BIN = os.environ.get("PG_BIN") or max(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CLIENTS = [int(c) for c in os.environ.get("BENCH_CLIENTS", "1 8").split()]
PORT = int(os.environ.get("BENCH_PORT", "54391"))
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'

SCRIPTS = {
    "insert": f"""\\set aid random(1, 1000000)
INSERT INTO bench.plain_events (id, xid, type, aggregate_id, payload, destination,
    created_at)
VALUES (gen_random_uuid(), pg_current_xact_id(), 'payment.created', :aid, '{PAYLOAD}',
    'payments', now());
""",
    "emit": f"""\\set aid random(1, 1000000)
SELECT outbox.emit('payment.created', :aid, '{PAYLOAD}');
""",
    "pgq": f"""\\set aid random(1, 1000000)
SELECT pgq.insert_event('payments', 'payment.created', '{PAYLOAD}');
""",
    "upsert": """\\set mid random(1, 2000000000)
INSERT INTO bench.plain_claims (consumer, message_id, claimed_at, expires_at)
VALUES ('default', :mid, now(), now() + interval '7 days') ON CONFLICT DO NOTHING;
""",
    "claim": """\\set mid random(1, 2000000000)
SELECT inbox.claim(:mid);
""",
}

RESET_SQL = """
TRUNCATE outbox.log_0, outbox.log_1, outbox.log_2, bench.plain_events, inbox.claims, bench.plain_claims;
SELECT pgq.drop_queue('payments', true);
SELECT pgq.create_queue('payments');
CHECKPOINT;
"""


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def psql(datadir, sql):
    return run([f"{BIN}/psql", "-X", "-q", "-h", datadir, "-p", str(PORT),
                "-d", "bench", "-v", "ON_ERROR_STOP=1", "-c", sql]).stdout


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_bench_")
    datadir = os.path.join(tmp, "data")
    run([f"{BIN}/initdb", "-D", datadir, "-A", "trust", "--no-sync"])
    with open(os.path.join(datadir, "postgresql.conf"), "a") as f:
        f.write(f"""
shared_preload_libraries = 'outbox_pg'
# no relay: emit() is measured like pgq.insert_event(), without a consumer
# competing for the CPU (the commit wake-up still runs)
outbox.databases = ''
port = {PORT}
listen_addresses = ''
unix_socket_directories = '{datadir}'
shared_buffers = 512MB
max_wal_size = 4GB
checkpoint_timeout = 30min
autovacuum = off
""")
    run([f"{BIN}/pg_ctl", "-D", datadir, "-l", os.path.join(tmp, "log"), "-w", "start"])
    try:
        run([f"{BIN}/createdb", "-h", datadir, "-p", str(PORT), "bench"])
        psql(datadir, """
CREATE EXTENSION outbox_pg;
CREATE EXTENSION pgq;
CREATE SCHEMA bench;
CREATE TABLE bench.plain_events (LIKE outbox.log_0 INCLUDING ALL);
CREATE TABLE bench.plain_claims (LIKE inbox.claims INCLUDING ALL);
INSERT INTO outbox.destinations (name, url) VALUES ('payments', 'http://127.0.0.1:9/');
INSERT INTO outbox.routes (pattern, destination) VALUES ('payment.*', 'payments');
SELECT pgq.create_queue('payments');
""")
        scripts = {}
        for name, text in SCRIPTS.items():
            path = os.path.join(tmp, name + ".sql")
            with open(path, "w") as f:
                f.write(text)
            scripts[name] = path

        groups = [("events", ["insert", "emit", "pgq"]), ("claims", ["upsert", "claim"])]
        results = {}
        for sync in ["on", "off"]:
            for clients in CLIENTS:
                for gname, variants in groups:
                    for rnd in range(ROUNDS):
                        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                        for v in order:
                            psql(datadir, RESET_SQL)
                            env = dict(os.environ, PGOPTIONS=f"-c synchronous_commit={sync}")
                            out = run([f"{BIN}/pgbench", "-n", "-M", "prepared", "-h", datadir,
                                       "-p", str(PORT), "-c", str(clients), "-j", str(min(clients, 2)),
                                       "-T", str(SECONDS), "-f", scripts[v], "bench"], env=env).stdout
                            tps = next(float(l.split("=")[1].split()[0]) for l in out.splitlines()
                                       if l.startswith("tps ="))
                            results.setdefault((sync, clients, v), []).append(tps)
                            print(f"  sync={sync:3} clients={clients} {v:7} round {rnd + 1}: {tps:10.0f} tps",
                                  file=sys.stderr, flush=True)

        med = {k: statistics.median(v) for k, v in results.items()}

        def paired(sync, c, v, base):
            """The median of the round-by-round ratios: the machine's speed
            drifts between rounds (by half, seen here), less within one."""
            return statistics.median(a / b for a, b in zip(results[(sync, c, v)], results[(sync, c, base)]))
        print()
        print(f"emit() vs plain INSERT vs PgQ — median tps of {ROUNDS} x {SECONDS}s runs, pgbench -M prepared")
        print()
        print("| sync_commit | clients | INSERT | emit() | pgq.insert_event | emit/INSERT | emit/INSERT, per round |"
              " emit/pgq |")
        print("|---|---|---|---|---|---|---|---|")
        for sync in ["on", "off"]:
            for c in CLIENTS:
                i, e, q = med[(sync, c, "insert")], med[(sync, c, "emit")], med[(sync, c, "pgq")]
                print(f"| {sync} | {c} | {i:.0f} | {e:.0f} | {q:.0f} | {e / i:.2f} "
                      f"| {paired(sync, c, 'emit', 'insert'):.2f} | {e / q:.2f} |")
        print()
        print("| sync_commit | clients | INSERT ON CONFLICT | inbox.claim() | claim/INSERT | claim/INSERT, per round |")
        print("|---|---|---|---|---|---|")
        for sync in ["on", "off"]:
            for c in CLIENTS:
                u, cl = med[(sync, c, "upsert")], med[(sync, c, "claim")]
                print(f"| {sync} | {c} | {u:.0f} | {cl:.0f} | {cl / u:.2f} | {paired(sync, c, 'claim', 'upsert'):.2f} |")
    finally:
        subprocess.run([f"{BIN}/pg_ctl", "-D", datadir, "-m", "fast", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
