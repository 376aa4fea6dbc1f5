#!/usr/bin/env python3
"""The reference: an application-side outbox relay as the typical NestJS
article writes it, transcribed to Python.

Every 2 seconds (or at once after a full batch) it opens a transaction,
selects up to 100 unpublished rows FOR UPDATE SKIP LOCKED, POSTs them to
the broker one by one (keep-alive connection, as axios would), marks them
published, and commits.  Used only by relay_bench.py for comparison.

usage: app_poller.py DSN URL STOP_AFTER_N
"""
import http.client
import json
import sys
import time
import urllib.parse

import psycopg2


def main():
    dsn, url, stop_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    u = urllib.parse.urlparse(url)
    conn = psycopg2.connect(dsn)
    broker = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    done = 0
    while done < stop_after:
        with conn:
            with conn.cursor() as cur:
                cur.execute("""SELECT id, type, payload::text FROM app_outbox
                                WHERE published_at IS NULL
                                ORDER BY created_at LIMIT 100 FOR UPDATE SKIP LOCKED""")
                rows = cur.fetchall()
                sent = []
                for mid, etype, payload in rows:
                    broker.request("POST", u.path, body=payload,
                                 headers={"Content-Type": "application/json", "ce-id": str(mid),
                                          "ce-type": etype, "ce-specversion": "1.0", "ce-source": "app"})
                    resp = broker.getresponse()
                    resp.read()
                    if 200 <= resp.status < 300:
                        sent.append(mid)
                if sent:
                    cur.execute("UPDATE app_outbox SET published_at = now() WHERE id = ANY(%s::uuid[])",
                                ([str(s) for s in sent],))
        done += len(sent) if rows else 0
        if len(rows) < 100:
            time.sleep(2)


if __name__ == "__main__":
    main()
