#!/usr/bin/env python3
"""Relay throughput per destination kind, side by side in one run: webhook
(nginx answering 204), SQS with SendMessageBatch (10 per request), SQS with
one SendMessage per event, both against the local SQS emulator (npm
local-aws-sqs, requests signed with SigV4), and RabbitMQ (a private
rabbitmq-server node) through the management API publish endpoint and
through AMQP with publisher confirms (kind amqp, rabbitmq-c), and Kafka
(kind kafka, librdkafka) to librdkafka's mock cluster
(test/sink/kafka_mock.c, built here), beside the database's own drain
limit measured in the same run: the same number of events claimed and
acknowledged by a procedure through the relay's store functions, no
network (as test/bench/run relay measures it).  The relay workers' private
memory (RssAnon, the largest of them) is read before and after each row:
with BENCH_AMQP_EVENTS / BENCH_KAFKA_EVENTS at 200000 it shows whether it
stays flat.

For each destination: N events are emitted up front while it is paused,
then it is resumed and the time until the last one is published gives
events/s.  BENCH_WORKERS relay workers (default 2).  A benchmark, not a test: the emulator and the
management API are the bottleneck as much as the relay is.

Environment: BENCH_BROKER_EVENTS (5000), BENCH_RABBIT_EVENTS (2000, the
management API), BENCH_AMQP_EVENTS (50000), BENCH_KAFKA_EVENTS (50000, also
the drain limit's), BENCH_TXN_EVENTS (100: events per emitting
transaction; a claim takes whole transactions), BENCH_WORKERS (2),
BENCH_AMQP_WINDOW (256: the AMQP destination's max_concurrency, its window
of unconfirmed publishes), BENCH_KAFKA_OPTIONS (the Kafka destination's
options, default {"topic": "bench"}), BENCH_KINDS (which rows, comma-separated, of
webhook, sqs_batch, sqs_single, rabbitmq, amqp, kafka; default all), PG_BIN
(the PostgreSQL bin directory, default Debian's).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import base64

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relay_bench import BIN, cpu_seconds, free_port, machine_jiffies, rss_kb, start_cluster, start_nginx  # noqa: E402
from relay_bench import sql_drain as relay_sql_drain  # noqa: E402


N = int(os.environ.get("BENCH_BROKER_EVENTS", "5000"))
N_RABBIT = int(os.environ.get("BENCH_RABBIT_EVENTS", "2000"))
N_AMQP = int(os.environ.get("BENCH_AMQP_EVENTS", "50000"))
N_KAFKA = int(os.environ.get("BENCH_KAFKA_EVENTS", "50000"))
TXN = int(os.environ.get("BENCH_TXN_EVENTS", "100"))
HERE = os.path.dirname(os.path.abspath(__file__))
KAFKA_MOCK = next(p for p in (os.path.join(HERE, "kafka_mock.c"), os.path.join(HERE, "..", "sink", "kafka_mock.c"))
                  if os.path.exists(p))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
AMQP_REFERENCE = os.path.join(HERE, "amqp_reference.c")  # beside this script, in the repo or /tmp
AMQP_WINDOW = int(os.environ.get("BENCH_AMQP_WINDOW", "256"))
KAFKA_OPTIONS = os.environ.get("BENCH_KAFKA_OPTIONS", '{"topic": "bench"}')
CPU_PER_EVENT = {}  # row: CPU microseconds per event (see run_one, sql_drain)
BROKER_PIDS = {}  # row: the pid of the broker process this bench started for it
ALL_KINDS = ("webhook", "sqs_batch", "sqs_single", "rabbitmq", "amqp", "kafka")
KINDS = [k for k in os.environ.get("BENCH_KINDS", ",".join(ALL_KINDS)).split(",") if k]
NODE_PREFIX = "/opt/outbox_pg-test/node"
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'


def wait_port(port, seconds=60):
    import socket
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("port %d did not open" % port)


def start_sqs():
    port = free_port()
    script = """
const { createSqsServer } = require('local-aws-sqs');
createSqsServer({ port: %d, hostname: '127.0.0.1', baseUrl: '/', emulateQueueCreationLifecycle: false,
                  queues: [{ QueueName: 'bench-batch' }, { QueueName: 'bench-single' }] });
""" % port
    env = dict(os.environ, NODE_PATH=NODE_PREFIX + "/node_modules")
    proc = subprocess.Popen(["node", "-e", script], env=env)
    wait_port(port)
    return proc, port


def start_rabbit(tmp):
    base = os.path.join(tmp, "rabbit")
    for d in ("home", "mnesia", "log"):
        os.makedirs(os.path.join(base, d))
    amqp, mgmt, dist, epmd = free_port(), free_port(), free_port(), free_port()
    with open(os.path.join(base, "rabbitmq.conf"), "w") as f:
        f.write("listeners.tcp.1 = 127.0.0.1:%d\nmanagement.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %d\n" % (amqp, mgmt))
    with open(os.path.join(base, "enabled_plugins"), "w") as f:
        f.write("[rabbitmq_management].\n")
    cookie = os.path.join(base, "home", ".erlang.cookie")
    with open(cookie, "w") as f:
        f.write("OUTBOXPGBENCH%d\n" % os.getpid())
    os.chmod(cookie, 0o400)
    env = dict(os.environ, HOME=os.path.join(base, "home"), RABBITMQ_NODENAME="outboxbench%d@localhost" % mgmt,
               RABBITMQ_CONFIG_FILE=os.path.join(base, "rabbitmq"),
               RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(base, "enabled_plugins"),
               RABBITMQ_MNESIA_BASE=os.path.join(base, "mnesia"), RABBITMQ_LOG_BASE=os.path.join(base, "log"),
               RABBITMQ_DIST_PORT=str(dist), ERL_EPMD_ADDRESS="127.0.0.1", ERL_EPMD_PORT=str(epmd),
               RABBITMQ_CONF_ENV_FILE=os.path.join(base, "none.env"))
    proc = subprocess.Popen(["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env,
                            stdout=open(os.path.join(base, "log", "stdout.log"), "w"), stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % mgmt
    deadline = time.time() + 90
    while True:
        try:
            rabbit_api(url, "GET", "/api/overview")
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.3)
    rabbit_api(url, "PUT", "/api/exchanges/%2F/bench", {"type": "direct", "durable": True})
    rabbit_api(url, "PUT", "/api/queues/%2F/bench", {"durable": True})
    rabbit_api(url, "POST", "/api/bindings/%2F/e/bench/q/bench", {"routing_key": "bench.event"})
    return proc, env, url, epmd, amqp


def purge_queue(url):
    """Empty the queue bench: a classic queue that holds many messages
    takes new ones more slowly (60,000 persistent messages with confirms,
    nothing consuming: 13,331/s into an empty queue, 5,021/s into one
    already holding 360,000), so every RabbitMQ row starts from empty, and
    a consumer reads it meanwhile."""
    rabbit_api(url, "DELETE", "/api/queues/%2F/bench/contents")


def rabbit_api(url, method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def start_kafka(tmp):
    """librdkafka's mock cluster with the topic bench (3 partitions); returns
    (process, bootstrap address)."""
    binary = os.path.join(tmp, "kafka_mock")
    subprocess.run(["cc", "-O2", "-o", binary, KAFKA_MOCK, "-lrdkafka"], check=True)
    state, fifo = os.path.join(tmp, "kafka_state"), os.path.join(tmp, "kafka_commands")
    os.mkfifo(fifo)
    proc = subprocess.Popen([binary, state, fifo, "bench"])
    for _ in range(300):
        if os.path.exists(state) and os.path.getsize(state) > 0:
            with open(state) as f:
                return proc, f.readline().strip()
        time.sleep(0.05)
    raise RuntimeError("kafka_mock did not start")


def build_amqp_reference(tmp):
    binary = os.path.join(tmp, "amqp_reference")
    subprocess.run(["cc", "-O2", "-o", binary, AMQP_REFERENCE, "-lrabbitmq"], check=True)
    return binary


def amqp_reference(binary, amqp_port, n):
    """The broker's own limit with the relay's message shape: a plain
    rabbitmq-c publisher (test/bench/amqp_reference.c) with confirms, one
    connection per relay worker, each with its share of the window;
    messages/s."""
    out = subprocess.run([binary, "127.0.0.1", str(amqp_port), "bench", "bench.event", PAYLOAD, str(n),
                          str(max(1, AMQP_WINDOW // WORKERS)), str(WORKERS)],
                         check=True, capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip())


def relay_rss(cur):
    cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
    return max((rss_kb(p) or 0) for p in cur.fetchone()[0] or [0])


def machine_busy_seconds():
    """CPU seconds the whole machine spent busy since boot, all cores."""
    return machine_jiffies()[0] / os.sysconf("SC_CLK_TCK")


def sql_drain(cur, n):
    """The database's own drain limit: n events of the paused destination
    'drain' claimed and acknowledged by a procedure (relay_bench.py's (d)),
    with the relay's session settings; events/s."""
    cur.execute("UPDATE outbox.destinations SET paused = true")
    for first in range(0, n, TXN):
        cur.execute(f"SELECT count(outbox.emit('bench.event', (g %% 1000)::text, '{PAYLOAD}', destination => 'drain'))"
                    " FROM generate_series(1, %s) g", (min(TXN, n - first),))
    cur.execute("SELECT pg_backend_pid()")
    backend = cur.fetchone()[0]
    cpu0 = (machine_busy_seconds(), cpu_seconds(backend))
    rate = relay_sql_drain(cur, "drain")
    cpu1 = (machine_busy_seconds(), cpu_seconds(backend))
    CPU_PER_EVENT["sql_drain"] = [1e6 * (b - a) / n for a, b in zip(cpu0, cpu1)]
    return rate


def run_one(cur, dest, n):
    cur.execute("UPDATE outbox.destinations SET paused = true")
    for first in range(0, n, TXN):
        cur.execute(f"SELECT count(outbox.emit('bench.event', (g %% 1000)::text, '{PAYLOAD}', destination => %s))"
                    " FROM generate_series(1, %s) g", (dest, min(TXN, n - first)))
    cur.execute("SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'")
    before = cur.fetchone()[0]
    cur.execute("SELECT array_agg(pid) FROM outbox.workers() WHERE database = 'postgres' AND pid IS NOT NULL")
    relays = cur.fetchone()[0] or []
    pids = relays + ([BROKER_PIDS[dest]] if dest in BROKER_PIDS else [])
    cpu0 = [machine_busy_seconds()] + [cpu_seconds(p) or 0 for p in pids]
    t0 = time.time()
    cur.execute("UPDATE outbox.destinations SET paused = false WHERE name = %s", (dest,))
    cur.execute("SELECT outbox.emit('bench.kick', 'k', '{}', destination => %s)", (dest,))
    deadline = t0 + 600
    while time.time() < deadline:
        cur.execute("SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'")
        # the kick event itself may be unroutable (RabbitMQ): count only the n
        if cur.fetchone()[0] - before >= n:
            break
        time.sleep(0.02)
    elapsed = time.time() - t0
    cpu1 = [machine_busy_seconds()] + [cpu_seconds(p) or 0 for p in pids]
    used = [b - a for a, b in zip(cpu0, cpu1)]
    # machine, the relays (every thread: librdkafka's too), the broker if it is ours
    CPU_PER_EVENT[dest] = [1e6 * used[0] / n, 1e6 * sum(used[1:1 + len(relays)]) / n] + \
        ([1e6 * used[-1] / n] if dest in BROKER_PIDS else [])
    cur.execute("SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status = 'pending')"
                " FROM outbox.events WHERE destination = %s", (dest,))
    dead, pending = cur.fetchone()
    print(f"  {dest}: {n} events in {elapsed:.1f} s (dead {dead}, pending {pending})", file=sys.stderr, flush=True)
    return n / elapsed


def run_row(cur, results, dest, n):
    """run_one, with the relay's memory before and after."""
    before = relay_rss(cur)
    results[dest] = run_one(cur, dest, n)
    results[dest + "_rss"] = (before, relay_rss(cur))


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_broker_bench_")
    os.chmod(tmp, 0o777)
    nginx_port = start_nginx(tmp)
    sqs, sqs_port = start_sqs()
    rabbit, rabbit_env, rabbit_url, epmd, amqp_port = start_rabbit(tmp)
    kafka, bootstrap = start_kafka(tmp)
    BROKER_PIDS["kafka"] = kafka.pid
    # an application reading the queue, as in production (see purge_queue)
    amqp_binary = build_amqp_reference(tmp)
    consumer = subprocess.Popen([amqp_binary, "consume", "127.0.0.1", str(amqp_port), "bench"])
    data, dsn = start_cluster(tmp, WORKERS, poll_interval="1s")
    results = {}
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        q = f"http://127.0.0.1:{sqs_port}/123456789012"
        cur.execute(f"""
CREATE EXTENSION outbox_pg;
INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key, username, password)
VALUES ('aws', 'AKIDBENCH', 'benchsecret', NULL, NULL), ('rmq', NULL, NULL, 'guest', 'guest');
INSERT INTO outbox.destinations (name, kind, url, credentials, max_concurrency, paused, options) VALUES
  ('webhook', 'webhook', 'http://127.0.0.1:{nginx_port}/hook', NULL, 256, true, '{{}}'),
  ('sqs_batch', 'sqs', 'http://127.0.0.1:{sqs_port}/', 'aws', 200, true,
   '{{"queue_url": "{q}/bench-batch", "region": "us-east-1"}}'),
  ('sqs_single', 'sqs', 'http://127.0.0.1:{sqs_port}/', 'aws', 64, true,
   '{{"queue_url": "{q}/bench-single", "region": "us-east-1", "batch_size": 1}}'),
  ('rabbitmq', 'rabbitmq', '{rabbit_url}', 'rmq', 32, true, '{{"exchange": "bench"}}'),
  ('amqp', 'amqp', 'amqp://127.0.0.1:{amqp_port}', 'rmq', {AMQP_WINDOW}, true, '{{"exchange": "bench"}}'),
  ('kafka', 'kafka', 'kafka://{bootstrap}', NULL, 1000, true, '{KAFKA_OPTIONS}'),
  ('drain', 'webhook', 'http://127.0.0.1:{nginx_port}/drain', NULL, 16, true, '{{}}');
""")
        time.sleep(2)
        results["rss_start"] = relay_rss(cur)
        for dest, n in (("webhook", N), ("sqs_batch", N), ("sqs_single", N), ("rabbitmq", N_RABBIT),
                        ("amqp", N_AMQP), ("kafka", N_KAFKA)):
            if dest in KINDS:
                if dest in ("rabbitmq", "amqp"):
                    purge_queue(rabbit_url)
                run_row(cur, results, dest, n)
        if "amqp" in KINDS:
            purge_queue(rabbit_url)
            results["amqp_reference"] = amqp_reference(amqp_binary, amqp_port, N_AMQP)
        results["sql_drain"] = sql_drain(cur, N_KAFKA)
    finally:
        subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        sqs.terminate()
        kafka.kill()
        consumer.kill()
        subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", rabbit_env["RABBITMQ_NODENAME"], "stop"],
                       env=rabbit_env, capture_output=True)
        rabbit.wait(timeout=60)
        subprocess.run(["epmd", "-port", str(epmd), "-kill"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    r = results
    print(f"Relay throughput by destination kind — {WORKERS} relay worker(s), {N} events"
          f" ({N_RABBIT} for the management API, {N_AMQP} for AMQP, {N_KAFKA} for Kafka) emitted up front,"
          f" {TXN} per transaction")
    print()
    print("| destination | how | events | events/s | relay RssAnon before / after (kB) |")
    print("|---|---|---|---|---|")
    for dest, what, n in (("webhook", "nginx 204, one POST per event", N),
                          ("sqs_batch", "SQS (local-aws-sqs), SendMessageBatch, 10 per request, SigV4", N),
                          ("sqs_single", "SQS (local-aws-sqs), SendMessage, one per request, SigV4", N),
                          ("rabbitmq", "RabbitMQ, management API publish, one per request", N_RABBIT),
                          ("amqp", f"RabbitMQ, AMQP 0-9-1 with publisher confirms, window {AMQP_WINDOW}", N_AMQP),
                          ("kafka", "Kafka mock cluster, acks=all, idempotent, max_concurrency 1000", N_KAFKA)):
        if dest not in r:
            continue
        print(f"| {dest} | {what} | {n} | {r[dest]:.0f} | {r[dest + '_rss'][0]} / {r[dest + '_rss'][1]} |")
    print()
    print(f"relay RssAnon at the start: {r['rss_start']} kB")
    print(f"the database's own drain limit, same run (claim + acknowledge by a procedure, no network): "
          f"{r['sql_drain']:.0f} events/s"
          + "".join(f"; {what} reached {r[k] / r['sql_drain']:.2f}x of it"
                    for k, what in (("kafka", "Kafka"), ("amqp", "AMQP")) if k in r))
    if "kafka" in CPU_PER_EVENT and "sql_drain" in CPU_PER_EVENT:
        m, rel, brk = CPU_PER_EVENT["kafka"]
        dm, db = CPU_PER_EVENT["sql_drain"]
        cores = os.cpu_count()
        print(f"CPU per event, Kafka row: {m:.1f} us of the machine ({cores} cores), of which the relays {rel:.1f}"
              f" (librdkafka's threads included) and the mock cluster {brk:.1f}; the drain: {dm:.1f} us of the"
              f" machine, its backend {db:.1f}. At {m:.1f} us an event these {cores} cores deliver at most"
              f" {cores * 1e6 / m:.0f} events/s to Kafka ({cores * 1e6 / m / r['sql_drain']:.2f}x of the drain limit)")
    if "sqs_batch" in r and "sqs_single" in r:
        print(f"SQS batch / single: {r['sqs_batch'] / r['sqs_single']:.1f}x")
    if "amqp_reference" in r:
        print(f"AMQP, the broker's own limit in the same run (test/bench/amqp_reference.c: rabbitmq-c, no database,"
              f" the relay's message shape, {WORKERS} connections, window {AMQP_WINDOW} over them): "
              f"{r['amqp_reference']:.0f} messages/s; the relay reached {r['amqp'] / r['amqp_reference']:.2f}x of it")
    if "amqp" in r and "rabbitmq" in r:
        print(f"AMQP / management API: {r['amqp'] / r['rabbitmq']:.1f}x")


if __name__ == "__main__":
    main()
