-- migrate: no-transaction
-- The in-app feed (issue 24, digest/feed.py) reads a subscriber's events by entity, sent or not:
-- one item per entity, newest activity first. The columns the feed's aggregation needs are in the
-- index (an index-only scan over a subscriber's events, no heap visits); the events of the shown
-- entities are then found by the same index's prefix. Built partition by partition, concurrently
-- (app/platform/partitioned_index.py): ingestion goes on meanwhile.
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_events_feed_idx
    ON digest_events (user_id, entity_type, entity_id, occurred_at) INCLUDE (id, category, actor_id);
