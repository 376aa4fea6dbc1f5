#!/usr/bin/python3
"""An SNS + SQS endpoint for outbox_pg's tests that verifies every request's
AWS Signature Version 4 with botocore (Debian python3-botocore), independently
of libcurl, and rejects mismatches the way AWS does (403).

It answers the SNS Query protocol (Action=Publish / PublishBatch, XML) and
the SQS JSON 1.0 protocol (X-Amz-Target AmazonSQS.SendMessage /
SendMessageBatch), and logs every request as one JSON line to --log: the
verification result and reason, the signed headers, and each entry (id,
body, attributes, FIFO group and deduplication ids).

Fault modes, chosen by the topic or queue name:
  ...partial...   in a batch, the entries at odd positions fail on their
                  first attempt with SenderFault false (ServiceUnavailable),
                  inside an HTTP 200; they succeed when sent again
  ...poison...    entries whose body contains "poison" always fail with
                  SenderFault true (InvalidParameterValue), inside an HTTP 200
  ...deep...      (SQS) an HTTP 200 whose body opens 30,000 JSON arrays
  ...bignum...    (SQS) an HTTP 200 with a number no numeric holds
Standard library and botocore only.
"""
import argparse
import datetime
import hashlib
import hmac
import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

LOCK = threading.Lock()
SEEN = {}
ARGS = None


def verify(method, path, headers, body):
    """Recompute the signature with botocore; returns (ok, reason, signed)."""
    auth = headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False, "no AWS4-HMAC-SHA256 Authorization header", []
    fields = {}
    for part in auth[len("AWS4-HMAC-SHA256 "):].split(","):
        k, _, v = part.strip().partition("=")
        fields[k] = v
    try:
        akid, day, region, service, term = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        signature = fields["Signature"]
    except (KeyError, ValueError):
        return False, "malformed Authorization header", []
    amz_date = headers.get("x-amz-date", "")
    if akid != ARGS.access_key:
        return False, "unknown access key", signed
    if region != ARGS.region or service not in ("sns", "sqs") or term != "aws4_request":
        return False, "wrong credential scope %s/%s/%s" % (region, service, term), signed
    if day != amz_date[:8]:
        return False, "scope date is not the x-amz-date day", signed
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return False, "bad x-amz-date", signed
    if abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) > 900:
        return False, "x-amz-date too far from now", signed
    for required in ("host", "x-amz-date", "content-type"):
        if required not in signed:
            return False, "header %s is not signed" % required, signed
    if service == "sqs" and "x-amz-target" not in signed:
        return False, "x-amz-target is not signed", signed
    if "x-amz-security-token" in headers and "x-amz-security-token" not in signed:
        return False, "x-amz-security-token is not signed", signed
    if signed != sorted(signed):
        return False, "signed headers are not sorted", signed
    for h in signed:
        if h not in headers:
            return False, "signed header %s was not sent" % h, signed

    token = headers.get("x-amz-security-token")
    req = AWSRequest(method=method, url="http://%s%s" % (headers["host"], path), data=body,
                     headers={h: headers[h] for h in signed})
    req.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(akid, ARGS.secret, token), service, region)
    if signer.signed_headers(signer.headers_to_sign(req)) != ";".join(signed):
        return False, "botocore would sign other headers", signed
    canonical = signer.canonical_request(req)
    expected = signer.signature(signer.string_to_sign(req, canonical), req)
    if not hmac.compare_digest(expected, signature):
        return False, "signature mismatch", signed
    return True, "ok", signed


def sns_entries(form):
    """Entries of a Publish or PublishBatch form, in order."""
    def one(prefix):
        attrs = {}
        n = 1
        while form.get("%sMessageAttributes.entry.%d.Name" % (prefix, n)) is not None:
            name = form["%sMessageAttributes.entry.%d.Name" % (prefix, n)]
            attrs[name] = form.get("%sMessageAttributes.entry.%d.Value.StringValue" % (prefix, n))
            n += 1
        return {"id": form.get(prefix + "Id"), "body": form.get(prefix + "Message"), "attributes": attrs,
                "group": form.get(prefix + "MessageGroupId"), "dedup": form.get(prefix + "MessageDeduplicationId")}
    if form.get("Action") == "Publish":
        return [one("")]
    out = []
    n = 1
    while form.get("PublishBatchRequestEntries.member.%d.Id" % n) is not None:
        out.append(one("PublishBatchRequestEntries.member.%d." % n))
        n += 1
    return out


def sqs_entries(target, doc):
    def one(e):
        attrs = {k: v.get("StringValue") for k, v in (e.get("MessageAttributes") or {}).items()}
        return {"id": e.get("Id"), "body": e.get("MessageBody"), "attributes": attrs,
                "group": e.get("MessageGroupId"), "dedup": e.get("MessageDeduplicationId")}
    if target == "AmazonSQS.SendMessage":
        return [one(doc)]
    return [one(e) for e in doc.get("Entries", [])]


def entry_fault(name, index, entry):
    """None, or (code, message, sender_fault) for one batch entry."""
    key = entry.get("attributes", {}).get("message_id") or entry.get("id")
    with LOCK:
        SEEN[(name, key)] = SEEN.get((name, key), 0) + 1
        nth = SEEN[(name, key)]
    entry["nth"] = nth
    if "poison" in name and "poison" in (entry.get("body") or ""):
        return ("InvalidParameterValue", "poison message refused on purpose", True)
    if "partial" in name and index % 2 == 1 and nth == 1:
        return ("ServiceUnavailable", "entry failing once on purpose", False)
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, body, ctype):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        ok, reason, signed = verify("POST", self.path, headers, body)
        target = headers.get("x-amz-target")
        record = {"path": self.path, "verified": ok, "reason": reason, "signed_headers": signed,
                  "content_type": headers.get("content-type"), "body_ascii": all(b < 128 for b in body),
                  "body_sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}
        if target:
            record["service"] = "sqs"
            record["action"] = target.split(".", 1)[1]
            doc = json.loads(body.decode("utf-8"))
            name = doc.get("QueueUrl", "").rstrip("/").split("/")[-1]
            entries = sqs_entries(target, doc)
        else:
            record["service"] = "sns"
            form = dict(urllib.parse.parse_qsl(body.decode("ascii"), keep_blank_values=True, strict_parsing=True))
            record["action"] = form.get("Action")
            name = form.get("TopicArn", "").split(":")[-1]
            entries = sns_entries(form)
        record["name"] = name
        record["entries"] = entries

        if not ok:
            record["answer"] = 403
            self.log(record)
            if target:
                self.reply(403, json.dumps({"__type": "com.amazon.coral.service#SignatureDoesNotMatch",
                                            "message": "The request signature we calculated does not match"}),
                           "application/x-amz-json-1.0")
            else:
                self.reply(403, "<ErrorResponse><Error><Type>Sender</Type><Code>SignatureDoesNotMatch</Code>"
                                "<Message>The request signature we calculated does not match</Message></Error>"
                                "<RequestId>%s</RequestId></ErrorResponse>" % uuid.uuid4(), "text/xml")
            return

        batch = record["action"] in ("PublishBatch", "SendMessageBatch")
        good, bad = [], []
        for i, e in enumerate(entries):
            fault = entry_fault(name, i, e) if batch else None
            if not batch:
                key = e["attributes"].get("message_id")
                with LOCK:
                    SEEN[(name, key)] = SEEN.get((name, key), 0) + 1
                    e["nth"] = SEEN[(name, key)]
            e["result"] = "ok" if fault is None else fault[0]
            (good if fault is None else bad).append((e, fault))
        record["answer"] = 200
        self.log(record)

        if target and "deep" in name:
            self.reply(200, "[" * 30000, "application/x-amz-json-1.0")
        elif target and "bignum" in name:
            self.reply(200, '{"MessageId": "m-1", "x": 1e999999}', "application/x-amz-json-1.0")
        elif target:
            if not batch:
                e = entries[0]
                self.reply(200, json.dumps({"MD5OfMessageBody": hashlib.md5(e["body"].encode()).hexdigest(),
                                            "MessageId": str(uuid.uuid4())}), "application/x-amz-json-1.0")
            else:
                out = {"Successful": [{"Id": e["id"], "MessageId": str(uuid.uuid4()),
                                       "MD5OfMessageBody": hashlib.md5(e["body"].encode()).hexdigest()}
                                      for e, _ in good],
                       "Failed": [{"Id": e["id"], "Code": f[0], "Message": f[1], "SenderFault": f[2]}
                                  for e, f in bad]}
                self.reply(200, json.dumps(out), "application/x-amz-json-1.0")
        else:
            rid = "<ResponseMetadata><RequestId>%s</RequestId></ResponseMetadata>" % uuid.uuid4()
            ns = 'xmlns="http://sns.amazonaws.com/doc/2010-03-31/"'
            if not batch:
                self.reply(200, "<PublishResponse %s><PublishResult><MessageId>%s</MessageId></PublishResult>%s"
                                "</PublishResponse>" % (ns, uuid.uuid4(), rid), "text/xml")
            else:
                ok_xml = "".join("<member><Id>%s</Id><MessageId>%s</MessageId></member>" % (e["id"], uuid.uuid4())
                                 for e, _ in good)
                bad_xml = "".join("<member><Id>%s</Id><Code>%s</Code><Message>%s</Message>"
                                  "<SenderFault>%s</SenderFault></member>"
                                  % (e["id"], f[0], f[1], "true" if f[2] else "false") for e, f in bad)
                self.reply(200, "<PublishBatchResponse %s><PublishBatchResult><Successful>%s</Successful>"
                                "<Failed>%s</Failed></PublishBatchResult>%s</PublishBatchResponse>"
                                % (ns, ok_xml, bad_xml, rid), "text/xml")

    def log(self, record):
        with LOCK:
            with open(ARGS.log, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--region", default="us-east-1")
    ARGS = p.parse_args()
    srv = Server(("127.0.0.1", ARGS.port), Handler)
    print("listening", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
