-- migrate: no-transaction
-- Issue 11.6: the `hourly` and `immediately` cadences, and events that go out now (priority high,
-- or a category whose delivery is `immediate`). README "How mail goes out".
--
-- Each statement commits on its own (one hot table locked at a time, each under
-- MIGRATION_LOCK_TIMEOUT with retries), and each is a catalog change only:
--   * digest_runs.slot: which slot of the period a run is for (0 for daily and weekly; hourly: the
--     minutes from the local midnight of `period` to the slot, so the two 01:00s of a fall-back day
--     are two runs; immediately: the millisecond of the UTC day it was scheduled for). A NOT NULL
--     column with a constant default is stored in the catalog: no rewrite. 0561 puts it in the
--     unique key.
--   * the cadence CHECKs are replaced in one ALTER each (no moment without one) as NOT VALID, then
--     validated: VALIDATE scans under SHARE UPDATE EXCLUSIVE, which blocks no read or write. Every
--     old value is in the new list.
--   * digest_events.high_priority: true for an event sent with "priority": "high" (NULL otherwise).
--     A nullable column without a default, added to the partitioned parent: a catalog change on
--     it and on every partition; partitions created later copy it (create_time_partitions).
--   * digest_send_now: the subscribers who may have something to send now. Ingest adds a row in
--     the same transaction as the events (so Postgres holds the fact: a lost Redis hint only
--     delays), the immediate planner (digest/immediate.py) consumes it with the run it creates.
--     Small: a row lives seconds. Erasure removes it with the subscriber (ON DELETE CASCADE).

ALTER TABLE digest_runs ADD COLUMN IF NOT EXISTS slot integer NOT NULL DEFAULT 0;

ALTER TABLE digest_runs DROP CONSTRAINT IF EXISTS digest_runs_cadence_check,
    ADD CONSTRAINT digest_runs_cadence_check
    CHECK (cadence IN ('daily', 'weekly', 'hourly', 'immediately')) NOT VALID;
ALTER TABLE digest_runs VALIDATE CONSTRAINT digest_runs_cadence_check;

ALTER TABLE subscribers DROP CONSTRAINT IF EXISTS subscribers_digest_cadence_check,
    ADD CONSTRAINT subscribers_digest_cadence_check
    CHECK (digest_cadence IN ('daily', 'weekly', 'hourly', 'immediately', 'off')) NOT VALID;
ALTER TABLE subscribers VALIDATE CONSTRAINT subscribers_digest_cadence_check;

ALTER TABLE digest_events ADD COLUMN IF NOT EXISTS high_priority boolean;

CREATE TABLE IF NOT EXISTS digest_send_now (
    subscriber_id bigint PRIMARY KEY REFERENCES subscribers (id) ON DELETE CASCADE,
    since         timestamptz NOT NULL DEFAULT now()
);
