--
-- setup: install the extension and check what it owns
--
CREATE EXTENSION outbox_pg;

-- the schemas, tables and functions are extension members (a table's or
-- view's row type and its array type come with the relation; 17 and later
-- list them as members too, so they are left out)
SELECT pg_catalog.pg_describe_object(classid, objid, 0) AS member
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox_pg')
   AND deptype = 'e'
   AND NOT (classid = 'pg_type'::regclass AND objid IN
            (SELECT t.oid FROM pg_type t
               LEFT JOIN pg_type e ON e.oid = t.typelem
              WHERE t.typrelid <> 0 OR e.typrelid <> 0))
 ORDER BY 1;

-- configuration tables are dumped by pg_dump
SELECT unnest(extconfig)::regclass AS dumped, unnest(extcondition) AS condition
  FROM pg_extension WHERE extname = 'outbox_pg' ORDER BY 1;

-- nothing is granted to PUBLIC
SELECT p.oid::regprocedure AS function, p.proacl IS NOT NULL AS has_acl,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute,
       p.prosecdef AS security_definer
  FROM pg_proc p
 WHERE p.pronamespace IN ('outbox'::regnamespace, 'inbox'::regnamespace)
 ORDER BY p.oid::regprocedure::text COLLATE "C";

-- DROP EXTENSION removes everything, CREATE brings it back
DROP EXTENSION outbox_pg;
SELECT count(*) AS leftover_schemas FROM pg_namespace WHERE nspname IN ('outbox', 'inbox');
CREATE EXTENSION outbox_pg;

-- a helper for the error tests: run a statement, report SQLSTATE and message
CREATE FUNCTION try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;
