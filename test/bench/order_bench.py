#!/usr/bin/env python3
"""Ordering, storage and steady-state benchmarks of the outbox (issue #5).

nginx answers 204 to every POST (as in relay_bench.py).  On a throwaway
cluster, side by side in one run:

  ordering  (a) N events over 1,000 aggregates, emitted up front to an
                unordered and to an ordered destination (paused), then each
                destination resumed alone: events/s until all published.
                Rounds alternate unordered/ordered; the ratio is per round.
                A third ordered destination has one aggregate held: its
                first event deferred by an hour, BENCH_HELD (10,000) events
                of it behind that one in outbox.retries, analyzed (as
                autovacuum would); the same N events of the other
                aggregates drain past it.
  storage   (0.2 and 0.3 only: outbox.events is a view over the
                insert-only store since 0.4.0, see backlog_bench.py) the
                unordered throughput and what the lease and ack wrote,
                with fillfactor 100 (no room for HOT) and 50 (the default),
                alternating, same run; HOT share of updates from
                pg_stat_user_tables.
  throughput  plain relay throughput of whatever PG_BIN has installed (used
                to compare two builds, run alternately by the caller)
  steady    (b) STEADY_EVENTS events emitted at a sustained rate (STEADY_RATE
                per second, 100 per transaction) while the relay delivers
                them and retention (outbox.retention = STEADY_RETENTION s)
                removes them; the store's size at 10% of the events and at
                the end (0.4.0: the log's slots, their indexes, the
                bookkeeping tables, the log's rows; before: outbox.events,
                its indexes, live and dead rows).

Environment: PG_BIN (bin directory of the PostgreSQL to use), BENCH_EVENTS
(100000), BENCH_ROUNDS (2), BENCH_WORKERS (2), BENCH_HELD (10000), STEADY_EVENTS (1000000),
STEADY_RATE (4000), STEADY_RETENTION (5), STEADY_NAPTIME (autovacuum_naptime
in seconds, 10; the server default of 60 lets dead rows pile up at this rate).  A benchmark, not a test.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relay_bench import BIN, PAYLOAD, cpu_seconds, free_port, published, start_cluster, start_nginx  # noqa: E402

N = int(os.environ.get("BENCH_EVENTS", "100000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
HELD = int(os.environ.get("BENCH_HELD", "10000"))
STEADY_EVENTS = int(os.environ.get("STEADY_EVENTS", "1000000"))
STEADY_RATE = int(os.environ.get("STEADY_RATE", "4000"))
STEADY_RETENTION = int(os.environ.get("STEADY_RETENTION", "5"))
STEADY_NAPTIME = int(os.environ.get("STEADY_NAPTIME", "10"))
AGGREGATES = 1000


def drain(cur, dest, n):
    """Resume dest, wait until n more events are published; events/s."""
    base = published(cur)
    t0 = time.time()
    cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = %s", (dest,))
    cur.execute("SELECT outbox.emit('bench.kick', 'k', '{}', destination => %s)", (dest,))
    while published(cur) < base + n + 1:
        time.sleep(0.02)
    elapsed = time.time() - t0
    cur.execute("UPDATE outbox.destinations SET paused = true WHERE name = %s", (dest,))
    return n / elapsed


def emit_backlog(cur, dest, n):
    cur.execute(f"SELECT count(outbox.emit('bench.event', (g %% {AGGREGATES})::text, '{PAYLOAD}',"
                f" destination => %s)) FROM generate_series(1, %s) g", (dest, n))


def events_is_table(cur):
    """outbox.events is a table before 0.4.0, a view over the store since."""
    cur.execute("SELECT relkind = 'r' FROM pg_class WHERE oid = 'outbox.events'::regclass")
    return cur.fetchone()[0]


def vacuum_events(cur):
    if events_is_table(cur):
        cur.execute("VACUUM ANALYZE outbox.events")


def table_stats(cur):
    """Before 0.4.0: outbox.events' size, its indexes' size, live, dead,
    updated and HOT-updated rows.  Since: the log's slots, their indexes,
    the bookkeeping tables (batches, batch_acks, retries, settled_events,
    with their indexes), the log's rows (a truncation resets them)."""
    if events_is_table(cur):
        cur.execute("""
SELECT pg_relation_size('outbox.events'), pg_indexes_size('outbox.events'),
       n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd
  FROM pg_stat_user_tables WHERE relid = 'outbox.events'::regclass""")
        return cur.fetchone()
    cur.execute("""
SELECT sum(pg_relation_size(c.oid)) FILTER (WHERE c.relname LIKE 'log\\__'),
       sum(pg_indexes_size(c.oid)) FILTER (WHERE c.relname LIKE 'log\\__'),
       sum(s.n_live_tup) FILTER (WHERE c.relname LIKE 'log\\__'),
       sum(pg_total_relation_size(c.oid)) FILTER (WHERE c.relname NOT LIKE 'log\\__'), 0, 0
  FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relnamespace = 'outbox'::regnamespace
   AND c.relname IN ('log_0', 'log_1', 'log_2', 'batches', 'batch_acks', 'retries', 'settled_events')""")
    return tuple(int(v) for v in cur.fetchone())


def hold_aggregate(cur, dest):
    """One aggregate of dest held: its first event deferred by an hour,
    HELD events of it behind that one, copied to outbox.retries by the
    relay's claims (dest resumed until they are there)."""
    cur.execute("SELECT outbox.emit('bench.held', 'held', '{}', destination => %s,"
                " not_before => now() + interval '1 hour')", (dest,))
    cur.execute(f"SELECT count(outbox.emit('bench.held', 'held', '{PAYLOAD}', destination => %s))"
                f" FROM generate_series(1, %s) g", (dest, HELD))
    cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = %s", (dest,))
    while True:
        cur.execute("SELECT count(*) FROM outbox.retries WHERE destination = %s", (dest,))
        if cur.fetchone()[0] >= HELD + 1:
            break
        time.sleep(0.1)
    cur.execute("UPDATE outbox.destinations SET paused = true WHERE name = %s", (dest,))
    cur.execute("ANALYZE outbox.retries")


def bench_ordering(cur, url):
    cur.execute(f"""
INSERT INTO outbox.destinations (name, url, max_concurrency, paused, options) VALUES
  ('unordered', '{url}', 256, true, '{{}}'),
  ('ordered', '{url}', 256, true, '{{"ordering": "aggregate"}}'),
  ('held', '{url}', 256, true, '{{"ordering": "aggregate"}}')""")
    if HELD:
        hold_aggregate(cur, "held")
    rows = []
    for r in range(ROUNDS):
        emit_backlog(cur, "unordered", N)
        emit_backlog(cur, "ordered", N)
        if HELD:
            emit_backlog(cur, "held", N)
        vacuum_events(cur)
        u = drain(cur, "unordered", N)
        o = drain(cur, "ordered", N)
        h = drain(cur, "held", N) if HELD else None
        print(f"  round {r + 1}: unordered {u:.0f}/s, ordered {o:.0f}/s"
              + (f", ordered with one held aggregate {h:.0f}/s" if HELD else ""), file=sys.stderr, flush=True)
        rows.append((u, o, h))
        if events_is_table(cur):
            cur.execute("DELETE FROM outbox.events")
            cur.execute("VACUUM outbox.events")
    print()
    print(f"(a) Ordered vs unordered delivery — {N} events over {AGGREGATES} aggregates per round, "
          f"{WORKERS} relay workers, max_concurrency 256, nginx 204 sink"
          + (f"; held: an ordered destination with one more aggregate held ({HELD} events in "
             f"outbox.retries behind an event deferred by an hour)" if HELD else ""))
    print()
    if HELD:
        print("| round | unordered (events/s) | ordered (events/s) | ordered / unordered "
              "| held (events/s) | held / ordered |")
        print("|---|---|---|---|---|---|")
        for i, (u, o, h) in enumerate(rows):
            print(f"| {i + 1} | {u:.0f} | {o:.0f} | {o / u:.2f}x | {h:.0f} | {h / o:.2f}x |")
    else:
        print("| round | unordered (events/s) | ordered (events/s) | ordered / unordered |")
        print("|---|---|---|---|")
        for i, (u, o, _) in enumerate(rows):
            print(f"| {i + 1} | {u:.0f} | {o:.0f} | {o / u:.2f}x |")


def bench_storage(cur, url):
    if not events_is_table(cur):
        print("storage: outbox.events is a view over the insert-only store since 0.4.0, nothing is updated "
              "in place; test/bench/run backlog reports the store's size")
        return
    cur.execute(f"INSERT INTO outbox.destinations (name, url, max_concurrency, paused) VALUES ('plain', '{url}', 256, true)")
    rows = []
    for r in range(ROUNDS):
        for ff in (100, 50):
            cur.execute("TRUNCATE outbox.events")
            cur.execute(f"ALTER TABLE outbox.events SET (fillfactor = {ff})")
            emit_backlog(cur, "plain", N)
            cur.execute("VACUUM ANALYZE outbox.events")
            cur.execute("SELECT pg_stat_force_next_flush()")
            time.sleep(0.6)
            s0 = table_stats(cur)
            eps = drain(cur, "plain", N)
            time.sleep(1.0)   # relay statistics are flushed at most once a second
            s1 = table_stats(cur)
            upd, hot = s1[4] - s0[4], s1[5] - s0[5]
            print(f"  fillfactor {ff}: {eps:.0f}/s, HOT {hot}/{upd}", file=sys.stderr, flush=True)
            rows.append((ff, eps, hot, upd, s1[0], s1[1]))
    cur.execute("ALTER TABLE outbox.events SET (fillfactor = 50)")
    print()
    print(f"Storage: unordered relay throughput by fillfactor — {N} events per run, {WORKERS} workers, alternating")
    print()
    print("| fillfactor | events/s | HOT updates / updates (lease + ack) | table MB after | indexes MB after |")
    print("|---|---|---|---|---|")
    for ff, eps, hot, upd, tsz, isz in rows:
        print(f"| {ff} | {eps:.0f} | {hot} / {upd} ({100.0 * hot / max(upd, 1):.0f}%) | {tsz / 1e6:.1f} | {isz / 1e6:.1f} |")


def bench_throughput(cur, url):
    """Plain relay throughput, the table as the installed version creates it."""
    cur.execute(f"INSERT INTO outbox.destinations (name, url, max_concurrency, paused) VALUES ('plain', '{url}', 256, true)")
    emit_backlog(cur, "plain", N)
    vacuum_events(cur)
    cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
    pids = cur.fetchone()[0] or []
    cpu0 = sum(cpu_seconds(p) or 0 for p in pids)
    eps = drain(cur, "plain", N)
    cpu1 = sum(cpu_seconds(p) or 0 for p in pids)
    print(f"throughput {eps:.0f} relay_cpu_us_per_event {(cpu1 - cpu0) * 1e6 / N:.0f}")


def bench_steady(cur, dsn, url):
    cur.execute(f"INSERT INTO outbox.destinations (name, url, max_concurrency) VALUES ('steady', '{url}', 256)")
    cur.execute("INSERT INTO outbox.routes (pattern, destination) VALUES ('steady.*', 'steady')")
    samples = {}
    marks = {STEADY_EVENTS // 10: "at 10%", STEADY_EVENTS: "at the end"}
    stop = threading.Event()

    def sampler():
        c = psycopg2.connect(dsn)
        c.autocommit = True
        k = c.cursor()
        while not stop.is_set():
            # emitted so far less the workers' published counters: counting
            # the pending rows would compete with the relay for the CPU
            pending = samples.get("emitted", 0) - published(k)
            samples["max_pending"] = max(samples.get("max_pending", 0), pending)
            time.sleep(1.0)
        c.close()

    th = threading.Thread(target=sampler)
    th.start()
    per_tx = 100
    emitted = 0
    t0 = time.time()
    behind = 0.0
    while emitted < STEADY_EVENTS:
        cur.execute("SELECT count(outbox.emit('steady.event', (g %% %s)::text, %s)) FROM generate_series(1, %s) g",
                    (AGGREGATES, PAYLOAD, per_tx))
        emitted += per_tx
        samples["emitted"] = emitted
        due = t0 + emitted / STEADY_RATE
        now = time.time()
        if due > now:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
        for mark, name in marks.items():
            if emitted == mark:
                cur.execute("SELECT pg_stat_force_next_flush()")
                samples[name] = table_stats(cur) + (time.time() - t0,)
                print(f"  {name}: {emitted} emitted", file=sys.stderr, flush=True)
    emit_elapsed = time.time() - t0
    while published(cur) < STEADY_EVENTS:
        time.sleep(0.2)
    drain_elapsed = time.time() - t0
    stop.set()
    th.join()
    cur.execute("SELECT pg_stat_force_next_flush()")
    final = table_stats(cur)
    print()
    print(f"(b) Steady state — {STEADY_EVENTS} events emitted at a target of {STEADY_RATE}/s (100 per transaction, "
          f"1,000 aggregates), relayed to nginx, outbox.retention = {STEADY_RETENTION}s, "
          f"autovacuum_naptime = {STEADY_NAPTIME}s, {WORKERS} workers")
    print()
    print(f"achieved emit rate {STEADY_EVENTS / emit_elapsed:.0f}/s (emitter at most {behind:.1f} s behind schedule); "
          f"all delivered after {drain_elapsed:.0f} s; most pending seen {samples.get('max_pending', 0)}")
    print(f"in-flight working set ≈ retention × rate + pending = {STEADY_RETENTION * STEADY_RATE + samples.get('max_pending', 0)} rows")
    print()
    if events_is_table(cur):
        print("| | events emitted | table MB | indexes MB | live rows | dead rows |")
    else:
        print("| | events emitted | log MB | log indexes MB | log rows | bookkeeping tables MB |")
    print("|---|---|---|---|---|---|")
    for name, mark in (("at 10%", STEADY_EVENTS // 10), ("at the end", STEADY_EVENTS)):
        s = samples[name]
        print(f"| {name} | {mark} | {s[0] / 1e6:.1f} | {s[1] / 1e6:.1f} | {s[2]} | {stat4(cur, s[3])} |")
    print(f"| after the drain | {STEADY_EVENTS} | {final[0] / 1e6:.1f} | {final[1] / 1e6:.1f} | {final[2]} | {stat4(cur, final[3])} |")


def stat4(cur, v):
    """table_stats' fourth value: dead rows, or the bookkeeping tables' bytes (0.4.0)."""
    return v if events_is_table(cur) else f"{v / 1e6:.1f}"


def main():
    which = sys.argv[1:] or ["ordering", "storage", "steady"]
    for b in which:
        tmp = tempfile.mkdtemp(prefix=f"outbox_{b}_bench_")
        os.chmod(tmp, 0o777)
        nginx_port = start_nginx(tmp)
        url = f"http://127.0.0.1:{nginx_port}/hook"
        extra = (f"outbox.retention = '{STEADY_RETENTION}s'\noutbox.retention_batch = 5000\n"
                 f"autovacuum_naptime = '{STEADY_NAPTIME}s'") if b == "steady" else "outbox.retention = -1"
        data, dsn = start_cluster(tmp, WORKERS, extra=extra)
        try:
            conn = psycopg2.connect(dsn)
            conn.autocommit = True
            cur = conn.cursor()
            cur.execute("CREATE EXTENSION outbox_pg")
            time.sleep(2)
            if b == "ordering":
                bench_ordering(cur, url)
            elif b == "storage":
                bench_storage(cur, url)
            elif b == "throughput":
                bench_throughput(cur, url)
            elif b == "steady":
                bench_steady(cur, dsn, url)
            else:
                raise SystemExit(f"unknown benchmark {b}")
            conn.close()
        finally:
            subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
            subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
