-- migrate: no-transaction
-- digest_events is the hottest table: build online, never take a write lock.
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_events_received_idx ON digest_events (received_at);
