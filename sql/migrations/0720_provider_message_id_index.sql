-- migrate: no-transaction
-- Issue 38: the webhooks of Amazon SES, Postmark and Mailgun name a mail by the provider's message
-- id only (no custom_args come back), so applying them looks the mail up by provider_message_id in
-- both mail tables. Partial: rows not sent yet (NULL) are not in it. Built online: email_log is
-- written by every send and digest_runs by every digest (the migrator's lock_timeout and retries
-- keep the build from queueing writers behind it; an INVALID leftover is rebuilt).
CREATE INDEX CONCURRENTLY IF NOT EXISTS email_log_provider_message_id_idx ON email_log (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS digest_runs_provider_message_id_idx ON digest_runs (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
