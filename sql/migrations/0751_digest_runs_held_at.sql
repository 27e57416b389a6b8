-- When a digest run was held for its subscriber's quiet hours (digest/runs.py HOLD): the mail that
-- goes at the window's end says "while you were away". A nullable column without a default on a
-- hot table: a catalog-only change under the runner's short lock_timeout; no row is rewritten.
ALTER TABLE digest_runs ADD COLUMN IF NOT EXISTS held_at timestamptz;
