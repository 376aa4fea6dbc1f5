--
-- destination_options: a destination is checked against its kind when it
-- is written (src/destination/): unknown options with a "did you mean"
-- hint, JSON types, values, required options and credentials, webhook
-- secrets; never showing a value of the row
--
-- try_hint() prints SQLSTATE, message, detail and hint, and flags any of
-- them that shows a secret (every secret below contains S3CRET).
CREATE FUNCTION try_hint(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    m text; d text; h text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
                            h = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || m
        || CASE WHEN d <> '' THEN E'\nDETAIL: ' || d ELSE '' END
        || CASE WHEN h <> '' THEN E'\nHINT: ' || h ELSE '' END
        || CASE WHEN concat(m, d, h) ~ 'S3CRET' THEN E'\n*** SHOWS A SECRET ***' ELSE '' END;
END
$$;

INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key)
VALUES ('do_aws', 'AKIAS3CRET', 'aws-S3CRET');
INSERT INTO outbox.credentials (name, username, password)
VALUES ('do_rmq', 'outbox', 'rmq-S3CRET');

-- a valid definition of each kind is accepted
INSERT INTO outbox.destinations (name, kind, url, credentials, signing_secrets, bearer_token, options) VALUES
    ('do_hook', 'webhook', 'https://127.0.0.1:9/hook', NULL,
     ARRAY['whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', NULL, 'S3CRETS3CRET'], 'bearer-S3CRET',
     '{"source": "urn:shop", "circuit_threshold": 0, "ordering": "aggregate", "on_dead": "skip"}'),
    ('do_sns', 'sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws',
     NULL, NULL,
     '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders.fifo", "fifo": true, "batch_size": 1e1}'),
    ('do_sqs', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/123456789012/billing', 'do_aws',
     NULL, NULL, '{"message_group_key": "destination", "circuit_threshold": 3}'),
    ('do_rmq', 'rabbitmq', 'http://127.0.0.1:15672', 'do_rmq',
     NULL, NULL, '{"vhost": "/", "exchange": "events", "routing_key": "{type}", "unroutable": "retry"}');
SELECT name, kind FROM outbox.destinations WHERE name LIKE 'do\_%' ORDER BY name;

-- an unknown kind lists the kinds
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url) VALUES ('x', 'kinesis', 'http://127.0.0.1:9/')$$);
SELECT try_hint($$UPDATE outbox.destinations SET kind = 'SNS' WHERE name = 'do_sns'$$);

-- a misspelt option: "Perhaps you meant"; another unknown one: the list
SELECT o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', %L, %L, %L, %L)$$, k, u, c, o))
  FROM (VALUES
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"sorce": "urn:x"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"circuit_treshold": 3}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"Ordering": "aggregate"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"colour": "blue"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t"}'),
    ('sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws', '{"topic_ar": "arn:aws:sns:eu-west-1:123456789012:t"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"queue_ulr": "https://sqs.eu-west-1.amazonaws.com/1/q"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"batchsize": 5}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"regoin": "eu-west-1"}'),
    ('rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', '{"exchnage": "events"}'),
    ('rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', '{"source": "urn:x"}')) AS t(k, u, c, o);

-- the JSON type of each option
SELECT o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', %L, %L, %L, %L)$$, k, u, c, o))
  FROM (VALUES
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"batch_size": "10"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"fifo": "true"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"region": null}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"circuit_threshold": "3"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"source": 1}'),
    ('rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', '{"exchange": {"name": "events"}}'),
    ('rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', '{"routing_key": ["a", "b"]}')) AS t(k, u, c, o);

-- values: integers written as integers, in range; choices
SELECT o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', %L, %L, %L, %L)$$, k, u, c, o))
  FROM (VALUES
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"circuit_threshold": -1}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"circuit_threshold": 1.5}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"circuit_threshold": 1000000}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"source": ""}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"batch_size": 11}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"batch_size": 2.0}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"message_group_key": "S3CRET"}'),
    ('sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws', '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "region": ""}'),
    ('rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', '{"unroutable": "drop"}')) AS t(k, u, c, o);
SELECT try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', %L)$$,
                       jsonb_build_object('routing_key', repeat('k', 256))));

-- webhook batches: a known mode, sizes in range, sizes only with a mode
SELECT o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, url, options) VALUES ('x', 'http://127.0.0.1:9/', %L)$$, o))
  FROM (VALUES ('{"batch": "json"}'), ('{"batch": true}'),
               ('{"batch": "array", "batch_size": 0}'), ('{"batch": "array", "batch_size": 1001}'),
               ('{"batch": "cloudevents", "batch_max_bytes": 1023}'),
               ('{"batch": "cloudevents", "batch_max_bytes": 16777217}'),
               ('{"batch_size": 10}'), ('{"batch_max_bytes": 65536}')) AS t(o);
BEGIN;
INSERT INTO outbox.destinations (name, url, options) VALUES
    ('do_batch_ce', 'http://127.0.0.1:9/', '{"batch": "cloudevents", "batch_size": 1000, "batch_max_bytes": 16777216}'),
    ('do_batch_arr', 'http://127.0.0.1:9/', '{"batch": "array", "batch_size": 1, "batch_max_bytes": 1024}');
SELECT name, options FROM outbox.destinations WHERE name LIKE 'do_batch%' ORDER BY name;
ROLLBACK;

-- a webhook's HTTP version: auto (the default: HTTP/2 where TLS offers it),
-- 1.1 or 2, as strings (over https here: 2 over plain http depends on the
-- libcurl, TAP 068 tests it)
SELECT o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, url, options) VALUES ('h' || md5(%L), 'https://127.0.0.1:9/', %L)$$, o, o))
  FROM (VALUES ('{"http_version": "auto"}'), ('{"http_version": "1.1"}'), ('{"http_version": "2"}'),
               ('{"http_version": "3"}'), ('{"http_version": "HTTP/2"}'), ('{"http_version": 2}'),
               ('{"http_versoin": "2"}')) AS t(o);
SELECT options FROM outbox.destinations WHERE options ? 'http_version' ORDER BY options::text;
DELETE FROM outbox.destinations WHERE options ? 'http_version';

-- CloudEvents: a webhook's percent_encoding (allow or avoid); SNS and SQS
-- send the payload or a CloudEvent as the body, with its source
SELECT n, o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES (%L, %L, %L, %L, %L)$$, 'ce' || n, k, u, c, o))
  FROM (SELECT row_number() OVER () AS n, * FROM (VALUES
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"percent_encoding": "allow"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"percent_encoding": "avoid", "source": "urn:café"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"percent_encoding": "auto"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"percent_encoding": "AVOID"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"percent_encoding": false}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"percent_encodng": "avoid"}'),
    ('webhook', 'http://127.0.0.1:9/', NULL, '{"body": "cloudevents"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"body": "payload"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"body": "cloudevents", "source": "urn:shop"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"body": "structured"}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"body": {"format": "cloudevents"}}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"body": "cloudevents", "source": ""}'),
    ('sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_aws', '{"percent_encoding": "avoid"}'),
    ('sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws', '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "body": "cloudevents"}'),
    ('sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws', '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "body": "CloudEvents"}'),
    ('sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws', '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "bdy": "cloudevents"}'),
    ('rabbitmq', 'http://127.0.0.1:15672', 'do_rmq', '{"body": "cloudevents"}')) AS v(k, u, c, o)) AS t
 ORDER BY n;
SELECT name, kind, options FROM outbox.destinations WHERE name ~ '^ce[0-9]+$' ORDER BY name;
DELETE FROM outbox.destinations WHERE name ~ '^ce[0-9]+$';

-- each kind's required options and credentials
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sns', 'https://sns.eu-west-1.amazonaws.com/', 'do_aws', '{"region": "eu-west-1"}')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', '{}')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'do_rmq')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials) VALUES ('x', 'rabbitmq', 'http://127.0.0.1:15672', 'do_aws')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url) VALUES ('x', 'rabbitmq', 'http://127.0.0.1:15672')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials) VALUES ('x', 'sqs', 'https://user:S3CRET@sqs.eu-west-1.amazonaws.com/1/q?S3CRET', 'do_aws')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/', 'do_aws')$$);
-- a credentials name without a row is the foreign key's to report
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'nope')$$);

-- webhooks: signing secrets decode to keys, the bearer token fits on a line
SELECT try_hint($$INSERT INTO outbox.destinations (name, url, signing_secrets) VALUES ('x', 'http://127.0.0.1:9/', ARRAY['whsec_S3CRETS3CRET', NULL, 'whsec_S3CRET'])$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, url, signing_secrets) VALUES ('x', 'http://127.0.0.1:9/', ARRAY['S3CRET='])$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, url, signing_secrets) VALUES ('x', 'http://127.0.0.1:9/', ARRAY['whsec_S3CRET!'])$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, url, bearer_token) VALUES ('x', 'http://127.0.0.1:9/', E'S3CRET\r\nHost: evil')$$);
SELECT try_hint($$INSERT INTO outbox.destinations (name, url, bearer_token) VALUES ('x', 'http://127.0.0.1:9/', '')$$);
SELECT try_hint($$UPDATE outbox.destinations SET signing_secrets = signing_secrets || 'whsec_S3CRETS3CRETS'::text WHERE name = 'do_hook'$$);

-- an UPDATE checks the row again when it writes a column the checks read
SELECT try_hint($$UPDATE outbox.destinations SET options = options - 'topic_arn' WHERE name = 'do_sns'$$);
SELECT try_hint($$UPDATE outbox.destinations SET options = options || '{"batch_size": 20}' WHERE name = 'do_sqs'$$);
SELECT try_hint($$UPDATE outbox.destinations SET credentials = 'do_rmq' WHERE name = 'do_sqs'$$);
SELECT try_hint($$UPDATE outbox.destinations SET kind = 'rabbitmq' WHERE name = 'do_sqs'$$);
-- and leaves a row an older version accepted alone otherwise
ALTER TABLE outbox.destinations DISABLE TRIGGER destinations_check;
UPDATE outbox.destinations SET options = options || '{"legacy": 1}' WHERE name = 'do_hook';
ALTER TABLE outbox.destinations ENABLE TRIGGER destinations_check;
SELECT try_hint($$SELECT outbox.pause('do_hook')$$);
SELECT try_hint($$SELECT outbox.resume('do_hook')$$);
-- outbox._check_destination() runs the checks on a row as it is
SELECT try_hint($$SELECT outbox._check_destination('do_hook')$$);
SELECT try_hint($$SELECT outbox._check_destination('do_sns')$$);
SELECT try_hint($$SELECT outbox._check_destination('nope')$$);
SELECT try_hint($$UPDATE outbox.destinations SET options = options || '{"circuit_threshold": 4}' WHERE name = 'do_hook'$$);
UPDATE outbox.destinations SET options = options - 'legacy' WHERE name = 'do_hook';

-- credentials: a change that would break a destination they serve is refused
SELECT try_hint($$UPDATE outbox.credentials SET aws_access_key_id = NULL, aws_secret_access_key = NULL, username = 'u', password = 'S3CRET' WHERE name = 'do_aws'$$);
SELECT try_hint($$UPDATE outbox.credentials SET username = NULL, password = NULL, aws_access_key_id = 'AKIAS3CRET', aws_secret_access_key = 'S3CRET' WHERE name = 'do_rmq'$$);
SELECT try_hint($$UPDATE outbox.credentials SET aws_secret_access_key = 'new-S3CRET' WHERE name = 'do_aws'$$);
-- a rename reaches the destinations (ON UPDATE CASCADE), which still pass
SELECT try_hint($$UPDATE outbox.credentials SET name = 'do_aws2' WHERE name = 'do_aws'$$);
SELECT name, credentials FROM outbox.destinations WHERE name LIKE 'do\_%' ORDER BY name;

-- what was accepted, as stored (1e1 is the number 10)
SELECT name, options FROM outbox.destinations WHERE name LIKE 'do\_%' ORDER BY name;

DELETE FROM outbox.destinations WHERE name LIKE 'do\_%';
DELETE FROM outbox.credentials WHERE name LIKE 'do\_%';
DROP FUNCTION try_hint(text);
