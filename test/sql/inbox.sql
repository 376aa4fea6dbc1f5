--
-- inbox: claim() is true the first time only, and rolls back with the caller
--
SELECT inbox.claim('m-1') AS first;
SELECT inbox.claim('m-1') AS duplicate;
SELECT inbox.claim('m-1', 'billing') AS other_consumer;

-- a rolled-back claim is no claim
BEGIN;
SELECT inbox.claim('m-2') AS claimed;
ROLLBACK;
SELECT inbox.claim('m-2') AS after_rollback;

-- the claim and the business write commit or vanish together
CREATE TABLE ledger (message_id text PRIMARY KEY, amount numeric NOT NULL);
CREATE FUNCTION apply_payment(mid text, amount numeric) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT inbox.claim(mid, 'ledger') THEN
        RETURN false;
    END IF;
    IF amount < 0 THEN
        RAISE EXCEPTION 'negative amount';
    END IF;
    INSERT INTO ledger VALUES (mid, amount);
    RETURN true;
END
$$;
SELECT apply_payment('p-1', 10) AS applied;
SELECT apply_payment('p-1', 10) AS applied_again;
SELECT try($$SELECT apply_payment('p-2', -5)$$);
SELECT apply_payment('p-2', 5) AS applied_after_failure;
SELECT * FROM ledger ORDER BY 1;

-- retention: explicit ttl, server default, and the session setting
SELECT inbox.claim('m-3', ttl => '30 days') AS claimed;
SELECT inbox.claim('m-4') AS claimed;
SET outbox.claim_retention = '2d';
SELECT inbox.claim('m-5') AS claimed;
RESET outbox.claim_retention;
SELECT message_id, expires_at - claimed_at AS retention
  FROM inbox.claims WHERE message_id IN ('m-3', 'm-4', 'm-5') ORDER BY 1;

-- bad input
SELECT try($$SELECT inbox.claim(NULL)$$);
SELECT try($$SELECT inbox.claim('')$$);
SELECT try($$SELECT inbox.claim(repeat('m', 1025))$$);
SELECT try($$SELECT inbox.claim('m-9', NULL)$$);
SELECT try($$SELECT inbox.claim('m-9', '')$$);
SELECT try($$SELECT inbox.claim('m-9', ttl => '0')$$);
SELECT try($$SELECT inbox.claim('m-9', ttl => '-1 day')$$);
SELECT try($$SELECT inbox.claim('m-9', ttl => '11 years')$$);
-- the ttl is checked as interval comparisons count it (months of 30 days),
-- the same on every date: 10 years and 120 months are accepted; a part
-- beyond the range on its own is refused (22023), not added to now until
-- it overflows (22008) or lands 14 years away
SELECT inbox.claim('m-ttl-10y', ttl => '10 years') AS claimed;
SELECT inbox.claim('m-ttl-120mon', ttl => '120 mon') AS claimed;
SELECT try($$SELECT inbox.claim('m-9', ttl => '1000 years -359999 days')$$);
SELECT try($$SELECT inbox.claim('m-9', ttl => '300000 years -107999999 days')$$);
-- kept as the calendar adds the ttl to now, but never less than the
-- redelivery window: '1 mon -28 days' (2 days of 30-day months) expired at
-- once in February
SELECT inbox.claim('m-ttl-short', ttl => '1 mon -28 days') AS claimed;
SELECT expires_at - claimed_at >= interval '1 day' AS kept_for_the_window
  FROM inbox.claims WHERE message_id = 'm-ttl-short';
SELECT try($$SELECT inbox.claim('m-9', ttl => '1 hour')$$);
-- (the range's wording differs between majors: "(1 .. 315576000)" up to
-- 16, "(1 s .. 315576000 s)" from 17)
SELECT regexp_replace(try($$SET outbox.claim_retention = 0$$), ' \(.*\)$', '') AS try;
BEGIN READ ONLY;
SELECT try($$SELECT inbox.claim('m-ro')$$);
ROLLBACK;
SET outbox.claim_retention = '1h';
SELECT try($$SELECT inbox.claim('m-9')$$);
RESET outbox.claim_retention;
-- below the floor is allowed once the floor is lowered deliberately
SET outbox.redelivery_window = '10min';
SELECT inbox.claim('m-9', ttl => '1 hour') AS claimed;
RESET outbox.redelivery_window;
SELECT count(*) AS claims FROM inbox.claims WHERE message_id = 'm-9';
