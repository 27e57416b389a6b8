-- digest_events.digest_run_id names the digest run that handled the event. Its foreign key cost a
-- trigger call for every marked event (about 20 per digest: the largest Postgres item per digest
-- after the update itself, issue 13) and guarded nothing the code does not: only digest/runs.py
-- MARK_EVENTS writes the column, with ids of runs it holds `processing` in the same transaction,
-- and runs are deleted only by erasure, which deletes the subscriber's events first. Its ON DELETE
-- SET NULL was a hazard besides: a deleted run would have made its events unsent, mailed again.
-- Dropping a constraint is a catalog change; the runner's lock_timeout keeps it from queueing
-- writers behind it.
ALTER TABLE digest_events DROP CONSTRAINT IF EXISTS digest_events_digest_run_id_fkey;
ALTER TABLE digest_events_legacy DROP CONSTRAINT IF EXISTS digest_events_legacy_digest_run_id_fkey;
