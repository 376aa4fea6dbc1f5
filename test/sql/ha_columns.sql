--
-- ha_columns: emit() writes outbox.events by column position, so it
-- checks the columns before writing.  A table with a column of its own
-- appended (a later version's) is fine; a table whose columns do not match
-- the library's is refused with a clear error, never written wrongly.
--
\set VERBOSITY default

-- a column appended by a later version: emit() leaves it NULL
BEGIN;
ALTER TABLE outbox.events ADD COLUMN from_the_future pg_catalog.int4;
SELECT outbox.emit('ha.future', '1', '{"a": 1}') IS NOT NULL AS emitted;
SELECT type, payload, status, from_the_future FROM outbox.events WHERE type = 'ha.future';
ROLLBACK;

-- a 0.1.0 column missing (renamed away; views depend on it): refused
BEGIN;
ALTER TABLE outbox.events RENAME COLUMN last_error TO last_error_old;
SELECT outbox.emit('ha.broken', '1', '{}');
ROLLBACK;

-- columns in another order: refused
BEGIN;
ALTER TABLE outbox.events RENAME COLUMN aggregate_type TO x;
ALTER TABLE outbox.events RENAME COLUMN aggregate_id TO aggregate_type;
ALTER TABLE outbox.events RENAME COLUMN x TO aggregate_id;
SELECT outbox.emit('ha.swapped', '1', '{}');
ROLLBACK;

-- and after the rollbacks everything works again
SELECT outbox.emit('ha.after', '1', '{}') IS NOT NULL AS emitted;
SELECT count(*) AS broken_rows FROM outbox.events WHERE type IN ('ha.broken', 'ha.swapped');
DELETE FROM outbox.events WHERE type LIKE 'ha.%';

-- the installed version, as the relay reads it
SELECT extversion = default_version AS current
  FROM pg_extension JOIN pg_available_extensions ON name = extname
 WHERE extname = 'outbox_pg';
