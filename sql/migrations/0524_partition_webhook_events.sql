-- Retention, step 3b: webhook_events becomes partitioned by month on received_at, exactly as
-- digest_events in 0523 (one short transaction of catalog changes; the old table becomes the
-- partition FROM (MINVALUE) TO (cutover); webhook_event_keys dedups on sg_event_id, 0520-0521).
-- Nothing references webhook_events by foreign key.

ALTER TABLE webhook_events RENAME TO webhook_events_legacy;
ALTER TABLE webhook_events_legacy DROP CONSTRAINT webhook_events_pkey;
ALTER TABLE webhook_events_legacy ADD CONSTRAINT webhook_events_legacy_pkey PRIMARY KEY USING INDEX webhook_events_legacy_pkey;
ALTER TABLE webhook_events_legacy DROP CONSTRAINT webhook_events_once;
ALTER INDEX webhook_events_unprocessed_idx RENAME TO webhook_events_legacy_unprocessed_idx;
DROP TRIGGER webhook_events_claim_key ON webhook_events_legacy;
DROP TRIGGER webhook_events_rename_key ON webhook_events_legacy;
DROP TRIGGER webhook_events_forget_keys ON webhook_events_legacy;
DROP TRIGGER webhook_events_truncate_keys ON webhook_events_legacy;

CREATE OR REPLACE FUNCTION webhook_events_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_event_keys (sg_event_id, event_id) VALUES (NEW.sg_event_id, NEW.id)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM webhook_event_keys WHERE sg_event_id = NEW.sg_event_id AND event_id = NEW.id;
    IF FOUND THEN
        RETURN NEW;   -- this row, moved to another partition by an UPDATE
    END IF;
    RETURN NULL;
END
$$;

CREATE TABLE webhook_events (
    id           bigint NOT NULL DEFAULT nextval('webhook_events_id_seq'),
    sg_event_id  text NOT NULL,
    event        text NOT NULL,
    email        text,
    payload      jsonb NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz,
    error        text,
    CONSTRAINT webhook_events_pkey PRIMARY KEY (id, received_at)
) PARTITION BY RANGE (received_at);
CREATE INDEX webhook_events_unprocessed_idx ON webhook_events (id) WHERE processed_at IS NULL;
ALTER SEQUENCE webhook_events_id_seq OWNED BY webhook_events.id;
COMMENT ON TABLE webhook_events IS 'Partitioned by month on received_at (app/partitions.py); the dedup key is in webhook_event_keys';

DO $$
DECLARE
    cutover timestamptz := (SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz
                            FROM pg_constraint WHERE conname = 'webhook_events_legacy_bound'
                              AND conrelid = 'webhook_events_legacy'::regclass);
BEGIN
    EXECUTE format('ALTER TABLE webhook_events ATTACH PARTITION webhook_events_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
                   cutover);
END
$$;
ALTER TABLE webhook_events_legacy DROP CONSTRAINT webhook_events_legacy_bound;

CREATE TRIGGER webhook_events_claim_key BEFORE INSERT ON webhook_events
    FOR EACH ROW EXECUTE FUNCTION webhook_events_claim_key();
CREATE TRIGGER webhook_events_rename_key BEFORE UPDATE OF sg_event_id ON webhook_events
    FOR EACH ROW WHEN (OLD.sg_event_id IS DISTINCT FROM NEW.sg_event_id)
    EXECUTE FUNCTION webhook_events_rename_key();
CREATE TRIGGER webhook_events_forget_keys AFTER DELETE ON webhook_events
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION webhook_events_forget_keys();
CREATE TRIGGER webhook_events_truncate_keys AFTER TRUNCATE ON webhook_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_events_truncate_keys();

SELECT create_time_partitions('webhook_events', now(), 3);
