--
-- classify: every kind's reading of an answer, on a table of statuses and
-- bodies (outbox._classify runs the kind's classify on a synthetic answer;
-- status 0 is no answer at all).  Columns: the outcome per message, the
-- error as the kind wrote it, and whether the destination itself failed
-- (what the circuit breaker counts).
--

-- webhook: 2xx acknowledges; 3xx and other 4xx are permanent; 408, 429
-- and 5xx retry and count against the destination; no answer retries
SELECT s.status, c.outcome, c.error, c.destination_failed
  FROM (VALUES (200, ''), (204, ''), (302, 'moved'), (400, 'bad payload'),
               (404, ''), (408, ''), (429, 'slow down'), (500, 'oops'),
               (503, ''), (0, '')) AS s(status, body),
       LATERAL outbox._classify('webhook', s.status, s.body) AS c
 ORDER BY s.status;
-- a webhook batch (options.batch): the answer is every event's
SELECT * FROM outbox._classify('webhook', 204, '', ARRAY['a', 'b', 'c']);
SELECT * FROM outbox._classify('webhook', 503, 'busy', ARRAY['a', 'b']);
SELECT * FROM outbox._classify('webhook', 400, 'bad batch', ARRAY['a', 'b']);

-- SNS: Publish (one message) and PublishBatch (several)
SELECT * FROM outbox._classify('sns', 200,
    '<PublishResponse><PublishResult><MessageId>x</MessageId></PublishResult></PublishResponse>');
SELECT * FROM outbox._classify('sns', 200, 'not xml at all');
-- a batch with one success, a sender fault, a service fault, a throttled
-- sender fault, and one entry the answer forgot
SELECT * FROM outbox._classify('sns', 200,
    '<PublishBatchResponse><PublishBatchResult><Successful><member><Id>a</Id><MessageId>1</MessageId></member></Successful>'
    '<Failed><member><Id>b</Id><Code>InvalidParameter</Code><Message>bad &amp; wrong</Message><SenderFault>true</SenderFault></member>'
    '<member><Id>c</Id><Code>InternalError</Code><Message>try later</Message><SenderFault>false</SenderFault></member>'
    '<member><Id>d</Id><Code>Throttling</Code><Message>slow</Message><SenderFault>true</SenderFault></member></Failed>'
    '</PublishBatchResult></PublishBatchResponse>',
    ARRAY['a', 'b', 'c', 'd', 'e']);
SELECT * FROM outbox._classify('sns', 200, '<html>garbage</html>', ARRAY['a', 'b']);
-- errors for the whole request: throttling and credentials retry (the
-- destination's failure), a bad request is the messages' fault
SELECT * FROM outbox._classify('sns', 400,
    '<ErrorResponse><Error><Code>Throttling</Code><Message>Rate exceeded</Message></Error></ErrorResponse>',
    ARRAY['a', 'b']);
SELECT * FROM outbox._classify('sns', 403,
    '<ErrorResponse><Error><Code>InvalidClientTokenId</Code><Message>no such key</Message></Error></ErrorResponse>');
SELECT * FROM outbox._classify('sns', 400,
    '<ErrorResponse><Error><Code>InvalidParameter</Code><Message>Message too long</Message></Error></ErrorResponse>');
SELECT * FROM outbox._classify('sns', 0, '', ARRAY['a', 'b']);

-- SQS: SendMessage and SendMessageBatch
SELECT * FROM outbox._classify('sqs', 200, '{"MessageId": "m-1", "MD5OfMessageBody": "x"}');
SELECT * FROM outbox._classify('sqs', 200, '{"Nothing": true}');
SELECT * FROM outbox._classify('sqs', 200,
    '{"Successful": [{"Id": "a", "MessageId": "1"}],
      "Failed": [{"Id": "b", "Code": "InvalidMessageContents", "Message": "bad", "SenderFault": true},
                 {"Id": "c", "Code": "InternalError", "Message": "later", "SenderFault": false}]}',
    ARRAY['a', 'b', 'c', 'd']);
SELECT * FROM outbox._classify('sqs', 200, '{"Successful": [', ARRAY['a', 'b']);
SELECT * FROM outbox._classify('sqs', 400,
    '{"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "The specified queue does not exist."}');
SELECT * FROM outbox._classify('sqs', 400,
    '{"__type": "com.amazonaws.sqs#InvalidParameterValue", "message": "bad value"}');
SELECT * FROM outbox._classify('sqs', 500, '<html>proxy error</html>');

-- RabbitMQ: only routed true acknowledges; routed false retries (the
-- default: a binding added later recovers it); configuration problems
-- count against the destination
SELECT s.status, s.body, c.outcome, c.error, c.destination_failed
  FROM (VALUES (200, '{"routed":true}'), (200, '{"routed": false}'),
               (200, '{}'), (401, '{"error":"not_authorised"}'),
               (404, '{"error":"Object Not Found"}'),
               (400, '{"error":"bad_request","reason":"NOT_FOUND - no exchange"}'),
               (400, '{"error":"bad_request","reason":"payload_encoding"}'),
               (503, '')) AS s(status, body),
       LATERAL outbox._classify('rabbitmq', s.status, s.body) AS c
 ORDER BY s.status, s.body;

-- mistakes
SELECT try($$SELECT * FROM outbox._classify('kinesis', 200, '')$$);
SELECT try($$SELECT * FROM outbox._classify('rabbitmq', 200, '', ARRAY['a', 'b'])$$);
SELECT try($$SELECT * FROM outbox._classify('sqs', 200, '', ARRAY[]::text[])$$);
SELECT try($$SELECT * FROM outbox._classify('sqs', NULL, '')$$);
