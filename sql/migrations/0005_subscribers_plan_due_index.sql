-- migrate: no-transaction
-- The planner's "who is due" lookup (app/digest_planner.py). Built online: subscribers is written
-- by every preference change and webhook bounce.
CREATE INDEX CONCURRENTLY IF NOT EXISTS subscribers_plan_due_idx ON subscribers (digest_planned_until)
    WHERE digest_cadence <> 'off' AND unsubscribed_at IS NULL;
