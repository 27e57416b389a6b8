-- Issue 26.2: a digest marks what it handled without rewriting event rows (digest/marks.py).
-- Each event row keeps the transaction that inserted it; a subscriber's mark is the snapshot their
-- last digest read its events in: every event visible in it is handled. Why a snapshot and not the
-- largest id read: ids are drawn at insert and committed in any order, so an event with a smaller id
-- can commit after a digest read a larger one; a snapshot says which transactions had not committed.
--
-- Adding a nullable column without a default and then setting the default are catalog changes:
-- no table rewrite (a volatile default given in ADD COLUMN would rewrite every partition). Rows
-- stored before get their txid from 0691.
ALTER TABLE digest_events ADD COLUMN IF NOT EXISTS txid xid8;
ALTER TABLE digest_events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- One row per subscriber, updated in place once per digest (a HOT update: no index holds `through`).
CREATE TABLE IF NOT EXISTS digest_marks (
    subscriber_id bigint PRIMARY KEY REFERENCES subscribers (id) ON DELETE CASCADE,
    through       pg_snapshot NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE digest_marks IS 'Per subscriber: events visible in `through` were handled by a digest (digest/marks.py)';

-- What each run handled, for its hosted copy and for audits: the events visible in events_through
-- and not in events_after (the mark it started from; NULL: none). NULL events_through: the run
-- marked its events one by one (digest_events.digest_run_id), or handled none.
ALTER TABLE digest_runs ADD COLUMN IF NOT EXISTS events_after pg_snapshot;
ALTER TABLE digest_runs ADD COLUMN IF NOT EXISTS events_through pg_snapshot;

-- Snapshots of one server are taken one after another: the later sees every transaction the earlier
-- saw finished. True when `a` was taken after `b` (a mark never moves back: a run the watchdog
-- handed to a second worker may record after it).
CREATE OR REPLACE FUNCTION digest_snapshot_newer(a pg_snapshot, b pg_snapshot) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (pg_snapshot_xmax(a), pg_snapshot_xmin(a), -(SELECT count(*) FROM pg_snapshot_xip(a)))
         > (pg_snapshot_xmax(b), pg_snapshot_xmin(b), -(SELECT count(*) FROM pg_snapshot_xip(b)))
$$;

-- One event row's "handled by a digest": marked one by one, or shown by its subscriber's mark
-- (digest/marks.py `pending` says the same for a scan by index). Retention counts the events it
-- drops that no digest handled (app/platform/retention.py).
CREATE OR REPLACE FUNCTION digest_event_handled(event_user_id text, event_txid xid8, event_run_id bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT event_run_id IS NOT NULL OR EXISTS (
        SELECT 1 FROM subscribers s JOIN digest_marks m ON m.subscriber_id = s.id
        WHERE s.user_id = event_user_id AND pg_visible_in_snapshot(event_txid, m.through))
$$;
