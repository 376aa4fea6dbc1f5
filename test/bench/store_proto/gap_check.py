#!/usr/bin/env python3
"""Gap-safety check of the prototypes A and B (not a benchmark).

Four writers insert events into a.log and b.log in the same transaction,
sleep 0-50 ms before committing (so transactions commit out of xid order)
and roll back one transaction in ten; one more writer keeps a transaction
open for LONG seconds after inserting (its xid stays in every position's
xip meanwhile).  Two claimers per store claim and acknowledge until the end.
Then every committed event must have been claimed exactly once, and no
rolled-back event at all.

Usage: /usr/bin/python3 gap_check.py [dsn]; environment SECONDS_ (20), LONG (8).
"""
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import store_proto as sp  # noqa: E402

RUN = int(os.environ.get("SECONDS_", "20"))
LONG = int(os.environ.get("LONG", "8"))
INS = ("INSERT INTO {s}.log (slot, id, destination, type, payload)"
       " SELECT 0, gen_random_uuid(), 'd', 'gap', '{{}}' FROM generate_series(1, %s) RETURNING id")


def writer(k, t_end, out):
    c = sp.connect()
    cur = c.cursor()
    committed, aborted = [], []
    while time.time() < t_end:
        n = random.randint(1, 5)
        ids = []
        for s in ("a", "b"):
            cur.execute(INS.format(s=s), (n,))
            ids += [r[0] for r in cur.fetchall()]
        time.sleep(random.random() * 0.05)
        if random.random() < 0.1:
            c.rollback()
            aborted += ids
        else:
            c.commit()
            committed += ids
    out.put(("w", committed, aborted))


def long_writer(t_end, out):
    c = sp.connect()
    cur = c.cursor()
    ids = []
    for s in ("a", "b"):
        cur.execute(INS.format(s=s), (3,))
        ids += [r[0] for r in cur.fetchall()]
    time.sleep(LONG)
    c.commit()
    out.put(("w", ids, []))


def claimer(design, k, t_end, out):
    c = sp.connect()
    cur = c.cursor()
    got = []
    while time.time() < t_end:
        if design == "A":
            cur.execute("SELECT id, seq FROM a.claim('d', 50, '30 s')")
        else:
            if k == 0:                      # one ticker, as in the design
                cur.execute("SELECT b.tick()")
                c.commit()
            cur.execute("SELECT id, tick FROM b.claim('30 s')")
        rows = cur.fetchall()
        c.commit()
        if rows:
            got += [r[0] for r in rows]
            if design == "A":
                cur.execute("SELECT a.ack('d', %s, '{}'::uuid[], now())", (rows[0][1],))
            else:
                cur.execute("SELECT b.ack(%s, '{}'::uuid[], now())", (rows[0][1],))
            c.commit()
        else:
            time.sleep(0.005)
    out.put(("c", design, got))


def main():
    sp.setup()
    out = mp.Queue()
    t0 = time.time()
    procs = [mp.Process(target=writer, args=(k, t0 + RUN, out)) for k in range(4)]
    procs.append(mp.Process(target=long_writer, args=(t0 + RUN, out)))
    # claimers run on for 3 s after the writers stop, to drain
    procs += [mp.Process(target=claimer, args=(d, k, t0 + RUN + 3, out)) for d in ("A", "B") for k in range(2)]
    for p in procs:
        p.start()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    committed = set()
    aborted = set()
    claimed = {"A": [], "B": []}
    for r in res:
        if r[0] == "w":
            committed |= set(r[1])
            aborted |= set(r[2])
        else:
            claimed[r[1]] += r[2]
    ok = True
    for d, s in (("A", "a"), ("B", "b")):
        c = sp.connect()
        cur = c.cursor()
        cur.execute(f"SELECT id::text FROM {s}.log")
        mine = {r[0] for r in cur.fetchall()}
        c.close()
        want = {i for i in committed if i in mine}
        got = claimed[d]
        missing = want - set(got)
        dup = len(got) - len(set(got))
        bad = set(got) & aborted
        print(f"{d}: committed {len(want)}, claimed {len(got)}, missing {len(missing)},"
              f" claimed twice {dup}, rolled back but claimed {len(bad)}")
        ok = ok and not missing and not dup and not bad and len(want) > 0
    print("gap check:", "passed" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
