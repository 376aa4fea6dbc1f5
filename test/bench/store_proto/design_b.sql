-- Prototype of design B (src/worker/README.store): PgQ-style batches.  A
-- ticker (in the extension: relay worker 0) inserts a tick, the current
-- pg_snapshot, every tick interval while events arrive; batch k is every
-- event whose transaction became visible between tick k-1 and tick k, for
-- every destination at once.  Workers claim whole batches: lock the next
-- tick row FOR UPDATE SKIP LOCKED and INSERT a claim row; done = INSERT a
-- done row.  Failed events are copied to a retry table (as in A).  The log
-- rotates over three slots and the oldest is truncated.  Scratch code for
-- the measurement, not the extension.

DROP SCHEMA IF EXISTS b CASCADE;
CREATE SCHEMA b;

CREATE TABLE b.log (
    slot        int2 NOT NULL,
    id          uuid NOT NULL,
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    destination text NOT NULL,
    type        text NOT NULL,
    aggregate_id text,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE TABLE b.log_0 PARTITION OF b.log FOR VALUES IN (0);
CREATE TABLE b.log_1 PARTITION OF b.log FOR VALUES IN (1);
CREATE TABLE b.log_2 PARTITION OF b.log FOR VALUES IN (2);
CREATE UNIQUE INDEX blog_0_id ON b.log_0 (id);
CREATE UNIQUE INDEX blog_1_id ON b.log_1 (id);
CREATE UNIQUE INDEX blog_2_id ON b.log_2 (id);
-- batches are queue-wide: the log is read by xid alone
CREATE INDEX blog_xid ON b.log (xid);

CREATE TABLE b.rotation (slot int2 NOT NULL, switched_at timestamptz NOT NULL);
INSERT INTO b.rotation VALUES (0, now());

CREATE TABLE b.ticks (tick_id int8 PRIMARY KEY, snap pg_snapshot NOT NULL,
                      at timestamptz NOT NULL);
INSERT INTO b.ticks VALUES (0, pg_current_snapshot(), now());
CREATE TABLE b.claims (tick_id int8 PRIMARY KEY, leased_until timestamptz NOT NULL);
INSERT INTO b.claims VALUES (0, now());
CREATE TABLE b.done (tick_id int8 PRIMARY KEY);
INSERT INTO b.done VALUES (0);

CREATE TABLE b.retry (
    id           uuid PRIMARY KEY,
    destination  text NOT NULL,
    aggregate_id text,
    payload      jsonb NOT NULL,
    created_at   timestamptz NOT NULL,
    attempts     int4 NOT NULL,
    due_at       timestamptz NOT NULL,
    leased_until timestamptz);
CREATE INDEX bretry_due ON b.retry (destination, due_at);

-- The ticker: a new tick when some transaction began since the last one.
CREATE FUNCTION b.tick() RETURNS int8 LANGUAGE sql AS $$
    INSERT INTO b.ticks
    SELECT t.tick_id + 1, pg_current_snapshot(), now()
      FROM (SELECT * FROM b.ticks ORDER BY tick_id DESC LIMIT 1) t
     WHERE pg_snapshot_xmax(pg_current_snapshot()) > pg_snapshot_xmax(t.snap)
    RETURNING tick_id;
$$;

CREATE FUNCTION b.range_events(prev pg_snapshot, upto pg_snapshot)
RETURNS SETOF b.log LANGUAGE sql STABLE AS $$
    SELECT l.* FROM pg_snapshot_xip(prev) AS x(xid)
      CROSS JOIN LATERAL (SELECT * FROM b.log l0 WHERE l0.xid = x.xid OFFSET 0) l
     WHERE pg_visible_in_snapshot(l.xid, upto)
    UNION ALL
    SELECT l.* FROM b.log l
     WHERE l.xid >= pg_snapshot_xmax(prev) AND l.xid < pg_snapshot_xmax(upto)
       AND pg_visible_in_snapshot(l.xid, upto)
$$;

-- Claim the next unclaimed batch (tick after the newest claim; a tick
-- locked by another claimer is skipped, so two workers take consecutive
-- batches side by side).
CREATE FUNCTION b.claim(lease interval,
                        OUT tick int8, OUT id uuid, OUT destination text,
                        OUT aggregate_id text, OUT payload text, OUT created_at timestamptz)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    t    b.ticks;
    prev pg_snapshot;
BEGIN
    SELECT * INTO t FROM b.ticks k
     WHERE k.tick_id > (SELECT max(c.tick_id) FROM b.claims c)
     ORDER BY k.tick_id LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN RETURN; END IF;
    SELECT k.snap INTO prev FROM b.ticks k WHERE k.tick_id = t.tick_id - 1;
    INSERT INTO b.claims VALUES (t.tick_id, now() + lease) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN RETURN; END IF;
    RETURN QUERY SELECT t.tick_id, e.id, e.destination, e.aggregate_id, e.payload::text, e.created_at
                   FROM b.range_events(prev, t.snap) e ORDER BY e.xid, e.id;
    -- an empty batch is done at once (nobody will acknowledge it)
    IF NOT FOUND THEN
        INSERT INTO b.done VALUES (t.tick_id);
    END IF;
END
$$;

CREATE FUNCTION b.ack(batch int8, failed uuid[], due timestamptz)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO b.retry
    SELECT l.id, l.destination, l.aggregate_id, l.payload, l.created_at, 1, due, NULL
      FROM b.log l WHERE l.id = ANY (failed);
    INSERT INTO b.done VALUES (batch);
$$;

CREATE FUNCTION b.claim_retry(d text, n int, lease interval)
RETURNS TABLE (id uuid, aggregate_id text, payload text, created_at timestamptz, attempts int4)
LANGUAGE sql AS $$
    UPDATE b.retry r SET leased_until = now() + lease, attempts = r.attempts + 1
     WHERE r.ctid = ANY (ARRAY(
            SELECT c.ctid FROM b.retry c
             WHERE c.destination = d AND c.due_at <= now()
               AND (c.leased_until IS NULL OR c.leased_until <= now())
             ORDER BY c.due_at LIMIT n FOR UPDATE SKIP LOCKED))
    RETURNING r.id, r.aggregate_id, r.payload::text, r.created_at, r.attempts;
$$;
CREATE FUNCTION b.retry_done(ok uuid[], failed uuid[], due timestamptz) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM b.retry WHERE id = ANY (ok);
    UPDATE b.retry SET due_at = due, leased_until = NULL WHERE id = ANY (failed);
$$;

-- Retention as in A: the slot emit goes to next is truncated once every
-- row in it is older than the oldest unfinished batch.
CREATE FUNCTION b.retention(every interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r b.rotation;
    nxt int2;
    tbl text;
    acked pg_snapshot;
    blocked bool;
BEGIN
    SELECT * INTO r FROM b.rotation;
    IF r.switched_at > now() - every THEN RETURN 'wait'; END IF;
    nxt := (r.slot + 1) % 3;
    tbl := format('b.log_%s', nxt);
    SELECT k.snap INTO acked FROM b.ticks k
     WHERE k.tick_id = coalesce(
            (SELECT min(c.tick_id) - 1 FROM b.claims c
              WHERE c.tick_id > (SELECT max(d.tick_id) - 10000 FROM b.done d)
                AND NOT EXISTS (SELECT 1 FROM b.done d WHERE d.tick_id = c.tick_id)),
            (SELECT max(c.tick_id) FROM b.claims c));
    -- then lock (NOWAIT: never queue behind pg_dump, emit() would queue
    -- behind us): a writer that commits after the check below cannot exist
    BEGIN
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', tbl);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'locked';
    END;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s l WHERE NOT pg_visible_in_snapshot(l.xid, $1))', tbl)
      INTO blocked USING acked;
    IF blocked THEN RETURN 'blocked'; END IF;
    EXECUTE format('TRUNCATE %s', tbl);
    UPDATE b.rotation SET slot = nxt, switched_at = now();
    RETURN 'rotated';
END
$$;
