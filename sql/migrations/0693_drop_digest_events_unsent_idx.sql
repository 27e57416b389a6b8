-- digest_events_pending_idx (0692) serves every query the unsent index served; one index less to
-- write per event. A partitioned index cannot be dropped concurrently: this is a catalog change
-- under the runner's lock_timeout (retried when ingestion holds the lock).
DROP INDEX IF EXISTS digest_events_unsent_idx;
