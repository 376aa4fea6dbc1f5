/* sql/outbox_pg--0.4.0--0.5.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.5.0'" to load this file. \quit

------------------------------------------------------------------------
-- A destination's stream belongs to its name (src/worker/README.store,
-- 3.1, "destinations come and go")
------------------------------------------------------------------------

-- In 0.4.0 deleting a destination deleted its stream (position, batches,
-- acknowledgements) through this foreign key, and creating the name again
-- started a new stream at the creating transaction's snapshot: the events
-- still pending under the name then showed as published and were never
-- sent, whether the delete and the insert ran in one transaction or in two
-- (TRUNCATE ... CASCADE likewise).  The log rows keep the name they were
-- emitted with, so the stream is the name's too: it stays when the
-- destination's row goes, a destination written again under the name
-- continues from it, and the rotation spills a deleted destination's
-- backlog to outbox.retries as it does a paused one's (retention.c).
-- Streams of names that have neither a destination nor a log row any more
-- are deleted with the trim (retention.c).
ALTER TABLE outbox.streams DROP CONSTRAINT streams_destination_fkey;
COMMENT ON TABLE outbox.streams IS
    'One row per destination name whose events the store has claimed or will claim; kept when the destination is deleted, so that one created again under the name continues where it stopped.';

-- The first stream of a name starts before every transaction ('3:3:'):
-- its first claim takes each event the log holds for the name, those
-- written before the destination existed (INSERT INTO outbox.events, a
-- restore in any order) included.  A name that has a stream keeps it.
CREATE OR REPLACE FUNCTION outbox._stream_changed()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO outbox.streams (destination) VALUES (NEW.name)
        ON CONFLICT (destination) DO NOTHING;
    IF FOUND THEN
        INSERT INTO outbox.batches (destination, seq, from_snap, to_snap, leased_until, events)
        VALUES (NEW.name, 0, '3:3:', '3:3:', pg_catalog.now(), 0);
        INSERT INTO outbox.batch_acks (destination, seq) VALUES (NEW.name, 0);
    END IF;
    RETURN NEW;
END
$$;
-- end of a destination's stream belongs to its name
