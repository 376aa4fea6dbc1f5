#!/usr/bin/env python3
"""Relay throughput and commit-to-sink latency, outbox_pg vs the reference
application-side poller (app_poller.py), side by side in one run.

nginx answers 204 to every POST and logs the arrival time and the ce-id of
each request.  On a throwaway cluster:

  (a) throughput: N events emitted up front (destination paused), then
      resumed; events/s until all are published; the relay worker's RSS is
      sampled along the way;
  (b) latency: M single events, each committed on its own, spaced apart,
      with outbox.poll_interval = 60s so only the commit wake-up counts;
      commit-to-sink = nginx arrival time - the moment COMMIT was sent;
  (c) the same two figures for the reference poller;
  (e) open loop: pgbench commits single-event transactions on a schedule
      (--rate, BENCH_OPEN_RATE events/s for BENCH_OPEN_SECONDS; its
      sessions with synchronous_commit off: this machine cannot fsync
      5,000 commits/s) while the relay delivers; commit-to-sink = nginx
      arrival - the event's created_at (its transaction's start: an
      overestimate by the statement's own time); p50, p99, p99.9, and how
      far pgbench itself fell behind its schedule;
  (d) the database's own drain limit in the same run: the same backlog
      claimed and acknowledged by a server-side procedure through the
      relay's own store functions (outbox._claim, outbox._claim_ack), up
      to 256 events per claim, committed per claim, with the relay's session
      settings (generic plans, synchronous_commit off), no HTTP: what the
      relay could reach if sending cost nothing.
  (f) the issue's drain limit (issue #17), same run: a copy of the backlog
      in a plain table with a status column, drained by a procedure with
      UPDATE ... SET status = 'published' WHERE id IN (SELECT ... ORDER BY
      next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED), committed per
      batch: the 0.2 store's claim, the shape an application outbox has;
  (g) the sink's own limit, same run: wrk (one thread) sending requests of
      the relay's size (its body and CloudEvents headers) to the same nginx
      for BENCH_SINK_SECONDS (3) on 1 and on 64 keep-alive connections,
      PostgreSQL idle: what this machine answers when the sender costs
      almost nothing.

Environment: BENCH_EVENTS (100000), BENCH_LATENCY_EVENTS (1000),
BENCH_OPEN_RATE (5000; 0 skips (e)), BENCH_OPEN_SECONDS (10),
BENCH_WORKERS (1), BENCH_TXN_EVENTS (events per emitting transaction in
(a); default all of them in one), BENCH_DEST_OPTIONS (the destination's
options, e.g. '{"batch": "cloudevents"}' for batched webhooks; batches
carry no ce-id header, so (b) reports no latency then),
BENCH_MAX_CONCURRENCY (256; it counts events, also in batches),
BENCH_HTTP2=1 (nginx speaks HTTP/2 without TLS only; add
'{"http_version": "2"}' to BENCH_DEST_OPTIONS, and the poller and wrk
cannot be measured),
BENCH_SETTINGS (server settings added to the cluster's, separated by ";",
e.g. "outbox.batch_size = 2000"), BENCH_PERF (a file: `perf record -g`
of the relay workers during (a); read it with `perf report -i FILE`).
A benchmark, not a test.
"""
import glob
import os
import resource
import shutil
import socket
import statistics
import subprocess
import signal
import sys
import tempfile
import time

import psycopg2

# the major test/bench/run chose (PG_BIN), else the newest installed
BIN = os.environ.get("PG_BIN") or max(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
HERE = os.path.dirname(os.path.abspath(__file__))
N = int(os.environ.get("BENCH_EVENTS", "100000"))
M = int(os.environ.get("BENCH_LATENCY_EVENTS", "1000"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "1"))
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'
TXN_EVENTS = int(os.environ.get("BENCH_TXN_EVENTS") or 0) or N
OPEN_RATE = int(os.environ.get("BENCH_OPEN_RATE", "5000"))
PERF = os.environ.get("BENCH_PERF", "")
OPEN_SECONDS = int(os.environ.get("BENCH_OPEN_SECONDS", "10"))
DEST_OPTIONS = os.environ.get("BENCH_DEST_OPTIONS") or "{}"
MAX_CONCURRENCY = int(os.environ.get("BENCH_MAX_CONCURRENCY") or 256)
SETTINGS = os.environ.get("BENCH_SETTINGS", "").replace(";", "\n")
SINK_SECONDS = int(os.environ.get("BENCH_SINK_SECONDS", "3"))
HTTP2 = os.environ.get("BENCH_HTTP2", "") == "1"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_nginx(tmp, port=None, hosts=1, nofile=None, http2=False):
    """nginx answering 204 on 127.0.0.1 .. 127.0.0.<hosts>, logging each
    request's arrival and ce-id; nofile: its open files limit (raised for
    it alone, as far as the hard limit allows); http2: HTTP/2 without TLS
    (prior knowledge) only.  Returns the port."""
    port = port or free_port()
    listens = "\n".join(f"        listen 127.0.0.{h}:{port}{' http2' if http2 else ''};"
                         for h in range(1, hosts + 1))
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
worker_processes 1;
{f"worker_rlimit_nofile {nofile};" if nofile else ""}
pid {tmp}/nginx.pid;
error_log {tmp}/nginx_error.log;
events {{ worker_connections {nofile - 100 if nofile else 4096}; }}
http {{
    client_body_temp_path {tmp};
    proxy_temp_path {tmp};
    fastcgi_temp_path {tmp};
    uwsgi_temp_path {tmp};
    scgi_temp_path {tmp};
    log_format arrival '$msec $http_ce_id';
    access_log {tmp}/arrivals.log arrival buffer=64k flush=100ms;
    keepalive_requests 1000000;
    server {{
{listens}
        location / {{ client_body_buffer_size 64k; return 204; }}
    }}
}}
""")
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    subprocess.run(["nginx", "-c", conf, "-p", tmp], check=True, preexec_fn=limit)
    return port


def arrivals(tmp):
    out = {}
    path = os.path.join(tmp, "arrivals.log")
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 2 and parts[1] != "-":
                out.setdefault(parts[1], float(parts[0]))
    return out


def rss_kb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def cpu_seconds(pid):
    """user + system CPU time of a process, in seconds."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def context_switches(pid):
    """(voluntary, involuntary) context switches of a process so far."""
    out = [0, 0]
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("voluntary_ctxt_switches:"):
                out[0] = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                out[1] = int(line.split()[1])
    except OSError:
        pass
    return out


def machine_jiffies():
    """(busy, all) jiffies of the whole machine since boot, all cores, from
    /proc/stat: busy is user, nice, system, irq and softirq (guest time is
    inside user already); all adds idle, iowait and steal (the time the
    hypervisor gave to others).  Also used by concurrency_bench.py and
    broker_bench.py."""
    user, nice, system, idle, iowait, irq, softirq, steal = \
        [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def start_cluster(tmp, workers, poll_interval="60s", extra=""):
    """initdb and start a throwaway cluster in tmp with outbox_pg preloaded
    (also used by the other relay benchmarks); returns (data dir, dsn)."""
    data = os.path.join(tmp, "data")
    port = free_port()
    subprocess.run([f"{BIN}/initdb", "-D", data, "-A", "trust", "--no-sync"], check=True, capture_output=True)
    with open(os.path.join(data, "postgresql.conf"), "a") as f:
        f.write(f"""
port = {port}
listen_addresses = ''
unix_socket_directories = '{tmp}'
shared_preload_libraries = 'outbox_pg'
shared_buffers = 512MB
max_wal_size = 4GB
outbox.poll_interval = '{poll_interval}'
outbox.workers_per_database = {workers}
outbox.batch_size = 500
outbox.discovery_interval = 1
{extra}
""")
    subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-l", os.path.join(tmp, "log"), "-w", "start"],
                   check=True, capture_output=True)
    return data, f"host={tmp} port={port} dbname=postgres"


def published(cur):
    """Events the database's relay workers published, from their counters in
    shared memory (counting rows would compete with the relay for the CPU).
    Also used by backlog_bench.py and order_bench.py."""
    cur.execute("SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'")
    return int(cur.fetchone()[0])


def bench_destination(dsn, url, max_concurrency=256, options="{}"):
    """Connects (autocommit), creates the extension and a paused destination
    'bench' that every event type routes to; returns the cursor.  Also used
    by backlog_bench.py."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(f"""
CREATE EXTENSION outbox_pg;
INSERT INTO outbox.destinations (name, url, max_concurrency, paused, options)
VALUES ('bench', '{url}', {max_concurrency}, true, '{options}');
INSERT INTO outbox.routes (pattern, destination) VALUES ('*', 'bench');
""")
    return cur


def emit_backlog(cur):
    """N events to the route's destination, TXN_EVENTS per transaction."""
    for first in range(0, N, TXN_EVENTS):
        cur.execute(f"SELECT count(outbox.emit('bench.event', (g % 1000)::text, '{PAYLOAD}')) "
                    f"FROM generate_series(1, {min(TXN_EVENTS, N - first)}) g")


def sql_drain(cur, dest):
    """The database's own drain limit: every claimable event of dest
    claimed and acknowledged by a procedure through the relay's store
    functions (outbox._claim, outbox._claim_ack), with the relay's session
    settings (relay.c), so that only the network differs; events/s.  Also
    used by broker_bench.py."""
    cur.execute("""
CREATE OR REPLACE PROCEDURE bench_sql_drain(dest text, INOUT drained bigint DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    s bigint;
BEGIN
    LOOP
        SELECT count(*), max(c.seq) INTO n, s FROM outbox._claim(256, '60 s', dest) AS c;
        EXIT WHEN s IS NULL;
        PERFORM outbox._claim_ack(dest, s);
        drained := drained + n;
        COMMIT;
    END LOOP;
END $$""")
    return timed_drain(cur, "SQL drain", "CALL bench_sql_drain(%s)", (dest,))


def timed_drain(cur, what, call, args=()):
    """Run a drain procedure (it returns the events it drained) with the
    relay's session settings (relay.c: generic plans, synchronous_commit
    off); events/s."""
    cur.execute("SET plan_cache_mode = force_generic_plan")
    cur.execute("SET synchronous_commit = off")
    t0 = time.time()
    cur.execute(call, args)
    drained = cur.fetchone()[0]
    elapsed = time.time() - t0
    cur.execute("RESET plan_cache_mode")
    cur.execute("RESET synchronous_commit")
    print(f"  {what}: {drained} events in {elapsed:.1f} s", file=sys.stderr, flush=True)
    return drained / elapsed


def issue_drain(cur):
    """The drain limit as issue #17 measured it on the 0.2 store: the same
    number of events copied into a plain table with a status column,
    drained 100 at a time by UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
    SKIP LOCKED), committed per batch, with the relay's session settings;
    events/s."""
    cur.execute(f"""
CREATE TABLE bench_issue_outbox (id uuid PRIMARY KEY, status text NOT NULL DEFAULT 'pending',
                                 next_attempt_at timestamptz NOT NULL DEFAULT now(),
                                 type text NOT NULL, payload jsonb NOT NULL);
CREATE INDEX ON bench_issue_outbox (next_attempt_at, id) WHERE status = 'pending';
INSERT INTO bench_issue_outbox (id, type, payload)
    SELECT gen_random_uuid(), 'bench.event', '{PAYLOAD}' FROM generate_series(1, {N})""")
    cur.execute("VACUUM ANALYZE bench_issue_outbox")
    cur.execute("""
CREATE OR REPLACE PROCEDURE bench_issue_drain(INOUT drained bigint DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    LOOP
        UPDATE bench_issue_outbox SET status = 'published'
         WHERE id IN (SELECT id FROM bench_issue_outbox WHERE status = 'pending'
                       ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n = 0;
        drained := drained + n;
        COMMIT;
    END LOOP;
END $$""")
    rate = timed_drain(cur, "the issue's drain", "CALL bench_issue_drain()")
    cur.execute("DROP TABLE bench_issue_outbox")
    return rate


def sink_limit(tmp, url, connections):
    """Requests/s the nginx sink answers to wrk (one thread) on this many
    keep-alive connections, requests of the relay's size; None without
    wrk (test/install-deps bench installs it)."""
    if not shutil.which("wrk"):
        return None
    script = os.path.join(tmp, "sink.lua")
    with open(script, "w") as f:
        f.write(f"""wrk.method = "POST"
wrk.body = '{PAYLOAD}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["ce-specversion"] = "1.0"
wrk.headers["ce-id"] = "0193a0b2-7c4e-7d2a-9f1e-3b5c6d7e8f90"
wrk.headers["ce-type"] = "bench.event"
wrk.headers["ce-source"] = "/outbox_pg/postgres"
wrk.headers["ce-subject"] = "421"
wrk.headers["ce-time"] = "2026-12-06T19:40:54.123456Z"
""")
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{SINK_SECONDS}s", "-s", script, url],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            rate = float(line.split()[1])
            print(f"  the sink alone (wrk, {connections} connection{'s' if connections > 1 else ''}): {rate:.0f} requests/s",
                  file=sys.stderr, flush=True)
            return rate
    print(f"  the sink alone (wrk, {connections} connections): no result", file=sys.stderr, flush=True)
    return None


def open_loop(tmp, dsn, cur):
    """(e): pgbench offers OPEN_RATE single-event commits a second for
    OPEN_SECONDS on a schedule; returns (p50, p99, p99.9, events delivered,
    events emitted, pgbench's mean lag behind its schedule in ms)."""
    params = dict(kv.split("=", 1) for kv in dsn.split())
    script = os.path.join(tmp, "open.sql")
    with open(script, "w") as f:
        f.write("SELECT outbox.emit('bench.open', :client_id::text, '{}');\n")
    os.chmod(script, 0o644)
    out = subprocess.run([f"{BIN}/pgbench", "-n", "-M", "prepared", "-h", params["host"], "-p", params["port"],
                          "-c", "4", "-j", "2", "-R", str(OPEN_RATE), "-T", str(OPEN_SECONDS),
                          "-f", script, params["dbname"]],
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, PGOPTIONS="-c synchronous_commit=off")).stdout
    # "rate limit schedule lag: avg 0.123 (max 4.567) ms"
    lag = next((float(l.split("avg")[1].split()[0]) for l in out.splitlines()
                if l.startswith("rate limit schedule lag") and "avg" in l), float("nan"))
    deadline = time.time() + 60
    while time.time() < deadline:
        cur.execute("SELECT count(*) FROM outbox.events WHERE type = 'bench.open' AND status <> 'published'")
        if cur.fetchone()[0] == 0:
            break
        time.sleep(0.2)
    time.sleep(1)
    arr = arrivals(tmp)
    cur.execute("SELECT id::text, extract(epoch FROM created_at)::float8 FROM outbox.events WHERE type = 'bench.open'")
    rows = cur.fetchall()
    emitted = len(rows)
    lat = [(arr[k] - t) * 1000 for k, t in rows if k in arr]
    print(f"  open loop: {emitted} events offered at {OPEN_RATE}/s, {len(lat)} delivered", file=sys.stderr, flush=True)
    return (pct(lat, 50), pct(lat, 99), pct(lat, 99.9), len(lat), emitted, lag)


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_relay_bench_")
    os.chmod(tmp, 0o777)
    nginx_port = start_nginx(tmp, http2=HTTP2)
    url = f"http://127.0.0.1:{nginx_port}/hook"
    data, dsn = start_cluster(tmp, WORKERS, extra=SETTINGS)
    results = {}
    try:
        cur = bench_destination(dsn, url, MAX_CONCURRENCY, DEST_OPTIONS)
        cur.execute("""
CREATE TABLE app_outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), type text NOT NULL,
                         payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                         published_at timestamptz);
CREATE INDEX ON app_outbox (created_at) WHERE published_at IS NULL;
""")
        time.sleep(2)

        # (a) outbox_pg throughput
        emit_backlog(cur)
        relay_pid = None
        for _ in range(200):
            cur.execute("SELECT pid FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL ORDER BY worker LIMIT 1")
            row = cur.fetchone()
            if row:
                relay_pid = row[0]
                break
            time.sleep(0.05)
        cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
        relay_pids = cur.fetchone()[0] or []
        cpu0 = sum(cpu_seconds(p) or 0 for p in relay_pids)
        busy0 = machine_jiffies()
        csw0 = [sum(x) for x in zip(*(context_switches(p) for p in relay_pids))] if relay_pids else [0, 0]
        rss = [rss_kb(relay_pid)]
        perf = None
        if PERF:
            # a profile of the relay workers while they drain (BENCH_PERF=file)
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-g", "-o", PERF,
                                     "-p", ",".join(str(p) for p in relay_pids)],
                                    stdout=subprocess.DEVNULL)
            time.sleep(0.5)
        t0 = time.time()
        cur.execute("UPDATE outbox.destinations SET paused = false")
        cur.execute("SELECT outbox.emit('bench.kick', 'k', '{}')")   # a commit wakes the relay
        while True:
            # the workers' counters, from shared memory: polling the table
            # itself would compete with the relay for the CPU
            cur.execute("SELECT %s + 1 - coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'", (N,))
            left = cur.fetchone()[0]
            rss.append(rss_kb(relay_pid))
            if left == 0:
                break
            time.sleep(0.02)
        elapsed = time.time() - t0
        cpu1 = sum(cpu_seconds(p) or 0 for p in relay_pids)
        busy1 = machine_jiffies()
        csw1 = [sum(x) for x in zip(*(context_switches(p) for p in relay_pids))] if relay_pids else [0, 0]
        results["csw"] = ((csw1[0] - csw0[0]) / N, (csw1[1] - csw0[1]) / N)
        results["machine_busy"] = (os.cpu_count() * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
                                   (cpu1 - cpu0) / elapsed)
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait()
            print(f"  perf profile of the drain: {PERF}", file=sys.stderr, flush=True)
        results["relay_cpu_us"] = (cpu1 - cpu0) * 1e6 / N
        results["relay_eps"] = N / elapsed
        rss = [r for r in rss if r]
        results["rss"] = (rss[1] if len(rss) > 1 else rss[0], rss[len(rss) // 2], rss[-1])
        print(f"  outbox_pg: {N} events in {elapsed:.1f} s", file=sys.stderr, flush=True)
        cur.execute("SELECT count(*), round(avg(events), 1) FROM outbox.batches WHERE destination = 'bench' AND events > 0")
        claims, per_claim = cur.fetchone()
        print(f"  outbox_pg: {claims} claims, {per_claim} events each", file=sys.stderr, flush=True)

        # (b) outbox_pg latency
        lat_ids = {}
        for i in range(M):
            cur.execute("BEGIN")
            cur.execute("SELECT outbox.emit('bench.latency', %s, '{}')", (str(i),))
            mid = str(cur.fetchone()[0])
            t_commit = time.time()
            cur.execute("COMMIT")
            lat_ids[mid] = t_commit
            time.sleep(0.01)
        time.sleep(1.5)
        arr = arrivals(tmp)
        lat = [(arr[k] - v) * 1000 for k, v in lat_ids.items() if k in arr]
        results["relay_lat"] = (pct(lat, 50), pct(lat, 99), len(lat))

        # (e) outbox_pg under a steady offered load (open loop)
        if OPEN_RATE > 0:
            results["open"] = open_loop(tmp, dsn, cur)

        if HTTP2:
            # the poller speaks HTTP/1.1 only
            results["app_eps"] = float("nan")
            results["app_lat"] = (float("nan"), float("nan"), 0)
        else:
            # (c) the reference poller: throughput
            cur.execute(f"INSERT INTO app_outbox (type, payload) SELECT 'bench.event', '{PAYLOAD}' FROM generate_series(1, {N})")
            t0 = time.time()
            subprocess.run([sys.executable, os.path.join(HERE, "app_poller.py"), dsn, url, str(N)], check=True)
            elapsed = time.time() - t0
            results["app_eps"] = N / elapsed
            print(f"  reference poller: {N} events in {elapsed:.1f} s", file=sys.stderr, flush=True)

            # (c) the reference poller: latency
            poller = subprocess.Popen([sys.executable, os.path.join(HERE, "app_poller.py"), dsn, url, str(M)])
            lat_ids = {}
            for i in range(M):
                cur.execute("BEGIN")
                cur.execute("INSERT INTO app_outbox (type, payload) VALUES ('bench.latency', '{}') RETURNING id")
                mid = str(cur.fetchone()[0])
                t_commit = time.time()
                cur.execute("COMMIT")
                lat_ids[mid] = t_commit
                time.sleep(0.01)
            poller.wait(timeout=120)
            time.sleep(1.5)
            arr = arrivals(tmp)
            lat = [(arr[k] - v) * 1000 for k, v in lat_ids.items() if k in arr]
            results["app_lat"] = (pct(lat, 50), pct(lat, 99), len(lat))
        # (d) the database's drain limit: the same backlog, claimed and
        # acknowledged by a procedure, the destination paused for the relay
        cur.execute("UPDATE outbox.destinations SET paused = true")
        emit_backlog(cur)
        results["sql_eps"] = sql_drain(cur, "bench")
        # (f) the same number of events drained the way the issue did
        results["issue_eps"] = issue_drain(cur)
        # (g) the sink alone, PostgreSQL idle
        results["sink"] = [(c, None if HTTP2 else sink_limit(tmp, url, c)) for c in (1, 64)]
    finally:
        subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    r = results
    print()
    print(f"Relay vs the reference application poller — {N} events up front, {M} spaced single events, nginx 204 sink")
    print()
    print("| | outbox_pg relay | reference poller (2 s poll, one by one) | ratio |")
    print("|---|---|---|---|")
    print(f"| throughput (events/s) | {r['relay_eps']:.0f} | {r['app_eps']:.0f} | {r['relay_eps'] / r['app_eps']:.1f}x |")
    print(f"| commit-to-sink p50 (ms) | {r['relay_lat'][0]:.1f} | {r['app_lat'][0]:.1f} | {r['app_lat'][0] / max(r['relay_lat'][0], 0.01):.0f}x faster |")
    print(f"| commit-to-sink p99 (ms) | {r['relay_lat'][1]:.1f} | {r['app_lat'][1]:.1f} | {r['app_lat'][1] / max(r['relay_lat'][1], 0.01):.0f}x faster |")
    print()
    print(f"relay workers' CPU per event (user + system, all workers): {r['relay_cpu_us']:.0f} µs; "
          f"during (a) the machine was busy {r['machine_busy'][0]:.2f} of its {os.cpu_count()} cores, "
          f"the relay workers {r['machine_busy'][1]:.2f}; their context switches per event: "
          f"{r['csw'][0]:.2f} waits, {r['csw'][1]:.2f} preemptions")
    print(f"the database's own drain limit, same run (claim + acknowledge by a procedure, no HTTP): "
          f"{r['sql_eps']:.0f} events/s; the relay reached {r['relay_eps'] / r['sql_eps']:.2f}x of it")
    print(f"the issue's drain limit, same run (status-column UPDATE ... FOR UPDATE SKIP LOCKED, 100 a commit): "
          f"{r['issue_eps']:.0f} events/s; the relay reached {r['relay_eps'] / r['issue_eps']:.2f}x of it")
    for c, rate in r["sink"]:
        if rate is None:
            print(f"the sink's own limit on {c} connection(s): not measured "
                  f"({'wrk speaks HTTP/1.1 only' if HTTP2 else 'no wrk; test/install-deps bench'})")
        else:
            print(f"the sink's own limit, same run (wrk, one thread, {c} connection{'s' if c > 1 else ''}, "
                  f"requests of the relay's size): {rate:.0f} requests/s; the relay reached "
                  f"{r['relay_eps'] / rate:.2f}x of it")
    if "open" in r:
        p50, p99, p999, got, emitted, lag = r["open"]
        print(f"open loop, {OPEN_RATE} events/s offered for {OPEN_SECONDS} s (pgbench -R, 4 clients, "
              f"single-event commits, synchronous_commit off): commit-to-sink p50 {p50:.1f} ms, "
              f"p99 {p99:.1f} ms, p99.9 {p999:.1f} ms over {got} of {emitted} events "
              f"(pgbench's mean lag behind its schedule: {lag:.2f} ms)")
    print(f"relay worker private memory (RssAnon, kB) at start / middle / end of the {N} events: {r['rss'][0]} / {r['rss'][1]} / {r['rss'][2]}")


if __name__ == "__main__":
    main()
