#!/usr/bin/env python3
"""CPU cost per call, counted in instructions: emit() vs a prepared plain
INSERT of the same row and vs PgQ's pgq.insert_event(), and claim() vs a
prepared INSERT ... ON CONFLICT DO NOTHING.  Each variant runs N times in a single-user backend under
valgrind's callgrind, which counts instructions exactly, whatever else the
machine is doing — the pgbench ratios (emit_bench.py) move by ±15 % on a
shared machine, these do not.  Network and client costs, the same for
both sides of each pair, are not included.

Environment: BENCH_CALLS (default 3000).
"""
import glob
import os
import re
import shutil
import subprocess
import tempfile

# the major test/bench/run chose (PG_BIN), else the newest installed
BIN = os.environ.get("PG_BIN") or max(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
N = int(os.environ.get("BENCH_CALLS", "3000"))
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'

SETUP = """
CREATE EXTENSION outbox_pg;
CREATE EXTENSION pgq;
SELECT pgq.create_queue('payments');
CREATE SCHEMA bench;
CREATE TABLE bench.plain_events (LIKE outbox.events INCLUDING ALL);
CREATE TABLE bench.plain_claims (LIKE inbox.claims INCLUDING ALL);
INSERT INTO outbox.destinations (name, url) VALUES ('payments', 'http://127.0.0.1:9/');
INSERT INTO outbox.routes (pattern, destination) VALUES ('payment.*', 'payments');
"""

VARIANTS = {
    "insert": ("PREPARE s(text) AS INSERT INTO bench.plain_events (id, type, aggregate_id, payload, "
               "destination, status, attempts, next_attempt_at, created_at) VALUES (gen_random_uuid(), "
               f"'payment.created', $1, '{PAYLOAD}', 'payments', 'pending', 0, now(), now());", "{i}"),
    "emit": (f"PREPARE s(text) AS SELECT outbox.emit('payment.created', $1, '{PAYLOAD}');", "{i}"),
    "pgq": (f"PREPARE s(text) AS SELECT pgq.insert_event('payments', 'payment.created', '{PAYLOAD}');", "{i}"),
    "upsert": ("PREPARE s(text) AS INSERT INTO bench.plain_claims (consumer, message_id, claimed_at, "
               "expires_at) VALUES ('default', $1, now(), now() + interval '7 days') ON CONFLICT DO NOTHING;", "m{i}"),
    "claim": ("PREPARE s(text) AS SELECT inbox.claim($1);", "m{i}"),
}


def single(datadir, script, out=None):
    cmd = [f"{BIN}/postgres", "--single", "-D", datadir, "-c", "fsync=off", "-c", "synchronous_commit=off", "postgres"]
    if out:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + cmd
    p = subprocess.run(cmd, input=script, capture_output=True, text=True)
    if "ERROR" in p.stdout or p.returncode != 0:
        raise SystemExit(f"single-user run failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    m = re.search(r"Collected : (\d+)", p.stderr)
    return int(m.group(1)) if m else None


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_cost_")
    data = os.path.join(tmp, "data")
    subprocess.run([f"{BIN}/initdb", "-D", data, "-A", "trust", "--no-sync"], check=True, capture_output=True)
    single(data, SETUP)
    try:
        base = single(data, "SELECT 1;\n", os.path.join(tmp, "cg.base"))
        cost = {}
        for name, (prepare, arg) in VARIANTS.items():
            script = prepare + "\n" + "".join(f"EXECUTE s('{arg.format(i=i)}');\n" for i in range(N))
            total = single(data, script, os.path.join(tmp, f"cg.{name}"))
            cost[name] = (total - base) / N
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"Backend instructions per call (callgrind, {N} calls, single-user backend)")
    print()
    print("| operation | baseline | instructions | outbox_pg | instructions | baseline/outbox_pg |")
    print("|---|---|---|---|---|---|")
    print(f"| write an event | prepared INSERT | {cost['insert']:,.0f} | emit() | {cost['emit']:,.0f} | {cost['insert'] / cost['emit']:.2f} |")
    print(f"| write an event | PgQ pgq.insert_event() | {cost['pgq']:,.0f} | emit() | {cost['emit']:,.0f} | {cost['pgq'] / cost['emit']:.2f} |")
    print(f"| claim a message id | prepared INSERT ... ON CONFLICT DO NOTHING | {cost['upsert']:,.0f} | inbox.claim() | {cost['claim']:,.0f} | {cost['upsert'] / cost['claim']:.2f} |")


if __name__ == "__main__":
    main()
