-- A finished newsletter's per-status row counts, written by the statement that marks it done
-- (app/newsletter/rows.py DONE) and cleared when failed rows are retried (REOPEN): GET /v1/newsletters
-- lists many newsletters without counting their email_log rows again. A nullable column without
-- a default: a catalog-only change, no table rewrite.
ALTER TABLE newsletters ADD COLUMN IF NOT EXISTS final_counts jsonb;
