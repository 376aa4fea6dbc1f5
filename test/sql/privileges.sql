--
-- privileges: an application role gets emit() and claim() and nothing else
--
CREATE ROLE regress_outbox_app;
CREATE ROLE regress_outbox_nobody;
-- schema usage alone does not allow calling anything
GRANT USAGE ON SCHEMA outbox, inbox TO regress_outbox_nobody;
GRANT USAGE ON SCHEMA outbox, inbox TO regress_outbox_app;
GRANT EXECUTE ON FUNCTION
    outbox.emit(text, text, jsonb, text, text, jsonb, text, timestamptz),
    inbox.claim(text, text, interval)
    TO regress_outbox_app;

SET ROLE regress_outbox_app;
SELECT outbox.emit('payment.created', 'priv-1', '{"amount": 1}') IS NOT NULL AS can_emit;
SELECT outbox.emit('payment.created', 'priv-2', '{}', destination => 'audit') IS NOT NULL AS can_emit_to_destination;
-- an untyped parameter (what drivers send) resolves to emit()'s text
-- form, for which EXECUTE on the jsonb form is the grant too
PREPARE priv_untyped AS SELECT outbox.emit($1, $2, $3) IS NOT NULL AS can_emit_untyped;
EXECUTE priv_untyped('payment.created', 'priv-4', '{"amount": 4}');
DEALLOCATE priv_untyped;
SELECT inbox.claim('priv-m-1') AS can_claim;
SELECT inbox.claim('priv-m-1') AS claim_dedupes;
SELECT try($$SELECT * FROM outbox.events$$);
SELECT try($$SELECT * FROM outbox.destinations$$);
SELECT try($$SELECT bearer_token FROM outbox.destinations$$);
SELECT try($$SELECT * FROM inbox.claims$$);
SELECT try($$INSERT INTO outbox.routes VALUES ('evil.*', 'audit')$$);
SELECT try($$UPDATE outbox.events SET status = 'published'$$);
SELECT try($$DELETE FROM inbox.claims$$);
SELECT try($$SELECT outbox.route('payment.created')$$);
SELECT try($$SELECT * FROM outbox._lease(10, '1 minute', 'audit')$$);
SELECT try($$SELECT outbox._ack(ARRAY[gen_random_uuid()], ARRAY[200])$$);
-- search_path tricks do not reach the SECURITY DEFINER claim
RESET ROLE;
CREATE SCHEMA regress_evil AUTHORIZATION regress_outbox_app;
SET ROLE regress_outbox_app;
CREATE TABLE regress_evil.claims (consumer text, message_id text, claimed_at timestamptz, expires_at timestamptz);
SET search_path = regress_evil, public;
SELECT inbox.claim('priv-m-2') AS claimed;
SELECT count(*) AS evil_rows FROM regress_evil.claims;
RESET search_path;
RESET ROLE;

SET ROLE regress_outbox_nobody;
SELECT try($$SELECT outbox.emit('payment.created', 'priv-3', '{}')$$);
SELECT try($$SELECT inbox.claim('priv-m-3')$$);
RESET ROLE;

SELECT aggregate_id, destination FROM outbox.events
 WHERE aggregate_id LIKE 'priv-%' ORDER BY id;
SELECT message_id FROM inbox.claims WHERE message_id LIKE 'priv-%' ORDER BY 1;

DROP SCHEMA regress_evil CASCADE;
REVOKE ALL ON SCHEMA outbox, inbox FROM regress_outbox_app, regress_outbox_nobody;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM regress_outbox_app;
DROP ROLE regress_outbox_app;
DROP ROLE regress_outbox_nobody;
