#!/usr/bin/env python3
"""Delivery to a slow receiver (issue #20): events/s against a receiver
that answers 204 after BENCH_DELAY_MS (200), next to the bound Little's law
puts on it (max_concurrency / delay), and the most requests the receiver
itself saw in flight (test/sink/slow_sink.py measures that).

The rows of the issue's table, each on a throwaway cluster: relay workers,
outbox.batch_size and max_concurrency

    1 worker,  batch_size 200,  max_concurrency 16
    1 worker,  batch_size 200,  max_concurrency 200
    2 workers, batch_size 1000, max_concurrency 1000
    1 worker,  batch_size 1000, max_concurrency 1000  (row 4: only with BENCH_ROWS=4)

and, with BENCH_NEIGHBOUR=1, a fast destination (answers at once,
max_concurrency 64; BENCH_FAST_DELAY_MS, BENCH_FAST_CONCURRENCY and
BENCH_FAST_EVENTS (5000) change that) next to the third row, answered by a
receiver process of its own: its events/s alone and next to the slow one
at its limit, with the machine's CPU and each process's during both, and
its rate between its receiver's first request and last answer (each phase
counted under a name of its own: the destination's URL changes while it
is paused) beside the time from the resume to the first request.
Each row: a backlog of events (destination paused, emitted in
transactions of 100, resumed), timed from the resume until the receiver
has answered every event.  BENCH_EVENTS scales the backlogs (default 1:
1,000, 5,000 and 20,000 events); BENCH_SETTINGS adds server settings
("a = 1; b = 2").  BENCH_HTTP2=1: the slow destination is reached over
HTTP/2 with TLS (http_version '2'), through nginx with a throwaway
certificate in front of the receiver; "connections" is then the relay's
connections to nginx (distinct in nginx's log), not the receiver's.
BENCH_SLOW_RECEIVER=nginx: the slow destination's receiver is nginx with
the echo module (Debian's libnginx-mod-http-echo: echo_sleep, then 204)
instead of slow_sink.py, a receiver that costs the machine little CPU
(the Python one takes half a core at 5,000 requests/s, on a machine of
two); the receiver then reports no requests in flight, and the slow
destination counts as at its limit once max_concurrency requests were
answered.  A benchmark, not a test.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relay_bench import BIN, cpu_seconds, free_port, machine_jiffies, start_cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SINK = next(p for p in (os.path.join(HERE, "slow_sink.py"), os.path.join(HERE, "..", "sink", "slow_sink.py"))
            if os.path.exists(p))
DELAY = int(os.environ.get("BENCH_DELAY_MS", "200"))
SCALE = float(os.environ.get("BENCH_EVENTS", "1"))
NEIGHBOUR = os.environ.get("BENCH_NEIGHBOUR", "") == "1"
FAST_EVENTS = int(os.environ.get("BENCH_FAST_EVENTS", "5000"))
FAST_DELAY = int(os.environ.get("BENCH_FAST_DELAY_MS", "0"))
FAST_CONC = int(os.environ.get("BENCH_FAST_CONCURRENCY", "64"))
ROWS = [(1, 200, 16, 1000), (1, 200, 200, 5000), (2, 1000, 1000, 20000), (1, 1000, 1000, 20000)]
WHICH = [int(r) for r in os.environ.get("BENCH_ROWS", "1,2,3").split(",")]
SETTINGS = os.environ.get("BENCH_SETTINGS", "").replace(";", "\n")
HTTP2 = os.environ.get("BENCH_HTTP2", "") == "1"
SLOW_NGINX = os.environ.get("BENCH_SLOW_RECEIVER", "") == "nginx"
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def run_nginx(d, log_format, http, preamble=""):
    """nginx in the foreground with its files in d (created), the http
    block's common lines, an access log of log_format (d/access.log) and
    the rest of the http block; returns the process once it has started."""
    os.makedirs(d)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(d, sub))
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(f"""{preamble}
daemon off;
master_process off;
worker_rlimit_nofile 16384;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
    log_format c '{log_format}';
    access_log {d}/access.log c;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
{http}
}}
""")
    proc = subprocess.Popen([NGINX, "-p", d, "-c", os.path.join(d, "nginx.conf")])
    for _ in range(100):
        if os.path.exists(os.path.join(d, "nginx.pid")):
            break
        time.sleep(0.05)
    return proc


def start_h2_front(tmp, sink_port):
    """nginx speaking HTTP/2 over TLS on a free port, passing every request
    on to the receiver (keep-alive, HTTP/1.1); returns (process, port, the
    certificate, its access log)."""
    d = os.path.join(tmp, "nginx")
    certs = tempfile.mkdtemp(prefix="certs_", dir=tmp)
    cert, key = (os.path.join(certs, f) for f in ("cert.pem", "key.pem"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", key,
                    "-out", cert, "-subj", "/CN=outbox_pg bench", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    version = subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr
    major, minor, patch = (int(x) for x in version.split("/")[1].split()[0].split(".")[:3])
    new_h2 = (major, minor, patch) >= (1, 25, 1)
    port = free_port()
    proc = run_nginx(d, "$connection", f"""    upstream receiver {{ server 127.0.0.1:{sink_port}; keepalive 2048; }}
    server {{
        listen 127.0.0.1:{port} ssl{'' if new_h2 else ' http2'};
        {'http2 on;' if new_h2 else ''}
        keepalive_requests 1000000;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{ proxy_pass http://receiver; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}""")
    return proc, port, cert, os.path.join(d, "access.log")


def start_nginx_receiver(tmp):
    """nginx answering 204 to everything after DELAY ms (the echo
    module's echo_sleep), logging each request's connection and URI;
    returns (process, port, its access log)."""
    if not os.path.exists(ECHO_MODULE):
        raise RuntimeError(f"BENCH_SLOW_RECEIVER=nginx needs {ECHO_MODULE} (apt install libnginx-mod-http-echo)")
    d = os.path.join(tmp, "nginx_receiver")
    port = free_port()
    proc = run_nginx(d, "$connection $request_uri", f"""    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        keepalive_timeout 300s;
        location / {{ echo_sleep {DELAY / 1000.0}; echo_status 204; }}
    }}""", preamble=f"load_module {ECHO_MODULE};")
    return proc, port, os.path.join(d, "access.log")


def log_requests(log, name):
    """Requests in an nginx receiver's access log whose URI ends in /name."""
    try:
        with open(log) as f:
            return sum(1 for line in f if line.rstrip("\n").endswith("/" + name))
    except OSError:
        return 0


def distinct_connections(log):
    try:
        with open(log) as f:
            return len({line.split()[0] for line in f if line.strip()})
    except OSError:
        return None


def start_sink(tmp, stats_name="sink.json"):
    port = free_port()
    stats = os.path.join(tmp, stats_name)
    proc = subprocess.Popen([sys.executable, SINK, "--port", str(port), "--stats", stats],
                            stdout=subprocess.PIPE)
    proc.stdout.readline()
    return proc, port, stats


def sink_stats(path):
    for _ in range(50):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            time.sleep(0.1)
    return {"names": {}}


class Phase:
    """CPU of the machine and of some processes over a stretch of a run."""

    def __init__(self, pids):
        self.pids = pids
        self.m0 = machine_jiffies()
        self.p0 = [cpu_seconds(p) or 0 for p in pids]
        self.t0 = time.time()

    def end(self):
        m1 = machine_jiffies()
        wall = time.time() - self.t0
        p1 = [cpu_seconds(p) or 0 for p in self.pids]
        busy = (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1]) * os.cpu_count()
        return busy, [(b - a) / wall for a, b in zip(self.p0, p1)]


def receiver_view(stats, name):
    c = sink_stats(stats)["names"].get(name, {})
    return c.get("requests", 0), c.get("serve_sum", 0.0), c.get("in_flight_sum", 0), c.get("samples", 0)


def receiver_delta(a, b):
    """What the receiver saw between two receiver_view()s: (its time per
    request in ms, requests the sender kept in flight on average)."""
    dr, ds, di, dn = (y - x for x, y in zip(a, b))
    return (1000 * ds / dr if dr else float("nan")), (di / dn if dn else float("nan"))


def emit(cur, dest, n):
    for first in range(0, n, 100):
        cur.execute("SELECT count(outbox.emit('bench.slow', (g %% 1000)::text, '{}', destination => %s)) "
                    "FROM generate_series(1, %s) g", (dest, min(100, n - first)))


def answered(stats, name):
    return sink_stats(stats)["names"].get(name, {}).get("requests", 0)


def wait_for(cond, what):
    deadline = time.time() + 600
    while not cond():
        if time.time() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.05)


def resume_and_wait(cur, stats, name, until, counted=None):
    """Resume a destination; seconds until the receiver answered `until`
    requests of it in all (counted under `counted`, else its name)."""
    t0 = time.time()
    cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = %s", (name,))
    wait_for(lambda: answered(stats, counted or name) >= until, f"{until} answers of {counted or name}")
    return time.time() - t0


def fast_phase(cur, stats, pids, n, name):
    """Resume the fast destination, its receiver counting its n requests
    under `name` (the destination's URL changed while paused), until they
    are answered: (events/s from the resume, Phase.end() over that time,
    what its receiver saw: receiver_delta(), events/s from the receiver's
    first request to its last answer, seconds from the resume to the first
    request)."""
    cur.execute("UPDATE outbox.destinations SET url = regexp_replace(url, '[^/]*$', %s) WHERE name = 'fast'",
                (name,))
    phase = Phase(pids)
    view = receiver_view(stats, name)
    t0 = time.time()
    elapsed = resume_and_wait(cur, stats, "fast", n, name)
    c = sink_stats(stats)["names"][name]
    steady = (n - 1) / (c["last"] - c["first"]) if c["last"] > c["first"] else float("nan")
    return n / elapsed, phase.end(), receiver_delta(view, receiver_view(stats, name)), steady, c["first"] - t0


def run_row(workers, batch_size, conc, n, neighbour):
    tmp = tempfile.mkdtemp(prefix="outbox_conc_bench_")
    os.chmod(tmp, 0o777)
    sink, port, stats = start_sink(tmp)
    # the fast neighbour has a receiver of its own: sharing the slow one's
    # event loop would measure that loop, not the relay
    fast_sink, fast_port, fast_stats = start_sink(tmp, "fast.json") if neighbour else (None, port, stats)
    front = None
    slow_url, slow_options, extra = f"http://127.0.0.1:{port}/delay/{DELAY}/slow", "{}", ""
    receiver_pid = sink.pid
    if SLOW_NGINX and HTTP2:
        raise RuntimeError("BENCH_SLOW_RECEIVER=nginx and BENCH_HTTP2=1 do not go together")
    if SLOW_NGINX:
        front, nginx_port, nginx_log = start_nginx_receiver(tmp)
        slow_url = f"http://127.0.0.1:{nginx_port}/delay/{DELAY}/slow"
        receiver_pid = front.pid

    def slow_answered():
        return log_requests(nginx_log, "slow") if SLOW_NGINX else answered(stats, "slow")

    def slow_at_limit():
        if SLOW_NGINX:
            return slow_answered() >= conc
        return sink_stats(stats)["names"].get("slow", {}).get("in_flight", 0) >= conc * 0.9
    if HTTP2:
        front, front_port, cert, front_log = start_h2_front(tmp, port)
        slow_url = f"https://127.0.0.1:{front_port}/delay/{DELAY}/slow"
        slow_options = '{"http_version": "2"}'
        extra = f"outbox.ca_file = '{cert}'\n"
    data, dsn = start_cluster(tmp, workers, poll_interval="1s",
                              extra=f"outbox.batch_size = {batch_size}\n{extra}{SETTINGS}\n")
    out = {}
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE EXTENSION outbox_pg")
        cur.execute("INSERT INTO outbox.destinations (name, url, timeout_ms, max_concurrency, paused, options) VALUES "
                    "('slow', %s, 60000, %s, true, %s), ('fast', %s, 60000, %s, true, '{}')",
                    (slow_url, conc, slow_options, f"http://127.0.0.1:{fast_port}/delay/{FAST_DELAY}/fast", FAST_CONC))
        while True:
            cur.execute("SELECT count(*) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
            if cur.fetchone()[0] == workers:
                break
            time.sleep(0.1)
        time.sleep(1)
        emit(cur, "slow", n)
        cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
        relays = cur.fetchone()[0]
        with open(f"/proc/{relays[0]}/limits") as f:
            out["nofile"] = next(line.split()[3] for line in f if line.startswith("Max open files"))
        whole = Phase(relays + [receiver_pid])
        if not neighbour:
            t0 = time.time()
            cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = 'slow'")
            wait_for(lambda: slow_answered() >= n, "every answer of slow")
            out["rate"] = n / (time.time() - t0)
        else:
            # the fast one alone, then next to the slow one at its limit
            nf = FAST_EVENTS
            emit(cur, "fast", nf)
            pids = relays + [receiver_pid, fast_sink.pid]
            out["fast_alone"], out["cpu_alone"], out["seen_alone"], out["steady_alone"], out["start_alone"] = \
                fast_phase(cur, fast_stats, pids, nf, "fast_alone")
            cur.execute("UPDATE outbox.destinations SET paused = true WHERE name = 'fast'")
            emit(cur, "fast", nf)
            t0 = time.time()
            cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = 'slow'")
            # at its limit, or as close as it gets in 5 s
            wait_for(lambda: slow_at_limit() or time.time() > t0 + 5, "the slow destination at its limit")
            out["fast_next"], out["cpu_next"], out["seen_next"], out["steady_next"], out["start_next"] = \
                fast_phase(cur, fast_stats, pids, nf, "fast_next")
            out["slow_left"] = n - slow_answered()
            wait_for(lambda: slow_answered() >= n, "every answer of slow")
            out["rate"] = n / (time.time() - t0)
        procs = whole.end()[1]
        out["cpu"] = "relays " + " + ".join(f"{100 * c:.0f}%" for c in procs[:-1]) + \
            f", receiver {100 * procs[-1]:.0f}%"
        time.sleep(0.3)
        s = sink_stats(stats)
        out["max_in_flight"] = s["names"].get("slow", {}).get("max_in_flight")
        if SLOW_NGINX:
            out["max_connections"] = distinct_connections(nginx_log)
        elif HTTP2:
            out["max_connections"] = distinct_connections(front_log)
        else:
            out["max_connections"] = s.get("max_connections")
        conn.close()
    finally:
        subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-m", "immediate", "stop"], capture_output=True)
        sink.kill()
        if fast_sink:
            fast_sink.kill()
        if front:
            front.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():
    print(f"receiver answers after {DELAY} ms; BENCH_ROWS {','.join(map(str, WHICH))}; settings: {SETTINGS or '-'}"
          f"{'; over HTTP/2 with TLS (nginx in front)' if HTTP2 else ''}"
          f"{'; the slow receiver is nginx (echo_sleep)' if SLOW_NGINX else ''}\n")
    print("| relay workers | batch_size | max_concurrency | events | delivered | bound: max_concurrency / delay | receiver: most in flight | connections | CPU (of a core) |")
    print("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for i, (workers, batch_size, conc, n) in enumerate(ROWS):
        if i + 1 not in WHICH:
            continue
        n = max(100, int(n * SCALE) // 100 * 100)
        neighbour = NEIGHBOUR and i == 2
        r = run_row(workers, batch_size, conc, n, neighbour)
        bound = conc * 1000.0 / DELAY
        print(f"| {workers} | {batch_size} | {conc} | {n} | {r['rate']:.0f} ev/s | {bound:.0f} -> {r['rate'] / bound:.2f}x "
              f"| {r['max_in_flight']} | {r['max_connections']} | {r['cpu']} |", flush=True)
        notes.append(f"row {i + 1}: the relay's limit of open files {r['nofile']}")
        if neighbour:
            notes.append(f"row {i + 1}: a fast neighbour (max_concurrency {FAST_CONC}, "
                         f"{f'answers after {FAST_DELAY} ms' if FAST_DELAY else 'answers at once'}, {FAST_EVENTS} events): "
                         f"{r['fast_alone']:.0f} ev/s alone, {r['fast_next']:.0f} ev/s next to the slow one at its limit "
                         f"({r['fast_next'] / r['fast_alone']:.2f}x; the slow one had {r['slow_left']} events to go then)")
            notes.append(f"row {i + 1}: the fast neighbour from its receiver's first request to its last answer: "
                         f"{r['steady_alone']:.0f} ev/s alone, {r['steady_next']:.0f} ev/s next to the slow one "
                         f"({r['steady_next'] / r['steady_alone']:.2f}x); from the resume to the first request "
                         f"{1000 * r['start_alone']:.0f} ms alone, {1000 * r['start_next']:.0f} ms next to it")
            for what, key in (("alone", "cpu_alone"), ("next to the slow one", "cpu_next")):
                busy, procs = r[key]
                notes.append(f"row {i + 1}: CPU while the fast one ran {what}: machine {busy:.2f} of {os.cpu_count()} cores; "
                             + ", ".join(f"relay {100 * c:.0f}%" for c in procs[:-2])
                             + f", slow receiver {100 * procs[-2]:.0f}%, fast receiver {100 * procs[-1]:.0f}%")
            for what, key in (("alone", "seen_alone"), ("next to the slow one", "seen_next")):
                ms, kept = r[key]
                notes.append(f"row {i + 1}: the fast receiver's view {what}: {ms:.1f} ms per request from its head to "
                             f"its answer; {kept:.1f} requests kept in flight on average (of {FAST_CONC})")
    print()
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
