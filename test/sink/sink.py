#!/usr/bin/env python3
"""A webhook sink for outbox_pg's tests, with fault modes chosen by path.

Every request is appended as one JSON line to --log (flushed at once), with
its path, headers, body, the time it arrived, and the result of verifying
its Standard Webhooks signature and CloudEvents attributes independently
of the relay's code.

Paths (anything after the mode is free, e.g. a destination name):
  /ok/...                      204
  /status/<code>/...           that status (Retry-After: <s> with ?retry_after=<s>)
  /failfirst/<n>/<code>/...    the first n requests per message id get <code>, then 204
                               (with ?retry_after=<s>: and a Retry-After header)
  /failcount/<n>/<code>/...    the first n requests to the path (any message) get <code>,
                               then 204 (?retry_after=<s> as above; ?retry_after_date=<s>:
                               Retry-After as an HTTP-date s seconds from the answer)
  /failseq/<c1>,<c2>,.../...   the requests to the path (any message) get c1, c2, ... in
                               turn, then 204 (?retry_after=<s>: on the first answer only)
  /hangfirst/<n>/...           the first n requests per message id hang, then 204
  /resetfirst/<n>/...          the first n requests per message id are reset, then 204
  /delay/<ms>/...              wait, then 204
  /slowfirst/<ms1>/<code>/<ms2>/...
                               the first request per message id waits ms1, then <code>;
                               later ones wait ms2, then 204 (a slow failure, then a slow
                               success: keeps both attempts in flight for a while)
  /flaky/<pct>/<code>/...      <code> for about pct% of requests, chosen by a hash of the
                               message id and its request number (repeatable), else 204;
                               with ?hold=<subject>: always <code> for events of that
                               aggregate (ce-subject)
  /hang/...                    never answer (until the client gives up)
  /reset/...                   close the connection without answering
  /redirect/...                302 to /ok (with ?to=<url>: to that URL)
  /big/...                     200 with a 10 MB body
  /echo/<code>/<body>/...      <code> with a body a careless or hostile peer might send:
                                 headers     the credentials, the signing secret (when the
                                             request is signed) and every request header, as JSON
                                 awsxml      an SNS error quoting X-Amz-Security-Token and
                                             Authorization
                                 at/<n>      n dots, then the Authorization header's value
                                             (to put a secret across a stored limit)
                                 straddle/<n> n bytes, then multibyte characters
                                 invalid     invalid UTF-8 (and one valid e-acute)
                                 ansi        ESC sequences, BEL, CR, NUL, CSI, RLO
Only POST is accepted.  Standard library only.
"""
import argparse
import base64
import email.utils
import hashlib
import hmac
import json
import urllib.parse
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COUNTS = {}
ARGS = None


def verify_signature(headers, body):
    """Standard Webhooks: v1,<base64 HMAC-SHA256 over id.timestamp.body>."""
    if not ARGS.secret:
        return None
    sig = headers.get("webhook-signature")
    mid = headers.get("webhook-id")
    ts = headers.get("webhook-timestamp")
    if not (sig and mid and ts):
        return False
    key = base64.b64decode(ARGS.secret[len("whsec_"):] if ARGS.secret.startswith("whsec_") else ARGS.secret)
    signed = mid.encode() + b"." + ts.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    if abs(time.time() - int(ts)) > 300:
        return False
    return any(part.startswith("v1,") and hmac.compare_digest(part[3:], expected)
               for part in sig.split(" "))


def structured_event(ev, mode):
    """A structured-mode event (a JSON object), as check_cloudevent's tuple."""
    ok = ev.get("specversion") == "1.0" and all(ev.get(k) for k in ("id", "type", "source"))
    return ok, ev.get("id"), ev.get("type"), ev.get("subject"), ev.get("time"), ev.get("data"), mode


def check_cloudevent(headers, body):
    """CloudEvents 1.0 HTTP binding, binary or structured mode."""
    ctype = headers.get("content-type", "")
    if ctype.startswith("application/cloudevents+json"):
        return structured_event(json.loads(body), "structured")
    ok = (headers.get("ce-specversion") == "1.0" and all(headers.get(k) for k in ("ce-id", "ce-type", "ce-source"))
          and "ce-datacontenttype" not in headers and ctype.startswith("application/json"))
    data = json.loads(body) if body else None
    pct = lambda v: None if v is None else urllib.parse.unquote(v, errors="strict")
    if headers.get("ce-time"):
        time.strptime(headers["ce-time"][:19], "%Y-%m-%dT%H:%M:%S")
    return ok, headers.get("ce-id"), pct(headers.get("ce-type")), pct(headers.get("ce-subject")), headers.get("ce-time"), data, "binary"


def batch_events(headers, body):
    """A batched request (options.batch): one tuple per event, like
    check_cloudevent's, or None when the request is not a batch."""
    ctype = headers.get("content-type", "")
    if ctype.startswith("application/cloudevents-batch+json"):
        return [structured_event(ev, "batch-cloudevents") for ev in json.loads(body)]
    if ctype.startswith("application/json") and headers.get("idempotency-key", "").startswith("batch_"):
        out = []
        for ev in json.loads(body):
            ok = set(ev) == {"id", "type", "aggregate_id", "time", "traceparent", "payload"} and bool(ev["id"])
            out.append((ok, ev.get("id"), ev.get("type"), ev.get("aggregate_id"), ev.get("time"),
                        ev.get("payload"), "batch-array"))
        return out
    return None


def echo_body(what, headers):
    """The bodies of /echo/<code>/<what>/..."""
    if what[0] == "headers":
        # the credentials first (so they fall inside a stored prefix), the
        # secret shared with a signing sender, then every header
        shared = ARGS.secret if "webhook-signature" in headers else None
        return json.dumps({"error": "rejected",
                           "authorization": headers.get("authorization"),
                           "x-api-key": headers.get("x-api-key"),
                           "signing_secret": shared,
                           "signing_key": shared and shared[len("whsec_"):],
                           "request_headers": headers}).encode()
    if what[0] == "awsxml":
        # an AWS Query-protocol error quoting what was signed, as AWS does
        return ("<ErrorResponse><Error><Type>Sender</Type><Code>InvalidParameter</Code>"
                "<Message>token %s auth %s</Message></Error></ErrorResponse>"
                % (headers.get("x-amz-security-token", ""),
                   headers.get("authorization", ""))).encode()
    if what[0] == "at":
        return b"." * int(what[1]) + headers.get("authorization", "").encode() + b" was refused"
    if what[0] == "straddle":
        return b"x" * int(what[1]) + "\u20ac\u20ac\u20ac".encode() + b" tail"
    if what[0] == "invalid":
        return (b"bad \xff\xfe lone \xc3( cut \xe2\x82 overlong \xc0\xaf "
                b"surrogate \xed\xa0\x80 latin \xc3\xa9 end")
    if what[0] == "ansi":
        return (b"\x1b[31mALERT\x1b[0m \x1b]0;title\x07 cr\rret nul\x00byte "
                b"\xc2\x9b2J csi \xe2\x80\xae rlo")
    return b"echo"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, body=b"", extra=None):
        self.send_response(code)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def reset(self):
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def do_GET(self):
        self.reply(405)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        query = dict(q.split("=", 1) for q in self.path.split("?", 1)[1].split("&")) if "?" in self.path else {}
        try:
            events = batch_events(headers, body)
        except Exception as e:  # malformed batch: record it as such
            events = [(False, None, None, None, None, None, "invalid:" + str(e))]
        if events is None:
            try:
                events = [check_cloudevent(headers, body)]
            except Exception as e:  # malformed event: record it as such
                events = [(False, headers.get("ce-id"), None, None, None, None, "invalid:" + str(e))]
            key = events[0][1] or headers.get("idempotency-key")
        else:
            key = headers.get("idempotency-key")  # a batch's id: its answers go by it
        ce_ok, mid, etype, subject, etime, data, mode = events[0]
        with LOCK:
            COUNTS[(self.path, key)] = COUNTS.get((self.path, key), 0) + 1
            nth = COUNTS[(self.path, key)]
            COUNTS[self.path] = COUNTS.get(self.path, 0) + 1
            nth_path = COUNTS[self.path]
        kind = parts[0] if parts else "ok"
        if kind == "status":
            answer = int(parts[1])
        elif kind == "failfirst":
            answer = int(parts[2]) if nth <= int(parts[1]) else 204
        elif kind == "failcount":
            answer = int(parts[2]) if nth_path <= int(parts[1]) else 204
        elif kind == "failseq":
            seq = [int(c) for c in parts[1].split(",")]
            answer = seq[nth_path - 1] if nth_path <= len(seq) else 204
        elif kind in ("hangfirst", "resetfirst"):
            answer = 0 if nth <= int(parts[1]) else 204
        elif kind == "flaky":
            roll = int(hashlib.sha256(f"{key}/{nth}".encode()).hexdigest()[:8], 16) % 100
            held = "hold" in query and subject == urllib.parse.unquote(query["hold"])
            answer = int(parts[2]) if held or roll < int(parts[1]) else 204
        elif kind == "slowfirst":
            answer = int(parts[2]) if nth == 1 else 204
        elif kind in ("hang", "reset"):
            answer = 0
        elif kind == "redirect":
            answer = 302
        elif kind == "big":
            answer = 200
        elif kind == "echo":
            answer = int(parts[1])
        else:
            answer = 204
        # one line per event (a batch's events share its request's fields)
        sig_ok = verify_signature(headers, body)
        lines = []
        for ce_ok, mid, etype, subject, etime, data, mode in events:
            record = {
                "t": time.time(), "path": self.path, "mode": parts[0] if parts else "",
                "id": key if len(events) == 1 and mode in ("binary", "structured") else mid,
                "type": etype, "subject": subject, "time": etime, "data": data, "format": mode,
                "ce_ok": ce_ok, "sig_ok": sig_ok, "nth": nth,
                "answer": answer, "batch": len(events) if mode.startswith("batch") else None,
                "headers": headers, "body_traceparent": b'"traceparent"' in body,
            }
            lines.append(json.dumps(record) + "\n")
        with LOCK:
            with open(ARGS.log, "a") as f:
                f.write("".join(lines))
                f.flush()

        if kind == "status":
            extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else None
            self.reply(int(parts[1]), b"failing on purpose", extra)
        elif kind == "failfirst":
            if nth <= int(parts[1]):
                extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else None
                self.reply(int(parts[2]), b"failing first", extra)
            else:
                self.reply(204)
        elif kind == "failcount":
            if answer != 204:
                extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else None
                if "retry_after_date" in query:
                    extra = {"Retry-After": email.utils.formatdate(time.time() + float(query["retry_after_date"]),
                                                                   usegmt=True)}
                self.reply(answer, b"shedding load", extra)
            else:
                self.reply(204)
        elif kind == "failseq":
            if answer != 204:
                extra = {"Retry-After": query["retry_after"]} if "retry_after" in query and nth_path == 1 else None
                self.reply(answer, b"failing in turn", extra)
            else:
                self.reply(204)
        elif kind == "hangfirst":
            if nth <= int(parts[1]):
                time.sleep(3600)
            self.reply(204)
        elif kind == "resetfirst":
            if nth <= int(parts[1]):
                self.reset()
            else:
                self.reply(204)
        elif kind == "flaky":
            self.reply(answer, b"failing at random" if answer != 204 else b"")
        elif kind == "delay":
            time.sleep(int(parts[1]) / 1000.0)
            self.reply(204)
        elif kind == "slowfirst":
            time.sleep(int(parts[1] if nth == 1 else parts[3]) / 1000.0)
            self.reply(answer, b"failing slowly" if answer != 204 else b"")
        elif kind == "hang":
            time.sleep(3600)
        elif kind == "reset":
            self.reset()
        elif kind == "redirect":
            to = query.get("to", "http://127.0.0.1:%d/ok" % ARGS.port)
            self.reply(302, b"", {"Location": to})
        elif kind == "big":
            self.reply(200, b"x" * (10 * 1024 * 1024))
        elif kind == "echo":
            self.reply(answer, echo_body(parts[2:], headers))
        else:
            self.reply(204)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--secret", default="")
    p.add_argument("--host", default="127.0.0.1")
    ARGS = p.parse_args()
    if ":" in ARGS.host:
        Server.address_family = socket.AF_INET6
    srv = Server((ARGS.host, ARGS.port), Handler)
    print("listening", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
