-- Issue 39: a category in every language (PUT /v1/categories/{key} `translations`, docs/i18n.md
-- "Translating categories"): {"pt-BR": {"label", "description", "verb"}, …}, keyed by normalised
-- locale tags; NULL: none. A nullable column without a default: a catalog-only change, no table
-- rewrite, under the runner's short lock_timeout.
ALTER TABLE categories ADD COLUMN IF NOT EXISTS translations jsonb;
