#!/usr/bin/env python3
"""Store prototypes of issue #21 side by side, with and without a held snapshot.

Three stores in one database of one running cluster (so one held snapshot
pins the same xmin horizon for all of them):

  base  the current store: outbox.events of the installed extension,
        outbox.emit() to emit, outbox._lease()/_ack()/_retry() (the very
        statements of src/worker/store.c) to claim and acknowledge,
        outbox._expire_published() for retention
  A     design_a.sql: append-only log, per-destination snapshot position,
        batch rows inserted, failures copied to a retry table
  B     design_b.sql: PgQ-style ticks and queue-wide batches

Per store: one emitter committing RATE events/s (10 per transaction), two
relay loops that claim, "deliver" at once (no HTTP) and acknowledge, with
FAIL_PCT % of events failing to the retry path (retried 1 s later; 90 % of
retries succeed).  Relay 0 runs retention every second (retention 30 s)
and, for A, the expired-lease recovery.  B has a ticker process (20 ms).
After WARM s, one session runs BEGIN ISOLATION LEVEL REPEATABLE READ and a
SELECT, and holds it HOLD s; then the run goes on for AFTER s.

Printed per 10 s window and store: claim statement time (mean, p99, over
claims that returned rows, and over all claims), events claimed/s, commit
to claim lag p50/p99, backlog (emitted - acknowledged), table+index size,
server CPU of the two relay backends per 1,000 events.

Usage (the database must have outbox_pg installed, see README):
  /usr/bin/python3 store_proto.py "host=/var/tmp/store_proto port=55471 dbname=postgres user=postgres"
Environment: RATE (500), WARM (60), HOLD (120), AFTER (90), FAIL_PCT (1).
HOLD_READS_LOG=1: the held transaction reads the outbox tables first, as
pg_dump does, and so keeps ACCESS SHARE locks on them (no TRUNCATE then).
MODE=drain instead: DRAIN_EVENTS (20000) emitted up front per store, then two
relays drain them, stores one after the other, without and then with a
REPEATABLE READ snapshot held during the drain, DRAIN_ROUNDS (2) rounds.
"""
import multiprocessing as mp
import os
import random
import sys
import time

import psycopg2

DSN = sys.argv[1] if len(sys.argv) > 1 else "host=/var/tmp/store_proto port=55471 dbname=postgres user=postgres"
RATE = int(os.environ.get("RATE", "500"))
WARM = int(os.environ.get("WARM", "60"))
HOLD = int(os.environ.get("HOLD", "120"))
AFTER = int(os.environ.get("AFTER", "90"))
FAIL = float(os.environ.get("FAIL_PCT", "1")) / 100.0
DRAIN_IDLE = None
WINDOW = 10
TOTAL = WARM + HOLD + AFTER
HERE = os.path.dirname(os.path.abspath(__file__))
PAYLOAD = '{"amount": 1250, "currency": "EUR", "customer": "c-42", "note": "benchmark payment"}'
DESIGNS = ["base", "A", "B"]
SCHEMA = {"base": "outbox", "A": "a", "B": "b"}


def connect():
    c = psycopg2.connect(DSN)
    c.autocommit = False
    return c


def window(t0):
    return int((time.time() - t0) // WINDOW)


def cpu_seconds(pid):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def setup():
    c = connect()
    c.autocommit = True
    cur = c.cursor()
    cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_pg'")
    if cur.fetchone() is None:
        cur.execute("CREATE EXTENSION outbox_pg")
    cur.execute("DELETE FROM outbox.events")
    cur.execute("INSERT INTO outbox.destinations (name, url) VALUES ('d', 'http://127.0.0.1:9/')"
                " ON CONFLICT DO NOTHING")
    cur.execute("ALTER TABLE outbox.events SET (autovacuum_vacuum_scale_factor = 0.01,"
                " autovacuum_vacuum_threshold = 1000)")
    for f in ("design_a.sql", "design_b.sql"):
        cur.execute(open(os.path.join(HERE, f)).read())
    cur.execute("SELECT a.add_destination('d')")
    cur.execute("VACUUM ANALYZE outbox.events")
    c.close()


def emitter(design, t0, out):
    c = connect()
    cur = c.cursor()
    per_tx = 10
    interval = per_tx / RATE
    emitted = {}
    slot, slot_read = 0, 0.0
    nxt = time.time()
    while time.time() < t0 + TOTAL:
        if design != "base" and time.time() - slot_read > 1.0:
            cur.execute(f"SELECT slot FROM {SCHEMA[design]}.rotation")
            slot = cur.fetchone()[0]
            c.commit()
            slot_read = time.time()
        if design == "base":
            cur.execute("SELECT count(outbox.emit('bench.event', (random() * 1000)::int::text, %s::jsonb,"
                        " destination => 'd')) FROM generate_series(1, %s)", (PAYLOAD, per_tx))
        else:
            s = SCHEMA[design]
            # id: 48 bits of Unix ms then random, like emit()'s UUIDv7
            cur.execute(f"INSERT INTO {s}.log (slot, id, destination, type, aggregate_id, payload)"
                        " SELECT %s, encode(overlay(uuid_send(gen_random_uuid()) placing"
                        "   substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::int8) FROM 3)"
                        "   FROM 1 FOR 6), 'hex')::uuid, 'd', 'bench.event', (random() * 1000)::int::text,"
                        " %s::jsonb FROM generate_series(1, %s)", (slot, PAYLOAD, per_tx))
        c.commit()
        w = window(t0)
        emitted[w] = emitted.get(w, 0) + per_tx
        nxt += interval
        delay = nxt - time.time()
        if delay > 0:
            time.sleep(delay)
    out.put(("emit", design, emitted))


def ticker(t0, out):
    c = connect()
    cur = c.cursor()
    n = 0
    while time.time() < t0 + TOTAL:
        cur.execute("SELECT b.tick()")
        n += len(cur.fetchall())
        c.commit()
        time.sleep(0.02)
    out.put(("ticks", "B", n))


def relay(design, k, t0, out):
    c = connect()
    cur = c.cursor()
    cur.execute("SELECT pg_backend_pid()")
    pid = cur.fetchone()[0]
    c.commit()
    rec = {}                    # window -> dict of lists/counters
    last_ret = 0.0
    seen = set()
    dups = 0

    def W():
        w = window(t0)
        if w not in rec:
            rec[w] = {"claim_ms": [], "claim_ms_rows": [], "rows": 0, "lag": [], "acked": 0,
                      "retry_ms": [], "maint_ms": [], "recover_ms": [], "cpu0": cpu_seconds(pid)}
        return rec[w]

    first = last = None
    total_rows = 0
    idle_since = time.time()
    while time.time() < t0 + TOTAL:
        if DRAIN_IDLE is not None and time.time() - idle_since > DRAIN_IDLE:
            break
        r = W()
        # -- claim
        t1 = time.perf_counter()
        if design == "base":
            cur.execute("SELECT id, extract(epoch FROM clock_timestamp()) - age, leased_until, 0"
                        "  FROM outbox._lease(100, '30 s', 'd')")
        elif design == "A":
            cur.execute("SELECT id, extract(epoch FROM created_at), NULL, seq FROM a.claim('d', 100, '30 s')")
        else:
            cur.execute("SELECT id, extract(epoch FROM created_at), NULL, tick FROM b.claim('30 s')")
        rows = cur.fetchall()
        ms = (time.perf_counter() - t1) * 1000
        c.commit()
        now = time.time()
        r["claim_ms"].append(ms)
        if rows:
            last = time.time()
            first = first or t1
            idle_since = last
            total_rows += len(rows)
            for x in rows:
                if x[0] in seen:
                    dups += 1
                seen.add(x[0])
            r["claim_ms_rows"].append(ms)
            r["rows"] += len(rows)
            r["lag"].extend((now - float(x[1])) * 1000 for x in rows)
            failed = [x for x in rows if random.random() < FAIL]
            ok = [x for x in rows if x not in failed]
            if design == "base":
                if ok:
                    cur.execute("SELECT outbox._ack(%s::uuid[], %s::int4[])",
                                ([x[0] for x in ok], [204] * len(ok)))
                if failed:
                    cur.execute("SELECT outbox._retry(%s::uuid[], %s::timestamptz[], %s::int4[], %s::text[],"
                                " %s::timestamptz[])",
                                ([x[0] for x in failed],
                                 [time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(now + 1))] * len(failed),
                                 [503] * len(failed), ["bench"] * len(failed), [x[2] for x in failed]))
            elif design == "A":
                cur.execute("SELECT a.ack('d', %s, %s::uuid[], now() + '1 s')",
                            (rows[0][3], [x[0] for x in failed]))
            else:
                cur.execute("SELECT b.ack(%s, %s::uuid[], now() + '1 s')",
                            (rows[0][3], [x[0] for x in failed]))
            c.commit()
            r["acked"] += len(ok)
        # -- the retry path of A and B (base retries through its lease)
        if design != "base":
            s = SCHEMA[design]
            t1 = time.perf_counter()
            cur.execute(f"SELECT id FROM {s}.claim_retry('d', 100, '30 s')")
            rr = [x[0] for x in cur.fetchall()]
            r["retry_ms"].append((time.perf_counter() - t1) * 1000)
            c.commit()
            if rr:
                okr = [x for x in rr if random.random() < 0.9]
                bad = [x for x in rr if x not in okr]
                cur.execute(f"SELECT {s}.retry_done(%s::uuid[], %s::uuid[], now() + '1 s')", (okr, bad))
                c.commit()
                r["acked"] += len(okr)
        # -- maintenance on relay 0, once a second
        if k == 0 and time.time() - last_ret >= 1.0:
            last_ret = time.time()
            t1 = time.perf_counter()
            if design == "base":
                cur.execute("SELECT outbox._expire_published('30 s', 5000)")
            elif design == "A":
                cur.execute("SELECT a.retention('30 s')")
                res = cur.fetchall()
                if res[0][0] != "wait":
                    r.setdefault("ret", []).append(res[0][0])
                c.commit()
                r["maint_ms"].append((time.perf_counter() - t1) * 1000)
                t1 = time.perf_counter()
                cur.execute("SELECT a.recover('d', '30 s')")
            else:
                cur.execute("SELECT b.retention('30 s')")
            res = cur.fetchall()
            if design != "base" and res and isinstance(res[0][0], str) and res[0][0] != "wait":
                r.setdefault("ret", []).append(res[0][0])
            c.commit()
            r["recover_ms" if design == "A" else "maint_ms"].append((time.perf_counter() - t1) * 1000)
        if not rows:
            time.sleep(0.01)
    # close the last window's CPU
    W()["cpu0"] = cpu_seconds(pid)
    for w in rec:
        rec[w]["cpu1"] = rec.get(w + 1, {}).get("cpu0", cpu_seconds(pid))
    out.put(("relay", design, rec))
    out.put(("ids", design, (seen, dups)))
    if DRAIN_IDLE is not None:
        out.put(("drain", design, (last, total_rows)))


def holder(t0, out):
    c = connect()
    cur = c.cursor()
    time.sleep(max(0, t0 + WARM - time.time()))
    cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    if os.environ.get("HOLD_READS_LOG"):
        # like pg_dump: the snapshot's transaction has read the outbox tables
        # and keeps their ACCESS SHARE locks to the end
        cur.execute("SELECT (SELECT count(*) FROM outbox.events) + (SELECT count(*) FROM a.log)"
                    " + (SELECT count(*) FROM b.log)")
    else:
        cur.execute("SELECT count(*) FROM pg_class")   # the snapshot is taken now
    cur.fetchall()
    time.sleep(max(0, t0 + WARM + HOLD - time.time()))
    c.rollback()
    out.put(("hold", None, None))


def sampler(t0, out):
    c = connect()
    c.autocommit = True
    cur = c.cursor()
    cur.execute("SET lock_timeout = '200ms'")     # never wait behind a TRUNCATE
    sizes = {}
    while time.time() < t0 + TOTAL:
        time.sleep(max(0, t0 + (window(t0) + 1) * WINDOW - 0.05 - time.time()))
        w = window(t0)
        row = {}
        row["load"] = float(open("/proc/loadavg").read().split()[0])
        for d in DESIGNS:
          try:
            cur.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)"
                        "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                        " WHERE n.nspname = %s AND c.relkind = 'r'"
                        "   AND (%s <> 'outbox' OR c.relname = 'events')", (SCHEMA[d], SCHEMA[d]))
            row[d] = int(cur.fetchone()[0])
          except psycopg2.errors.LockNotAvailable:
            row[d] = None
        cur.execute("SELECT n_dead_tup, autovacuum_count FROM pg_stat_user_tables"
                    " WHERE relid = 'outbox.events'::regclass")
        row["base_dead"] = cur.fetchone()
        sizes[w] = row
        time.sleep(0.1)
    out.put(("size", None, sizes))


def drain(design, n, held):
    """n events emitted up front (for B with the ticker running), then two
    relays of that store alone until both have been idle for 1 s; events/s
    from the relays' start to the last claim that returned rows."""
    global FAIL
    FAIL = 0.0
    setup()
    out = mp.Queue()
    t0 = time.time()
    tk = None
    if design == "B":
        tk = mp.Process(target=ticker, args=(t0, out))
        tk.start()
    c = connect()
    cur = c.cursor()
    per_tx = 100
    for i in range(n // per_tx):
        if design == "base":
            cur.execute("SELECT count(outbox.emit('bench.event', (random() * 1000)::int::text, %s::jsonb,"
                        " destination => 'd')) FROM generate_series(1, %s)", (PAYLOAD, per_tx))
        else:
            s = SCHEMA[design]
            cur.execute(f"INSERT INTO {s}.log (slot, id, destination, type, aggregate_id, payload)"
                        " SELECT 0, gen_random_uuid(), 'd', 'bench.event', (random() * 1000)::int::text,"
                        " %s::jsonb FROM generate_series(1, %s)", (PAYLOAD, per_tx))
        c.commit()
        if design == "B":
            time.sleep(0.02)       # one tick per emitting transaction: batches of 100
    c.close()
    if design == "base":
        # the lease takes due rows: emitted up front, all are due
        pass
    time.sleep(0.5)
    hold = None
    if held:
        hold = connect()
        hc = hold.cursor()
        hc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        hc.execute("SELECT count(*) FROM pg_class")
        hc.fetchall()
    t1 = time.time()
    relays = [mp.Process(target=relay, args=(design, k, t1, out)) for k in range(2)]
    for p in relays:
        p.start()
    got = []
    for _ in range(2 * 3):
        got.append(out.get())
    for p in relays:
        p.join()
    if hold:
        hold.rollback()
        hold.close()
    if tk:
        tk.terminate()
        tk.join()
    lasts = [g[2][0] for g in got if g[0] == "drain" and g[2][0]]
    rows = sum(g[2][1] for g in got if g[0] == "drain")
    return rows, rows / (max(lasts) - t1)


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    if os.environ.get("MODE") == "drain":
        global DRAIN_IDLE
        DRAIN_IDLE = 1.0
        n = int(os.environ.get("DRAIN_EVENTS", "20000"))
        print(f"drain of {n} events emitted up front, 2 relays, batch 100, without and with a snapshot held during the drain")
        for rnd in range(int(os.environ.get("DRAIN_ROUNDS", "2"))):
            for held in (False, True):
                for d in DESIGNS:
                    rows, rate = drain(d, n, held)
                    print(f"round {rnd + 1} {d} {'snapshot held' if held else 'no snapshot'}:"
                          f" {rows} events claimed, {rate:.0f} ev/s", flush=True)
        return
    setup()
    out = mp.Queue()
    t0 = time.time() + 1.0
    procs = [mp.Process(target=holder, args=(t0, out)), mp.Process(target=sampler, args=(t0, out)),
             mp.Process(target=ticker, args=(t0, out))]
    for d in DESIGNS:
        procs.append(mp.Process(target=emitter, args=(d, t0, out)))
        for k in range(2):
            procs.append(mp.Process(target=relay, args=(d, k, t0, out)))
    for p in procs:
        p.start()
    results = [out.get() for _ in range(len(procs) + 2 * len(DESIGNS))]
    for p in procs:
        p.join()
    emitted = {d: {} for d in DESIGNS}
    relays = {d: [] for d in DESIGNS}
    sizes = {}
    ticks = 0
    ids = {d: [set(), 0, 0] for d in DESIGNS}
    for kind, d, data in results:
        if kind == "ids":
            ids[d][2] += len(ids[d][0] & data[0]) + data[1]
            ids[d][0] |= data[0]
            ids[d][1] += data[1]
            continue
        if kind == "emit":
            emitted[d] = data
        elif kind == "relay":
            relays[d].append(data)
        elif kind == "size":
            sizes = data
        elif kind == "ticks":
            ticks = data
    nwin = TOTAL // WINDOW
    print(f"rate {RATE} ev/s per store, fail {FAIL * 100:.1f} %, snapshot held from {WARM} s to {WARM + HOLD} s,"
          f" B ticks {ticks}")
    print("| t (s) | snap | store | claims/s | claim ms mean | p99 | claim ms (with rows) mean | p99 |"
          " claimed ev/s | lag p50 ms | p99 ms | backlog | size MB | relay CPU ms/1k ev | retention ms max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cum_emit = {d: 0 for d in DESIGNS}
    cum_ack = {d: 0 for d in DESIGNS}
    for w in range(nwin):
        for d in DESIGNS:
            cum_emit[d] += emitted[d].get(w, 0)
            cm, cmr, lag, maint = [], [], [], []
            rows = acked = 0
            cpu = 0.0
            for rec in relays[d]:
                r = rec.get(w)
                if not r:
                    continue
                cm += r["claim_ms"]
                cmr += r["claim_ms_rows"]
                lag += r["lag"]
                maint += r["maint_ms"]
                rows += r["rows"]
                acked += r["acked"]
                cpu += r["cpu1"] - r["cpu0"]
            cum_ack[d] += acked
            snap = "held" if WARM <= w * WINDOW < WARM + HOLD else "-"
            mean = sum(cm) / len(cm) if cm else float("nan")
            meanr = sum(cmr) / len(cmr) if cmr else float("nan")
            size = (sizes.get(w, {}).get(d) or float("nan")) / 1048576
            cpk = cpu * 1000 / rows * 1000 if rows else float("nan")
            print(f"| {w * WINDOW}-{(w + 1) * WINDOW} | {snap} | {d} | {len(cm) / WINDOW:.0f} | {mean:.2f} |"
                  f" {pct(cm, 99):.2f} | {meanr:.2f} | {pct(cmr, 99):.2f} | {rows / WINDOW:.0f} |"
                  f" {pct(lag, 50):.0f} | {pct(lag, 99):.0f} | {cum_emit[d] - cum_ack[d]} | {size:.1f} |"
                  f" {cpk:.0f} | {max(maint) if maint else 0:.1f} |")
    print()
    print("| t (s) | snap | store | retry-table claim ms mean | p99 | retention ms max | recovery ms max |")
    print("|---|---|---|---|---|---|---|")
    for w in range(nwin):
        for d in ("A", "B"):
            rm, mm, vm = [], [], []
            for rec in relays[d]:
                r = rec.get(w, {})
                rm += r.get("retry_ms", [])
                mm += r.get("maint_ms", [])
                vm += r.get("recover_ms", [])
            snap = "held" if WARM <= w * WINDOW < WARM + HOLD else "-"
            print(f"| {w * WINDOW}-{(w + 1) * WINDOW} | {snap} | {d} | {sum(rm) / len(rm) if rm else float('nan'):.2f} |"
                  f" {pct(rm, 99):.2f} | {max(mm) if mm else 0:.1f} | {max(vm) if vm else 0:.1f} |")
    for d in DESIGNS:
        print(f"{d}: emitted {sum(emitted[d].values())}, distinct events claimed (first attempts and"
              f" lease re-sends) {len(ids[d][0])}, claimed twice {ids[d][2]}")
    for d in ("A", "B"):
        print(f"{d} retention results:", [(w * WINDOW, x) for w in range(nwin) for rec in relays[d]
                                            for x in rec.get(w, {}).get("ret", [])])
    print("load average per window:", [sizes.get(w, {}).get("load") for w in range(nwin)])
    print("base n_dead_tup per window:", [sizes.get(w, {}).get("base_dead") for w in range(nwin)])


if __name__ == "__main__":
    main()
