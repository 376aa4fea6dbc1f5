--
-- peer_text: what a destination says, as the relay stores and logs it
-- (peertext.c through outbox._sanitize_peer_text)
--
\pset null '(null)'

-- plain ASCII, tab and newline pass; CR, NUL, ESC, DEL are escaped
SELECT outbox._sanitize_peer_text('plain text', 255) AS plain;
SELECT outbox._sanitize_peer_text(E'a\tb\nc'::bytea, 255) = E'a\tb\nc' AS tab_newline_kept;
SELECT outbox._sanitize_peer_text('\x610d0a62'::bytea, 255) AS cr;
SELECT outbox._sanitize_peer_text('\x6100620063'::bytea, 255) AS nul;
SELECT outbox._sanitize_peer_text(convert_to(E'\x1b[31mred\x1b[0m \x07\x7f', 'UTF8'), 255) AS ansi;

-- C1 controls (CSI), bidirectional overrides, line separators
SELECT outbox._sanitize_peer_text('\x41c29b326a42'::bytea, 255) AS csi;
SELECT outbox._sanitize_peer_text('\xe280ae6c6c61e280a8'::bytea, 255) AS bidi_and_ls;

-- invalid UTF-8: stray continuation, overlong, surrogate, bad lead, cut sequence
SELECT outbox._sanitize_peer_text('\x6180'::bytea, 255) AS continuation;
SELECT outbox._sanitize_peer_text('\xc0af'::bytea, 255) AS overlong;
SELECT outbox._sanitize_peer_text('\xeda080'::bytea, 255) AS surrogate;
SELECT outbox._sanitize_peer_text('\xff41fe'::bytea, 255) AS bad_lead;
SELECT outbox._sanitize_peer_text('\x41e282'::bytea, 255) AS cut_sequence;

-- a multibyte character straddling the byte limit is left out whole;
-- escapes are never cut in the middle
SELECT outbox._sanitize_peer_text('\x6162c3a9'::bytea, 3) AS straddle,
       octet_length(outbox._sanitize_peer_text('\x6162c3a9'::bytea, 3)) AS bytes;
SELECT outbox._sanitize_peer_text('\x61621b'::bytea, 5) AS escape_not_cut;
SELECT bool_and(octet_length(outbox._sanitize_peer_text(b, n)) BETWEEN n - 3 AND n) AS bounded
  FROM (SELECT decode(repeat('e282ac1bff', 50), 'hex') AS b) s, generate_series(0, 40) n;

-- valid UTF-8 is kept in a UTF8 database; elsewhere non-ASCII is \u-escaped
SELECT getdatabaseencoding() <> 'UTF8'
       OR convert_to(outbox._sanitize_peer_text('\x6162c3a9f09f9880'::bytea, 255), 'UTF8')
          = '\x6162c3a9f09f9880'::bytea AS utf8_kept;
SELECT getdatabaseencoding() = 'UTF8'
       OR outbox._sanitize_peer_text('\x6162c3a9f09f9880'::bytea, 255) = 'ab\u00e9\U0001f600'
       AS escaped_elsewhere;

-- redaction: a bearer token, raw, as "Bearer x", base64, percent-encoded, JSON
SELECT outbox._sanitize_peer_text(convert_to(
         '{"authorization": "Bearer tok/en+42=="} tok/en+42== dG9rL2VuKzQyPT0= tok%2Fen%2B42%3D%3D tok%2fen%2b42%3d%3d tok\/en+42==',
         'UTF8'), 1000, secrets => '{"bearer_token": "tok/en+42=="}') AS bearer;

-- a header value: whole, and its credentials after the scheme
SELECT outbox._sanitize_peer_text(convert_to('x-api-key: k3y-v4lue; auth Token s3cr3t-tok', 'UTF8'), 255,
         secrets => '{"headers": {"X-Api-Key": "k3y-v4lue", "Authorization": "Token s3cr3t-tok"}}') AS headers;
-- a value that is no "scheme credentials" pair is redacted whole only
SELECT outbox._sanitize_peer_text(convert_to('charset=utf-8 vs text/plain; charset=utf-8', 'UTF8'), 255,
         secrets => '{"headers": {"Content-Type": "text/plain; charset=utf-8"}}') AS not_a_scheme;

-- basic credentials: the base64 a peer echoes, user:pass, the password alone
SELECT outbox._sanitize_peer_text(convert_to(
         'Authorization: Basic ' || encode(convert_to('guest:hunter2pw', 'UTF8'), 'base64')
         || ' guest:hunter2pw hunter2pw guest', 'UTF8'), 255,
         secrets => '{"username": "guest", "password": "hunter2pw"}') AS basic;

-- a short password is redacted only in its context, not wherever it appears
SELECT outbox._sanitize_peer_text(convert_to(
         'Basic ' || encode(convert_to('bob:pw', 'UTF8'), 'base64') || ' bob:pw pw power', 'UTF8'), 255,
         secrets => '{"username": "bob", "password": "pw"}') AS short_password;
SELECT outbox._sanitize_peer_text(convert_to('Bearer abc; abc alone', 'UTF8'), 255,
         secrets => '{"bearer_token": "abc"}') AS short_token;

-- URL userinfo, as written (percent-encoded) and decoded, and its Basic form
SELECT outbox._sanitize_peer_text(convert_to(
         'http://me:p%40ss-w0rd@127.0.0.1/ p@ss-w0rd p%40ss-w0rd '
         || encode(convert_to('me:p@ss-w0rd', 'UTF8'), 'base64'), 'UTF8'), 255,
         secrets => '{"url": "http://me:p%40ss-w0rd@127.0.0.1:8080/hook"}') AS userinfo;

-- Standard Webhooks secret, with and without its prefix; AWS keys
SELECT outbox._sanitize_peer_text(convert_to(
         'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw and MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'UTF8'), 255,
         secrets => '{"signing_secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}') AS webhook_secret;
SELECT outbox._sanitize_peer_text(convert_to(
         '<Message>Credential=AKIAEXAMPLE0001 token FwoGZXIvYXdzEXAMPLE secret wJalrXUtnFEMI</Message>', 'UTF8'), 255,
         secrets => '{"aws_access_key_id": "AKIAEXAMPLE0001", "aws_secret_access_key": "wJalrXUtnFEMI", "aws_session_token": "FwoGZXIvYXdzEXAMPLE"}') AS aws;

-- redaction comes before the cut: a secret across the limit leaves nothing of itself
SELECT outbox._sanitize_peer_text(convert_to('0123456789 s3cr3t-tok', 'UTF8'), 15,
         secrets => '{"bearer_token": "s3cr3t-tok"}') AS cut_after_redaction;

-- an input cut before it got here: a trailing start of a secret is redacted
SELECT outbox._sanitize_peer_text(convert_to('error: s3cr3t-t', 'UTF8'), 255, true,
         '{"bearer_token": "s3cr3t-tok"}') AS partial_when_cut,
       outbox._sanitize_peer_text(convert_to('error: s3cr3t-t', 'UTF8'), 255, false,
         '{"bearer_token": "s3cr3t-tok"}') AS partial_when_whole;

-- no secrets, empty input, zero bytes
SELECT outbox._sanitize_peer_text('', 255) = '' AS empty,
       outbox._sanitize_peer_text('abc', 0) = '' AS zero_bytes;

-- bad arguments
SELECT try($$SELECT outbox._sanitize_peer_text('x', -1)$$);
SELECT try($$SELECT outbox._sanitize_peer_text('x', 10, false, '{"token": "x"}')$$);
SELECT try($$SELECT outbox._sanitize_peer_text('x', 10, false, '[]')$$);

-- internal: not granted to PUBLIC
SELECT has_function_privilege('public',
       'outbox._sanitize_peer_text(bytea, int4, bool, jsonb)', 'EXECUTE') AS public_execute;
