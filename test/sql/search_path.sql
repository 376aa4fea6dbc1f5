--
-- search_path: an administrator whose search_path puts a hostile role's
-- schema first calls every function of the extension, reads its views and
-- fires its triggers; nothing may resolve to the hostile schema.
--
-- The hostile schema shadows the functions, aggregates, operators and type
-- names the extension's SQL uses, each recording its call in a table (a
-- sequence counts calls in rolled-back subtransactions too).  With
-- search_path = hostile, pg_catalog, public every unqualified name of the
-- same signature resolves to hostile, and so does any more specific
-- signature (e.g. array_to_string(text[], text) over anyarray).
-- BEGIN hostile schema (test/t/027_relay_search_path.pl builds the same)
CREATE ROLE regress_hostile;
CREATE SCHEMA hostile AUTHORIZATION regress_hostile;
GRANT USAGE ON SCHEMA hostile TO PUBLIC;
CREATE TABLE hostile.hits (fn pg_catalog.text);
CREATE SEQUENCE hostile.hit_count;
GRANT INSERT ON hostile.hits TO PUBLIC;
GRANT USAGE ON SEQUENCE hostile.hit_count TO PUBLIC;

CREATE FUNCTION hostile.hit(fn pg_catalog.text) RETURNS pg_catalog.bool
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_catalog.nextval('hostile.hit_count');
    INSERT INTO hostile.hits VALUES (fn);
    RETURN true;
END
$$;

-- a wrapper for every non-polymorphic, non-variadic pg_catalog function of
-- these names, and for every binary operator of these names on ordinary
-- types
DO $$
DECLARE
    p record;
    n int := 0;
    args text;
BEGIN
    FOR p IN
        SELECT f.oid, f.proname, f.pronargs,
               pg_catalog.oidvectortypes(f.proargtypes) AS argtypes,
               pg_catalog.format_type(f.prorettype, NULL) AS rettype
          FROM pg_catalog.pg_proc AS f
         WHERE f.pronamespace = 'pg_catalog'::regnamespace
           AND f.prokind = 'f' AND NOT f.proretset AND f.provariadic = 0
           AND f.proname = ANY (ARRAY[
               'now', 'clock_timestamp', 'statement_timestamp', 'transaction_timestamp',
               'lower', 'upper', 'length', 'char_length', 'octet_length', 'replace',
               'strpos', 'split_part', 'substring', 'substr', 'left', 'right',
               'regexp_replace', 'regexp_match', 'array_length', 'cardinality',
               'jsonb_typeof', 'jsonb_extract_path_text', 'to_jsonb', 'to_char',
               'date_part', 'date_trunc', 'timezone', 'floor', 'ceil', 'round', 'abs',
               'current_setting', 'set_config', 'pg_has_role', 'has_function_privilege',
               'pg_get_userbyid', 'format', 'md5', 'encode', 'decode',
               'gen_random_uuid', 'nextval', 'current_database', 'pg_backend_pid',
               'textcat', 'texteq', 'uuid_eq', 'jsonb_object_field_text', 'int4pl',
               'interval_pl', 'timestamptz_pl_interval', 'timestamptz_mi',
               'pg_notify', 'txid_current', 'version', 'int8', 'int4', 'float8',
               'text', 'numeric', 'uuid', 'bool'])
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(f.proargtypes::oid[] || f.prorettype) AS t(oid)
                             JOIN pg_catalog.pg_type AS ty ON ty.oid = t.oid
                            WHERE ty.typtype = 'p')
    LOOP
        SELECT pg_catalog.string_agg('$' || i, ', ') INTO args
          FROM pg_catalog.generate_series(1, p.pronargs) AS i;
        EXECUTE pg_catalog.format(
            'CREATE FUNCTION hostile.%I(%s) RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog '
            'AS $f$ BEGIN PERFORM hostile.hit(%L); RETURN pg_catalog.%I(%s); END $f$',
            p.proname, p.argtypes, p.rettype, p.proname, p.proname, coalesce(args, ''));
        n := n + 1;
    END LOOP;
    RAISE NOTICE 'hostile functions: % or more', CASE WHEN n > 100 THEN 100 ELSE n END;

    n := 0;
    FOR p IN
        SELECT o.oprname, o.oprleft::regtype AS l, o.oprright::regtype AS r,
               o.oprresult::regtype AS res, f.proname
          FROM pg_catalog.pg_operator AS o
          JOIN pg_catalog.pg_proc AS f ON f.oid = o.oprcode
         WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprkind = 'b'
           AND o.oprname = ANY (ARRAY['=', '<>', '<', '>', '<=', '>=', '||', '~', '~*',
                                      '!~', '!~*', '->>', '->', '+', '-', '@>', '?'])
           AND o.oprleft = ANY ('{text,uuid,jsonb,timestamptz,interval,int4,int8,bool,float8,numeric,name,text[]}'::regtype[])
           AND o.oprright = ANY ('{text,uuid,jsonb,timestamptz,interval,int4,int8,bool,float8,numeric,name,text[]}'::regtype[])
    LOOP
        n := n + 1;
        EXECUTE pg_catalog.format(
            'CREATE FUNCTION hostile.op_%s(%s, %s) RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog '
            'AS $f$ BEGIN PERFORM hostile.hit(%L); RETURN pg_catalog.%I($1, $2); END $f$',
            n, p.l, p.r, p.res, 'operator ' || p.oprname, p.proname);
        EXECUTE pg_catalog.format(
            'CREATE OPERATOR hostile.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = hostile.op_%s)',
            p.oprname, p.l, p.r, n);
    END LOOP;
    RAISE NOTICE 'hostile operators: % or more', CASE WHEN n > 50 THEN 50 ELSE n END;
END
$$;

-- more specific signatures than pg_catalog's polymorphic or variadic ones
CREATE FUNCTION hostile.array_to_string(a text[], sep text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('array_to_string'); RETURN pg_catalog.array_to_string(a, sep); END $$;
CREATE FUNCTION hostile.unnest(a text[]) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('unnest'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$;
CREATE FUNCTION hostile.unnest(a uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('unnest'); RETURN QUERY SELECT pg_catalog.unnest(a); END $$;
CREATE FUNCTION hostile.jsonb_build_object(k text, v text) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('jsonb_build_object'); RETURN pg_catalog.jsonb_build_object(k, v); END $$;
CREATE FUNCTION hostile.jsonb_object_keys(j jsonb) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('jsonb_object_keys'); RETURN QUERY SELECT pg_catalog.jsonb_object_keys(j); END $$;
CREATE FUNCTION hostile.format(f text, a text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('format'); RETURN pg_catalog.format(f, a); END $$;
CREATE FUNCTION hostile.count_step(s int8) RETURNS int8
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('count'); RETURN s + 1; END $$;
CREATE AGGREGATE hostile.count(*) (SFUNC = hostile.count_step, STYPE = int8, INITCOND = '0');
CREATE FUNCTION hostile.ts_step(s timestamptz, v timestamptz) RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('min/max'); RETURN coalesce(s, v); END $$;
CREATE AGGREGATE hostile.min(timestamptz) (SFUNC = hostile.ts_step, STYPE = timestamptz);
CREATE AGGREGATE hostile.max(timestamptz) (SFUNC = hostile.ts_step, STYPE = timestamptz);
CREATE FUNCTION hostile.sum_step(s int8, v int8) RETURNS int8
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$ BEGIN PERFORM hostile.hit('sum'); RETURN coalesce(s, 0) + v; END $$;
CREATE AGGREGATE hostile.sum(int8) (SFUNC = hostile.sum_step, STYPE = int8);
-- type names: domains whose check records the cast
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['text', 'uuid', 'jsonb', 'int4', 'int8', 'float8', 'interval',
                             'timestamptz', 'bool', 'numeric', 'regclass', 'regtype']
    LOOP
        EXECUTE pg_catalog.format('CREATE DOMAIN hostile.%I AS pg_catalog.%I CHECK (hostile.hit(%L))',
                                  t, t, 'type ' || t);
    END LOOP;
END
$$;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS f FROM pg_catalog.pg_proc AS p
              WHERE p.pronamespace = 'hostile'::regnamespace LOOP
        EXECUTE pg_catalog.format('ALTER ROUTINE %s OWNER TO regress_hostile', r.f);
    END LOOP;
END
$$;
-- END hostile schema

-- what the calls below work on
INSERT INTO outbox.credentials (name, aws_access_key_id, aws_secret_access_key)
VALUES ('hp_c', 'AKIDHP', 'hp-secret');
INSERT INTO outbox.destinations (name, url, options)
VALUES ('hp_d', 'http://127.0.0.1:9/hp', '{"ordering": "aggregate"}');
INSERT INTO outbox.routes (pattern, destination) VALUES ('hp.*', 'hp_d');
CREATE FUNCTION public.hp_handler(m inbox.messages) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SET track_functions = 'all';

-- the hostile administrator's session
SET search_path = hostile, pg_catalog, public;
-- the trap works: an unqualified call in this session is hostile's
SELECT lower('CONTROL') AS control;
SELECT outbox.emit('hp.t', 'a1', '{"k": 1}', headers => '{"x-h": "v"}',
                   traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01') IS NOT NULL AS emitted;
SELECT outbox.emit('hp.t', 'a1', '{"k": 2}', destination => 'hp_d') AS second_id \gset
SELECT outbox.emit('hp.u', 'a2', '{}', not_before => '2000-01-01') IS NOT NULL AS unrouted;
SELECT outbox.emit('hp.t', 'a1', '{"k": 3}'::pg_catalog.jsonb) IS NOT NULL AS emitted_jsonb;
SELECT outbox.route('hp.t') AS routed;
SELECT outbox._route_pending() AS newly_routed;
SELECT id AS leased_id, seq AS leased_seq FROM outbox._claim(1, '30 s', 'hp_d') \gset
SELECT outbox._claim_ack('hp_d', :leased_seq, ARRAY[:'leased_id']::pg_catalog.uuid[],
                         ARRAY[pg_catalog.now()], ARRAY[1], ARRAY[503], ARRAY['unavailable']) AS retried;
SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 AS leased_again
  FROM outbox._retries_lease(10, '30 s', 'hp_d');
SELECT outbox._retries_dead(ARRAY[:'leased_id']::pg_catalog.uuid[], ARRAY[400], ARRAY['bad request']) AS dead;
SELECT outbox.release_aggregate('hp_d', 'a1') AS released;
SELECT id IS NOT NULL AS leased_second, seq AS second_seq FROM outbox._claim(1, '30 s', 'hp_d') \gset
SELECT :'leased_second' AS leased_second, outbox._claim_ack('hp_d', :second_seq) AS acked;
SELECT outbox.wait_published(:'second_id', '0 s') AS published;
-- the view outbox.events: INSERT writes the log, UPDATE is refused
INSERT INTO outbox.events (type, payload, destination) VALUES ('hp.view', '{}', 'hp_d')
RETURNING status, destination;
UPDATE outbox.events SET attempts = 0 WHERE type OPERATOR(pg_catalog.=) 'hp.view';
-- the insert-only store (issue #21)
INSERT INTO outbox.log_0 (id, xid, type, payload, destination, created_at)
VALUES (pg_catalog.gen_random_uuid(), pg_catalog.pg_current_xact_id(), 'hp.log', '{}', 'hp_d',
        pg_catalog.now());
SELECT type, seq AS claimed_seq FROM outbox._claim(10, '0 s', 'hp_d');
SELECT type, seq AS recovered_seq FROM outbox._claim_recover('30 s', 'hp_d');
SELECT outbox._claim_ack('hp_d',
                         (SELECT pg_catalog.max(b.seq) FROM outbox.batches AS b
                           WHERE b.destination OPERATOR(pg_catalog.=) 'hp_d'),
                         ARRAY(SELECT id FROM outbox.log_0 WHERE type OPERATOR(pg_catalog.=) 'hp.log'),
                         ARRAY[pg_catalog.now()], ARRAY[1], ARRAY[503], ARRAY['unavailable']) AS claim_acked;
SELECT outbox._snapshot_cut('10:20:12,15', '14') AS cut;
SELECT outbox._move_events_0_3() AS moved_from_0_3;
SELECT outbox._log_undelivered(id, destination, xid) AS undelivered
  FROM outbox.log_0 WHERE type OPERATOR(pg_catalog.=) 'hp.log';
SELECT outbox._rotate_log('1 day') AS rotation;
SELECT outbox._trim_batches() OPERATOR(pg_catalog.>=) 0 AS trimmed;
SELECT id IS NOT NULL AS retry_leased FROM outbox._retries_lease(10, '30 s', 'hp_d');
SELECT outbox._retries_retry(ARRAY(SELECT id FROM outbox.retries WHERE type OPERATOR(pg_catalog.=) 'hp.log'),
                             ARRAY[pg_catalog.now()], ARRAY[503], ARRAY['unavailable']) AS retry_retried;
SELECT outbox._retries_dead(ARRAY(SELECT id FROM outbox.retries WHERE type OPERATOR(pg_catalog.=) 'hp.log'),
                            ARRAY[400], ARRAY['bad request']) AS retry_dead;
SELECT outbox._retries_ack(ARRAY(SELECT id FROM outbox.dead_events WHERE type OPERATOR(pg_catalog.=) 'hp.log'))
       AS retry_acked;
SELECT pg_catalog.cardinality(reasons) OPERATOR(pg_catalog.>=) 0 AS health FROM outbox.health();
SELECT pg_catalog.length(outbox.metrics()) OPERATOR(pg_catalog.>) 0 AS metrics;
SELECT id IS NOT NULL AS dead_letter FROM outbox.dead_letters(destination => 'hp_d');
SELECT outbox.redrive(:'leased_id') AS redriven;
SELECT outbox._retries_dead(ARRAY[:'leased_id']::pg_catalog.uuid[], ARRAY[400], ARRAY['bad request']) AS dead;
SELECT outbox.redrive_dead(destination => 'hp_d') AS redriven;
SELECT outbox._retries_dead(ARRAY[:'leased_id']::pg_catalog.uuid[], ARRAY[400], ARRAY['bad request']) AS dead;
SELECT outbox.purge_dead(type => 'hp.*') AS purged;
SELECT outbox.pause('hp_d'), outbox.resume('hp_d');
SELECT outbox.backoff_delay(3, 1000, 60000, 0.5) AS delay;
SELECT outcome, destination_failed FROM outbox._classify('webhook', 503, 'busy');
SELECT outbox._glob_to_like('hp_*') AS like_pattern, outbox._prom_label('a"b') AS label;
SELECT outbox._wake();
SELECT outbox._sanitize_peer_text('\x1b5b316d6869'::pg_catalog.bytea, 64) AS sanitized;
SELECT outbox._host_allowed('http://user@127.0.0.1:8080/', '127.0.0.1') AS host_refusal;
SELECT preloaded FROM outbox._relay_presence();
SELECT state IS NULL OR checked_at IS NOT NULL AS rotation_known FROM outbox._log_rotation();
SELECT pid IS NULL AS no_relay FROM outbox.workers() LIMIT 0;
SELECT destination FROM outbox.destination_runtime() LIMIT 0;
SELECT destination, pending, dead FROM outbox.destination_stats
 WHERE destination OPERATOR(pg_catalog.=) 'hp_d';
SELECT destination FROM outbox._destination_backlog LIMIT 0;
SELECT aggregate_id FROM outbox.blocked_aggregates;
SELECT inbox.claim('hp-1', 'c1', '2 days') AS claimed, inbox.claim('hp-1', 'c1') AS again;
SELECT inbox.register_handler('hp.*', 'public.hp_handler(inbox.messages)', max_attempts => 3);
SELECT (inbox.handler_for('hp.t')).pattern AS handler;
SELECT inbox._pattern_matches('hp.*', 'hp.t') AS matches;
SELECT inbox.receive('hp-m1', 'hp.t', '{}', 'a1', '{"x": "y"}', 'src') AS received;
SELECT inbox.receive('hp-m2', 'hp.t', '{}') AS received;
SELECT inbox.receive('hp-m3', 'hp.t', '{}'::pg_catalog.jsonb) AS received_jsonb;
SELECT id FROM inbox._lease(10, '30 s') ORDER BY 1;
UPDATE inbox.messages SET status = 'dead' WHERE id OPERATOR(pg_catalog.=) ANY (ARRAY['hp-m1', 'hp-m2']);
SELECT inbox.redrive('hp-m1'), inbox.purge('hp-m2');
SELECT type, pending FROM inbox.message_stats ORDER BY 1;
SELECT inbox.unregister_handler('hp.*');
-- the triggers of the configuration tables
INSERT INTO outbox.destinations (name, kind, url, credentials, options, headers)
VALUES ('hp_sqs', 'sqs', 'https://sqs.eu-west-1.amazonaws.com/', 'hp_c',
        '{"queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/hp", "batch_size": 5}',
        '{"x-h": "v"}');
UPDATE outbox.destinations SET timeout_ms = 5000 WHERE name OPERATOR(pg_catalog.=) 'hp_sqs';
UPDATE outbox.credentials SET name = 'hp_c2' WHERE name OPERATOR(pg_catalog.=) 'hp_c';
SELECT outbox._check_destination('hp_sqs') AS checked;
UPDATE outbox.routes SET priority = 5 WHERE pattern OPERATOR(pg_catalog.=) 'hp.*';
INSERT INTO inbox.handlers (pattern, function) VALUES ('hp2.*', 'public.hp_handler(inbox.messages)');
DELETE FROM inbox.handlers WHERE pattern OPERATOR(pg_catalog.=) 'hp2.*';
RESET search_path;

-- nothing but the control ran hostile code
SELECT fn, count(*) FROM hostile.hits GROUP BY fn ORDER BY fn;
SELECT last_value AS hostile_calls FROM hostile.hit_count;

-- and every function of the extension was called above
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT p.oid::regprocedure AS not_called
  FROM pg_proc AS p
  JOIN pg_depend AS d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox_pg')
   AND coalesce((SELECT s.calls FROM pg_stat_user_functions AS s WHERE s.funcid = p.oid), 0) = 0
   -- the view's UPDATE/DELETE trigger always raises, so it is never counted
   AND p.oid <> 'outbox._events_refuse()'::regprocedure
 ORDER BY 1::text;

RESET track_functions;
DELETE FROM inbox.messages WHERE id LIKE 'hp-%';
DELETE FROM inbox.claims WHERE message_id LIKE 'hp-%';
DELETE FROM outbox.log_0 WHERE type LIKE 'hp.%';
DELETE FROM outbox.retries WHERE type LIKE 'hp.%';
DELETE FROM outbox.dead_events WHERE type LIKE 'hp.%';
DELETE FROM outbox.aggregate_releases WHERE destination = 'hp_d';
DELETE FROM outbox.routes WHERE pattern = 'hp.*';
DELETE FROM outbox.destinations WHERE name IN ('hp_d', 'hp_sqs');
DELETE FROM outbox.credentials WHERE name = 'hp_c2';
DROP FUNCTION public.hp_handler(inbox.messages);
SET client_min_messages = warning;
DROP SCHEMA hostile CASCADE;
RESET client_min_messages;
DROP ROLE regress_hostile;
