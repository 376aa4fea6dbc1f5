#!/usr/bin/env python3
"""Inbox throughput: inbox.receive() plus the handler run by the worker.

Starts a throwaway cluster with the relay workers (which also run the
inbox), registers a plpgsql handler that writes one ledger row per
message, and measures in messages/s:

  process   a backlog of BENCH_MESSAGES messages received in one
            transaction, from its commit (which wakes the worker) until the
            last one is processed: handler + processed mark only
  end2end   BENCH_CLIENTS pgbench clients calling inbox.receive() for
            BENCH_SECONDS while the worker processes concurrently; messages
            received divided by the time until the last one is processed

for 1 and 2 workers per database (outbox.workers_per_database).  Also
prints the receive rate pgbench saw during end2end.  A benchmark, not a
test: it never fails on a timing, but it does fail if a message is lost
or processed twice (ledger rows must equal messages).

Environment: BENCH_MESSAGES (default 20000), BENCH_SECONDS (default 10),
BENCH_CLIENTS (default 4), BENCH_INBOX_WORKERS (the worker counts to run,
in that order; default "1 2"), BENCH_INBOX_ORDERED=1 (the handler is
ordered: each of the 1,000 aggregates' messages in received order),
BENCH_PG_BIN or PG_BIN (default: the newest installed
/usr/lib/postgresql/N/bin).
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("BENCH_PG_BIN") or os.environ.get("PG_BIN") or max(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
MESSAGES = int(os.environ.get("BENCH_MESSAGES", "20000"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "4"))
PORT = int(os.environ.get("BENCH_PORT", "54393"))
WORKERS = [int(w) for w in os.environ.get("BENCH_INBOX_WORKERS", "1 2").split()]
ORDERED = os.environ.get("BENCH_INBOX_ORDERED", "0") == "1"
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'

RECEIVE_SCRIPT = f"""\\set mid random(1, 2000000000)
\\set aid random(1, 1000)
SELECT inbox.receive('m-' || :mid || '-' || :client_id, 'payment.created', '{PAYLOAD}', aggregate_id => :aid::text);
"""

SETUP_SQL = """
CREATE EXTENSION outbox_pg;
CREATE SCHEMA bench;
CREATE TABLE bench.ledger (message_id text PRIMARY KEY, customer text, amount int);
CREATE FUNCTION bench.apply_payment(m inbox.messages) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench.ledger VALUES (m.id, m.payload ->> 'customer', (m.payload ->> 'amount')::int);
END
$$;
SELECT inbox.register_handler('payment.*', 'bench.apply_payment(inbox.messages)',
                              ordered => %s);
""" % ("true" if ORDERED else "false")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def psql(datadir, sql):
    return run([f"{BIN}/psql", "-X", "-q", "-A", "-t", "-h", datadir, "-p", str(PORT),
                "-d", "bench", "-v", "ON_ERROR_STOP=1", "-c", sql]).stdout.strip()


def wait_processed(datadir, total):
    """Poll until every message is processed; returns the time it happened."""
    while True:
        # the pending index only: a count over the whole table every 20 ms
        # took a good part of a core from the workers being measured
        if psql(datadir, "SELECT EXISTS (SELECT FROM inbox.messages WHERE status = 'pending')") == "f":
            return time.time()
        time.sleep(0.02)


def check(datadir, total):
    got = psql(datadir, "SELECT (SELECT count(*) FROM bench.ledger) || ' ' || "
                        "(SELECT count(*) FROM inbox.messages WHERE status = 'processed')")
    ledger, processed = (int(x) for x in got.split())
    if ledger != total or processed != total:
        sys.exit(f"inbox bench: {total} messages, {ledger} ledger rows, {processed} processed")


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_inbox_bench_")
    datadir = os.path.join(tmp, "data")
    run([f"{BIN}/initdb", "-D", datadir, "-A", "trust", "--no-sync"])
    with open(os.path.join(datadir, "postgresql.conf"), "a") as f:
        f.write(f"""
shared_preload_libraries = 'outbox_pg'
outbox.databases = 'bench'
outbox.discovery_interval = 1
port = {PORT}
listen_addresses = ''
unix_socket_directories = '{datadir}'
shared_buffers = 512MB
max_wal_size = 4GB
checkpoint_timeout = 30min
autovacuum = off
""")
    script = os.path.join(tmp, "receive.sql")
    with open(script, "w") as f:
        f.write(RECEIVE_SCRIPT)
    run([f"{BIN}/pg_ctl", "-D", datadir, "-l", os.path.join(tmp, "log"), "-w", "start"])
    rows = []
    try:
        run([f"{BIN}/createdb", "-h", datadir, "-p", str(PORT), "bench"])
        psql(datadir, SETUP_SQL)
        for workers in WORKERS:
            psql(datadir, f"ALTER SYSTEM SET outbox.workers_per_database = {workers}")
            psql(datadir, "SELECT pg_reload_conf()")
            deadline = time.time() + 30
            while int(psql(datadir, "SELECT count(*) FROM pg_stat_activity "
                                    "WHERE backend_type = 'outbox_pg relay' AND datname = 'bench'")) != workers:
                if time.time() > deadline:
                    sys.exit("inbox bench: relay workers did not start")
                time.sleep(0.1)

            # process: a backlog received in one transaction
            psql(datadir, "TRUNCATE inbox.messages, bench.ledger; CHECKPOINT")
            psql(datadir, f"""SELECT count(inbox.receive('p-' || g, 'payment.created', '{PAYLOAD}',
                                                 aggregate_id => (g % 1000)::text))
                               FROM generate_series(1, {MESSAGES}) g""")
            t0 = time.time()
            t1 = wait_processed(datadir, MESSAGES)
            check(datadir, MESSAGES)
            process_rate = MESSAGES / (t1 - t0)

            # end2end: receive and process at once
            psql(datadir, "TRUNCATE inbox.messages, bench.ledger; CHECKPOINT")
            t0 = time.time()
            out = run([f"{BIN}/pgbench", "-n", "-M", "prepared", "-h", datadir, "-p", str(PORT),
                       "-c", str(CLIENTS), "-j", str(min(CLIENTS, 2)), "-T", str(SECONDS),
                       "-f", script, "bench"]).stdout
            receive_tps = next(float(l.split("=")[1].split()[0]) for l in out.splitlines()
                               if l.startswith("tps ="))
            total = int(psql(datadir, "SELECT count(*) FROM inbox.messages"))
            t1 = wait_processed(datadir, total)
            check(datadir, total)
            rows.append((workers, process_rate, receive_tps, total / (t1 - t0), total))
            print(f"  workers={workers}: process {process_rate:.0f}/s, receive {receive_tps:.0f}/s, "
                  f"end2end {total / (t1 - t0):.0f}/s ({total} messages)", file=sys.stderr, flush=True)
    finally:
        run([f"{BIN}/pg_ctl", "-D", datadir, "-m", "fast", "stop"])
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"Inbox: receive() + plpgsql handler (one INSERT{', ordered' if ORDERED else ''}), "
          f"messages/s; backlog of {MESSAGES} over 1,000 aggregates, "
          f"{CLIENTS} receiving clients for {SECONDS}s")
    print()
    print("| workers | process a backlog | receive (pgbench, concurrent) | end to end (receive + process) |")
    print("|---|---|---|---|")
    for workers, process_rate, receive_tps, e2e, total in rows:
        print(f"| {workers} | {process_rate:,.0f} | {receive_tps:,.0f} | {e2e:,.0f} |")


if __name__ == "__main__":
    main()
