/* sql/outbox_pg--0.5.1--0.5.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.5.2'" to load this file. \quit

------------------------------------------------------------------------
-- The inbox: a lease no longer stops behind an ordered aggregate
------------------------------------------------------------------------

-- 0.5.1's lease stepped over a message of an ordered aggregate whose
-- first pending message was due within the lease (a retry soon, or a
-- lease another worker holds) and left it as it was, and the walk ended
-- after a batch of such steps.  The messages behind a first message that
-- failed had been set aside to the end of its lease, and its retry came
-- after that: due before it, they came first in every walk, a batch of
-- them were stepped over, and the walk never reached the first message,
-- nor any message due after them, of any aggregate: the inbox of the
-- database stopped for good, its workers idle.  Now such a message is set
-- aside as well: to the time its first message is due (its retry, or the
-- end of its lease; due with it, it comes after it by seq), or, when the
-- first message is due already (another worker processes it past its
-- lease, or it comes later in this walk, or was leased by it), for a
-- lease.  The end of the first message makes the next one due at once
-- (src/worker/inbox_process.c, release_plan), and a walk no longer leaves
-- what it visited due: it ends only with a full batch, a message leased
-- alone, or the due messages.
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
    aside       text[] := '{}';
    aside_until timestamptz[] := '{}';
    stepped     int4 := 0;
    horizon     timestamptz := now() + lease;
BEGIN
    IF batch_size < 1 THEN
        RETURN;
    END IF;
    FOR m IN
        SELECT w.id AS walk_id,
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
            -- its last attempt ended without a result: leased alone
            IF cardinality(leased) = 0 THEN
                leased := ARRAY[m.walk_id];
                EXIT;
            END IF;
            stepped := stepped + 1;
            EXIT WHEN stepped >= batch_size;
        ELSIF m.first_due IS NULL THEN
            leased := leased || m.walk_id;
            EXIT WHEN cardinality(leased) >= batch_size;
        ELSIF m.first_due > now() THEN
            aside := aside || m.walk_id;
            aside_until := aside_until || m.first_due;
        ELSE
            aside := aside || m.walk_id;
            aside_until := aside_until || horizon;
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
