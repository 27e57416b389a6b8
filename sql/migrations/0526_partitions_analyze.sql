-- migrate: no-transaction
-- Autovacuum analyzes partitions but never a partitioned parent, whose statistics the planner
-- uses for joins over the whole table (the digest's mark, the loads). Sampling, no lock that
-- blocks reads or writes. app/retention.py analyzes a parent again after dropping a partition.
ANALYZE digest_events;
ANALYZE webhook_events;
ANALYZE email_link_history;
