#!/usr/bin/env python3
"""Backlogs of different sizes drained side by side in one run (issue #17:
a backlog of 1,000,000 events drains at the rate of 100,000, with flat
worker memory, and the store back to its steady size after retention).

On a throwaway cluster with two relay workers and nginx answering 204, for
each size in BENCH_BACKLOGS (default 100,000, then 1,000,000, then 100,000
again): the destination is paused, the backlog emitted in transactions of
BENCH_TXN_EVENTS (100), the destination resumed; events/s until all are
published (also over the first and the last tenth of the backlog), the
relay workers' CPU per event, and the workers' private memory (RssAnon)
sampled along the drain.  The store's size (the log's three slots, their
indexes, and the bookkeeping tables: batches, batch_acks, retries,
settled_events) is read before and after each drain.  Then outbox.retention
is lowered to BENCH_RETENTION seconds (reload) and the store is read again
after three rotations, i.e. once every slot has been truncated.

Environment: BENCH_BACKLOGS, BENCH_TXN_EVENTS, BENCH_WORKERS (2),
BENCH_RETENTION (4), BENCH_DEST_OPTIONS (the destination's options, e.g.
'{"batch": "array"}').  A benchmark, not a test.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from relay_bench import BIN, PAYLOAD, bench_destination, cpu_seconds, published, rss_kb, start_cluster, start_nginx

BACKLOGS = [int(x) for x in os.environ.get("BENCH_BACKLOGS", "100000,1000000,100000").split(",")]
TXN_EVENTS = int(os.environ.get("BENCH_TXN_EVENTS") or 100)
WORKERS = int(os.environ.get("BENCH_WORKERS") or 2)
RETENTION = int(os.environ.get("BENCH_RETENTION") or 4)
DEST_OPTIONS = os.environ.get("BENCH_DEST_OPTIONS") or "{}"

STORE_SQL = """
SELECT coalesce(sum(pg_relation_size(c.oid)) FILTER (WHERE c.relname LIKE 'log\\__'), 0),
       coalesce(sum(pg_indexes_size(c.oid)) FILTER (WHERE c.relname LIKE 'log\\__'), 0),
       coalesce(sum(pg_total_relation_size(c.oid)) FILTER (WHERE c.relname NOT LIKE 'log\\__'), 0)
  FROM pg_class c
 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'r'
   AND c.relname IN ('log_0', 'log_1', 'log_2', 'batches', 'batch_acks', 'retries', 'settled_events')"""


def store(cur):
    """(log tables, log indexes, bookkeeping tables with their indexes), MB."""
    cur.execute(STORE_SQL)
    return tuple(float(v) / 1e6 for v in cur.fetchone())


def relay_pids(cur):
    cur.execute("SELECT array_agg(pid ORDER BY worker) FROM outbox.workers() "
                "WHERE database = 'postgres' AND pid IS NOT NULL")
    return cur.fetchone()[0] or []


def emit_backlog(cur, n):
    for first in range(0, n, TXN_EVENTS):
        cur.execute(f"SELECT count(outbox.emit('bench.event', (g % 1000)::text, '{PAYLOAD}')) "
                    f"FROM generate_series(1, {min(TXN_EVENTS, n - first)}) g")


def drain(cur, n):
    """Resume, wait until n more events are published; returns a dict."""
    pids = relay_pids(cur)
    base = published(cur)
    cpu0 = sum(cpu_seconds(p) or 0 for p in pids)
    rss = {p: [] for p in pids}
    tenth = max(n // 10, 1)
    marks = {}
    t0 = time.time()
    cur.execute("UPDATE outbox.destinations SET paused = false")
    cur.execute("SELECT outbox.emit('bench.kick', 'k', '{}')")   # a commit wakes the relays
    n += 1
    while True:
        # the workers' counters, from shared memory: polling the store
        # itself would compete with the relay for the CPU
        done = published(cur) - base
        now = time.time()
        for p in pids:
            r = rss_kb(p)
            if r:
                rss[p].append(r)
        if "first" not in marks and done >= tenth:
            marks["first"] = now
        if "last" not in marks and done >= n - tenth:
            marks["last"] = now
        if done >= n:
            break
        time.sleep(0.05)
    elapsed = time.time() - t0
    cpu1 = sum(cpu_seconds(p) or 0 for p in pids)
    cur.execute("UPDATE outbox.destinations SET paused = true")
    return {
        "eps": n / elapsed,
        "first": tenth / (marks["first"] - t0),
        "last": tenth / (elapsed - (marks["last"] - t0)) if elapsed > marks["last"] - t0 else float("nan"),
        "cpu_us": (cpu1 - cpu0) * 1e6 / n,
        "rss": {p: (v[0], max(v), v[-1]) for p, v in rss.items() if v},
        "elapsed": elapsed,
    }


def rotations(cur):
    cur.execute("SELECT generation FROM outbox.rotation")
    return cur.fetchone()[0]


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_backlog_bench_")
    os.chmod(tmp, 0o777)
    nginx_port = start_nginx(tmp)
    url = f"http://127.0.0.1:{nginx_port}/hook"
    data, dsn = start_cluster(tmp, WORKERS, poll_interval="1s", extra="outbox.retention = '1h'")
    rows = []
    try:
        cur = bench_destination(dsn, url, 256, DEST_OPTIONS)
        time.sleep(2)
        for n in BACKLOGS:
            t0 = time.time()
            emit_backlog(cur, n)
            emit_s = time.time() - t0
            before = store(cur)
            r = drain(cur, n)
            after = store(cur)
            print(f"  {n}: emitted in {emit_s:.1f} s, drained in {r['elapsed']:.1f} s ({r['eps']:.0f}/s)",
                  file=sys.stderr, flush=True)
            rows.append((n, r, before, after))

        # retention: every slot truncated once
        g0 = rotations(cur)
        t0 = time.time()
        cur.execute(f"ALTER SYSTEM SET outbox.retention = '{RETENTION}s'")
        cur.execute("SELECT pg_reload_conf()")
        deadline = time.time() + 30 * RETENTION + 60
        seen = None
        while rotations(cur) < g0 + 3 and time.time() < deadline:
            cur.execute("SELECT state FROM outbox._log_rotation()")
            state = cur.fetchone()[0]
            if state != seen:
                print(f"  rotation: {state} ({rotations(cur) - g0} of 3, {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
                seen = state
            time.sleep(0.5)
        g1 = rotations(cur)
        time.sleep(1)
        retained = store(cur)
        cur.execute("SELECT count(*) FROM outbox.events WHERE status <> 'published'")
        unpublished = cur.fetchone()[0]
        cur.execute("SELECT (SELECT count(*) FROM outbox.batches), (SELECT count(*) FROM outbox.batch_acks), "
                    "(SELECT count(*) FROM outbox.settled_events), (SELECT count(*) FROM outbox.retries)")
        kept = cur.fetchone()
    finally:
        subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    first = rows[0][1]["eps"]
    print()
    print(f"Backlogs drained side by side — {WORKERS} relay workers, max_concurrency 256, transactions of "
          f"{TXN_EVENTS} events, destination options {DEST_OPTIONS}, nginx 204 sink")
    print()
    print("| backlog | events/s | vs the first row | first tenth / last tenth (events/s) | relay CPU µs/event "
          "| worker RssAnon kB, start / max / end | store before: log MB + indexes MB, other MB "
          "| store after the drain |")
    print("|---|---|---|---|---|---|---|---|")
    for n, r, b, a in rows:
        mem = "; ".join(f"{s} / {m} / {e}" for s, m, e in r["rss"].values())
        print(f"| {n:,} | {r['eps']:.0f} | {r['eps'] / first:.2f}x | {r['first']:.0f} / {r['last']:.0f} "
              f"| {r['cpu_us']:.0f} | {mem} | {b[0]:.1f} + {b[1]:.1f}, {b[2]:.1f} | {a[0]:.1f} + {a[1]:.1f}, {a[2]:.1f} |")
    print()
    print(f"after outbox.retention = {RETENTION}s and {g1 - g0} rotations: log {retained[0]:.1f} MB + indexes "
          f"{retained[1]:.1f} MB, other store tables {retained[2]:.1f} MB (rows: batches {kept[0]}, batch_acks "
          f"{kept[1]}, settled_events {kept[2]}, retries {kept[3]}); events not published: {unpublished}")


if __name__ == "__main__":
    main()
