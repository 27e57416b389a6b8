-- The dedup-key triggers that follow a renamed event (0520) become AFTER UPDATE triggers. A BEFORE
-- UPDATE row trigger makes Postgres fetch and lock every updated row for it before the update, even
-- when its column list (source, producer_id) rules it out: each of the ~20 events a digest marks
-- (digest/runs.py MARK_EVENTS) paid an extra tuple lock and WAL record for a trigger that never ran.
-- An AFTER trigger with a column list is queued only when those columns are set, and it does the
-- same thing: moves the key in the same statement, and a clash with another key still fails it.
-- Catalog changes only; the runner's short lock_timeout keeps them from queueing writers.
CREATE OR REPLACE FUNCTION digest_events_rename_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE digest_event_keys SET source = NEW.source, producer_id = NEW.producer_id
    WHERE source = OLD.source AND producer_id = OLD.producer_id AND event_id = OLD.id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS digest_events_rename_key ON digest_events;
CREATE TRIGGER digest_events_rename_key AFTER UPDATE OF source, producer_id ON digest_events
    FOR EACH ROW WHEN (OLD.source IS DISTINCT FROM NEW.source OR OLD.producer_id IS DISTINCT FROM NEW.producer_id)
    EXECUTE FUNCTION digest_events_rename_key();

CREATE OR REPLACE FUNCTION webhook_events_rename_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE webhook_event_keys SET sg_event_id = NEW.sg_event_id
    WHERE sg_event_id = OLD.sg_event_id AND event_id = OLD.id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS webhook_events_rename_key ON webhook_events;
CREATE TRIGGER webhook_events_rename_key AFTER UPDATE OF sg_event_id ON webhook_events
    FOR EACH ROW WHEN (OLD.sg_event_id IS DISTINCT FROM NEW.sg_event_id)
    EXECUTE FUNCTION webhook_events_rename_key();
