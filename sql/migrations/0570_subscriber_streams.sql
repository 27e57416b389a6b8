-- Streams (README "Streams"): a subscriber can stop newsletters but keep digests, and the reverse.
-- The digest stream is digest_cadence = 'off' (the schedule trigger of 0004 cancels pending runs);
-- the cadence it had is kept so turning digests back on restores it. Newsletters stopped alone are
-- newsletters_unsubscribed_at, checked where email_log rows are built and claimed
-- (app/newsletter/rows.py). Nullable columns without a default: catalog changes only, no rewrite,
-- and the runner's short lock_timeout keeps the brief exclusive lock from queueing writers.
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS newsletters_unsubscribed_at timestamptz;
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS digest_cadence_before_off text;
