--
-- roles: the predefined roles outbox_writer, outbox_monitor and
-- outbox_admin -- what each may do and what it may not (42501)
--
\set VERBOSITY terse
-- created by the extension script, NOLOGIN, cluster-wide
SELECT rolname, rolcanlogin, rolsuper, rolinherit,
       ARRAY(SELECT b.rolname FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid
              WHERE m.member = r.oid ORDER BY 1) AS member_of
  FROM pg_roles r WHERE rolname LIKE 'outbox\_%' ORDER BY 1;

-- login roles that are members, as an administrator grants them
CREATE ROLE regress_outbox_w LOGIN IN ROLE outbox_writer;
CREATE ROLE regress_outbox_m LOGIN IN ROLE outbox_monitor;
CREATE ROLE regress_outbox_a LOGIN IN ROLE outbox_admin;
CREATE ROLE regress_outbox_pgm LOGIN IN ROLE pg_monitor;
CREATE ROLE regress_outbox_nobody_r LOGIN;
GRANT USAGE ON SCHEMA outbox, inbox TO regress_outbox_nobody_r;

--
-- Checks over every object that exists, so that objects a later section
-- of the script adds or replaces are covered too.
--
-- Nothing for PUBLIC but the text form of emit(), which requires EXECUTE
-- on the jsonb form (see "payload hint" below).
SELECT c.oid::regclass::text COLLATE "C" AS object, a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND a.grantee = 0
UNION ALL
SELECT p.oid::regprocedure::text, a.privilege_type
  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
 WHERE p.pronamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND a.grantee = 0
 ORDER BY 1, 2;

-- What holds payloads, headers, URLs, secrets or peers' error text: every
-- relation with such a column (tables and views), and the stores by name.
CREATE TEMP VIEW sensitive AS
SELECT c.oid::regclass AS relation
  FROM pg_class c
 WHERE c.relnamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
   AND (c.relname IN ('events', 'log', 'retries', 'dead_events', 'messages', 'claims',
                      'credentials', 'destinations', 'handlers')
        OR c.relname ~ '^log_[0-9]+$'
        OR EXISTS (SELECT FROM pg_attribute a
                    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                      AND a.attname IN ('payload', 'headers', 'url', 'last_error',
                                        'signing_secrets', 'bearer_token',
                                        'aws_secret_access_key', 'aws_session_token',
                                        'password')));
SELECT count(*) > 5 AS found_sensitive_relations FROM sensitive;

-- The writer and the monitors read none of them (not even a column).
SELECT r.rolname, s.relation
  FROM sensitive s,
       (VALUES ('outbox_writer'), ('outbox_monitor'), ('pg_monitor')) AS r(rolname)
 WHERE has_any_column_privilege(r.rolname, s.relation, 'SELECT');

-- The writer and the monitors change no relation; the admin changes
-- only the configuration.
SELECT r.rolname, c.oid::regclass::text AS relation, p.priv
  FROM pg_class c,
       (VALUES ('outbox_writer'), ('outbox_monitor'), ('pg_monitor'), ('outbox_admin')) AS r(rolname),
       (VALUES ('INSERT'), ('UPDATE'), ('DELETE'), ('TRUNCATE'), ('REFERENCES'), ('TRIGGER')) AS p(priv)
 WHERE c.relnamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
   AND (has_table_privilege(r.rolname, c.oid, p.priv)
        OR (p.priv IN ('INSERT', 'UPDATE', 'REFERENCES')
            AND has_any_column_privilege(r.rolname, c.oid, p.priv)))
 ORDER BY 1, c.oid::regclass::text COLLATE "C", 3;

-- What each role may read, and call (internal functions: only the two
-- count helpers outbox.destination_stats calls with the reader's rights).
SELECT r.rolname, string_agg(c.oid::regclass::text, ', ' ORDER BY c.oid::regclass::text COLLATE "C") AS may_select
  FROM pg_class c,
       (VALUES ('outbox_writer'), ('outbox_monitor'), ('pg_monitor'), ('outbox_admin')) AS r(rolname)
 WHERE c.relnamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
   AND has_any_column_privilege(r.rolname, c.oid, 'SELECT')
 GROUP BY 1 ORDER BY 1;
SELECT r.rolname, p.oid::regprocedure::text AS may_execute
  FROM pg_proc p,
       (VALUES ('outbox_writer'), ('outbox_monitor'), ('pg_monitor'), ('outbox_admin')) AS r(rolname)
 WHERE p.pronamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND has_function_privilege(r.rolname, p.oid, 'EXECUTE')
 ORDER BY 1, p.oid::regprocedure::text COLLATE "C";
SELECT r.rolname, p.oid::regprocedure AS internal
  FROM pg_proc p,
       (VALUES ('outbox_writer'), ('outbox_monitor'), ('pg_monitor'), ('outbox_admin')) AS r(rolname)
 WHERE p.pronamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
   AND p.proname LIKE '\_%'
   AND has_function_privilege(r.rolname, p.oid, 'EXECUTE')
 ORDER BY 1, p.oid::regprocedure::text COLLATE "C";
-- Every trigger that a write of the admin's fires reads or writes only
-- what the admin may, or runs with its owner's rights.
SELECT t.tgrelid::regclass::text AS relation, t.tgname, p.oid::regprocedure AS trigger_function
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid IN ('outbox.destinations'::regclass, 'outbox.routes'::regclass,
                     'outbox.credentials'::regclass)
   AND NOT t.tgisinternal
 ORDER BY t.tgrelid::regclass::text COLLATE "C", 2;

INSERT INTO outbox.destinations (name, url) VALUES ('roles-d', 'http://127.0.0.1:9/roles');
INSERT INTO outbox.routes (pattern, destination) VALUES ('roles.*', 'roles-d');
INSERT INTO outbox.destinations (name, url, options)
VALUES ('roles-ordered', 'http://127.0.0.1:9/ordered', '{"ordering": "aggregate"}');

--
-- outbox_writer
--
SET ROLE regress_outbox_w;
SELECT outbox.emit('roles.created', 'roles-1', '{"n": 1}') AS writer_event \gset
SELECT :'writer_event' IS NOT NULL AS can_emit;
SELECT outbox.emit('roles.created', 'roles-2', '{}', destination => 'audit') IS NOT NULL AS can_emit_to_destination;
SELECT inbox.claim('roles-m-1') AS can_claim;
SELECT inbox.receive('roles-m-2', 'roles.received', '{"n": 2}') AS can_receive;
-- its own event: known by the id emit() returned (nothing publishes in
-- this test, so it is not published within the timeout)
SELECT outbox.wait_published(:'writer_event', '0 s') AS own_event_published;
SELECT try($$SELECT outbox.wait_published(gen_random_uuid(), '0 s')$$) LIKE '42704:%' AS unknown_id_42704;
-- no reading of payloads, claims or configuration
SELECT try($$SELECT * FROM outbox.events$$);
SELECT try($$SELECT payload FROM outbox.log$$);
SELECT try($$SELECT payload FROM outbox.log_0$$);
SELECT try($$SELECT * FROM outbox.retries$$);
SELECT try($$SELECT * FROM outbox.dead_events$$);
SELECT try($$SELECT * FROM outbox.dead_letters()$$);
SELECT try($$SELECT * FROM inbox.messages$$);
SELECT try($$SELECT * FROM inbox.claims$$);
SELECT try($$SELECT url FROM outbox.destinations$$);
SELECT try($$SELECT * FROM outbox.credentials$$);
-- no changes to destinations, routes, events or claims
SELECT try($$INSERT INTO outbox.destinations (name, url) VALUES ('evil', 'http://127.0.0.1:9/')$$);
SELECT try($$UPDATE outbox.destinations SET url = 'http://127.0.0.1:9/evil'$$);
SELECT try($$INSERT INTO outbox.routes VALUES ('evil.*', 'audit')$$);
SELECT try($$DELETE FROM inbox.claims$$);
SELECT try($$SELECT outbox.pause('roles-d')$$);
SELECT try($$SELECT outbox.redrive(gen_random_uuid())$$);
-- no monitoring unless granted outbox_monitor too
SELECT try($$SELECT * FROM outbox.health()$$);
SELECT try($$SELECT * FROM outbox.destination_stats$$);

-- payload hint: a driver's untyped parameter resolves to emit()'s text
-- form, which parses the payload itself; a JavaScript array that the
-- driver sent as an array literal fails with a hint
PREPARE untyped AS SELECT outbox.emit($1, $2, $3);
SELECT parameter_types FROM pg_prepared_statements WHERE name = 'untyped';
EXECUTE untyped('roles.created', 'roles-3', '{"n": 3}') \gset untyped_
SELECT :'untyped_emit' IS NOT NULL AS emitted_untyped;
\set VERBOSITY default
EXECUTE untyped('roles.created', 'roles-4', '{1,2}');
EXECUTE untyped('roles.created', 'roles-4', '{"{\"n\":1}","{\"n\":2}"}');
EXECUTE untyped('roles.created', 'roles-4', 'plain text');
EXECUTE untyped('roles.created', 'roles-4', NULL);
-- the same for inbox.receive()
PREPARE untyped_receive AS SELECT inbox.receive($1, $2, $3);
SELECT parameter_types FROM pg_prepared_statements WHERE name = 'untyped_receive';
EXECUTE untyped_receive('roles-m-4', 'roles.received', '[1, 2]');
EXECUTE untyped_receive('roles-m-5', 'roles.received', '{1,2}');
DEALLOCATE untyped_receive;
-- a typed jsonb argument still reaches the jsonb form (and its errors)
SELECT outbox.emit('roles.created', 'roles-4', '{1,2}'::jsonb);
\set VERBOSITY terse
DEALLOCATE untyped;
RESET ROLE;
-- the text form grants nothing by itself
SET ROLE regress_outbox_nobody_r;
SELECT try($$SELECT outbox.emit('roles.created', 'roles-5', '{}'::text)$$);
SELECT try($$SELECT inbox.receive('roles-m-6', 'roles.received', '{}'::text)$$);
RESET ROLE;

--
-- outbox_monitor
--
SET ROLE regress_outbox_m;
SELECT status IS NOT NULL AS health FROM outbox.health();
SELECT outbox.metrics() LIKE '%outbox_%' AS metrics;
SELECT count(*) >= 0 AS workers FROM outbox.workers();
SELECT count(*) >= 0 AS destination_runtime FROM outbox.destination_runtime();
SELECT destination, pending, paused, circuit_state FROM outbox.destination_stats
 WHERE destination LIKE 'roles-%' ORDER BY 1;
SELECT type, pending FROM inbox.message_stats WHERE type LIKE 'roles.%';
-- no payloads
SELECT try($$SELECT payload FROM outbox.events$$);
SELECT try($$SELECT payload FROM outbox.log$$);
SELECT try($$SELECT payload FROM outbox.log_1$$);
SELECT try($$SELECT payload FROM outbox.retries$$);
SELECT try($$SELECT payload FROM outbox.dead_events$$);
SELECT try($$SELECT * FROM outbox.dead_letters()$$);
SELECT try($$SELECT payload FROM inbox.messages$$);
SELECT try($$SELECT * FROM outbox.blocked_aggregates$$);
-- no secrets, URLs or headers
SELECT try($$SELECT * FROM outbox.credentials$$);
SELECT try($$SELECT url FROM outbox.destinations$$);
SELECT try($$SELECT name FROM outbox.destinations$$);
SELECT try($$SELECT * FROM inbox.handlers$$);
-- no emitting, no operations
SELECT try($$SELECT outbox.emit('roles.created', 'roles-x', '{}')$$);
SELECT try($$SELECT outbox.pause('roles-d')$$);
SELECT try($$SELECT outbox.purge_dead(all_dead => true)$$);
SELECT try($$SELECT outbox._claim(10, '1 minute', 'roles-d')$$);
RESET ROLE;

-- pg_monitor, as since 0.2.0, can do what outbox_monitor can
SET ROLE regress_outbox_pgm;
SELECT status IS NOT NULL AS health FROM outbox.health();
SELECT count(*) > 0 AS stats FROM outbox.destination_stats;
SELECT type, pending FROM inbox.message_stats WHERE type LIKE 'roles.%';
SELECT try($$SELECT payload FROM outbox.events$$);
SELECT try($$SELECT payload FROM inbox.messages$$);
RESET ROLE;

--
-- outbox_admin
--
SET ROLE regress_outbox_a;
-- configuration, secrets included
INSERT INTO outbox.credentials (name, username, password) VALUES ('roles-c', 'u', 'p');
INSERT INTO outbox.destinations (name, url, signing_secrets)
VALUES ('roles-admin', 'http://127.0.0.1:9/admin', ARRAY['whsec_' || encode('0123456789abcdef0123456789abcdef', 'base64')]);
UPDATE outbox.destinations SET timeout_ms = 2000, url = 'http://127.0.0.1:9/admin2' WHERE name = 'roles-admin';
INSERT INTO outbox.routes (pattern, destination, priority) VALUES ('roles.admin.*', 'roles-admin', 10);
SELECT outbox.route('roles.admin.x') AS routed_to;
SELECT name, timeout_ms, signing_secrets IS NOT NULL AS has_secret FROM outbox.destinations
 WHERE name LIKE 'roles-%' ORDER BY 1;
SELECT name, username FROM outbox.credentials WHERE name = 'roles-c';
UPDATE outbox.credentials SET password = 'p2' WHERE name = 'roles-c';
-- operations
SELECT outbox.pause('roles-d') AS paused, outbox.resume('roles-d') AS resumed;
SELECT count(*) AS dead_letters FROM outbox.dead_letters(destination => 'roles-d');
SELECT outbox.redrive_dead(destination => 'roles-d') AS redriven,
       outbox.purge_dead(destination => 'roles-d') AS purged;
SELECT try($$SELECT outbox.redrive(gen_random_uuid())$$) LIKE '42704:%' AS redrive_ran;
SELECT outbox.release_aggregate('roles-ordered', 'agg-1') AS released;
SELECT destination, aggregate_id, released_by FROM outbox.aggregate_releases;
SELECT count(*) AS blocked FROM outbox.blocked_aggregates;
SELECT try($$SELECT inbox.redrive('roles-none')$$);
SELECT try($$SELECT inbox.purge('roles-none')$$);
-- and what a monitor sees
SELECT status IS NOT NULL AS health FROM outbox.health();
SELECT count(*) > 0 AS stats FROM outbox.destination_stats;
DELETE FROM outbox.routes WHERE pattern = 'roles.admin.*';
DELETE FROM outbox.destinations WHERE name = 'roles-admin';
DELETE FROM outbox.credentials WHERE name = 'roles-c';
-- not the application's part, the events themselves, handlers or internals
SELECT try($$SELECT outbox.emit('roles.created', 'roles-y', '{}')$$);
SELECT try($$SELECT inbox.claim('roles-m-3')$$);
SELECT try($$SELECT payload FROM outbox.events$$);
SELECT try($$SELECT payload FROM outbox.log_2$$);
SELECT try($$UPDATE outbox.retries SET due_at = now()$$);
SELECT try($$SELECT * FROM inbox.messages$$);
SELECT count(*) AS handlers FROM inbox.handlers;
SELECT try($$INSERT INTO inbox.handlers (pattern, function) VALUES ('x', 'pg_catalog.now()'::regprocedure)$$);
SELECT try($$SELECT inbox.register_handler('roles.*', 'pg_catalog.now()')$$);
SELECT try($$SELECT outbox._rotate_log('1 hour')$$);
SELECT try($$TRUNCATE outbox.routes$$);
RESET ROLE;

-- what the writer's calls stored (the text forms store the same jsonb)
SELECT aggregate_id, destination, payload FROM outbox.events
 WHERE aggregate_id LIKE 'roles-%' ORDER BY aggregate_id;
SELECT id, payload FROM inbox.messages WHERE id LIKE 'roles-%' ORDER BY id;

--
-- A second database: CREATE EXTENSION finds the roles and grants to them
-- there; DROP EXTENSION leaves them.  An existing role that can log in
-- is used, with a warning.
--
\set regress_db :DBNAME
CREATE DATABASE regress_outbox_roles;
ALTER ROLE outbox_monitor LOGIN;
\c regress_outbox_roles
CREATE EXTENSION outbox_pg;
SELECT has_function_privilege('outbox_writer', 'outbox.emit(text, text, jsonb, text, text, jsonb, text, timestamptz)', 'EXECUTE') AS writer_emits,
       has_table_privilege('outbox_admin', 'outbox.destinations', 'INSERT') AS admin_configures,
       has_table_privilege('outbox_monitor', 'outbox.destination_stats', 'SELECT') AS monitor_reads_stats;
DROP EXTENSION outbox_pg;
SELECT count(*) AS roles_left FROM pg_roles WHERE rolname IN ('outbox_writer', 'outbox_monitor', 'outbox_admin');
\c :regress_db
ALTER ROLE outbox_monitor NOLOGIN;
DROP DATABASE regress_outbox_roles;
-- the grants of this database still hold the roles
SELECT try($$DROP ROLE outbox_writer$$) LIKE '2BP01:%' AS writer_still_in_use;

DELETE FROM outbox.routes WHERE pattern = 'roles.*';
DELETE FROM outbox.destinations WHERE name IN ('roles-d', 'roles-ordered');
REVOKE USAGE ON SCHEMA outbox, inbox FROM regress_outbox_nobody_r;
DROP ROLE regress_outbox_w, regress_outbox_m, regress_outbox_a, regress_outbox_pgm, regress_outbox_nobody_r;
