-- Scheduled newsletters (app/newsletter/schedule.py): `send_at`, when a `scheduled` newsletter
-- starts (the scheduler tick starts it); `local_time`, the wall-clock time each recipient gets it
-- in their own time zone; on the outbox row, `not_before`, that moment for this recipient, which
-- the claim waits for. Nullable columns without defaults: catalog-only changes, no table rewrite.
-- The runner's short lock_timeout keeps the brief exclusive locks from queueing writers; the new
-- status check reads only newsletters, a small table.
ALTER TABLE newsletters ADD COLUMN IF NOT EXISTS send_at timestamptz;
ALTER TABLE newsletters ADD COLUMN IF NOT EXISTS local_time time;
ALTER TABLE email_log ADD COLUMN IF NOT EXISTS not_before timestamptz;
ALTER TABLE newsletters DROP CONSTRAINT IF EXISTS newsletters_status_check;
ALTER TABLE newsletters ADD CONSTRAINT newsletters_status_check
    CHECK (status IN ('draft', 'scheduled', 'queued', 'sending', 'paused', 'cancelled', 'done'));
-- The tick's "which scheduled newsletters are due" (few rows: an index of the scheduled ones only).
CREATE INDEX IF NOT EXISTS newsletters_scheduled_idx ON newsletters (send_at) WHERE status = 'scheduled';
