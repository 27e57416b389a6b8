-- migrate: no-transaction
-- Issue 25.4, step 3 of 3: the subscribers' canonical address is indexed (webhook application,
-- test sends and link imports look subscribers up by it; suppression checks join on it), the
-- lower(email) index nothing reads any more goes, and the constraint 0601 added NOT VALID is
-- validated (SHARE UPDATE EXCLUSIVE: writers go on during the scan).
CREATE INDEX CONCURRENTLY IF NOT EXISTS subscribers_canonical_email_idx ON subscribers (canonical_email);
DROP INDEX CONCURRENTLY IF EXISTS subscribers_email_idx;
ALTER TABLE subscribers VALIDATE CONSTRAINT subscribers_canonical_email_present;
