--
-- config_secrets: errors about configuration rows never show a secret;
-- reserved header names are refused under any spelling
--
-- Every secret below contains S3CRET.  try_full() prints what a client (and
-- the server log) gets: SQLSTATE, message, detail and hint, and flags any of
-- them, or the context, that contains a secret (the context's own line
-- quoting the statement try_full() ran excepted).
CREATE FUNCTION try_full(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    m text; d text; h text; c text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
                            h = PG_EXCEPTION_HINT, c = PG_EXCEPTION_CONTEXT;
    RETURN SQLSTATE || ': ' || m
        || CASE WHEN d <> '' THEN E'\nDETAIL: ' || d ELSE '' END
        || CASE WHEN h <> '' THEN E'\nHINT: ' || h ELSE '' END
        || CASE WHEN concat(m, d, h, regexp_replace(c, '^SQL statement .*$', '', 'gn')) ~ 'S3CRET' THEN E'\n*** SHOWS A SECRET ***' ELSE '' END;
END
$$;

INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key)
VALUES ('sec_aws', 'AKIAS3CRET', 'aws-S3CRET-key');
INSERT INTO outbox.destinations (name, url, headers, signing_secrets, bearer_token)
VALUES ('sec_ok', 'https://user:S3CRET@127.0.0.1:9/hook', '{"X-Api-Key": "S3CRET-1"}',
        ARRAY['whsec_S3CRETS3CRET'], 'bearer-S3CRET');

-- destinations: NOT NULL and CHECK, on INSERT and UPDATE
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token) VALUES ('sec_x', NULL, 'bearer-S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token) VALUES ('sec_x', 'ftp://user:S3CRET@127.0.0.1/', 'bearer-S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token) VALUES ('sec x', 'https://user:S3CRET@127.0.0.1/', 'bearer-S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token, timeout_ms) VALUES ('sec_x', 'https://user:S3CRET@127.0.0.1/', 'bearer-S3CRET', 0)$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, signing_secrets) VALUES ('sec_x', 'https://127.0.0.1/', ARRAY['whsec_S3CRET!'])$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, headers) VALUES ('sec_x', 'https://127.0.0.1/', '["S3CRET"]')$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token, options) VALUES ('sec_x', 'https://127.0.0.1/', 'bearer-S3CRET', '{"ordering": "S3CRET"}')$$);
SELECT try_full($$UPDATE outbox.destinations SET max_attempts = 0 WHERE name = 'sec_ok'$$);
SELECT try_full($$UPDATE outbox.destinations SET backoff_max_ms = 1 WHERE name = 'sec_ok'$$);
SELECT try_full($$UPDATE outbox.destinations SET paused = NULL WHERE name = 'sec_ok'$$);

-- destination headers: values never shown, reserved names under any spelling
SELECT try_full($$UPDATE outbox.destinations SET headers = '{"X-Api-Key": "S3CRET\r\nHost: evil"}' WHERE name = 'sec_ok'$$);
SELECT try_full($$UPDATE outbox.destinations SET headers = '{"X-Api-Key": 1}' WHERE name = 'sec_ok'$$);
SELECT h AS header, try_full(format($$UPDATE outbox.destinations SET headers = '{"%s": "S3CRET"}' WHERE name = 'sec_ok'$$, h))
  FROM unnest(ARRAY['ce_id', 'CE_ID', 'webhook_signature', 'Webhook-Signature',
                    'content_type', 'Content_Length', 'idempotency_key', 'X_Amz_Security_Token',
                    'proxy_authorization', 'transfer_encoding', 'TraceParent', 'Authorization']) AS h;
-- a webhook without bearer_token may send its own Authorization; brokers
-- and destinations with bearer_token may not
SELECT try_full($$INSERT INTO outbox.destinations (name, url, headers) VALUES ('sec_basic', 'https://127.0.0.1/', '{"Authorization": "Basic S3CRET"}')$$);
SELECT try_full($$UPDATE outbox.destinations SET bearer_token = 'bearer-S3CRET' WHERE name = 'sec_basic'$$);
SELECT try_full($$UPDATE outbox.destinations SET kind = 'sqs', credentials = 'sec_aws' WHERE name = 'sec_basic'$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, headers) VALUES ('sec_x', 'https://127.0.0.1/', '{"X_Request_Id": "S3CRET", "x-tenant": "S3CRET"}')$$);
DELETE FROM outbox.destinations WHERE name IN ('sec_basic', 'sec_x');

-- headers written by an older version stay until the headers are written
ALTER TABLE outbox.destinations DISABLE TRIGGER destinations_check;
UPDATE outbox.destinations SET headers = '{"ce_id": "legacy"}' WHERE name = 'sec_ok';
ALTER TABLE outbox.destinations ENABLE TRIGGER destinations_check;
SELECT try_full($$SELECT outbox.pause('sec_ok')$$);
SELECT try_full($$UPDATE outbox.destinations SET headers = headers WHERE name = 'sec_ok'$$);
SELECT try_full($$UPDATE outbox.destinations SET headers = headers || '{"x-b": "S3CRET"}' WHERE name = 'sec_ok'$$);
UPDATE outbox.destinations SET headers = '{"X-Api-Key": "S3CRET-1"}' WHERE name = 'sec_ok';

-- foreign key and unique violations show a name only
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token, credentials) VALUES ('sec_x', 'https://127.0.0.1/', 'bearer-S3CRET', 'nope')$$);
SELECT try_full($$INSERT INTO outbox.destinations (name, url, bearer_token) VALUES ('sec_ok', 'https://user:S3CRET@127.0.0.1/', 'bearer-S3CRET')$$);

-- credentials
SELECT try_full($$INSERT INTO outbox.credentials (name, aws_access_key_id) VALUES ('sec_c', 'AKIAS3CRET')$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key) VALUES ('sec_c', 'AKIA-S3CRET', 'aws-S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key) VALUES ('sec_c', 'AKIAS3CRET', 'aws S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, aws_session_token) VALUES ('sec_c', 'tok-S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, username, password) VALUES ('sec_c', 'user:S3CRET', 'S3CRET')$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, username, password) VALUES ('sec_c', 'user', E'S3CRET\n')$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, username, password, created_at) VALUES ('sec_c', 'user', 'S3CRET', NULL)$$);
SELECT try_full($$INSERT INTO outbox.credentials (name, username, password) VALUES ('sec_aws', 'user', 'S3CRET')$$);
SELECT try_full($$UPDATE outbox.credentials SET aws_secret_access_key = NULL WHERE name = 'sec_aws'$$);

-- routes and inbox handlers hold no secrets, and get the same messages
SELECT try_full($$INSERT INTO outbox.routes (pattern, destination) VALUES ('', 'sec_ok')$$);
SELECT try_full($$INSERT INTO outbox.routes (pattern, destination) VALUES ('sec.*', NULL)$$);
CREATE FUNCTION sec_handler(m inbox.messages) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT try_full($$INSERT INTO inbox.handlers (pattern, function, max_attempts) VALUES ('sec.*', 'sec_handler(inbox.messages)', 0)$$);
SELECT try_full($$INSERT INTO inbox.handlers (pattern, function) VALUES ('sec.*', NULL)$$);
DROP FUNCTION sec_handler(inbox.messages);

-- emit(): reserved header names under any spelling
SELECT h AS header, try_full(format($$SELECT outbox.emit('sec.t', '1', '{}', headers => '{"%s": "S3CRET"}')$$, h))
  FROM unnest(ARRAY['ce_id', 'CE_ID', 'Ce_Type', 'webhook_signature', 'Webhook-Signature', 'webhook_id',
                    'content_type', 'Content-Type', 'idempotency_key', 'x_amz_date', 'trace_state',
                    'transfer_encoding', 'Proxy_Authorization']) AS h;
SELECT try_full($$SELECT outbox.emit('sec.t', '1', '{}', headers => '{"x_request_id": "S3CRET"}') IS NOT NULL$$);

-- the constraints stay as the backstop
SELECT pg_catalog.count(*) AS check_constraints
  FROM pg_constraint
 WHERE conrelid IN ('outbox.destinations'::regclass, 'outbox.credentials'::regclass,
                    'outbox.routes'::regclass, 'inbox.handlers'::regclass)
   AND contype = 'c';
SELECT tgrelid::regclass AS config_table, tgname
  FROM pg_trigger
 WHERE tgfoid = 'outbox._check_config()'::regprocedure
 ORDER BY 1;

DELETE FROM outbox.destinations WHERE name = 'sec_ok';
DELETE FROM outbox.credentials WHERE name = 'sec_aws';
DROP FUNCTION try_full(text);
