-- migrate: no-transaction
-- Right to erasure (app/subscribers.py erase): the address stays suppressed with reason 'erased'
-- so it is never mailed again by mistake (e.g. a stale sync re-creating the subscriber).
-- The new check is added NOT VALID (a brief lock, no scan) and validated in its own statement,
-- which takes only a SHARE UPDATE EXCLUSIVE lock: suppression writes are never blocked by a scan.
ALTER TABLE suppressions
    DROP CONSTRAINT IF EXISTS suppressions_reason_check,
    ADD CONSTRAINT suppressions_reason_check
        CHECK (reason IN ('unsubscribe', 'bounce', 'block', 'spamreport', 'soft_bounce', 'manual', 'erased'))
        NOT VALID;
ALTER TABLE suppressions VALIDATE CONSTRAINT suppressions_reason_check;
