#!/usr/bin/env python3
"""Relay throughput per destination kind, side by side in one run: webhook
(nginx answering 204), SQS with SendMessageBatch (10 per request), SQS with
one SendMessage per event, both against the local SQS emulator (npm
local-aws-sqs, requests signed with SigV4), and RabbitMQ (a private
rabbitmq-server node) through the management API publish endpoint and
through AMQP with publisher confirms (kind amqp, rabbitmq-c).

For each destination: N events are emitted up front while it is paused,
then it is resumed and the time until the last one is published gives
events/s.  BENCH_WORKERS relay workers (default 2).  A benchmark, not a test: the emulator and the
management API are the bottleneck as much as the relay is.

Environment: BENCH_BROKER_EVENTS (5000), BENCH_RABBIT_EVENTS (2000, the
management API), BENCH_AMQP_EVENTS (50000), BENCH_WORKERS (2), PG_BIN
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
from relay_bench import BIN, free_port, start_cluster, start_nginx  # noqa: E402


N = int(os.environ.get("BENCH_BROKER_EVENTS", "5000"))
N_RABBIT = int(os.environ.get("BENCH_RABBIT_EVENTS", "2000"))
N_AMQP = int(os.environ.get("BENCH_AMQP_EVENTS", "50000"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
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


def rabbit_api(url, method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def run_one(cur, dest, n):
    cur.execute("UPDATE outbox.destinations SET paused = true")
    cur.execute(f"SELECT count(outbox.emit('bench.event', (g %% 1000)::text, '{PAYLOAD}', destination => %s))"
                " FROM generate_series(1, %s) g", (dest, n))
    cur.execute("SELECT coalesce(sum(published), 0) FROM outbox.workers() WHERE database = 'postgres'")
    before = cur.fetchone()[0]
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
    cur.execute("SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status = 'pending')"
                " FROM outbox.events WHERE destination = %s", (dest,))
    dead, pending = cur.fetchone()
    print(f"  {dest}: {n} events in {elapsed:.1f} s (dead {dead}, pending {pending})", file=sys.stderr, flush=True)
    return n / elapsed


def main():
    tmp = tempfile.mkdtemp(prefix="outbox_broker_bench_")
    os.chmod(tmp, 0o777)
    nginx_port = start_nginx(tmp)
    sqs, sqs_port = start_sqs()
    rabbit, rabbit_env, rabbit_url, epmd, amqp_port = start_rabbit(tmp)
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
  ('amqp', 'amqp', 'amqp://127.0.0.1:{amqp_port}', 'rmq', 256, true, '{{"exchange": "bench"}}');
""")
        time.sleep(2)
        results["webhook"] = run_one(cur, "webhook", N)
        results["sqs_batch"] = run_one(cur, "sqs_batch", N)
        results["sqs_single"] = run_one(cur, "sqs_single", N)
        results["rabbitmq"] = run_one(cur, "rabbitmq", N_RABBIT)
        results["amqp"] = run_one(cur, "amqp", N_AMQP)
    finally:
        subprocess.run([f"{BIN}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], capture_output=True)
        subprocess.run(["nginx", "-c", os.path.join(tmp, "nginx.conf"), "-p", tmp, "-s", "stop"], capture_output=True)
        sqs.terminate()
        subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", rabbit_env["RABBITMQ_NODENAME"], "stop"],
                       env=rabbit_env, capture_output=True)
        rabbit.wait(timeout=60)
        subprocess.run(["epmd", "-port", str(epmd), "-kill"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"Relay throughput by destination kind — {WORKERS} relay worker(s), {N} events"
          f" ({N_RABBIT} for the management API, {N_AMQP} for AMQP) emitted up front")
    print()
    print("| destination | how | events/s |")
    print("|---|---|---|")
    print(f"| webhook | nginx 204, one POST per event | {results['webhook']:.0f} |")
    print(f"| SQS (local-aws-sqs) | SendMessageBatch, 10 per request, SigV4 | {results['sqs_batch']:.0f} |")
    print(f"| SQS (local-aws-sqs) | SendMessage, one per request, SigV4 | {results['sqs_single']:.0f} |")
    print(f"| RabbitMQ 3.10 | management API publish, one per request | {results['rabbitmq']:.0f} |")
    print(f"| RabbitMQ 3.10 | AMQP 0-9-1, publisher confirms, window 256 per worker | {results['amqp']:.0f} |")
    print()
    print(f"SQS batch / single: {results['sqs_batch'] / results['sqs_single']:.1f}x;"
          f" AMQP / management API: {results['amqp'] / results['rabbitmq']:.1f}x")


if __name__ == "__main__":
    main()
