/* outbox_pg--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.0'" to load this file. \quit

-- A fresh CREATE EXTENSION runs outbox_pg--0.1.0.sql and then this script,
-- so a new install and an upgraded one are the same by construction.
-- Like the install script, everything is schema-qualified, operators
-- included.  Sections are kept apart so each stays readable on its own.

------------------------------------------------------------------------
-- Ordering, gap safety and retention of the outbox
------------------------------------------------------------------------



------------------------------------------------------------------------
-- The full inbox: messages and handlers
------------------------------------------------------------------------



------------------------------------------------------------------------
-- Operability: monitoring, health, metrics, admin functions
------------------------------------------------------------------------



------------------------------------------------------------------------
-- Brokers: SNS, SQS, RabbitMQ
------------------------------------------------------------------------

-- Secrets for broker destinations, referenced by name from
-- outbox.destinations.credentials.  Like the destinations table it is for
-- privileged roles only: never grant SELECT on it to application or
-- monitoring roles.  The relay hands the values to libcurl and never logs
-- them.
CREATE TABLE outbox.credentials (
    name                  pg_catalog.text PRIMARY KEY
                          CONSTRAINT credentials_name_check
                          CHECK (name OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.-]{1,63}$'),
    aws_access_key_id     pg_catalog.text
                          CONSTRAINT credentials_access_key_check
                          CHECK (aws_access_key_id OPERATOR(pg_catalog.~) '^[A-Za-z0-9]{1,128}$'),
    aws_secret_access_key pg_catalog.text
                          CONSTRAINT credentials_secret_check
                          CHECK (aws_secret_access_key OPERATOR(pg_catalog.~) '^[^[:space:][:cntrl:]]+$'),
    aws_session_token     pg_catalog.text
                          CONSTRAINT credentials_session_token_check
                          CHECK (aws_session_token OPERATOR(pg_catalog.~) '^[^[:space:][:cntrl:]]+$'),
    username              pg_catalog.text
                          CONSTRAINT credentials_username_check
                          CHECK (username OPERATOR(pg_catalog.~) '^[^:[:cntrl:]]{1,255}$'),
    password              pg_catalog.text
                          CONSTRAINT credentials_password_check
                          CHECK (password OPERATOR(pg_catalog.!~) '[[:cntrl:]]'),
    created_at            pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT credentials_aws_pair_check
        CHECK ((aws_access_key_id IS NULL) OPERATOR(pg_catalog.=) (aws_secret_access_key IS NULL)),
    CONSTRAINT credentials_token_check
        CHECK (aws_session_token IS NULL OR aws_access_key_id IS NOT NULL),
    CONSTRAINT credentials_basic_pair_check
        CHECK ((username IS NULL) OPERATOR(pg_catalog.=) (password IS NULL)),
    CONSTRAINT credentials_not_empty_check
        CHECK (aws_access_key_id IS NOT NULL OR username IS NOT NULL)
);

COMMENT ON TABLE outbox.credentials IS
    'Secrets of broker destinations (AWS keys, RabbitMQ user). Never grant SELECT on this table to application or monitoring roles.';

SELECT pg_catalog.pg_extension_config_dump('outbox.credentials', '');

ALTER TABLE outbox.destinations
    ADD COLUMN credentials pg_catalog.text
        REFERENCES outbox.credentials (name) ON UPDATE CASCADE ON DELETE RESTRICT;

COMMENT ON COLUMN outbox.destinations.credentials IS
    'For kinds sns, sqs and rabbitmq: the outbox.credentials row the relay signs or authenticates with.';

-- Validates a broker destination's url, options and credentials when it is
-- written, so that mistakes surface as errors here rather than as failed
-- deliveries later.  See README, "Destination kinds".
CREATE FUNCTION outbox._check_broker_destination()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    o      pg_catalog.jsonb := NEW.options;
    k      pg_catalog.text;
    known  pg_catalog.text[];
    cred   outbox.credentials%ROWTYPE;
    region pg_catalog.text;
    wanted pg_catalog.text;
BEGIN
    -- webhooks, and kinds the CHECK constraint refuses anyway
    IF NEW.kind OPERATOR(pg_catalog.<>) ALL (ARRAY['sns', 'sqs', 'rabbitmq']) THEN
        RETURN NEW;
    END IF;

    known := CASE NEW.kind
        WHEN 'sns' THEN ARRAY['topic_arn', 'region', 'fifo', 'message_group_key', 'batch_size', 'circuit_threshold']
        WHEN 'sqs' THEN ARRAY['queue_url', 'region', 'fifo', 'message_group_key', 'batch_size', 'circuit_threshold']
        ELSE ARRAY['vhost', 'exchange', 'routing_key', 'unroutable', 'circuit_threshold'] END;
    FOR k IN SELECT pg_catalog.jsonb_object_keys(o) LOOP
        IF NOT (k OPERATOR(pg_catalog.=) ANY (known)) THEN
            RAISE EXCEPTION 'unknown option "%" for a destination of kind %', k, NEW.kind
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = pg_catalog.format('Options of kind %s: %s.', NEW.kind,
                                               pg_catalog.array_to_string(known, ', '));
        END IF;
        wanted := CASE WHEN k OPERATOR(pg_catalog.=) 'fifo' THEN 'boolean'
                       WHEN k OPERATOR(pg_catalog.=) ANY (ARRAY['batch_size', 'circuit_threshold']) THEN 'number'
                       ELSE 'string' END;
        IF pg_catalog.jsonb_typeof(o OPERATOR(pg_catalog.->) k) OPERATOR(pg_catalog.<>) wanted THEN
            RAISE EXCEPTION 'option "%" of destination "%" has the wrong type', k, NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'fifo is a boolean, batch_size and circuit_threshold are numbers, the other options are strings.';
        END IF;
    END LOOP;

    IF NEW.credentials IS NULL THEN
        RAISE EXCEPTION 'a destination of kind % needs credentials', NEW.kind
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Insert a row into outbox.credentials and name it in the credentials column.';
    END IF;
    SELECT * INTO cred FROM outbox.credentials AS c WHERE c.name OPERATOR(pg_catalog.=) NEW.credentials;

    IF NEW.kind OPERATOR(pg_catalog.=) ANY (ARRAY['sns', 'sqs']) THEN
        IF cred.aws_access_key_id IS NULL THEN
            RAISE EXCEPTION 'credentials "%" have no AWS access key', NEW.credentials
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set aws_access_key_id and aws_secret_access_key in outbox.credentials.';
        END IF;
        -- libcurl 7.88 signs a query string unsorted: every parameter goes in the body
        IF pg_catalog.strpos(NEW.url, '?') OPERATOR(pg_catalog.>) 0 THEN
            RAISE EXCEPTION 'the url of an % destination must not have a query string', NEW.kind
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use the service endpoint, e.g. https://sqs.eu-west-1.amazonaws.com/.';
        END IF;
        IF NEW.kind OPERATOR(pg_catalog.=) 'sns' AND
           (o OPERATOR(pg_catalog.->>) 'topic_arn') IS NULL THEN
            RAISE EXCEPTION 'an sns destination needs the option topic_arn'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set options to e.g. {"topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders"}.';
        END IF;
        IF NEW.kind OPERATOR(pg_catalog.=) 'sns' AND
           (o OPERATOR(pg_catalog.->>) 'topic_arn') OPERATOR(pg_catalog.!~)
           '^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]+(\.fifo)?$' THEN
            RAISE EXCEPTION 'option topic_arn of destination "%" is not an SNS topic ARN', NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A topic ARN looks like arn:aws:sns:REGION:ACCOUNT:NAME (NAME ending in .fifo for a FIFO topic).';
        END IF;
        IF NEW.kind OPERATOR(pg_catalog.=) 'sqs' AND
           coalesce(o OPERATOR(pg_catalog.->>) 'queue_url', NEW.url) OPERATOR(pg_catalog.!~*)
           '^https?://[^/?#[:space:]]+/[0-9A-Za-z]+/[A-Za-z0-9_-]{1,80}(\.fifo)?$' THEN
            RAISE EXCEPTION 'destination "%" has no SQS queue URL', NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set the option queue_url to e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/orders.';
        END IF;
        region := coalesce(o OPERATOR(pg_catalog.->>) 'region',
                           NULLIF(pg_catalog.split_part(o OPERATOR(pg_catalog.->>) 'topic_arn', ':', 4), ''),
                           pg_catalog.substring(NEW.url, '^https?://[a-z0-9-]+\.([a-z0-9-]+)\.amazonaws\.com'));
        IF region IS NULL OR region OPERATOR(pg_catalog.!~) '^[a-z0-9-]{1,64}$' THEN
            RAISE EXCEPTION 'destination "%" has no AWS region', NEW.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set the option region, e.g. {"region": "eu-west-1"}; it is derived only from a topic ARN or an amazonaws.com endpoint.';
        END IF;
        IF (o OPERATOR(pg_catalog.->>) 'message_group_key') OPERATOR(pg_catalog.<>) ALL (ARRAY['aggregate_id', 'type', 'destination']) THEN
            RAISE EXCEPTION 'option message_group_key must be aggregate_id, type or destination'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (o OPERATOR(pg_catalog.->>) 'batch_size')::pg_catalog.numeric OPERATOR(pg_catalog.<>) ALL (ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]::pg_catalog.numeric[]) THEN
            RAISE EXCEPTION 'option batch_size must be an integer from 1 to 10'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'SNS PublishBatch and SQS SendMessageBatch take at most 10 entries; 1 sends every message on its own.';
        END IF;
    ELSE
        IF cred.username IS NULL THEN
            RAISE EXCEPTION 'credentials "%" have no user name and password', NEW.credentials
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Set username and password in outbox.credentials (a RabbitMQ user with the management tag).';
        END IF;
        IF (o OPERATOR(pg_catalog.->>) 'unroutable') OPERATOR(pg_catalog.<>) ALL (ARRAY['retry', 'dead']) THEN
            RAISE EXCEPTION 'option unroutable must be retry or dead'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF pg_catalog.length(coalesce(o OPERATOR(pg_catalog.->>) 'routing_key', '')) OPERATOR(pg_catalog.>) 255 THEN
            RAISE EXCEPTION 'option routing_key is longer than 255 bytes'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER destinations_check_broker
    BEFORE INSERT OR UPDATE ON outbox.destinations
    FOR EACH ROW EXECUTE FUNCTION outbox._check_broker_destination();



------------------------------------------------------------------------
-- Privileges: whatever the sections above created is not for PUBLIC
------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM PUBLIC;
