#!/usr/bin/env python3
"""A hostile HTTP destination for outbox_pg's tests, on raw sockets.

It reads a request (request line, headers, Content-Length body) and answers
according to the first path segment:

  /endless/...      200, then a body that never ends (no length, no chunking)
  /hugeheaders/...  200, then --header-mb megabytes of header lines, then 204-like end
  /longheader/...   200, then a single header line of --header-mb megabytes
  /drip/...         a valid 204 response sent one byte per second
  /garbage/...      a status line that is not HTTP, then random bytes, then close
  /ok/...           204 (a well-behaved answer, for comparison)

Every request is appended to --log as one JSON line (time, path, message id),
so a test can see what arrived.  The server never crashes on what a client
sends; each connection runs in its own daemon thread and ends when the
client goes away.  Standard library only.
"""
import argparse
import json
import os
import socket
import threading
import time

ARGS = None
LOCK = threading.Lock()


def read_request(conn):
    """Returns (path, headers) or None when the client went away."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > 10 * 1024 * 1024:
            return None
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    path = parts[1] if len(parts) > 1 else "/"
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    need = int(headers.get("content-length", "0")) - len(rest)
    while need > 0:
        chunk = conn.recv(min(need, 65536))
        if not chunk:
            return None
        need -= len(chunk)
    return path, headers


def log(path, headers):
    record = {"t": time.time(), "path": path,
              "id": headers.get("ce-id") or headers.get("webhook-id")}
    with LOCK:
        with open(ARGS.log, "a") as f:
            f.write(json.dumps(record) + "\n")


def handle(conn):
    try:
        while True:
            req = read_request(conn)
            if req is None:
                return
            path, headers = req
            log(path, headers)
            mode = ([p for p in path.split("?")[0].split("/") if p] or ["ok"])[0]
            if mode == "endless":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
                block = b"endless " * 8192
                while True:
                    conn.sendall(block)
            elif mode == "hugeheaders":
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                line = b"X-Junk: " + b"h" * 990 + b"\r\n"
                for _ in range(ARGS.header_mb * 1024):
                    conn.sendall(line)
                conn.sendall(b"Content-Length: 0\r\n\r\n")
            elif mode == "longheader":
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Long: ")
                block = b"l" * (1024 * 1024)
                for _ in range(ARGS.header_mb):
                    conn.sendall(block)
                conn.sendall(b"\r\nContent-Length: 0\r\n\r\n")
            elif mode == "drip":
                for b in b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n":
                    conn.sendall(bytes([b]))
                    time.sleep(1)
            elif mode == "garbage":
                conn.sendall(b"HELLO THERE \x00\xff\xfe not http\r\n" + os.urandom(4096) + b"\r\n\r\n")
                return
            else:
                conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    except OSError:
        return                  # the client gave up: that is the point
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--header-mb", type=int, default=4)
    ARGS = p.parse_args()
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", ARGS.port))
    srv.listen(128)
    print("listening", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
