-- Issue 38: the provider that accepted each mail (ses, postmark, mailgun, sendgrid, smtp…) beside
-- its provider_message_id, so a webhook from any provider is matched by (provider, message id)
-- whichever provider failover chose. On a row still to be retried it names the provider whose
-- answer never came (an ambiguous outcome: the mail may have been accepted there), and the retry
-- goes to that provider only (MAIL_PROVIDERS failover never moves it elsewhere).
-- Nullable columns without defaults: catalog-only changes, no table rewrite; the runner's short
-- lock_timeout keeps the brief exclusive locks from queueing writers (retried when not granted).
ALTER TABLE email_log ADD COLUMN IF NOT EXISTS provider text;
ALTER TABLE digest_runs ADD COLUMN IF NOT EXISTS provider text;
