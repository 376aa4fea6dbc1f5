--
-- brokers_config: broker destinations are validated when written, and
-- their credentials are readable by privileged roles only
--
INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key)
VALUES ('regress_aws', 'AKIDREGRESS', 'regress/secret+key=');
INSERT INTO outbox.credentials (name, username, password)
VALUES ('regress_rmq', 'outbox', 'regress-password');

-- half a key pair, a user without a password, nothing at all
SELECT try($$INSERT INTO outbox.credentials (name, aws_access_key_id) VALUES ('x', 'AKID')$$);
SELECT try($$INSERT INTO outbox.credentials (name, username) VALUES ('x', 'u')$$);
SELECT try($$INSERT INTO outbox.credentials (name) VALUES ('x')$$);
SELECT try($$INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key) VALUES ('x', 'AKID', 'has space')$$);

-- valid destinations of each kind; the region comes from the ARN or the host
INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES
    ('regress_sns', 'sns', 'https://sns.eu-west-1.amazonaws.com/', 'regress_aws',
     '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:orders.fifo", "message_group_key": "type"}'),
    ('regress_sqs', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/', 'regress_aws',
     '{"queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/billing", "batch_size": 5}'),
    ('regress_sqs_local', 'sqs', 'http://127.0.0.1:9324/', 'regress_aws',
     '{"queue_url": "http://127.0.0.1:9324/000000000000/q.fifo", "region": "us-east-1", "fifo": true}'),
    ('regress_rmq', 'rabbitmq', 'http://127.0.0.1:15672', 'regress_rmq',
     '{"exchange": "events", "routing_key": "{type}.{aggregate_id}", "unroutable": "dead"}');

-- each mistake is named
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/', '{"queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/', 'regress_rmq', '{"queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'rabbitmq', 'http://127.0.0.1:15672', 'regress_aws', '{}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sns', 'https://sns.eu-west-1.amazonaws.com/', 'regress_aws', '{}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sns', 'https://sns.eu-west-1.amazonaws.com/', 'regress_aws', '{"topic_arn": "orders"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/?Action=SendMessage', 'regress_aws', '{"queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'http://127.0.0.1:9324/', 'regress_aws', '{"queue_url": "http://127.0.0.1:9324/1/q"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'http://127.0.0.1:9324/', 'regress_aws', '{"region": "us-east-1"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'regress_aws', '{"batch_size": 0}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'regress_aws', '{"batch_size": "10"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'regress_aws', '{"message_group_key": "payload"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/1/q', 'regress_aws', '{"topic_arn": "arn:aws:sns:eu-west-1:123456789012:t"}')$$);
SELECT try($$INSERT INTO outbox.destinations (name, kind, url, credentials, options) VALUES ('x', 'rabbitmq', 'http://127.0.0.1:15672', 'regress_rmq', '{"unroutable": "drop"}')$$);
SELECT try($$UPDATE outbox.destinations SET options = options - 'topic_arn' WHERE name = 'regress_sns'$$);
-- a referenced credential cannot be deleted
SELECT try($$DELETE FROM outbox.credentials WHERE name = 'regress_aws'$$);

-- application and monitoring roles never see secrets
CREATE ROLE regress_broker_app;
GRANT USAGE ON SCHEMA outbox, inbox TO regress_broker_app;
SET ROLE regress_broker_app;
SELECT try($$SELECT aws_secret_access_key FROM outbox.credentials$$);
SELECT try($$SELECT password FROM outbox.credentials$$);
RESET ROLE;
REVOKE USAGE ON SCHEMA outbox, inbox FROM regress_broker_app;
DROP ROLE regress_broker_app;

DELETE FROM outbox.destinations WHERE name LIKE 'regress\_%';
DELETE FROM outbox.credentials WHERE name LIKE 'regress\_%';
