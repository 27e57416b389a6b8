-- The in-app feed's summary (issue 24, digest/feed.py): per subscriber (user_id), entity and
-- category, the newest activity and the greatest event id of the events the feed shows (the
-- subscriber's own activity left out). A page then reads one row per entity and category instead of
-- aggregating every event the subscriber has; the events themselves are read for the page's
-- entities only.
--
-- Kept by the database, so no writer can forget it:
--   * inserts: one statement-level trigger per INSERT statement (an ingest group commit is one),
--     rows merged with greatest(), keys in order (two commits never wait on each other in a cycle);
--     the rows the dedup trigger skipped are not in `added`;
--   * deletes (erasure): the affected keys recomputed from the events left (feed_entities_refresh);
--   * partitions retention detaches: app/platform/retention.py recomputes the keys of each pruned
--     chunk (feed_entities_refresh_range) before the partition is dropped;
--   * TRUNCATE digest_events empties it.
-- digest_events rows are never updated in the columns kept here (marks set digest_run_id only).
CREATE TABLE IF NOT EXISTS feed_entities (
    user_id     text        NOT NULL,
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    category    text        NOT NULL,
    latest_at   timestamptz NOT NULL,
    latest_id   bigint      NOT NULL,
    PRIMARY KEY (user_id, entity_type, entity_id, category)
);

CREATE OR REPLACE FUNCTION feed_entities_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO feed_entities AS f (user_id, entity_type, entity_id, category, latest_at, latest_id)
    SELECT user_id, entity_type, entity_id, category, max(occurred_at), max(id)
    FROM added
    WHERE actor_id IS DISTINCT FROM user_id
    GROUP BY user_id, entity_type, entity_id, category
    ORDER BY user_id, entity_type, entity_id, category
    ON CONFLICT (user_id, entity_type, entity_id, category) DO UPDATE
        SET latest_at = greatest(f.latest_at, excluded.latest_at),
            latest_id = greatest(f.latest_id, excluded.latest_id);
    RETURN NULL;
END
$$;

-- Recompute the given keys from the events left. The rows are locked first (in key order) and the
-- events read by the next statements, each under a newer snapshot: an insert that committed while
-- we waited is counted, and one still open waits for this transaction and then merges with
-- greatest(). So a concurrent insert is never overwritten with an older value.
CREATE OR REPLACE FUNCTION feed_entities_refresh(users text[], types text[], ids text[], cats text[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM feed_entities f
    JOIN (SELECT DISTINCT * FROM unnest(users, types, ids, cats) AS k(u, t, i, c)) k
      ON f.user_id = k.u AND f.entity_type = k.t AND f.entity_id = k.i AND f.category = k.c
    ORDER BY f.user_id, f.entity_type, f.entity_id, f.category
    FOR UPDATE OF f;

    DELETE FROM feed_entities f
    USING (SELECT DISTINCT * FROM unnest(users, types, ids, cats) AS k(u, t, i, c)) k
    WHERE f.user_id = k.u AND f.entity_type = k.t AND f.entity_id = k.i AND f.category = k.c
      AND NOT EXISTS (
          SELECT 1 FROM digest_events e
          WHERE e.user_id = k.u AND e.entity_type = k.t AND e.entity_id = k.i AND e.category = k.c
            AND e.actor_id IS DISTINCT FROM e.user_id);

    UPDATE feed_entities f SET latest_at = x.latest_at, latest_id = x.latest_id
    FROM (
        SELECT k.u, k.t, k.i, k.c, max(e.occurred_at) AS latest_at, max(e.id) AS latest_id
        FROM (SELECT DISTINCT * FROM unnest(users, types, ids, cats) AS k(u, t, i, c)) k
        JOIN digest_events e ON e.user_id = k.u AND e.entity_type = k.t AND e.entity_id = k.i AND e.category = k.c
        WHERE e.actor_id IS DISTINCT FROM e.user_id
        GROUP BY k.u, k.t, k.i, k.c
    ) x
    WHERE f.user_id = x.u AND f.entity_type = x.t AND f.entity_id = x.i AND f.category = x.c
      AND (f.latest_at, f.latest_id) IS DISTINCT FROM (x.latest_at, x.latest_id);
END
$$;

CREATE OR REPLACE FUNCTION feed_entities_forget() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    users text[]; types text[]; ids text[]; cats text[];
BEGIN
    SELECT array_agg(user_id), array_agg(entity_type), array_agg(entity_id), array_agg(category)
    INTO users, types, ids, cats
    FROM (SELECT DISTINCT user_id, entity_type, entity_id, category FROM gone) g;
    IF users IS NOT NULL THEN
        PERFORM feed_entities_refresh(users, types, ids, cats);
    END IF;
    RETURN NULL;
END
$$;

-- The keys of a detached partition's rows with id in (after_id, upto_id]: retention's prune chunk.
CREATE OR REPLACE FUNCTION feed_entities_refresh_range(part regclass, after_id bigint, upto_id bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    users text[]; types text[]; ids text[]; cats text[];
BEGIN
    EXECUTE format(
        'SELECT array_agg(user_id), array_agg(entity_type), array_agg(entity_id), array_agg(category) '
        'FROM (SELECT DISTINCT user_id, entity_type, entity_id, category FROM %s WHERE id > $1 AND id <= $2) g',
        part)
    INTO users, types, ids, cats USING after_id, upto_id;
    IF users IS NOT NULL THEN
        PERFORM feed_entities_refresh(users, types, ids, cats);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION feed_entities_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE feed_entities;
    RETURN NULL;
EXCEPTION WHEN object_in_use THEN
    DELETE FROM feed_entities;  -- `TRUNCATE digest_events, feed_entities`: the same statement's
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER feed_entities_add AFTER INSERT ON digest_events
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION feed_entities_add();
CREATE OR REPLACE TRIGGER feed_entities_forget AFTER DELETE ON digest_events
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION feed_entities_forget();
CREATE OR REPLACE TRIGGER feed_entities_truncate AFTER TRUNCATE ON digest_events
    FOR EACH STATEMENT EXECUTE FUNCTION feed_entities_truncate();
