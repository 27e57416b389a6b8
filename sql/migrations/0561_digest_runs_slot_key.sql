-- migrate: no-transaction
-- Issue 11.6, step 2: the unique key of digest_runs becomes (subscriber_id, cadence, period, slot)
-- (an hourly subscriber has 23 to 25 runs per local date), keeping its name
-- digest_runs_once_per_period so `ON CONFLICT ON CONSTRAINT` statements do not change.
-- The new index is built online; the swap is one ALTER (drop the old constraint, adopt the new
-- index) under MIGRATION_LOCK_TIMEOUT: catalog work, no scan. A rerun after a failure between the
-- two builds the index again and swaps again (the constraint is then already four columns wide).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_once_per_slot
    ON digest_runs (subscriber_id, cadence, period, slot);
ALTER TABLE digest_runs DROP CONSTRAINT digest_runs_once_per_period,
    ADD CONSTRAINT digest_runs_once_per_period UNIQUE USING INDEX digest_runs_once_per_slot;

-- At most one immediate run per subscriber waits or is being sent: two planners (the scheduler
-- tick and an ingest hint) cannot both create one; the second insert does nothing.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_one_live_immediate ON digest_runs (subscriber_id)
    WHERE cadence = 'immediately' AND status IN ('pending', 'processing');

-- Ingest asks, per group commit, which of the batch's users chose `immediately`: a probe into
-- this small partial index instead of the whole user_id index.
CREATE INDEX CONCURRENTLY IF NOT EXISTS subscribers_immediately_idx ON subscribers (user_id)
    WHERE digest_cadence = 'immediately';
