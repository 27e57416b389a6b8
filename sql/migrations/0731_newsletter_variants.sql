-- Issue 39: newsletters in several languages (POST /v1/newsletters `variants`, docs/i18n.md
-- "Newsletters in several languages"). newsletters.variants: {"pt-BR": {"subject", "html", "text"}, …}
-- (NULL: the default only); email_log.variant: the variant the outbox chose for the recipient from
-- their locale (NULL: the default), so each mail is rendered from it and GET /v1/newsletters/{id}
-- counts per variant without re-deciding. Nullable columns without defaults: catalog-only changes,
-- no table rewrite; the runner's short lock_timeout keeps the brief exclusive locks from queueing writers.
ALTER TABLE newsletters ADD COLUMN IF NOT EXISTS variants jsonb;
ALTER TABLE email_log ADD COLUMN IF NOT EXISTS variant text;
