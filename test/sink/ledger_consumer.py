#!/usr/bin/python3
"""The consumer side of the outbox -> broker -> inbox loop, as an
application would write it (used by test/t/053_end_to_end.pl and shown in
the README).

For each message from the RabbitMQ queue, in ONE database transaction:
    SELECT inbox.claim(message_id, 'ledger')   -- true the first time only
    INSERT INTO ledger ...                      -- the business write, if claimed
then COMMIT, and only after the commit acknowledge the message to the
broker.  A crash before the commit rolls the claim back with the write, so
the redelivered message is applied then; a crash after the commit but
before the ack redelivers a message whose claim is already there, so it is
acknowledged without being applied again.  The ledger therefore gets each
payment exactly once although the broker delivers at least once.

Every outcome is appended to --log ("applied <id>" or "duplicate <id>").
Connections to the broker and the database are re-made after any error
(broker restarts, database crash restarts); unacknowledged messages are
redelivered by the broker.  --crash-after-commit N exits abruptly right
after the Nth commit, before its ack, to exercise that path.
"""
import argparse
import json
import os
import sys
import time

import pika
import psycopg2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--amqp-port", type=int, required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--crash-after-commit", type=int, default=0)
    args = p.parse_args()
    commits = 0

    while True:
        conn = None
        amqp = None
        try:
            conn = psycopg2.connect(args.dsn)
            amqp = pika.BlockingConnection(pika.ConnectionParameters(
                host="127.0.0.1", port=args.amqp_port, heartbeat=10,
                connection_attempts=1, blocked_connection_timeout=10))
            channel = amqp.channel()
            channel.basic_qos(prefetch_count=20)
            for method, props, body in channel.consume(args.queue, auto_ack=False, inactivity_timeout=1):
                if method is None:
                    continue
                message_id = props.message_id
                payment = json.loads(body)
                with conn:                      # one transaction: claim + business write
                    with conn.cursor() as cur:
                        cur.execute("SELECT inbox.claim(%s, 'ledger')", (message_id,))
                        claimed = cur.fetchone()[0]
                        if claimed:
                            cur.execute("INSERT INTO ledger (payment_no, amount, message_id) VALUES (%s, %s, %s)",
                                        (payment["payment_no"], payment["amount"], message_id))
                commits += 1
                with open(args.log, "a") as f:
                    f.write("%s %s\n" % ("applied" if claimed else "duplicate", message_id))
                if args.crash_after_commit and commits == args.crash_after_commit:
                    os._exit(3)                 # committed, never acknowledged
                channel.basic_ack(method.delivery_tag)   # only after the commit
        except (pika.exceptions.AMQPError, psycopg2.Error, OSError) as e:
            print("consumer: %s: %s; reconnecting" % (type(e).__name__, e), file=sys.stderr, flush=True)
            time.sleep(0.5)
        finally:
            for c in (amqp, conn):
                try:
                    if c is not None:
                        c.close()
                except Exception:
                    pass


if __name__ == "__main__":
    main()
