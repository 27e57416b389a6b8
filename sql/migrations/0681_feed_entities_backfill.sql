-- The feed summary (0680) for the events stored before it: inserts since 0680 keep it themselves,
-- so both merge with greatest(). Reads digest_events once (no lock that stops writers: 0680's
-- triggers are in place, and a new table takes the rows). An erasure that committed while this ran
-- read its events: the rows of a user_id left with no event at all are dropped again afterwards.
INSERT INTO feed_entities AS f (user_id, entity_type, entity_id, category, latest_at, latest_id)
SELECT user_id, entity_type, entity_id, category, max(occurred_at), max(id)
FROM digest_events
WHERE actor_id IS DISTINCT FROM user_id
GROUP BY user_id, entity_type, entity_id, category
ORDER BY user_id, entity_type, entity_id, category
ON CONFLICT (user_id, entity_type, entity_id, category) DO UPDATE
    SET latest_at = greatest(f.latest_at, excluded.latest_at),
        latest_id = greatest(f.latest_id, excluded.latest_id);

DELETE FROM feed_entities f
WHERE NOT EXISTS (SELECT 1 FROM digest_events e WHERE e.user_id = f.user_id);
