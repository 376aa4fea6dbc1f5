#!/usr/bin/env python3
"""Two builds of outbox_pg side by side in one run: relay throughput and
CPU per event (one destination, and four destinations sharing the load),
and emit() against a plain INSERT, alternating the builds every round so
that drift on a shared machine hits both alike.

PG_BIN_A / PG_BIN_B: bin directories of two relocatable PostgreSQL copies,
each with its own build of outbox_pg installed (test/bench/versions makes
them); LABEL_A / LABEL_B name them in the table.  BENCH_EVENTS (50000),
BENCH_WORKERS (2), BENCH_ROUNDS (3), BENCH_SECONDS (5).
A benchmark, not a test: it prints medians and ratios, it never fails on
a timing.

BENCH_DESTINATIONS (e.g. "1,100,1000") measures many destinations instead
(issue #19): for each count, the relays' CPU while every destination is
idle (BENCH_IDLE_SECONDS, 10, with the default 1 s poll), then
BENCH_EVENTS events to one of them and events/s until they are published
(or BENCH_DRAIN_LIMIT seconds, 120, have passed: then the rate so far),
then the CPU again with every destination paused.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psycopg2

import relay_bench as rb

N = int(os.environ.get("BENCH_EVENTS", "50000"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
BUILDS = [(os.environ.get("LABEL_A", "A"), os.environ["PG_BIN_A"]),
          (os.environ.get("LABEL_B", "B"), os.environ["PG_BIN_B"])]


def relay_round(bin_dir, ndest):
    """events/s and relay CPU µs per event for N events over ndest destinations."""
    rb.BIN = bin_dir
    tmp = tempfile.mkdtemp(prefix="outbox_versions_")
    os.chmod(tmp, 0o777)
    port = rb.start_nginx(tmp)
    data, dsn = rb.start_cluster(tmp, WORKERS)
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE EXTENSION outbox_pg")
        for d in range(ndest):
            cur.execute("INSERT INTO outbox.destinations (name, url, max_concurrency, paused) "
                        "VALUES (%s, %s, 256, true)", (f"d{d}", f"http://127.0.0.1:{port}/d{d}"))
            cur.execute("INSERT INTO outbox.routes (pattern, destination) VALUES (%s, %s)",
                        (f"bench{d}.*", f"d{d}"))
        time.sleep(2)
        cur.execute(f"SELECT count(outbox.emit('bench' || (g % {ndest}) || '.event', (g % 1000)::text, "
                    f"'{rb.PAYLOAD}')) FROM generate_series(1, {N}) g")
        pids = []
        for _ in range(200):
            cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
            pids = cur.fetchone()[0] or []
            if len(pids) == WORKERS:
                break
            time.sleep(0.05)
        cpu0 = sum(rb.cpu_seconds(p) or 0 for p in pids)
        t0 = time.time()
        cur.execute("UPDATE outbox.destinations SET paused = false")
        cur.execute("SELECT outbox.emit('bench0.kick', 'k', '{}')")
        while True:
            cur.execute("SELECT %s + 1 - coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'", (N,))
            if cur.fetchone()[0] <= 0:
                break
            if time.time() - t0 > 600:
                raise RuntimeError("relay did not drain in 600 s")
            time.sleep(0.02)
        elapsed = time.time() - t0
        cpu1 = sum(rb.cpu_seconds(p) or 0 for p in pids)
        conn.close()
        return N / elapsed, (cpu1 - cpu0) * 1e6 / N
    finally:
        subprocess.run([f"{bin_dir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


EMIT_SQL = "SELECT outbox.emit('payment.created', 'agg-' || (random() * 1000)::int, " \
           "'{\"amount\": 1250, \"currency\": \"EUR\"}');\n"
INSERT_SQL = "INSERT INTO plain_events (id, type, aggregate_id, payload, destination) VALUES (gen_random_uuid(), " \
             "'payment.created', 'agg-' || (random() * 1000)::int, '{\"amount\": 1250, \"currency\": \"EUR\"}', 'payments');\n"


def emit_round(bin_dir):
    """tps of emit() and of a plain INSERT into a copy of the table, 1 client."""
    rb.BIN = bin_dir
    tmp = tempfile.mkdtemp(prefix="outbox_versions_emit_")
    os.chmod(tmp, 0o777)
    data, dsn = rb.start_cluster(tmp, 1, extra="outbox.databases = ''\nautovacuum = off\n")
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("""CREATE EXTENSION outbox_pg;
CREATE TABLE plain_events (LIKE outbox.events INCLUDING ALL);
INSERT INTO outbox.destinations (name, url) VALUES ('payments', 'http://127.0.0.1:9/');
INSERT INTO outbox.routes (pattern, destination) VALUES ('payment.*', 'payments');""")
        port = dsn.split("port=")[1].split()[0]
        out = {}
        for name, sql in (("insert", INSERT_SQL), ("emit", EMIT_SQL)):
            path = os.path.join(tmp, name + ".sql")
            with open(path, "w") as f:
                f.write(sql)
            r = subprocess.run([f"{bin_dir}/pgbench", "-n", "-M", "prepared", "-h", tmp, "-p", port,
                                "-c", "1", "-T", str(SECONDS), "-f", path, "postgres"],
                               env=dict(os.environ, PGOPTIONS="-c synchronous_commit=off"),
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"pgbench {name}: {r.stderr.strip()[-500:]}")
            r = r.stdout
            out[name] = next(float(l.split("=")[1].split()[0]) for l in r.splitlines() if l.startswith("tps ="))
        conn.close()
        return out["emit"], out["insert"]
    finally:
        subprocess.run([f"{bin_dir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


DESTINATIONS = [int(x) for x in os.environ.get("BENCH_DESTINATIONS", "").split(",") if x.strip()]
IDLE_SECONDS = int(os.environ.get("BENCH_IDLE_SECONDS", "10"))
DRAIN_LIMIT = int(os.environ.get("BENCH_DRAIN_LIMIT", "120"))


def destinations_round(bin_dir, ndest):
    """Relay CPU (share of one core, all relays) with ndest idle
    destinations, then events/s for N events to one of them."""
    rb.BIN = bin_dir
    tmp = tempfile.mkdtemp(prefix="outbox_versions_dest_")
    os.chmod(tmp, 0o777)
    port = rb.start_nginx(tmp)
    data, dsn = rb.start_cluster(tmp, WORKERS, poll_interval="1s")
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE EXTENSION outbox_pg")
        cur.execute("INSERT INTO outbox.destinations (name, url, max_concurrency, paused) "
                    "VALUES ('d0', %s, 256, true)", (f"http://127.0.0.1:{port}/d0",))
        cur.execute("INSERT INTO outbox.destinations (name, url, max_concurrency) "
                    "SELECT 'd' || g, 'http://127.0.0.1:' || %s || '/d' || g, 256 "
                    "FROM generate_series(1, %s) g", (port, ndest - 1))
        pids = []
        for _ in range(400):
            cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
            pids = cur.fetchone()[0] or []
            if len(pids) == WORKERS:
                break
            time.sleep(0.05)
        time.sleep(3)           # the relays have started and seen the destinations
        cpu0 = sum(rb.cpu_seconds(p) or 0 for p in pids)
        t0 = time.time()
        time.sleep(IDLE_SECONDS)
        idle = (sum(rb.cpu_seconds(p) or 0 for p in pids) - cpu0) / (time.time() - t0)

        cur.execute(f"SELECT count(outbox.emit('bench.event', (g % 1000)::text, '{rb.PAYLOAD}', "
                    f"destination => 'd0')) FROM generate_series(1, {N}) g")
        cpu0 = sum(rb.cpu_seconds(p) or 0 for p in pids)
        t0 = time.time()
        cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = 'd0'")
        cur.execute("SELECT outbox.emit('bench.kick', 'k', '{}', destination => 'd0')")
        while True:
            cur.execute("SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'")
            done = int(cur.fetchone()[0])
            if done >= N + 1 or time.time() - t0 > DRAIN_LIMIT:
                break
            time.sleep(0.02)
        elapsed = time.time() - t0
        cpu = sum(rb.cpu_seconds(p) or 0 for p in pids) - cpu0

        # every destination paused: what is left per poll without lease statements
        cur.execute("UPDATE outbox.destinations SET paused = true")
        time.sleep(3)
        cpu0 = sum(rb.cpu_seconds(p) or 0 for p in pids)
        t1 = time.time()
        time.sleep(IDLE_SECONDS)
        paused = (sum(rb.cpu_seconds(p) or 0 for p in pids) - cpu0) / (time.time() - t1)
        conn.close()
        return idle, done / elapsed, cpu * 1e6 / max(done, 1), done >= N + 1, paused
    finally:
        subprocess.run([f"{bin_dir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def destinations_main():
    res = {}
    for rnd in range(ROUNDS):
        order = BUILDS if rnd % 2 == 0 else BUILDS[::-1]
        for label, bin_dir in order:
            for ndest in DESTINATIONS:
                idle, eps, cpu, drained, paused = destinations_round(bin_dir, ndest)
                res.setdefault((label, ndest, "idle"), []).append(idle)
                res.setdefault((label, ndest, "paused"), []).append(paused)
                res.setdefault((label, ndest, "eps"), []).append(eps)
                res.setdefault((label, ndest, "cpu"), []).append(cpu)
                print(f"  round {rnd + 1} {label}: {ndest} destination(s): idle {100 * idle:5.1f} % of a core, "
                      f"{N} events to one {eps:8.0f} events/s{'' if drained else ' (not drained)'}, "
                      f"{cpu:6.1f} µs CPU/event, all paused {100 * paused:5.1f} % of a core", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    (a, _), (b, _) = BUILDS
    print()
    print(f"outbox_pg {a} vs {b}, many destinations, median of {ROUNDS} round(s) (builds alternated), "
          f"{WORKERS} relay workers, poll 1 s, nginx 204 sink; idle CPU over {IDLE_SECONDS} s, all relays")
    print()
    print(f"| destinations | idle CPU {a} | idle CPU {b} | {N} events to one, {a} (events/s) | "
          f"{b} (events/s) | {b}/{a} | µs CPU/event {a} | {b} | all paused, CPU {a} | {b} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ndest in DESTINATIONS:
        ea, eb = med[(a, ndest, "eps")], med[(b, ndest, "eps")]
        print(f"| {ndest} | {100 * med[(a, ndest, 'idle')]:.1f} % | {100 * med[(b, ndest, 'idle')]:.1f} % | "
              f"{ea:.0f} | {eb:.0f} | {eb / ea:.2f} | {med[(a, ndest, 'cpu')]:.0f} | {med[(b, ndest, 'cpu')]:.0f} | "
              f"{100 * med[(a, ndest, 'paused')]:.1f} % | {100 * med[(b, ndest, 'paused')]:.1f} % |")


def main():
    if DESTINATIONS:
        destinations_main()
        return
    res = {}
    for rnd in range(ROUNDS):
        order = BUILDS if rnd % 2 == 0 else BUILDS[::-1]
        for label, bin_dir in order:
            for ndest in (1, 4):
                eps, cpu = relay_round(bin_dir, ndest)
                res.setdefault((label, f"relay{ndest}_eps"), []).append(eps)
                res.setdefault((label, f"relay{ndest}_cpu"), []).append(cpu)
                print(f"  round {rnd + 1} {label}: {ndest} destination(s) {eps:8.0f} events/s, {cpu:5.1f} µs CPU/event",
                      file=sys.stderr, flush=True)
            e, i = emit_round(bin_dir)
            res.setdefault((label, "emit"), []).append(e)
            res.setdefault((label, "insert"), []).append(i)
            res.setdefault((label, "emit_ratio"), []).append(e / i)
            print(f"  round {rnd + 1} {label}: emit {e:8.0f} tps, INSERT {i:8.0f} tps", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    (a, _), (b, _) = BUILDS
    print()
    print(f"outbox_pg {a} vs {b}, side by side, median of {ROUNDS} rounds (builds alternated), "
          f"{N} events, {WORKERS} relay workers, nginx 204 sink; emit: pgbench 1 client, synchronous_commit off")
    print()
    print(f"| measure | {a} | {b} | {b}/{a} |")
    print("|---|---|---|---|")
    rows = [("relay, 1 destination (events/s)", "relay1_eps", "{:.0f}"),
            ("relay, 4 destinations (events/s)", "relay4_eps", "{:.0f}"),
            ("relay CPU per event, 1 destination (µs)", "relay1_cpu", "{:.1f}"),
            ("relay CPU per event, 4 destinations (µs)", "relay4_cpu", "{:.1f}"),
            ("emit() (tps)", "emit", "{:.0f}"),
            ("plain INSERT, same run (tps)", "insert", "{:.0f}"),
            ("emit()/INSERT", "emit_ratio", "{:.2f}")]
    for title, key, fmt in rows:
        va, vb = med[(a, key)], med[(b, key)]
        print(f"| {title} | {fmt.format(va)} | {fmt.format(vb)} | {vb / va:.2f} |")


if __name__ == "__main__":
    main()
