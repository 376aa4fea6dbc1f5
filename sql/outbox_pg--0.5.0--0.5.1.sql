/* sql/outbox_pg--0.5.0--0.5.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.5.1'" to load this file. \quit

------------------------------------------------------------------------
-- The inbox: a worker that dies in a batch no longer uses up the
-- attempts of every message in it (src/worker/inbox_process.c)
------------------------------------------------------------------------

-- A lease counts the attempt of each message it takes before any handler
-- runs, so that a message whose handler kills the worker runs out of
-- attempts.  Until 0.5.1 the messages leased with it were charged each
-- time too, and taken with it again at every lease: after max_attempts
-- deaths the whole batch was dead-lettered ("ended without a result"),
-- the handlers of all but one of them never having failed.
-- finished_attempts counts the attempts that ended with a result (the
-- handler's error, or the processed mark); a pending message with more
-- attempts than that had its last attempt end without one, and the lease
-- takes it alone, so only the message that kills the worker runs out of
-- attempts.  The attempts of pending messages are taken as finished at the
-- update (only those attempted: the rest have 0 and 0).
ALTER TABLE inbox.messages
    ADD COLUMN finished_attempts pg_catalog.int4 NOT NULL DEFAULT 0;
UPDATE inbox.messages AS m
   SET finished_attempts = m.attempts
 WHERE m.status OPERATOR(pg_catalog.=) 'pending'
   AND m.attempts OPERATOR(pg_catalog.>) 0;
-- 0.5.0 charged a look that found no handler as an attempt; 0.5.1 does
-- not (src/worker/inbox_process.c), and a message that waits for its
-- handler gets all of the handler's attempts: its count starts again
-- (also where a handler failed it before it was unregistered: those
-- failures are forgiven, which costs at most a few more tries).
UPDATE inbox.messages AS m
   SET attempts = 0, finished_attempts = 0
 WHERE m.status OPERATOR(pg_catalog.=) 'pending'
   AND m.attempts OPERATOR(pg_catalog.>) 0
   AND m.last_error OPERATOR(pg_catalog.=)
       ('no inbox handler matches message type "' OPERATOR(pg_catalog.||) m.type
        OPERATOR(pg_catalog.||) '"');
COMMENT ON COLUMN inbox.messages.finished_attempts IS
    'Attempts that ended with a result (the handler''s error or success); fewer than attempts: the last one ended without a result (the worker died, or its transaction failed), and the message is tried alone next.';

CREATE OR REPLACE FUNCTION inbox.redrive(message_id pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM inbox._lock_dead($1, 'Only dead letters are redriven; pending messages are retried by the worker.');
    UPDATE inbox.messages AS m
       SET status = 'pending', attempts = 0, finished_attempts = 0,
           next_attempt_at = pg_catalog.now()
     WHERE m.id OPERATOR(pg_catalog.=) $1;
END
$$;

-- 0.4.0's lease (see its script for the walk), and a message whose last
-- attempt ended without a result is leased alone: first in a lease, it is
-- that lease's only message; after others, it is stepped over and comes
-- first in the next lease.
CREATE OR REPLACE FUNCTION inbox._lease(batch_size pg_catalog.int4, lease pg_catalog.interval)
RETURNS TABLE (id pg_catalog.text, attempts pg_catalog.int4)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET enable_seqscan = off
AS $$
DECLARE
    m           record;
    leased      text[] := '{}';
    leased_aggs text[] := '{}';
    aside       text[] := '{}';
    aside_until timestamptz[] := '{}';
    stepped     int4 := 0;
    horizon     timestamptz := now() + lease;
BEGIN
    IF batch_size < 1 THEN
        RETURN;
    END IF;
    FOR m IN
        SELECT w.id AS walk_id, w.aggregate_id AS walk_aggregate,
               w.attempts > w.finished_attempts AS unfinished,
               CASE WHEN w.aggregate_id IS NOT NULL
                     AND coalesce((inbox.handler_for(w.type)).ordered, false)
               THEN (SELECT p.next_attempt_at
                       FROM inbox.messages AS p
                      WHERE p.aggregate_id = w.aggregate_id
                        AND p.status = 'pending'
                        AND p.seq < w.seq
                      ORDER BY p.seq
                      LIMIT 1)
               END AS first_due
          FROM inbox.messages AS w
         WHERE w.status = 'pending'
           AND w.next_attempt_at <= now()
         ORDER BY w.next_attempt_at, w.seq
           FOR UPDATE OF w SKIP LOCKED
    LOOP
        IF m.first_due IS NULL AND m.unfinished THEN
            IF cardinality(leased) = 0 THEN
                leased := ARRAY[m.walk_id];
                EXIT;
            END IF;
            stepped := stepped + 1;
            EXIT WHEN stepped >= batch_size;
        ELSIF m.first_due IS NULL THEN
            leased := leased || m.walk_id;
            IF m.walk_aggregate IS NOT NULL THEN
                leased_aggs := leased_aggs || m.walk_aggregate;
            END IF;
            EXIT WHEN cardinality(leased) >= batch_size;
        ELSIF m.first_due > horizon THEN
            aside := aside || m.walk_id;
            aside_until := aside_until || m.first_due;
        ELSIF m.walk_aggregate = ANY (leased_aggs) THEN
            aside := aside || m.walk_id;
            aside_until := aside_until || horizon;
        ELSE
            stepped := stepped + 1;
            EXIT WHEN stepped >= batch_size;
        END IF;
    END LOOP;
    IF cardinality(aside) > 0 THEN
        UPDATE inbox.messages AS a
           SET next_attempt_at = s.until
          FROM unnest(aside, aside_until) AS s(aside_id, until)
         WHERE a.id = s.aside_id;
    END IF;
    RETURN QUERY
        UPDATE inbox.messages AS l
           SET attempts = l.attempts + 1,
               next_attempt_at = horizon
         WHERE l.id = ANY (leased)
        RETURNING l.id, l.attempts;
END
$$;

------------------------------------------------------------------------
-- A release belongs to the destination's name, as its stream does
------------------------------------------------------------------------

-- outbox.release_aggregate() records that an aggregate's dead events up
-- to one id no longer block it.  Dead events keep the destination name
-- they died under and outlive the destination's row (0.5.0); the release
-- was deleted with the row through this foreign key, so a destination of
-- policy 'block' deleted and created again had its released aggregates
-- blocked again by the same dead letters.  A release now stays with the
-- name (release_aggregate() still needs the destination to exist).
ALTER TABLE outbox.aggregate_releases DROP CONSTRAINT aggregate_releases_destination_fkey;
COMMENT ON TABLE outbox.aggregate_releases IS
    'Written by outbox.release_aggregate(): dead events of the aggregate up to released_through no longer block it; kept when the destination is deleted, like its dead events.';
