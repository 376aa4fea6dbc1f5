#!/usr/bin/env python3
"""A slow webhook receiver for outbox_pg's concurrency tests: it answers
204 to every POST after the delay its path names, on keep-alive HTTP/1.1
connections, and measures itself how many requests it has in flight.

Paths: /delay/<ms>/<name>: answer after <ms> milliseconds; <name> (the
rest of the path) is what the counts are kept by.

Every 0.1 s it writes --stats (a JSON object, replaced atomically):
  {"connections": open now, "max_connections": most open at once,
   "names": {<name>: {"requests": answered, "in_flight": now,
                      "max_in_flight": most at once,
                      "first": time of the first request, "last": of the
                      last answer (Unix seconds),
                      "serve_sum": seconds from requests' heads to their
                      answers, summed over the answered ones,
                      "in_flight_sum", "samples": in_flight summed over
                      the 0.1 s reports, and how many there were}}}
Between two reads, the difference of serve_sum over that of requests is
how long this receiver took per request (its delay and its own lateness
under load), and that of in_flight_sum over that of samples is how many
requests the sender kept in flight: by Little's law their quotient is the
rate, so a slower rate shows which side it came from.
A request is in flight from the moment its head has arrived until its
answer is written.  Thousands of connections are fine (asyncio, one task
per connection).  Standard library only.
"""
import argparse
import asyncio
import json
import os
import resource
import time

REPLY = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
NAMES = {}
CONN = {"connections": 0, "max_connections": 0}


def counts(name):
    c = NAMES.get(name)
    if c is None:
        c = NAMES[name] = {"requests": 0, "in_flight": 0, "max_in_flight": 0,
                           "first": time.time(), "last": None, "serve_sum": 0.0,
                           "in_flight_sum": 0, "samples": 0}
    return c


async def serve(reader, writer):
    CONN["connections"] += 1
    CONN["max_connections"] = max(CONN["max_connections"], CONN["connections"])
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            arrived = time.monotonic()
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            path = parts[1].decode() if len(parts) > 1 else "/"
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            segs = [p for p in path.split("?")[0].split("/") if p]
            delay = int(segs[1]) / 1000.0 if len(segs) > 1 and segs[0] == "delay" else 0
            c = counts("/".join(segs[2:]) if segs[:1] == ["delay"] else "/".join(segs))
            c["in_flight"] += 1
            c["max_in_flight"] = max(c["max_in_flight"], c["in_flight"])
            try:
                if length:
                    await reader.readexactly(length)
                if delay:
                    await asyncio.sleep(delay)
                writer.write(REPLY)
                await writer.drain()
            finally:
                c["in_flight"] -= 1
            c["requests"] += 1
            c["serve_sum"] += time.monotonic() - arrived
            c["last"] = time.time()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        CONN["connections"] -= 1
        writer.close()


async def report(path):
    tmp = path + ".tmp"
    while True:
        await asyncio.sleep(0.1)
        for c in NAMES.values():
            c["in_flight_sum"] += c["in_flight"]
            c["samples"] += 1
        with open(tmp, "w") as f:
            json.dump(dict(CONN, names=NAMES), f)
        os.replace(tmp, path)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--stats", required=True)
    args = p.parse_args()
    # a connection per request in flight: as many as the hard limit allows
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = await asyncio.start_server(serve, "127.0.0.1", args.port, backlog=4096)
    print("listening", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), report(args.stats))


if __name__ == "__main__":
    asyncio.run(main())
