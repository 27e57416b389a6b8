-- A subscriber's language (app/platform/i18n.py): a BCP 47 tag stored in its one spelling (`pt-BR`),
-- NULL for DEFAULT_LOCALE. A nullable column without a default: a catalog-only change on a hot
-- table, under the runner's short lock_timeout; no row is rewritten.
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS locale text;
