-- Retention, step 3c: email_link_history becomes partitioned by month on occurred_at (the time
-- of the click or open), as digest_events in 0523. It has no dedup key. Its foreign key to
-- email_links (ON DELETE CASCADE) is declared on the parent and cloned onto every partition.

ALTER TABLE email_link_history RENAME TO email_link_history_legacy;
ALTER TABLE email_link_history_legacy DROP CONSTRAINT email_link_history_pkey;
ALTER TABLE email_link_history_legacy ADD CONSTRAINT email_link_history_legacy_pkey
    PRIMARY KEY USING INDEX email_link_history_legacy_pkey;
ALTER TABLE email_link_history_legacy RENAME CONSTRAINT email_link_history_link_id_fkey
    TO email_link_history_legacy_link_id_fkey;
ALTER INDEX email_link_history_mail_idx RENAME TO email_link_history_legacy_mail_idx;

CREATE TABLE email_link_history (
    id             bigint NOT NULL DEFAULT nextval('email_link_history_id_seq'),
    kind           text NOT NULL CONSTRAINT email_link_history_kind_check CHECK (kind IN ('click', 'open')),
    link_id        bigint CONSTRAINT email_link_history_link_id_fkey REFERENCES email_links (id) ON DELETE CASCADE,
    mail_kind      text NOT NULL,
    mail_id        bigint NOT NULL,
    subscriber_id  bigint,
    ip             inet,
    user_agent     text,
    is_machine     boolean NOT NULL DEFAULT false,
    machine_reason text,
    occurred_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT email_link_history_pkey PRIMARY KEY (id, occurred_at)
) PARTITION BY RANGE (occurred_at);
CREATE INDEX email_link_history_mail_idx ON email_link_history (mail_kind, mail_id, kind);
ALTER SEQUENCE email_link_history_id_seq OWNED BY email_link_history.id;
COMMENT ON TABLE email_link_history IS 'Partitioned by month on occurred_at (app/partitions.py)';

DO $$
DECLARE
    cutover timestamptz := (SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz
                            FROM pg_constraint WHERE conname = 'email_link_history_legacy_bound'
                              AND conrelid = 'email_link_history_legacy'::regclass);
BEGIN
    EXECUTE format('ALTER TABLE email_link_history ATTACH PARTITION email_link_history_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', cutover);
END
$$;
ALTER TABLE email_link_history_legacy DROP CONSTRAINT email_link_history_legacy_bound;

SELECT create_time_partitions('email_link_history', now(), 3);
