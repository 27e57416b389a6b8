-- Retention, step 3a: digest_events becomes partitioned by month on received_at, in one short
-- transaction (catalog changes only: no row is read or moved). The runner holds it under
-- MIGRATION_LOCK_TIMEOUT and retries, so it never queues writers behind a long query.
--   * the live table is renamed digest_events_legacy; its (id, received_at) index from 0522
--     becomes its primary key, its old unique key goes (digest_event_keys dedups now, 0520-0521)
--     and so does the claim's look-up in it;
--   * a partitioned digest_events with the same columns, indexes, foreign key and triggers is
--     created, owns the id sequence (ids continue), and takes the old table as the partition
--     FROM (MINVALUE) TO (cutover): the validated CHECK from 0522 lets ATTACH skip its scan;
--   * monthly partitions from the cutover to 3 months ahead are added (the scheduler keeps
--     adding them: app/partitions.py).
-- Writers blocked on the old table during the swap resolve the name again once it commits and
-- insert into the new parent; nothing is refused or lost (tests/platform/test_partition_migration.py).
-- Nothing references digest_events by foreign key; one would now need (id, received_at).

ALTER TABLE digest_events RENAME TO digest_events_legacy;
ALTER TABLE digest_events_legacy DROP CONSTRAINT digest_events_pkey;
ALTER TABLE digest_events_legacy ADD CONSTRAINT digest_events_legacy_pkey PRIMARY KEY USING INDEX digest_events_legacy_pkey;
ALTER TABLE digest_events_legacy DROP CONSTRAINT digest_events_once;
ALTER TABLE digest_events_legacy RENAME CONSTRAINT digest_events_digest_run_id_fkey TO digest_events_legacy_digest_run_id_fkey;
ALTER INDEX digest_events_unsent_idx RENAME TO digest_events_legacy_unsent_idx;
ALTER INDEX digest_events_run_idx RENAME TO digest_events_legacy_run_idx;
DROP TRIGGER digest_events_claim_key ON digest_events_legacy;
DROP TRIGGER digest_events_rename_key ON digest_events_legacy;
DROP TRIGGER digest_events_forget_keys ON digest_events_legacy;
DROP TRIGGER digest_events_truncate_keys ON digest_events_legacy;

-- The key table has every key now (0521): the claim no longer asks the old unique index.
CREATE OR REPLACE FUNCTION digest_events_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO digest_event_keys (source, producer_id, event_id) VALUES (NEW.source, NEW.producer_id, NEW.id)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    -- Taken. By this very row when an UPDATE moves it to another partition.
    PERFORM 1 FROM digest_event_keys
    WHERE source = NEW.source AND producer_id = NEW.producer_id AND event_id = NEW.id;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    RETURN NULL;   -- a duplicate: not stored
END
$$;

CREATE TABLE digest_events (
    id            bigint NOT NULL DEFAULT nextval('digest_events_id_seq'),
    source        text NOT NULL,
    producer_id   text NOT NULL,
    user_id       text NOT NULL,
    category      text NOT NULL,
    entity_type   text NOT NULL,
    entity_id     text NOT NULL,
    actor_id      text,
    actor_name    text,
    payload       jsonb NOT NULL DEFAULT '{}',
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    received_at   timestamptz NOT NULL DEFAULT now(),
    digest_run_id bigint CONSTRAINT digest_events_digest_run_id_fkey REFERENCES digest_runs (id) ON DELETE SET NULL,
    CONSTRAINT digest_events_pkey PRIMARY KEY (id, received_at)
) PARTITION BY RANGE (received_at);
CREATE INDEX digest_events_unsent_idx ON digest_events (user_id, id) WHERE digest_run_id IS NULL;
CREATE INDEX digest_events_run_idx ON digest_events (digest_run_id) WHERE digest_run_id IS NOT NULL;
ALTER SEQUENCE digest_events_id_seq OWNED BY digest_events.id;
COMMENT ON TABLE digest_events IS 'Partitioned by month on received_at (app/partitions.py); the dedup key is in digest_event_keys';

DO $$
DECLARE
    cutover timestamptz := (SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz
                            FROM pg_constraint WHERE conname = 'digest_events_legacy_bound'
                              AND conrelid = 'digest_events_legacy'::regclass);
BEGIN
    EXECUTE format('ALTER TABLE digest_events ATTACH PARTITION digest_events_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
                   cutover);
END
$$;
ALTER TABLE digest_events_legacy DROP CONSTRAINT digest_events_legacy_bound;  -- the partition bound says it now

CREATE TRIGGER digest_events_claim_key BEFORE INSERT ON digest_events
    FOR EACH ROW EXECUTE FUNCTION digest_events_claim_key();
CREATE TRIGGER digest_events_rename_key BEFORE UPDATE OF source, producer_id ON digest_events
    FOR EACH ROW WHEN (OLD.source IS DISTINCT FROM NEW.source OR OLD.producer_id IS DISTINCT FROM NEW.producer_id)
    EXECUTE FUNCTION digest_events_rename_key();
CREATE TRIGGER digest_events_forget_keys AFTER DELETE ON digest_events
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION digest_events_forget_keys();
CREATE TRIGGER digest_events_truncate_keys AFTER TRUNCATE ON digest_events
    FOR EACH STATEMENT EXECUTE FUNCTION digest_events_truncate_keys();

SELECT create_time_partitions('digest_events', now(), 3);
