-- migrate: no-transaction
-- No query reads digest_events by received_at, and every digest marks ~20 event rows whose new
-- versions each paid an entry in this index: dropping it cut Postgres CPU per digest by about a
-- third (scripts/bench/digest.py: 790 -> 490 us). Online: no lock on the hottest table.
DROP INDEX CONCURRENTLY IF EXISTS digest_events_received_idx;
