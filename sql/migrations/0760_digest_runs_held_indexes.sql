-- migrate: no-transaction
-- Issue 40: the dashboard's "mails held and released per hour" (app/web/admin/stats.py) reads the
-- digest runs held by quiet hours by held_at, and those of them sent by completed_at. Partial: only
-- held runs are in them (held_at is set once, when a run is first held, and kept), a small share of
-- digest_runs; held_at and completed_at change only in updates that already touch indexed columns.
-- Built online: digest_runs is written by every digest (the migrator's lock_timeout and retries keep
-- the build from queueing writers behind it; an INVALID leftover is rebuilt).
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_held_idx ON digest_runs (held_at)
    WHERE held_at IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_released_idx ON digest_runs (completed_at)
    WHERE status = 'sent' AND held_at IS NOT NULL;
