-- Seen and read state of a subscriber's feed (issue 24; digest/seen.py owns every write).
-- Per entity: the time up to which its events were seen / read; an event is unseen when it occurred
-- after greatest(its entity's seen_until, the subscriber's "all" seen_until). "Mark all" is one row
-- of feed_state_all, never one per event or entity. Read implies seen: every write keeps
-- seen_until >= read_until. Both rows go with the subscriber (erasure cascades).
-- New, empty tables: nothing here locks a table in use.

CREATE TABLE feed_state (
    subscriber_id bigint NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    entity_type   text NOT NULL,
    entity_id     text NOT NULL,
    seen_until    timestamptz NOT NULL,
    read_until    timestamptz,                 -- NULL: nothing read
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscriber_id, entity_type, entity_id)
);
-- Retention prunes rows not touched for RETENTION_DAYS.
CREATE INDEX feed_state_updated_idx ON feed_state (updated_at);

CREATE TABLE feed_state_all (
    subscriber_id bigint PRIMARY KEY REFERENCES subscribers (id) ON DELETE CASCADE,
    seen_until    timestamptz NOT NULL,
    read_until    timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
