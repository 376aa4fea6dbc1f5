-- Prototype of design A (src/worker/README.store): an append-only event log
-- and, per destination, a position that is a pg_snapshot.  A claim takes the
-- events whose transactions became visible between the destination's last
-- position and pg_current_snapshot() (cut to a bounded batch at an xid),
-- and records the new position by INSERTing a batch row: nothing on the
-- success path is updated or deleted per event.  Failed events are copied
-- to a small retry table.  The log is split into three slots (partitions);
-- retention truncates the oldest slot once every destination's acknowledged
-- position covers it.  Scratch code for the measurement, not the extension.

DROP SCHEMA IF EXISTS a CASCADE;
CREATE SCHEMA a;

-- stands for outbox.destinations: the row a claim locks FOR UPDATE SKIP LOCKED
CREATE TABLE a.destinations (name text PRIMARY KEY);

-- the log; slot selects the partition (rotation), xid orders and gates it
CREATE TABLE a.log (
    slot        int2 NOT NULL,
    id          uuid NOT NULL,
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    destination text NOT NULL,
    type        text NOT NULL,
    aggregate_id text,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE TABLE a.log_0 PARTITION OF a.log FOR VALUES IN (0);
CREATE TABLE a.log_1 PARTITION OF a.log FOR VALUES IN (1);
CREATE TABLE a.log_2 PARTITION OF a.log FOR VALUES IN (2);
-- the primary key of the real log would be (id); per partition here
CREATE UNIQUE INDEX log_0_id ON a.log_0 (id);
CREATE UNIQUE INDEX log_1_id ON a.log_1 (id);
CREATE UNIQUE INDEX log_2_id ON a.log_2 (id);
CREATE INDEX log_dest_xid ON a.log (destination, xid);

-- which slot emit() writes to; switched by retention (one row, rare update)
CREATE TABLE a.rotation (slot int2 NOT NULL, switched_at timestamptz NOT NULL,
                         switch_xid xid8 NOT NULL);
INSERT INTO a.rotation VALUES (0, now(), pg_current_xact_id());

-- one row per claimed range; a destination's position is its newest row
CREATE TABLE a.batches (
    destination  text NOT NULL,
    seq          int8 NOT NULL,
    from_snap    pg_snapshot NOT NULL,
    to_snap      pg_snapshot NOT NULL,
    leased_until timestamptz NOT NULL,
    events       int4 NOT NULL,
    oldest       timestamptz,
    PRIMARY KEY (destination, seq));
-- a batch is done when its ack row exists (inserted, never updated)
CREATE TABLE a.acks (destination text NOT NULL, seq int8 NOT NULL,
                     PRIMARY KEY (destination, seq));

-- failed events only (copies), claimed like 0.2's events
CREATE TABLE a.retry (
    id           uuid PRIMARY KEY,
    destination  text NOT NULL,
    aggregate_id text,
    payload      jsonb NOT NULL,
    created_at   timestamptz NOT NULL,
    attempts     int4 NOT NULL,
    due_at       timestamptz NOT NULL,
    leased_until timestamptz);
CREATE INDEX retry_due ON a.retry (destination, due_at);
CREATE TABLE a.dead (LIKE a.retry);

CREATE FUNCTION a.add_destination(d text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO a.destinations VALUES (d);
    INSERT INTO a.batches VALUES (d, 0, pg_current_snapshot(), pg_current_snapshot(), now(), 0, NULL);
    INSERT INTO a.acks VALUES (d, 0);
$$;

-- events of d visible in snapshot "upto" and not in "prev": the ones of
-- transactions running at prev (prev's xip, one index probe per xid: a
-- lateral join kept from being flattened (OFFSET 0), because "xid = ANY (ARRAY(SELECT ...))" let the planner
-- pick a bitmap scan of all the destination's rows -- O(backlog) per claim
-- -- whenever the slot's statistics were stale, which truncation makes
-- routine) and the range
-- [xmax(prev), xmax(upto)) of the (destination, xid) index.  Only live rows
-- are in that range: no event row is ever updated.
CREATE FUNCTION a.range_events(d text, prev pg_snapshot, upto pg_snapshot)
RETURNS SETOF a.log LANGUAGE sql STABLE AS $$
    SELECT l.* FROM pg_snapshot_xip(prev) AS x(xid)
      CROSS JOIN LATERAL (SELECT * FROM a.log l0
                           WHERE l0.destination = d AND l0.xid = x.xid OFFSET 0) l
     WHERE pg_visible_in_snapshot(l.xid, upto)
    UNION ALL
    SELECT l.* FROM a.log l
     WHERE l.destination = d
       AND l.xid >= pg_snapshot_xmax(prev) AND l.xid < pg_snapshot_xmax(upto)
       AND pg_visible_in_snapshot(l.xid, upto)
$$;

-- Claim up to about n events of d (whole transactions): returns the batch
-- seq with each event.  The destination row lock serialises claims of one
-- destination; a second worker skips it (SKIP LOCKED) and serves another.
CREATE FUNCTION a.claim(d text, n int, lease interval,
                        OUT seq int8, OUT id uuid, OUT aggregate_id text,
                        OUT payload text, OUT created_at timestamptz)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    prev      pg_snapshot;
    prev_seq  int8;
    cur       pg_snapshot := pg_current_snapshot();
    lim       xid8;
    first_xid xid8;
    upto      pg_snapshot;
BEGIN
    PERFORM 1 FROM a.destinations AS x WHERE x.name = d FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN RETURN; END IF;
    SELECT b.seq, b.to_snap INTO prev_seq, prev
      FROM a.batches b WHERE b.destination = d ORDER BY b.seq DESC LIMIT 1;

    -- the cut: the xid of the (n+1)th candidate in xid order
    SELECT min(c.xid), max(c.xid) FILTER (WHERE c.rn = n + 1) INTO first_xid, lim
      FROM (SELECT r.xid, row_number() OVER (ORDER BY r.xid) AS rn
              FROM ((SELECT l.xid FROM pg_snapshot_xip(prev) AS x(xid)
                      CROSS JOIN LATERAL (SELECT l0.xid FROM a.log l0
                                           WHERE l0.destination = d AND l0.xid = x.xid OFFSET 0) l
                      WHERE pg_visible_in_snapshot(l.xid, cur))
                    UNION ALL
                    (SELECT l.xid FROM a.log l
                      WHERE l.destination = d
                        AND l.xid >= pg_snapshot_xmax(prev)
                        AND l.xid < pg_snapshot_xmax(cur)
                        AND pg_visible_in_snapshot(l.xid, cur)
                      ORDER BY l.xid LIMIT n + 1)) r
             ORDER BY r.xid LIMIT n + 1) c;
    IF first_xid IS NULL THEN RETURN; END IF;
    IF lim IS NULL THEN
        upto := cur;
    ELSE
        -- never cut inside the first transaction nor below prev's xmax
        IF lim <= first_xid THEN
            lim := (lim::text::int8 + 1)::text::xid8;
        END IF;
        IF lim < pg_snapshot_xmax(prev) THEN
            lim := pg_snapshot_xmax(prev);
        END IF;
        IF lim >= pg_snapshot_xmax(cur) THEN
            upto := cur;
        ELSE
            upto := (SELECT format('%s:%s:%s', least(pg_snapshot_xmin(cur), lim), lim,
                                  coalesce(string_agg(x::text, ',' ORDER BY x), ''))::pg_snapshot
                       FROM pg_snapshot_xip(cur) AS x WHERE x < lim);
        END IF;
    END IF;

    RETURN QUERY
    WITH ev AS (SELECT * FROM a.range_events(d, prev, upto)),
         ins AS (INSERT INTO a.batches
                 SELECT d, prev_seq + 1, prev, upto, now() + lease,
                        (SELECT count(*) FROM ev), (SELECT min(ev.created_at) FROM ev)
                 RETURNING batches.seq)
    SELECT (SELECT ins.seq FROM ins), ev.id, ev.aggregate_id, ev.payload::text, ev.created_at
      FROM ev ORDER BY ev.xid, ev.id;
END
$$;

-- Batch done: failed events copied to the retry table, then the ack row.
CREATE FUNCTION a.ack(d text, batch int8, failed uuid[], due timestamptz)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO a.retry
    SELECT l.id, l.destination, l.aggregate_id, l.payload, l.created_at, 1, due, NULL
      FROM a.log l WHERE l.id = ANY (failed) AND l.destination = d;
    INSERT INTO a.acks VALUES (d, batch);
$$;

-- Lease expired and no ack: give the batch to another worker (a new lease
-- row would do too; the prototype extends the old one).  Run about once a
-- second, not on every claim.
CREATE FUNCTION a.recover(d text, lease interval) RETURNS int8 LANGUAGE sql AS $$
    UPDATE a.batches b SET leased_until = now() + lease
     WHERE b.ctid = ANY (ARRAY(
            SELECT c.ctid FROM a.batches c
             WHERE c.destination = d AND c.leased_until < now()
               AND c.seq > (SELECT coalesce(max(k.seq), 0) - 10000 FROM a.acks k
                             WHERE k.destination = d)
               AND NOT EXISTS (SELECT 1 FROM a.acks k
                                WHERE k.destination = d AND k.seq = c.seq)
             LIMIT 1 FOR UPDATE SKIP LOCKED))
    RETURNING b.seq;
$$;

-- The retry table: leased in place like 0.2 (it only holds failures).
CREATE FUNCTION a.claim_retry(d text, n int, lease interval)
RETURNS TABLE (id uuid, aggregate_id text, payload text, created_at timestamptz, attempts int4)
LANGUAGE sql AS $$
    UPDATE a.retry r SET leased_until = now() + lease, attempts = r.attempts + 1
     WHERE r.ctid = ANY (ARRAY(
            SELECT c.ctid FROM a.retry c
             WHERE c.destination = d AND c.due_at <= now()
               AND (c.leased_until IS NULL OR c.leased_until <= now())
             ORDER BY c.due_at LIMIT n FOR UPDATE SKIP LOCKED))
    RETURNING r.id, r.aggregate_id, r.payload::text, r.created_at, r.attempts;
$$;
CREATE FUNCTION a.retry_done(ok uuid[], failed uuid[], due timestamptz) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM a.retry WHERE id = ANY (ok);
    UPDATE a.retry SET due_at = due, leased_until = NULL WHERE id = ANY (failed);
$$;

-- Retention: switch emit to the next slot every `every`, and truncate the
-- slot it will switch to next once every row in it is acknowledged by every
-- destination (visible in each one's acknowledged-through snapshot) and no
-- transaction that could still write to it is running.  TRUNCATE is tried
-- with NOWAIT: it never queues behind pg_dump (it would block emit()).
CREATE FUNCTION a.retention(every interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r a.rotation;
    nxt int2;
    tbl text;
    dest text;
    acked pg_snapshot;
    blocked bool;
    snaps text[] := '{}';
    names text[] := '{}';
BEGIN
    SELECT * INTO r FROM a.rotation;
    IF r.switched_at > now() - every THEN RETURN 'wait'; END IF;
    nxt := (r.slot + 1) % 3;
    tbl := format('a.log_%s', nxt);
    -- acknowledged-through snapshot per destination, taken before the lock
    -- (an older one is only more cautious): from_snap of its oldest
    -- unacknowledged batch, else its position
    FOR dest IN SELECT name FROM a.destinations LOOP
        SELECT coalesce(
                 (SELECT b.from_snap FROM a.batches b
                   WHERE b.destination = dest
                     AND b.seq > (SELECT max(k.seq) - 10000 FROM a.acks k WHERE k.destination = dest)
                     AND NOT EXISTS (SELECT 1 FROM a.acks k WHERE k.destination = dest AND k.seq = b.seq)
                   ORDER BY b.seq LIMIT 1),
                 (SELECT b.to_snap FROM a.batches b WHERE b.destination = dest
                   ORDER BY b.seq DESC LIMIT 1))
          INTO acked;
        names := names || dest;
        snaps := snaps || acked::text;
    END LOOP;
    -- lock (NOWAIT: never queue behind pg_dump, emit() and the claims would
    -- queue behind us), then check: a writer that commits after the check
    -- cannot exist
    BEGIN
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', tbl);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'locked';
    END;
    FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s l WHERE l.destination = $1'
                       ' AND NOT pg_visible_in_snapshot(l.xid, $2::pg_snapshot))', tbl)
          INTO blocked USING names[i], snaps[i];
        IF blocked THEN RETURN 'blocked'; END IF;
    END LOOP;
    EXECUTE format('TRUNCATE %s', tbl);
    UPDATE a.rotation SET slot = nxt, switched_at = now(), switch_xid = pg_current_xact_id();
    RETURN 'rotated';
END
$$;
