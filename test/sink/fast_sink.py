#!/usr/bin/env python3
"""A fast webhook sink for outbox_pg's volume tests: answers 204 to every
POST on a keep-alive HTTP/1.1 connection, and appends one line per request
to --log: the message id (ce-id, else webhook-id).  Lines are written in
blocks (at least every 0.2 s), whole lines only.  No fault modes and no
signature checks: test/sink/sink.py does those; this one only has to keep
up with a relay draining a large backlog.  Standard library only.
"""
import argparse
import asyncio

REPLY = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
PENDING = []


async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            mid = None
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"ce-id" or (name == b"webhook-id" and mid is None):
                    mid = value.strip()
            if length:
                await reader.readexactly(length)
            PENDING.append((mid or b"-") + b"\n")
            writer.write(REPLY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def flush(path):
    with open(path, "ab") as f:
        while True:
            await asyncio.sleep(0.2)
            if PENDING:
                block = b"".join(PENDING)
                PENDING.clear()
                f.write(block)
                f.flush()


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    args = p.parse_args()
    server = await asyncio.start_server(serve, "127.0.0.1", args.port, backlog=512)
    print("listening", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), flush(args.log))


if __name__ == "__main__":
    asyncio.run(main())
