#!/usr/bin/env python3
"""Delivery while a snapshot is held (issue #21), "without" and "with" side
by side in one run, for one or more builds of outbox_pg.

For each offered rate R (BENCH_RATES, "2000,5000" events/s) and each
build, two runs on a throwaway cluster with BENCH_WORKERS (2) relay workers
and an nginx sink answering 204 on 127.0.0.1:

  without  an open-loop emitter (its own process) commits R/100 events every
           10 ms on a fixed schedule (a late tick is sent at once, never
           skipped) for BENCH_WARMUP + BENCH_HOLD + BENCH_AFTER seconds;
  with     the same, and from BENCH_WARMUP on one session holds a
           REPEATABLE READ snapshot for BENCH_HOLD seconds (600; BENCH_HOLD_KIND
           "report": it read an application table; "dump": like pg_dump, it
           locked every table of the outbox schema and read outbox.events).

Per 10 s window: offered and delivered events/s, p50/p99 commit->delivery
(nginx's arrival time of the request minus the moment the emitting
transaction's COMMIT returned; events are grouped by the window they were
committed in), the relay workers' CPU per delivered event (user + system
from /proc), the events still undelivered at the window's end; every
minute the size of the outbox schema (tables + indexes + toast).

Then the drain: BENCH_DRAIN_EVENTS (200000) emitted up front while the
destination is paused, resumed, events/s until all reached the sink (or
BENCH_DRAIN_LIMIT, 600 s), without and with a snapshot held (taken after
the backlog was committed, before the resume).

BENCH_BUILDS: "label=bin_dir;label=bin_dir" (test/bench/snapshot makes the
copies).  A benchmark, not a test: it prints figures; it exits 1 only
when events had not reached the sink at the end (120 s after a stream
run's emitter stopped, or the drain limit).  Only public SQL (emit, the destination's paused flag,
pg_total_relation_size over the outbox schema).
"""
import bisect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psycopg2

import relay_bench as rb

RATES = [int(x) for x in os.environ.get("BENCH_RATES", "2000,5000").split(",") if x.strip()]
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "20"))
HOLD = int(os.environ.get("BENCH_HOLD", "600"))
AFTER = int(os.environ.get("BENCH_AFTER", "30"))
HOLD_KIND = os.environ.get("BENCH_HOLD_KIND", "report")
TICK = float(os.environ.get("BENCH_TICK_MS", "10")) / 1000.0
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "64"))
DRAIN_N = int(os.environ.get("BENCH_DRAIN_EVENTS", "200000"))
DRAIN_LIMIT = int(os.environ.get("BENCH_DRAIN_LIMIT", "600"))
MODES = [m for m in os.environ.get("BENCH_MODES", "stream,drain").split(",") if m]
WINDOW = 10
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'


def builds():
    out = []
    for item in os.environ["BENCH_BUILDS"].split(";"):
        label, _, bin_dir = item.partition("=")
        out.append((label, bin_dir))
    return out


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -- the sink -------------------------------------------------------------

def start_nginx(tmp):
    """nginx answering 204; logs arrival time and ce-subject (the emitter's
    tick number, so that an arrival maps to its commit time)."""
    port = rb.free_port()
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx_error.log;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {tmp};
    proxy_temp_path {tmp};
    fastcgi_temp_path {tmp};
    uwsgi_temp_path {tmp};
    scgi_temp_path {tmp};
    log_format arrival '$msec $http_ce_subject';
    access_log {tmp}/arrivals.log arrival buffer=64k flush=100ms;
    keepalive_requests 10000000;
    server {{
        listen 127.0.0.1:{port};
        location / {{ client_body_buffer_size 64k; return 204; }}
    }}
}}
""")
    subprocess.run(["nginx", "-c", conf, "-p", tmp], check=True)
    return port


class Arrivals:
    """Reads nginx's arrival log incrementally: (time, subject) pairs."""

    def __init__(self, tmp):
        self.path = os.path.join(tmp, "arrivals.log")
        self.offset = 0
        self.rest = b""
        self.items = []

    def poll(self):
        if not os.path.exists(self.path):
            return len(self.items)
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            parts = line.split()
            if len(parts) == 2:
                self.items.append((float(parts[0]), parts[1].decode()))
        return len(self.items)


# -- the cluster ------------------------------------------------------------

def relay_pids(cur):
    for _ in range(400):
        cur.execute("SELECT array_agg(pid) FROM pg_stat_activity "
                    "WHERE backend_type = 'outbox_pg relay' AND datname = 'postgres'")
        pids = cur.fetchone()[0] or []
        if len(pids) == WORKERS:
            return pids
        time.sleep(0.05)
    raise RuntimeError("the relay workers did not start")


def relay_cpu(pids):
    return sum(rb.cpu_seconds(p) or 0 for p in pids)


SIZE_SQL = """SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8 FROM pg_class c
               WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p', 'm')"""

DUMP_LOCKS = """DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT c.oid FROM pg_class c
              WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p') ORDER BY c.oid
    LOOP
        EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', t);
    END LOOP;
END $$"""


def hold_snapshot(dsn):
    """A session holding a REPEATABLE READ snapshot until it is closed."""
    conn = psycopg2.connect(dsn)
    conn.set_session(isolation_level="REPEATABLE READ")
    cur = conn.cursor()
    if HOLD_KIND == "dump":
        cur.execute(DUMP_LOCKS)
        cur.execute("SELECT count(*) FROM outbox.events")
    else:
        cur.execute("SELECT n FROM report")
    cur.fetchall()
    return conn


def setup(bin_dir, paused=False):
    rb.BIN = bin_dir
    tmp = tempfile.mkdtemp(prefix="outbox_snapshot_")
    os.chmod(tmp, 0o777)
    port = start_nginx(tmp)
    data, dsn = rb.start_cluster(tmp, WORKERS, poll_interval="1s")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION outbox_pg")
    cur.execute("INSERT INTO outbox.destinations (name, url, max_concurrency, paused) VALUES ('bench', %s, %s, %s)",
                (f"http://127.0.0.1:{port}/bench", CONCURRENCY, paused))
    cur.execute("CREATE TABLE report (n int); INSERT INTO report VALUES (1)")
    return tmp, data, dsn, conn, cur


def teardown(bin_dir, tmp, data):
    subprocess.run([f"{bin_dir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
    subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
    shutil.rmtree(tmp, ignore_errors=True)


# -- the emitter (a process of its own) -------------------------------------

def emitter(dsn, rate, seconds, out_path):
    """Commits the events of tick i at t0 + i * TICK, whatever happened to
    the previous ticks; writes "tick scheduled committed events" lines."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    sql = ("SELECT count(outbox.emit('bench.event', %s, '" + PAYLOAD + "', destination => 'bench')) "
           "FROM generate_series(1, %s)")
    ticks = int(seconds / TICK)
    t0 = time.time() + 0.2
    rows = []
    for i in range(ticks):
        k = int(rate * TICK * (i + 1)) - int(rate * TICK * i)
        sched = t0 + i * TICK
        wait = sched - time.time()
        if wait > 0:
            time.sleep(wait)
        if k:
            cur.execute(sql, (str(i), k))
        rows.append(f"{i} {sched:.6f} {time.time():.6f} {k}\n")
    with open(out_path, "w") as f:
        f.writelines(rows)


# -- one streaming run --------------------------------------------------------

def stream_run(bin_dir, rate, with_snapshot):
    tmp, data, dsn, conn, cur = setup(bin_dir)
    try:
        pids = relay_pids(cur)
        arr = Arrivals(tmp)
        total = WARMUP + HOLD + AFTER
        ticks_path = os.path.join(tmp, "ticks.txt")
        em = subprocess.Popen([sys.executable, os.path.abspath(__file__), "emit", dsn, str(rate), str(total), ticks_path])
        t0 = time.time()
        cpu = [(t0, relay_cpu(pids))]
        cur.execute(SIZE_SQL)
        sizes = [(0.0, cur.fetchone()[0])]
        holder = None
        held = None
        next_size = 60
        while em.poll() is None:
            time.sleep(1.0 - (time.time() - t0) % 1.0)
            now = time.time()
            cpu.append((now, relay_cpu(pids)))
            arr.poll()
            if with_snapshot and holder is None and held is None and now - t0 >= WARMUP:
                holder = hold_snapshot(dsn)
                held = (time.time(), None)
            if holder is not None and now - held[0] >= HOLD:
                holder.commit()
                holder.close()
                holder = None
                held = (held[0], time.time())
            if now - t0 >= next_size:
                cur.execute(SIZE_SQL)
                sizes.append((now - t0, cur.fetchone()[0]))
                next_size += 60
        if holder is not None:
            holder.commit()
            holder.close()
            held = (held[0], time.time())
        cur.execute(SIZE_SQL)
        sizes.append((time.time() - t0, cur.fetchone()[0]))
        ticks = {}
        emitted = 0
        for line in open(ticks_path):
            i, sched, done, k = line.split()
            ticks[i] = (float(sched), float(done), int(k))
            emitted += int(k)
        # what is still in flight arrives now (or never: lost)
        deadline = time.time() + 120
        while arr.poll() < emitted and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(0.3)
        arr.poll()
        conn.close()
    finally:
        teardown(bin_dir, tmp, data)
    return analyse(rate, t0, ticks, emitted, arr.items, cpu, sizes, held)


def analyse(rate, t0, ticks, emitted, items, cpu, sizes, held):
    """Per-window figures; held is the span of the snapshot, or None for a
    run without one (then the span the hold has in the run with one)."""
    real_hold = held is not None
    if held is None:
        held = (t0 + WARMUP, t0 + WARMUP + HOLD)
    tstart = min(s for s, _, _ in ticks.values())
    nwin = int((WARMUP + HOLD + AFTER) // WINDOW)
    offered = [0] * nwin
    lat = [[] for _ in range(nwin)]
    delivered = [0] * nwin
    seen = 0
    late_sched = max(d - s for s, d, _ in ticks.values())
    for s, d, k in ticks.values():
        w = int((d - tstart) // WINDOW)
        if 0 <= w < nwin:
            offered[w] += k
    for at, subj in items:
        t = ticks.get(subj)
        if t is None:
            continue
        seen += 1
        w = int((at - tstart) // WINDOW)
        if 0 <= w < nwin:
            delivered[w] += 1
        w = int((t[1] - tstart) // WINDOW)
        if 0 <= w < nwin:
            lat[w].append((at - t[1]) * 1000.0)
    cpu_t = [c[0] for c in cpu]
    windows = []
    cum_off = cum_del = 0
    for w in range(nwin):
        a, b = tstart + w * WINDOW, tstart + (w + 1) * WINDOW
        ia = min(bisect.bisect_left(cpu_t, a), len(cpu) - 1)
        ib = min(bisect.bisect_left(cpu_t, b), len(cpu) - 1)
        dcpu = cpu[ib][1] - cpu[ia][1]
        dt = max(cpu[ib][0] - cpu[ia][0], 1e-9)
        cum_off += offered[w]
        cum_del += delivered[w]
        mid = (a + b) / 2
        lo, hi = held
        phase = "warm" if mid < lo else ("after" if mid > hi else ("held" if real_hold else "(held)"))
        windows.append({
            "t": (w + 1) * WINDOW, "phase": phase, "offered": offered[w] / WINDOW,
            "delivered": delivered[w] / WINDOW,
            "p50": rb.pct(lat[w], 50) if lat[w] else float("nan"),
            "p99": rb.pct(lat[w], 99) if lat[w] else float("nan"),
            "cpu_us": dcpu * 1e6 * (WINDOW / dt) / max(delivered[w], 1),
            "cpu_pct": 100.0 * dcpu / dt,
            "backlog": cum_off - cum_del})
    return {"windows": windows, "sizes": sizes, "emitted": emitted, "delivered": seen,
            "max_sched_lag_ms": late_sched * 1000.0}


def print_windows(title, res):
    print()
    print(title)
    print()
    print("| t (s) | phase | offered/s | delivered/s | p50 ms | p99 ms | relay CPU µs/event | relay CPU % | undelivered |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in res["windows"]:
        print(f"| {w['t']} | {w['phase']} | {w['offered']:.0f} | {w['delivered']:.0f} | {w['p50']:.1f} | "
              f"{w['p99']:.1f} | {w['cpu_us']:.0f} | {w['cpu_pct']:.0f} | {w['backlog']} |")
    print()
    print("outbox schema size (tables + indexes): " +
          ", ".join(f"{t:.0f} s {b / 1048576:.1f} MB" for t, b in res["sizes"]))
    print(f"emitted {res['emitted']}, delivered {res['delivered']} (not delivered 120 s after the emitter stopped: "
          f"{max(res['emitted'] - res['delivered'], 0)}), "
          f"emitter's worst lag behind its schedule {res['max_sched_lag_ms']:.0f} ms")
    sys.stdout.flush()


def span_summary(res, phases):
    ws = [w for w in res["windows"] if w["phase"] in phases]
    if not ws:
        return None
    return {"offered": statistics.mean(w["offered"] for w in ws),
            "delivered_min": min(w["delivered"] for w in ws),
            "delivered": statistics.mean(w["delivered"] for w in ws),
            "p50": statistics.median(w["p50"] for w in ws),
            "p99_max": max(w["p99"] for w in ws),
            "cpu_us": statistics.mean(w["cpu_us"] for w in ws),
            "backlog_max": max(w["backlog"] for w in ws),
            "size_max": max(b for _, b in res["sizes"]),
            "lost": max(res["emitted"] - res["delivered"], 0)}


# -- the drain ----------------------------------------------------------------

def drain_run(bin_dir, with_snapshot):
    tmp, data, dsn, conn, cur = setup(bin_dir, paused=True)
    holder = None
    try:
        pids = relay_pids(cur)
        chunk = 50000
        for start in range(0, DRAIN_N, chunk):
            n = min(chunk, DRAIN_N - start)
            cur.execute(f"SELECT count(outbox.emit('bench.event', g::text, '{PAYLOAD}', destination => 'bench')) "
                        f"FROM generate_series({start + 1}, {start + n}) g")
        cur.execute("CHECKPOINT")
        if with_snapshot:
            holder = hold_snapshot(dsn)
        arr = Arrivals(tmp)
        cpu0 = relay_cpu(pids)
        t0 = time.time()
        cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = 'bench'")
        while arr.poll() < DRAIN_N and time.time() - t0 < DRAIN_LIMIT:
            time.sleep(0.2)
        got = len({s for _, s in arr.items})
        elapsed = (max(a for a, _ in arr.items) if arr.items else time.time()) - t0
        cpu = relay_cpu(pids) - cpu0
        cur.execute(SIZE_SQL)
        size = cur.fetchone()[0]
        if holder is not None:
            holder.commit()
            holder.close()
        conn.close()
    finally:
        teardown(bin_dir, tmp, data)
    return {"eps": got / elapsed, "cpu_us": cpu * 1e6 / max(got, 1), "got": got, "secs": elapsed,
            "size": size, "done": got >= DRAIN_N}


# -- main -----------------------------------------------------------------------

def main():
    bl = builds()
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"]
    print(f"outbox_pg with a snapshot held (issue #21): {', '.join(l for l, _ in bl)}; {WORKERS} relay workers, "
          f"nginx 204 sink, destination max_concurrency {CONCURRENCY}, outbox.batch_size 500, poll 1 s; "
          f"emitter: one transaction every {TICK * 1000:.0f} ms (open loop); snapshot: {HOLD_KIND}, "
          f"held {HOLD} s after {WARMUP} s, then {AFTER} s; load average at start {' '.join(load)} "
          f"on {os.cpu_count()} cores")
    sys.stdout.flush()
    table = []
    lost = 0
    if "stream" in MODES:
        for rate in RATES:
            for label, bin_dir in bl:
                per = {}
                for mode in ("without", "with"):
                    log(f"  {label}: {rate} events/s, {mode} snapshot ...")
                    res = stream_run(bin_dir, rate, mode == "with")
                    print_windows(f"{label}, {rate} events/s offered, {mode} snapshot", res)
                    per[mode] = span_summary(res, ("held", "(held)"))
                    lost += max(res["emitted"] - res["delivered"], 0)
                table.append((label, rate, per))
    drains = []
    if "drain" in MODES:
        for label, bin_dir in bl:
            for mode in ("without", "with"):
                log(f"  {label}: drain of {DRAIN_N}, {mode} snapshot ...")
                d = drain_run(bin_dir, mode == "with")
                drains.append((label, mode, d))
                lost += 0 if d["done"] else DRAIN_N - d["got"]
    print()
    if table:
        print(f"Summary over the windows of the hold ({HOLD} s; the same span of the run without a snapshot)")
        print()
        print("| build | offered/s | snapshot | delivered/s mean | worst window | p50 ms | worst p99 ms | "
              "relay CPU µs/event | with/without | max undelivered | max size MB | undelivered at the end |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for label, rate, per in table:
            base = per["without"]["cpu_us"] if per.get("without") else None
            for mode in ("without", "with"):
                s = per.get(mode)
                if s is None:
                    continue
                ratio = f"{s['cpu_us'] / base:.2f}" if base else "-"
                print(f"| {label} | {rate} | {mode} | {s['delivered']:.0f} | {s['delivered_min']:.0f} | "
                      f"{s['p50']:.1f} | {s['p99_max']:.1f} | {s['cpu_us']:.0f} | {ratio} | {s['backlog_max']} | "
                      f"{s['size_max'] / 1048576:.1f} | {s['lost']} |")
        print()
    if drains:
        print(f"Drain of a {DRAIN_N}-event backlog (limit {DRAIN_LIMIT} s)")
        print()
        print("| build | snapshot | events/s | relay CPU µs/event | seconds | outbox size MB at the end | all delivered |")
        print("|---|---|---|---|---|---|---|")
        for label, mode, d in drains:
            print(f"| {label} | {mode} | {d['eps']:.0f} | {d['cpu_us']:.0f} | {d['secs']:.1f} | "
                  f"{d['size'] / 1048576:.1f} | {'yes' if d['done'] else 'no'} |")
    if lost:
        print(f"\n{lost} events had not reached the sink at the end (stream: 120 s after the emitter "
              f"stopped; drain: BENCH_DRAIN_LIMIT)")
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "emit":
        emitter(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        main()
