--
-- ha_columns: emit() writes the log slots (outbox.log_0..2) by column
-- position, so it checks their columns before writing.  A slot with a
-- column of its own appended (a later version's) is fine; a slot whose
-- columns do not match the library's is refused with a clear error, never
-- written wrongly.  The columns of all three slots are checked.
--
\set VERBOSITY default
CREATE FUNCTION ha_alter(cmd text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR s IN 0 .. 2 LOOP
        EXECUTE format(cmd, 'outbox.log_' || s);
    END LOOP;
END
$$;

-- a column appended by a later version: emit() leaves it NULL
BEGIN;
SELECT ha_alter('ALTER TABLE %s ADD COLUMN from_the_future pg_catalog.int4');
SELECT outbox.emit('ha.future', '1', '{"a": 1}') IS NOT NULL AS emitted;
SELECT type, payload, from_the_future FROM outbox.log_0 WHERE type = 'ha.future'
UNION ALL SELECT type, payload, from_the_future FROM outbox.log_1 WHERE type = 'ha.future'
UNION ALL SELECT type, payload, from_the_future FROM outbox.log_2 WHERE type = 'ha.future';
SELECT type, status FROM outbox.events WHERE type = 'ha.future';
ROLLBACK;

-- a column missing (renamed away): refused
BEGIN;
SELECT ha_alter('ALTER TABLE %s RENAME COLUMN not_before TO not_before_old');
SELECT outbox.emit('ha.broken', '1', '{}');
ROLLBACK;

-- columns in another order: refused
BEGIN;
SELECT ha_alter('ALTER TABLE %s RENAME COLUMN aggregate_type TO x');
SELECT ha_alter('ALTER TABLE %s RENAME COLUMN aggregate_id TO aggregate_type');
SELECT ha_alter('ALTER TABLE %s RENAME COLUMN x TO aggregate_id');
SELECT outbox.emit('ha.swapped', '1', '{}');
ROLLBACK;

-- and after the rollbacks everything works again
SELECT outbox.emit('ha.after', '1', '{}') IS NOT NULL AS emitted;
SELECT count(*) AS broken_rows FROM outbox.events WHERE type IN ('ha.broken', 'ha.swapped');
DROP FUNCTION ha_alter(text);

-- the installed version, as the relay reads it
SELECT extversion = default_version AS current
  FROM pg_extension JOIN pg_available_extensions ON name = extname
 WHERE extname = 'outbox_pg';
