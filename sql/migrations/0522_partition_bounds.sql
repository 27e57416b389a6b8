-- migrate: no-transaction
-- Retention, step 2: prepare each live table to become the first partition of its new
-- partitioned self, without a long lock (the swap itself is 0523-0525).
--
-- ATTACH PARTITION scans the whole table to prove its rows fit the partition's range, holding an
-- ACCESS EXCLUSIVE lock on it, unless a valid CHECK constraint already proves it. So:
--   1. ADD CONSTRAINT <table>_legacy_bound CHECK (<key> < cutover) NOT VALID: a catalog change
--      under a brief ACCESS EXCLUSIVE lock (lock_timeout + retries, as every statement here);
--      from then on new rows are checked, old ones not yet. The cutover is the first month
--      boundary at least 7 days away, so it cannot pass before the swap (the key is now() at
--      insert: received_at, or the click's time for email_link_history).
--   2. VALIDATE CONSTRAINT: scans the table under SHARE UPDATE EXCLUSIVE only, which blocks no
--      read or write (measured with ingestion running: scripts/bench/partition_migration.py).
--   3. CREATE UNIQUE INDEX CONCURRENTLY on (id, key): the primary key of a partitioned table must
--      contain the partition key; this index becomes the old table's primary key at the swap.
-- The old table then becomes the partition FROM (MINVALUE) TO (cutover): every row stored before
-- the swap, and those arriving until the cutover, stay where they are; new monthly partitions
-- take the rows from the cutover on. Retention drops it whole once its newest row is older than
-- RETENTION_DAYS (about cutover + 90 days).
--
-- Also here: the two SQL functions that read and add monthly partitions, used by the swap and
-- by the scheduler (app/partitions.py) alike, so the naming and bounds are defined once.

-- A partitioned table's partitions with their bounds (range_from NULL: MINVALUE), oldest first.
CREATE OR REPLACE FUNCTION time_partitions(parent regclass)
RETURNS TABLE (partition regclass, range_from timestamptz, range_to timestamptz, detach_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass,
           substring(b.bound FROM 'FROM \(''([^'']+)''\)')::timestamptz,
           substring(b.bound FROM 'TO \(''([^'']+)''\)')::timestamptz,
           i.inhdetachpending
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
    WHERE i.inhparent = parent
    ORDER BY 3
$$;

-- Monthly partitions (UTC months, named <parent>_pYYYY_MM) from the end of the last one until
-- `ahead` months after the month of `at`; returns the names created. Each is created on its own
-- and then attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which blocks no read or
-- write (CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE), and an empty table needs no
-- scan. The parent's indexes, foreign keys and triggers are cloned onto it by ATTACH.
CREATE OR REPLACE FUNCTION create_time_partitions(parent regclass, at timestamptz, ahead integer)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    base  text := (SELECT relname FROM pg_class WHERE oid = parent);
    upto  timestamptz := (date_trunc('month', at AT TIME ZONE 'UTC') + make_interval(months => ahead + 1)) AT TIME ZONE 'UTC';
    lo    timestamptz := (SELECT max(range_to) FROM time_partitions(parent));
    hi    timestamptz;
    name  text;
BEGIN
    lo := coalesce(lo, date_trunc('month', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC');
    WHILE lo < upto LOOP
        hi := (date_trunc('month', lo AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC';
        name := format('%s_p%s', base, to_char(lo AT TIME ZONE 'UTC', 'YYYY_MM'));
        EXECUTE format('CREATE TABLE %I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name, parent);
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, name, lo, hi);
        RETURN NEXT name;
        lo := hi;
    END LOOP;
END
$$;

DO $$
DECLARE
    t       record;
    cutover timestamptz := (date_trunc('month', now() AT TIME ZONE 'UTC' + interval '7 days') + interval '1 month')
                           AT TIME ZONE 'UTC';
    bound   timestamptz;
BEGIN
    FOR t IN SELECT * FROM (VALUES ('digest_events', 'received_at'), ('webhook_events', 'received_at'),
                                   ('email_link_history', 'occurred_at')) v (tab, col) LOOP
        SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz INTO bound
        FROM pg_constraint WHERE conrelid = t.tab::regclass AND conname = t.tab || '_legacy_bound';
        -- A rerun keeps a bound still far enough away (it may be validated already).
        CONTINUE WHEN bound > now() + interval '1 day';
        IF bound IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', t.tab, t.tab || '_legacy_bound');
        END IF;
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (%I < %L) NOT VALID',
                       t.tab, t.tab || '_legacy_bound', t.col, cutover);
        COMMIT;   -- one table locked at a time
    END LOOP;
END
$$;

ALTER TABLE digest_events VALIDATE CONSTRAINT digest_events_legacy_bound;
ALTER TABLE webhook_events VALIDATE CONSTRAINT webhook_events_legacy_bound;
ALTER TABLE email_link_history VALIDATE CONSTRAINT email_link_history_legacy_bound;

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS digest_events_legacy_pkey ON digest_events (id, received_at);
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS webhook_events_legacy_pkey ON webhook_events (id, received_at);
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS email_link_history_legacy_pkey ON email_link_history (id, occurred_at);
