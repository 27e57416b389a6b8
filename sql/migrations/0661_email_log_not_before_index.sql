-- migrate: no-transaction
-- Pending rows that wait for their recipient's local time (newsletters with a local_time): when
-- the next one is due (the idle send chain sleeps until then) and whether any is due now (the
-- tick's re-kick). Partial: rows without a not_before, nearly all of them, are not in it. Built
-- online: email_log is written by every send.
CREATE INDEX CONCURRENTLY IF NOT EXISTS email_log_not_before_idx ON email_log (newsletter_id, not_before)
    WHERE status = 'pending' AND not_before IS NOT NULL;
