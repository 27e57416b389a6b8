-- migrate: no-transaction
-- The dashboard's "mails sent per hour" and digest lateness read the last 24 h / 7 d of sent
-- digests and newsletter mails: without these every chart would scan both tables. Partial (only
-- sent rows, the terminal state), built online: both tables are written by every send.
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_sent_idx ON digest_runs (completed_at) INCLUDE (scheduled_for)
    WHERE status = 'sent';
CREATE INDEX CONCURRENTLY IF NOT EXISTS email_log_sent_idx ON email_log (sent_at) WHERE status = 'sent';
