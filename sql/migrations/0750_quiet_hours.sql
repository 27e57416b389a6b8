-- Quiet hours and a mail budget per subscriber (issue 40; app/subscribers/quiet_hours.py): the
-- window as "HH:MM-HH:MM" in the subscriber's zone (NULL: DEFAULT_QUIET_HOURS), and the most mails a
-- local day (NULL: DEFAULT_MAX_MAILS_PER_DAY, 0 no limit). Nullable columns without defaults on a
-- hot table: catalog-only changes under the runner's short lock_timeout; no row is rewritten.
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS quiet_hours text;
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS max_mails_per_day integer;
