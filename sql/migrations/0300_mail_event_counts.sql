-- Per-mail counters of applied SendGrid events (delivered, bounce, open, click, ...).
-- Incremented in the same transaction that marks webhook_events.processed_at, so each stored
-- event is counted exactly once however often its apply message is delivered.
CREATE TABLE mail_event_counts (
    mail_kind  text NOT NULL CHECK (mail_kind IN ('digest', 'newsletter')),
    mail_id    bigint NOT NULL,
    event      text NOT NULL,
    count      bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (mail_kind, mail_id, event)
);
