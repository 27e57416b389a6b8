-- The planner used to scan every subscriber on each tick (0.2-0.4 s per 15k, so minutes at a
-- million). Now each subscriber remembers the slot its next run was planned for; only those whose
-- slot has passed (or who were never planned) are looked at. Adding a nullable column without a
-- default is a catalog change only: no table rewrite.
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS digest_planned_until timestamptz;

-- Whoever changes a subscriber's schedule (the API, the preference page, an operator in psql):
-- their pending runs were planned for the old schedule, so cancel them (a run already
-- `processing` is left to finish) and let the next tick plan the new one. The planner revives a
-- cancelled run of the same period instead of adding a second one.
CREATE OR REPLACE FUNCTION subscribers_schedule_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.digest_planned_until := NULL;
    UPDATE digest_runs SET status = 'cancelled', skip_reason = 'schedule changed'
    WHERE subscriber_id = NEW.id AND status = 'pending';
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS subscribers_schedule_changed ON subscribers;
CREATE TRIGGER subscribers_schedule_changed
    BEFORE UPDATE OF timezone, digest_cadence, digest_hour, digest_weekday ON subscribers
    FOR EACH ROW
    WHEN ((OLD.timezone, OLD.digest_cadence, OLD.digest_hour, OLD.digest_weekday)
          IS DISTINCT FROM (NEW.timezone, NEW.digest_cadence, NEW.digest_hour, NEW.digest_weekday))
    EXECUTE FUNCTION subscribers_schedule_changed();
