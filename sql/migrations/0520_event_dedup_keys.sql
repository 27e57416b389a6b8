-- migrate: no-transaction
-- Retention (issue 12.3), step 1: the dedup keys move out of the event tables.
--
-- digest_events, webhook_events and email_link_history become tables partitioned by month
-- (digest_events and webhook_events by received_at, email_link_history by occurred_at), so that
-- retention drops whole partitions instead of DELETEing rows (app/retention.py). A unique index on
-- a partitioned table must contain the partition key, and UNIQUE (source, producer_id, received_at)
-- would let a producer's retry be stored again as soon as it arrives in a later month. So each
-- dedup key gets a small unpartitioned table — digest_event_keys (source, producer_id) and
-- webhook_event_keys (sg_event_id) — holding the key of every stored row and the row's id, kept
-- by triggers on the event table, so that every writer (API, webhook, operator in psql, tests)
-- is deduplicated the way the unique constraints did it before, across partition boundaries:
--   * BEFORE INSERT (per row): claim the key (INSERT ... ON CONFLICT DO NOTHING); if it is taken,
--     the row is skipped (RETURNING leaves it out, so the API counts it as a duplicate). Two
--     concurrent inserts of one key queue on the key's index entry exactly as they did on the
--     unique index. A key taken by this same row id is an UPDATE moving the row to another
--     partition (DELETE + INSERT inside Postgres): the row goes through.
--   * BEFORE UPDATE of the key columns: the key row is renamed (a clash raises unique_violation,
--     as the old constraint did).
--   * AFTER DELETE (per statement, transition table): the deleted rows' keys go (erasure).
--   * AFTER TRUNCATE: the keys go too.
-- Retention deletes the keys of a dropped partition itself (DROP TABLE fires no trigger), in
-- bounded chunks after the partition is detached.
-- Rejected: a partition key derived from the dedup key (e.g. hash partitions) keeps the unique
-- index local, but then no partition ever becomes entirely old and retention could drop nothing.
-- Cost (scripts/bench/event_insert.py, 5,000-event group commits): database time per stored event
-- went from about 20 us (plain table, ON CONFLICT on the unique key) to about 27 us (partitioned,
-- this trigger). The application's INSERTs lose their ON CONFLICT clause: it could never fire on
-- the partitioned table and would add a speculative insertion per row (about 1 us more).
--
-- This file (expand, milliseconds): the key tables and the triggers on the live tables. Until
-- 0521 has copied the keys of the rows stored before, the claim also asks the old unique index
-- (still there until the swap), so a re-sent old key is a duplicate from the first moment on;
-- 0523/0524 replace the claim functions with the final ones. Then 0522 (bounds and indexes,
-- built online) and 0523-0525 (the swap, one short transaction per table); README "Retention".
--
-- The code of this release needs this file applied (its INSERTs rely on the triggers): the
-- release phase applies the migrations before the new processes start.

CREATE TABLE IF NOT EXISTS digest_event_keys (
    source      text NOT NULL,
    producer_id text NOT NULL,
    event_id    bigint NOT NULL,   -- digest_events.id of the row holding the key
    CONSTRAINT digest_event_keys_pkey PRIMARY KEY (source, producer_id)
);

CREATE TABLE IF NOT EXISTS webhook_event_keys (
    sg_event_id text NOT NULL,
    event_id    bigint NOT NULL,   -- webhook_events.id of the row holding the key
    CONSTRAINT webhook_event_keys_pkey PRIMARY KEY (sg_event_id)
);

-- What retention dropped, and its progress through a drop (app/retention.py owns every write).
CREATE TABLE IF NOT EXISTS retention_drops (
    id              bigserial PRIMARY KEY,
    parent          text NOT NULL,
    partition       text NOT NULL UNIQUE,
    range_to        timestamptz NOT NULL,          -- every row was received (occurred) before this
    state           text NOT NULL DEFAULT 'detaching' CHECK (state IN ('detaching', 'pruning', 'dropped')),
    rows_estimate   bigint,                        -- pg_class.reltuples when it was detached
    never_used      bigint,                        -- digest_events never included / webhook_events never applied
    keys_pruned_to  bigint NOT NULL DEFAULT 0,     -- the dedup keys of rows with id <= this are gone
    started_at      timestamptz NOT NULL DEFAULT now(),
    dropped_at      timestamptz
);

-- digest_events -------------------------------------------------------------------------------

-- Until the swap (0523): a key not copied yet may belong to a row stored before 0520, which the
-- old unique index knows; 0521 then gives the key to that row.
CREATE OR REPLACE FUNCTION digest_events_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO digest_event_keys (source, producer_id, event_id) VALUES (NEW.source, NEW.producer_id, NEW.id)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM digest_events WHERE source = NEW.source AND producer_id = NEW.producer_id) THEN
            RETURN NULL;
        END IF;
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

CREATE OR REPLACE FUNCTION digest_events_rename_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE digest_event_keys SET source = NEW.source, producer_id = NEW.producer_id
    WHERE source = OLD.source AND producer_id = OLD.producer_id AND event_id = OLD.id;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION digest_events_forget_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM digest_event_keys k USING gone g
    WHERE k.source = g.source AND k.producer_id = g.producer_id AND k.event_id = g.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION digest_events_truncate_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE digest_event_keys;
    RETURN NULL;
EXCEPTION WHEN object_in_use THEN
    -- `TRUNCATE digest_events, digest_event_keys`: already emptied by the same statement.
    DELETE FROM digest_event_keys;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER digest_events_claim_key BEFORE INSERT ON digest_events
    FOR EACH ROW EXECUTE FUNCTION digest_events_claim_key();
CREATE OR REPLACE TRIGGER digest_events_rename_key BEFORE UPDATE OF source, producer_id ON digest_events
    FOR EACH ROW WHEN (OLD.source IS DISTINCT FROM NEW.source OR OLD.producer_id IS DISTINCT FROM NEW.producer_id)
    EXECUTE FUNCTION digest_events_rename_key();
CREATE OR REPLACE TRIGGER digest_events_forget_keys AFTER DELETE ON digest_events
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION digest_events_forget_keys();
CREATE OR REPLACE TRIGGER digest_events_truncate_keys AFTER TRUNCATE ON digest_events
    FOR EACH STATEMENT EXECUTE FUNCTION digest_events_truncate_keys();

-- webhook_events ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION webhook_events_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_event_keys (sg_event_id, event_id) VALUES (NEW.sg_event_id, NEW.id)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM webhook_events WHERE sg_event_id = NEW.sg_event_id) THEN
            RETURN NULL;   -- stored before 0520, its key not copied yet (see digest_events_claim_key)
        END IF;
        RETURN NEW;
    END IF;
    PERFORM 1 FROM webhook_event_keys WHERE sg_event_id = NEW.sg_event_id AND event_id = NEW.id;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION webhook_events_rename_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE webhook_event_keys SET sg_event_id = NEW.sg_event_id
    WHERE sg_event_id = OLD.sg_event_id AND event_id = OLD.id;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION webhook_events_forget_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_event_keys k USING gone g WHERE k.sg_event_id = g.sg_event_id AND k.event_id = g.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION webhook_events_truncate_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE webhook_event_keys;
    RETURN NULL;
EXCEPTION WHEN object_in_use THEN
    DELETE FROM webhook_event_keys;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER webhook_events_claim_key BEFORE INSERT ON webhook_events
    FOR EACH ROW EXECUTE FUNCTION webhook_events_claim_key();
CREATE OR REPLACE TRIGGER webhook_events_rename_key BEFORE UPDATE OF sg_event_id ON webhook_events
    FOR EACH ROW WHEN (OLD.sg_event_id IS DISTINCT FROM NEW.sg_event_id)
    EXECUTE FUNCTION webhook_events_rename_key();
CREATE OR REPLACE TRIGGER webhook_events_forget_keys AFTER DELETE ON webhook_events
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION webhook_events_forget_keys();
CREATE OR REPLACE TRIGGER webhook_events_truncate_keys AFTER TRUNCATE ON webhook_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_events_truncate_keys();
