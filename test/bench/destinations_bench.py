#!/usr/bin/env python3
"""Many destinations (issue #19): what the relay costs with destinations
that have no work, and what it delivers when one, all, or one big and one
small destination have work.  One cluster, destinations added as the run
goes (1, then 10, 100, ... up to the largest count), two relay workers,
nginx answering 204.  The destinations' URLs differ by path and spread
over BENCH_HOSTS (1) host:port pairs on 127.0.0.x, one nginx listening on
each address (BENCH_HOSTS=250: the issue's bounded-resources case).

For each count of destinations:
  idle     relay CPU (all workers, share of one core) over BENCH_IDLE_SECONDS
           (30) with no events at all, poll 1 s;
  one      BENCH_EVENTS (20,000) events to one destination, emitted while it
           is paused, then resumed: events/s until published;
  spread   BENCH_EVENTS events spread evenly over every destination (paused
           while emitted): events/s, and the most sockets a relay held;
  fair     a backlog of BENCH_FAIR_EVENTS (200,000) to one destination while
           another gets one event every 20 ms (its own transaction each):
           the trickle's commit-to-sink p50/p99/max, and the backlog's rate.
Ratios are against the same run's single-destination rate (the "one"
figure with one destination).  Each relay's RssAnon is sampled throughout.

BENCH_DESTINATIONS (1,10,100,1000,10000), BENCH_WORKERS (2),
BENCH_DRAIN_LIMIT (300 s per phase; past it the rate so far is reported),
BENCH_SETTINGS (extra postgresql.conf lines, ";" between them).  A benchmark, not a test:
it never fails on a timing.
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psycopg2

import relay_bench as rb

COUNTS = [int(x) for x in os.environ.get("BENCH_DESTINATIONS", "1,10,100,1000,10000").split(",") if x.strip()]
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
N = int(os.environ.get("BENCH_EVENTS", "20000"))
FAIR_N = int(os.environ.get("BENCH_FAIR_EVENTS", "200000"))
HOSTS = int(os.environ.get("BENCH_HOSTS", "1"))
IDLE_SECONDS = int(os.environ.get("BENCH_IDLE_SECONDS", "30"))
DRAIN_LIMIT = int(os.environ.get("BENCH_DRAIN_LIMIT", "300"))
SETTINGS = os.environ.get("BENCH_SETTINGS", "").replace(";", "\n")
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
SETTLE = int(os.environ.get("BENCH_SETTLE_SECONDS", "10"))
TRICKLE_MS = 20
# nginx may hold every relay connection: its own open files limit as high
# as the hard limit allows (the relays' is left as the server has it)
NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
if NOFILE == resource.RLIM_INFINITY or NOFILE > 65536:
    NOFILE = 65536


def sockets(pid):
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    n += 1
            except OSError:
                pass
    except OSError:
        pass
    return n


class Relays:
    def __init__(self, cur):
        self.cur = cur
        self.pids = []
        for _ in range(400):
            cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
            self.pids = cur.fetchone()[0] or []
            if len(self.pids) == WORKERS:
                break
            time.sleep(0.05)
        self.rss_max = 0

    def cpu(self):
        return sum(rb.cpu_seconds(p) or 0 for p in self.pids)

    def published(self):
        self.cur.execute("SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'")
        return int(self.cur.fetchone()[0])

    def sample(self):
        rss = sum(rb.rss_kb(p) or 0 for p in self.pids)
        self.rss_max = max(self.rss_max, rss)
        return max((sockets(p) for p in self.pids), default=0)

    def wait_published(self, target):
        """events/s from now until target is published (or the limit),
        relay CPU µs per event, most sockets a relay held, drained?"""
        cpu0 = self.cpu()
        start = self.published()
        t0 = time.time()
        most = 0
        while True:
            done = self.published()
            most = max(most, self.sample())
            if done >= target or time.time() - t0 > DRAIN_LIMIT:
                break
            time.sleep(0.05)
        elapsed = time.time() - t0
        n = done - start
        return n / elapsed, (self.cpu() - cpu0) * 1e6 / max(n, 1), most, done >= target


def emit(cur, n, dest_expr, per_txn=1000):
    for first in range(0, n, per_txn):
        cur.execute(f"SELECT count(outbox.emit('bench.event', (g % 1000)::text, '{rb.PAYLOAD}', "
                    f"destination => {dest_expr})) FROM generate_series({first}, {min(first + per_txn, n) - 1}) g")


def trickle(dsn, stop, out):
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    while not stop.is_set():
        cur.execute("SELECT outbox.emit('bench.trickle', 't', '{}', destination => 'd1')")
        mid = str(cur.fetchone()[0])
        t = time.time()
        conn.commit()
        out[mid] = t
        time.sleep(TRICKLE_MS / 1000.0)
    conn.close()


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_dest_bench_")
    os.chmod(tmp, 0o777)
    port = rb.start_nginx(tmp, hosts=HOSTS, nofile=NOFILE)
    top = max(COUNTS)
    data, dsn = rb.start_cluster(tmp, WORKERS, poll_interval="1s",
                                 extra=f"outbox.max_destinations = {max(top + 100, 1000)}\n"
                                       f"{SETTINGS}\n")
    rows = []
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE EXTENSION outbox_pg")
        relays = None
        have = 0
        for count in COUNTS:
            cur.execute("INSERT INTO outbox.destinations (name, url, max_concurrency) "
                        "SELECT 'd' || g, format('http://127.0.0.%%s:%%s/d%%s', 1 + g %% %s, %s, g), 64 "
                        "FROM generate_series(%s, %s) g", (HOSTS, port, have, count - 1))
            have = count
            if relays is None:
                relays = Relays(cur)
            time.sleep(SETTLE)  # the relays have loaded the destinations and swept
            r = {"count": count}
            relays.rss_max = 0

            cpu0 = relays.cpu()
            t0 = time.time()
            time.sleep(IDLE_SECONDS)
            r["idle"] = (relays.cpu() - cpu0) / (time.time() - t0)

            # one destination with work, then every destination: REPEAT
            # times each, the median (and whether every run drained)
            for phase in ("one", "spread"):
                runs = []
                # the cluster's first run pays its one-time costs: not counted
                warm = 1 if not rows and phase == "one" else 0
                for i in range(warm + REPEAT):
                    where = " WHERE name = 'd0'" if phase == "one" else ""
                    cur.execute("UPDATE outbox.destinations SET paused = true" + where)
                    emit(cur, N, "'d0'" if phase == "one" else f"'d' || (g % {count})")
                    target = relays.published() + N
                    cur.execute("UPDATE outbox.destinations SET paused = false" + where)
                    res = relays.wait_published(target)
                    if i >= warm:
                        runs.append(res)
                runs.sort(key=lambda x: x[0])
                mid = runs[len(runs) // 2]
                r[phase], r[phase + "_cpu"] = mid[0], mid[1]
                r[phase + "_done"] = all(x[3] for x in runs)
                r[phase + "_runs"] = [x[0] for x in runs]
                if phase == "spread":
                    r["sockets"] = max(x[2] for x in runs)

            # a backlog on one, a trickle on another
            if count >= 2:
                cur.execute("UPDATE outbox.destinations SET paused = true WHERE name = 'd0'")
                emit(cur, FAIR_N, "'d0'")
                target = relays.published() + FAIR_N
                sent = {}
                stop = threading.Event()
                th = threading.Thread(target=trickle, args=(dsn, stop, sent))
                cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = 'd0'")
                th.start()
                r["fair"], _, _, r["fair_done"] = relays.wait_published(target)
                stop.set()
                th.join()
                time.sleep(1.5)
                arr = rb.arrivals(tmp)
                lat = [(arr[k] - v) * 1000 for k, v in sent.items() if k in arr]
                r["trickle"] = (rb.pct(lat, 50), rb.pct(lat, 99), max(lat) if lat else float("nan"),
                                len(lat), len(sent))
            r["rss"] = (sum(rb.rss_kb(p) or 0 for p in relays.pids), relays.rss_max)
            rows.append(r)
            print(f"  {count} destinations: idle {100 * r['idle']:.2f} % of a core, "
                  f"one {[round(x) for x in r['one_runs']]}/s, spread {[round(x) for x in r['spread_runs']]}/s, "
                  f"fair {r.get('fair', 0):.0f}/s, trickle {r.get('trickle')}, rss {r['rss']}",
                  file=sys.stderr, flush=True)
        conn.close()
    finally:
        subprocess.run([f"{rb.BIN}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    base = rows[0]["one"]
    print()
    print(f"Many destinations, one cluster, {WORKERS} relay workers, poll 1 s, nginx 204 sink on "
          f"{min(HOSTS, top)} host:port pairs, max_concurrency 64 each; {N} events per row, "
          f"backlog {FAIR_N} for the trickle; medians of {REPEAT}; ratios against {base:.0f} events/s "
          f"to a single destination alone; idle over {IDLE_SECONDS} s, {SETTLE} s after the destinations were added")
    print()
    print("| destinations | relay CPU, no work (% of a core) | events to one (events/s, ratio) | µs CPU/event | "
         "spread evenly (events/s, ratio) | µs CPU/event | most sockets per relay | "
          "trickle next to a backlog: p50 / p99 / max (ms) | backlog rate (events/s) | relays' RssAnon (kB): end of row / most |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        one = f"{r['one']:.0f} ({r['one'] / base:.2f}x){'' if r['one_done'] else ', not drained'}"
        spread = f"{r['spread']:.0f} ({r['spread'] / base:.2f}x){'' if r['spread_done'] else ', not drained'}"
        if "trickle" in r:
            p50, p99, mx, got, sent = r["trickle"]
            tr = f"{p50:.1f} / {p99:.1f} / {mx:.1f} ({got} of {sent})"
            fair = f"{r['fair']:.0f}{'' if r['fair_done'] else ', not drained'}"
        else:
            tr, fair = "—", "—"
        print(f"| {r['count']} | {100 * r['idle']:.2f} | {one} | {r['one_cpu']:.0f} | {spread} | "
              f"{r['spread_cpu']:.0f} | {r['sockets']} | {tr} | {fair} | {r['rss'][0]} / {r['rss'][1]} |")


if __name__ == "__main__":
    main()
