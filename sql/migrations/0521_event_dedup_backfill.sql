-- migrate: no-transaction
-- Retention, step 1b: the key tables of 0520 get the keys of every row stored before its triggers
-- existed, 20,000 rows per committed batch (no lock held across batches; ingestion goes on, its
-- triggers deduplicating meanwhile with the old unique index's help). README "Retention".
--
-- CREATE TRIGGER (0520) waited for the inserts in flight, so rows above max(id) all have their key.
-- DO UPDATE: a re-sent old key that arrived before its batch claimed the key for the new row,
-- which the trigger then skipped; the stored row is the key's owner.
DO $$
DECLARE
    done bigint := 0;
    top  bigint;
    last bigint;
BEGIN
    SELECT coalesce(max(id), 0) INTO top FROM digest_events;
    LOOP
        WITH batch AS (
            SELECT source, producer_id, id FROM digest_events WHERE id > done AND id <= top ORDER BY id LIMIT 20000
        ), stored AS (
            INSERT INTO digest_event_keys (source, producer_id, event_id) SELECT source, producer_id, id FROM batch
            ON CONFLICT (source, producer_id) DO UPDATE SET event_id = EXCLUDED.event_id
                WHERE digest_event_keys.event_id <> EXCLUDED.event_id
        )
        SELECT max(id) INTO last FROM batch;
        EXIT WHEN last IS NULL;
        done := last;
        COMMIT;
    END LOOP;
END
$$;

DO $$
DECLARE
    done bigint := 0;
    top  bigint;
    last bigint;
BEGIN
    SELECT coalesce(max(id), 0) INTO top FROM webhook_events;
    LOOP
        WITH batch AS (
            SELECT sg_event_id, id FROM webhook_events WHERE id > done AND id <= top ORDER BY id LIMIT 20000
        ), stored AS (
            INSERT INTO webhook_event_keys (sg_event_id, event_id) SELECT sg_event_id, id FROM batch
            ON CONFLICT (sg_event_id) DO UPDATE SET event_id = EXCLUDED.event_id
                WHERE webhook_event_keys.event_id <> EXCLUDED.event_id
        )
        SELECT max(id) INTO last FROM batch;
        EXIT WHEN last IS NULL;
        done := last;
        COMMIT;
    END LOOP;
END
$$;

-- A row deleted (erasure) after a batch read it but before that batch committed left its key
-- behind: the DELETE trigger could not see the uncommitted key. Every key is committed now, so
-- one pass finds those; later deletes find their keys themselves.
DELETE FROM digest_event_keys k WHERE NOT EXISTS (SELECT 1 FROM digest_events e WHERE e.id = k.event_id);
DELETE FROM webhook_event_keys k WHERE NOT EXISTS (SELECT 1 FROM webhook_events e WHERE e.id = k.event_id);
