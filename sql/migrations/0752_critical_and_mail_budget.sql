-- migrate: no-transaction
-- Issue 40: critical events, the mail budget, newsletters that respect quiet hours.
--
-- Each statement commits on its own (one hot table locked at a time, each under
-- MIGRATION_LOCK_TIMEOUT with retries), and each is a catalog change or an online build:
--   * digest_events.critical: true for an event sent with "priority": "critical" (NULL otherwise;
--     such an event is high_priority too). A nullable column without a default on the partitioned
--     parent: a catalog change on it and on every partition.
--   * digest_runs cadence `critical`: the run of a subscriber's critical events, sent at once in a
--     mail of its own whatever their quiet hours or budget (digest/immediate.py makes it). The CHECK
--     is replaced NOT VALID in one ALTER, then validated (SHARE UPDATE EXCLUSIVE: blocks no read or
--     write). At most one such run waits or is being sent per subscriber: a partial unique index,
--     built online.
--   * the schedule trigger of 0004 cancels a subscriber's pending runs when their schedule changes;
--     a critical run is not planned by the schedule, so it is left to go.
--   * mail_budget: the mails a subscriber got in their local day (app/subscribers/budget.py), one
--     row per subscriber (the day it counts, the count, the limit last applied; a new day starts
--     the count again), so it never grows with time. Erasure removes it with the subscriber.
--   * newsletters.respect_quiet_hours: hold each recipient's row until their quiet hours end.
--     A NOT NULL column with a constant default is stored in the catalog: no rewrite.

ALTER TABLE digest_events ADD COLUMN IF NOT EXISTS critical boolean;

ALTER TABLE digest_runs DROP CONSTRAINT IF EXISTS digest_runs_cadence_check,
    ADD CONSTRAINT digest_runs_cadence_check
    CHECK (cadence IN ('daily', 'weekly', 'hourly', 'immediately', 'critical')) NOT VALID;
ALTER TABLE digest_runs VALIDATE CONSTRAINT digest_runs_cadence_check;

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_one_live_critical ON digest_runs (subscriber_id)
    WHERE cadence = 'critical' AND status IN ('pending', 'processing');

CREATE OR REPLACE FUNCTION subscribers_schedule_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.digest_planned_until := NULL;
    UPDATE digest_runs SET status = 'cancelled', skip_reason = 'schedule changed'
    WHERE subscriber_id = NEW.id AND status = 'pending' AND cadence <> 'critical';
    RETURN NEW;
END
$$;

CREATE TABLE IF NOT EXISTS mail_budget (
    subscriber_id bigint PRIMARY KEY REFERENCES subscribers (id) ON DELETE CASCADE,
    day           date NOT NULL,
    spent         integer NOT NULL,
    cap           integer  -- the limit the last mail that could wait was counted against
);

ALTER TABLE newsletters ADD COLUMN IF NOT EXISTS respect_quiet_hours boolean NOT NULL DEFAULT false;
