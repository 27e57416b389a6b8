-- migrate: no-transaction
-- Issue 26.2, step 3 of 3: a subscriber's events not yet handled are those after their mark, found
-- by txid (digest/marks.py). Marking no longer removes rows from this partial index (only a run
-- that marks one by one does), so the scan starts at the mark's xmin, not at the subscriber's
-- oldest event. Built partition by partition, concurrently (app/platform/partitioned_index.py).
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_events_pending_idx
    ON digest_events (user_id, txid, id) WHERE digest_run_id IS NULL;
