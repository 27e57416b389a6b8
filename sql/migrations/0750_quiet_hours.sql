-- Quiet hours per subscriber (issue 40; app/subscribers/quiet_hours.py): the window as
-- "HH:MM-HH:MM" in the subscriber's zone (NULL: DEFAULT_QUIET_HOURS); and the column of the mail
-- budget to come (the most mails a local day), not read yet. Nullable columns without defaults on a
-- hot table: catalog-only changes under the runner's short lock_timeout; no row is rewritten.
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS quiet_hours text;
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS max_mails_per_day integer;
