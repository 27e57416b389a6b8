-- migrate: no-transaction
-- The dashboard's "mails sent per hour", open/click rates and digest lateness read the last 24 h /
-- 7 d of sent digests and newsletter mails: without these every view would scan both tables.
-- Partial (only sent rows, the terminal state); the INCLUDEd columns are what the statements join
-- and compute on, so they read the index alone. Built online: both tables are written by every send.
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_sent_idx ON digest_runs (completed_at)
    INCLUDE (scheduled_for, id) WHERE status = 'sent';
CREATE INDEX CONCURRENTLY IF NOT EXISTS email_log_sent_idx ON email_log (sent_at)
    INCLUDE (newsletter_id, subscriber_id) WHERE status = 'sent';
