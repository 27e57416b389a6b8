-- When a newsletter's send actually started: at the request for a send now, at the scheduler tick
-- that found its send_at come for a scheduled one (app/newsletter/rows.py QUEUE, START_SCHEDULED).
-- send_requested_at says when someone asked, which for a scheduled send is hours or days before.
-- A nullable column without a default: a catalog-only change. The backfill touches newsletters
-- only, a small table: a started send began at its request, or at its send_at if that was later.
ALTER TABLE newsletters ADD COLUMN IF NOT EXISTS started_at timestamptz;
UPDATE newsletters SET started_at = greatest(send_requested_at, coalesce(send_at, send_requested_at))
WHERE started_at IS NULL AND send_requested_at IS NOT NULL AND status NOT IN ('draft', 'scheduled');
