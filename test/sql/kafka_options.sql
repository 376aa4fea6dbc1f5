--
-- kafka_options: a destination of kind kafka is checked when it is
-- written (src/destination/kafka.c): its url lists bootstrap servers,
-- topic is required, the librdkafka properties it may set are an
-- allow-list with bounds, SASL needs credentials; no message shows a
-- value (every secret below contains S3CRET)
--
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

INSERT INTO outbox.credentials (name, username, password)
VALUES ('ko_sasl', 'outbox', 'sasl-S3CRET');
INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key)
VALUES ('ko_aws', 'AKIAS3CRET', 'aws-S3CRET');

-- valid definitions are accepted
INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES
    ('ko_plain', 'kafka', 'kafka://127.0.0.1:9092', NULL, '{"topic": "orders", "key": "none"}'),
    ('ko_many', 'kafka', 'KAFKA://broker-1.example.com:9092,10.0.0.2:9093,[::1]:9094/', NULL,
     '{"topic": "a.b_c-1", "key": "aggregate_id", "compression.type": "zstd", "linger.ms": 20,
       "batch.num.messages": 500, "message.max.bytes": 2000000, "client.id": "shop-1",
       "partitioner": "murmur2", "socket.keepalive.enable": true, "ordering": "aggregate"}'),
    ('ko_sasl', 'kafka', 'kafka://127.0.0.1:9092', 'ko_sasl',
     '{"topic": "orders", "tls": true, "sasl_mechanism": "SCRAM-SHA-512", "cloudevents": true, "source": "urn:shop"}');
SELECT name, kind, url, credentials FROM outbox.destinations WHERE name LIKE 'ko\_%' ORDER BY name;

-- the url: kafka:// and host:port pairs
SELECT u AS url, try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'kafka', %L, '{"topic": "t"}')$$, u))
  FROM (VALUES
    ('http://127.0.0.1:9092'),
    ('kafka://127.0.0.1'),
    ('kafka://127.0.0.1:0'),
    ('kafka://127.0.0.1:99999'),
    ('kafka://:9092'),
    ('kafka://127.0.0.1:9092,'),
    ('kafka://user:S3CRET@127.0.0.1:9092'),
    ('kafka://[::1:9092'),
    ('kafka://127.0.0.1:9092 '),
    ('kafka://' || (SELECT string_agg('h' || g || ':9092', ',') FROM generate_series(1, 17) g))) AS t(u);
-- an HTTP kind refuses a kafka:// url
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url) VALUES ('x', 'webhook', 'kafka://127.0.0.1:9092')$$);
SELECT try_hint($$UPDATE outbox.destinations SET kind = 'webhook', options = '{}' WHERE name = 'ko_plain'$$);

-- options: required, types, names, values, the allow-list
SELECT o AS options, try_hint(format($$INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'kafka', 'kafka://127.0.0.1:9092', %L)$$, o))
  FROM (VALUES
    ('{}'),
    ('{"topic": 1}'),
    ('{"topic": ""}'),
    ('{"topic": "has space"}'),
    ('{"topic": ".."}'),
    ('{"topic": "t", "key": "id"}'),
    ('{"topic": "t", "acks": "1"}'),
    ('{"topic": "t", "enable.idempotence": false}'),
    ('{"topic": "t", "bootstrap.servers": "S3CRET:1"}'),
    ('{"topic": "t", "linger_ms": 5}'),
    ('{"topic": "t", "linger.ms": 5000}'),
    ('{"topic": "t", "linger.ms": "5"}'),
    ('{"topic": "t", "batch.num.messages": 0}'),
    ('{"topic": "t", "message.max.bytes": 1.5}'),
    ('{"topic": "t", "compression.type": "brotli"}'),
    ('{"topic": "t", "tls": "yes"}'),
    ('{"topic": "t", "sasl_mechanism": "GSSAPI"}'),
    ('{"topic": "t", "sasl_mechanism": "PLAIN"}'),
    ('{"topic": "t", "client.id": "a b"}'),
    ('{"topic": "t", "cloudevents": true, "source": ""}'),
    ('{"topic": "t", "ordering": "partition"}'),
    ('{"topic": "t", "key": "none", "ordering": "aggregate"}'),
    -- librdkafka refuses the producer: the destination could never load
    ('{"topic": "t", "reconnect.backoff.ms": 20000}'),
    ('{"topic": "t", "reconnect.backoff.max.ms": 0}'),
    ('{"topic": "t", "reconnect.backoff.ms": 600, "reconnect.backoff.max.ms": 500}')) AS t(o);

-- credentials: SASL logs in with a user name and password
SELECT try_hint($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'kafka', 'kafka://127.0.0.1:9092', 'ko_aws', '{"topic": "t"}')$$);
SELECT try_hint($$UPDATE outbox.credentials SET username = NULL, password = NULL, aws_access_key_id = 'AKIAS3CRET', aws_secret_access_key = 'S3CRET' WHERE name = 'ko_sasl'$$);

-- an UPDATE checks the row again
SELECT try_hint($$UPDATE outbox.destinations SET options = options - 'topic' WHERE name = 'ko_plain'$$);
SELECT try_hint($$UPDATE outbox.destinations SET url = 'kafka://127.0.0.1:9092,127.0.0.2:9092' WHERE name = 'ko_plain'$$);

-- a native kind has no HTTP answer to classify
SELECT try_hint($$SELECT * FROM outbox._classify('kafka', 200, '{}')$$);

SELECT name, options FROM outbox.destinations WHERE name LIKE 'ko\_%' ORDER BY name;

DELETE FROM outbox.destinations WHERE name LIKE 'ko\_%';
DELETE FROM outbox.credentials WHERE name LIKE 'ko\_%';
DROP FUNCTION try_hint(text);
