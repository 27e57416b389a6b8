-- The whole mission's schema. The unique keys here are what make a double send impossible.

CREATE TABLE api_keys (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL,
    scope        text NOT NULL CHECK (scope IN ('events', 'admin')),
    key_prefix   text NOT NULL,
    key_hash     bytea NOT NULL UNIQUE,          -- sha256 of the key; the key itself is never stored
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

CREATE TABLE subscribers (
    id                bigserial PRIMARY KEY,
    user_id           text NOT NULL UNIQUE,
    email             text NOT NULL,
    name              text NOT NULL DEFAULT '',
    timezone          text NOT NULL DEFAULT 'UTC',
    digest_cadence    text NOT NULL DEFAULT 'daily' CHECK (digest_cadence IN ('daily', 'weekly', 'off')),
    digest_hour       smallint NOT NULL DEFAULT 9 CHECK (digest_hour BETWEEN 0 AND 23),
    digest_weekday    smallint NOT NULL DEFAULT 0 CHECK (digest_weekday BETWEEN 0 AND 6),  -- 0 = Monday
    category_opt_outs text[] NOT NULL DEFAULT '{}',
    paused_until      timestamptz,
    unsubscribed_at   timestamptz,
    tracking_opt_out  boolean NOT NULL DEFAULT false,
    token_version     integer NOT NULL DEFAULT 1,   -- bump to revoke every link token issued so far
    soft_bounce_count integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscribers_email_idx ON subscribers (lower(email));

CREATE TABLE digest_runs (
    id                  bigserial PRIMARY KEY,
    subscriber_id       bigint NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    cadence             text NOT NULL CHECK (cadence IN ('daily', 'weekly')),
    period              date NOT NULL,            -- local date of the slot (weekly: the slot's date)
    scheduled_for       timestamptz NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'processing', 'sent', 'skipped', 'failed', 'cancelled')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz,
    enqueued_at         timestamptz,
    claimed_at          timestamptz,
    completed_at        timestamptz,
    event_count         integer,
    provider_message_id text,
    last_error          text,
    skip_reason         text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT digest_runs_once_per_period UNIQUE (subscriber_id, cadence, period)
);
CREATE INDEX digest_runs_due_idx ON digest_runs (scheduled_for) WHERE status = 'pending';
CREATE INDEX digest_runs_processing_idx ON digest_runs (claimed_at) WHERE status = 'processing';

CREATE TABLE digest_events (
    id            bigserial PRIMARY KEY,
    source        text NOT NULL,                  -- the producer (API key name)
    producer_id   text NOT NULL,                  -- the producer's idempotency key
    user_id       text NOT NULL,
    category      text NOT NULL,
    entity_type   text NOT NULL,
    entity_id     text NOT NULL,
    actor_id      text,
    actor_name    text,
    payload       jsonb NOT NULL DEFAULT '{}',
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    received_at   timestamptz NOT NULL DEFAULT now(),
    digest_run_id bigint REFERENCES digest_runs (id) ON DELETE SET NULL,
    CONSTRAINT digest_events_once UNIQUE (source, producer_id)
);
CREATE INDEX digest_events_unsent_idx ON digest_events (user_id, id) WHERE digest_run_id IS NULL;
CREATE INDEX digest_events_run_idx ON digest_events (digest_run_id) WHERE digest_run_id IS NOT NULL;

CREATE TABLE newsletters (
    id             bigserial PRIMARY KEY,
    subject        text NOT NULL,
    html           text NOT NULL,
    text           text,
    from_addr      text,
    status         text NOT NULL DEFAULT 'draft'
                   CHECK (status IN ('draft', 'queued', 'sending', 'paused', 'cancelled', 'done')),
    audience       jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    send_requested_at timestamptz,
    outbox_completed_at timestamptz,
    completed_at   timestamptz
);

CREATE TABLE email_log (
    id                  bigserial PRIMARY KEY,
    newsletter_id       bigint NOT NULL REFERENCES newsletters (id) ON DELETE CASCADE,
    subscriber_id       bigint NOT NULL REFERENCES subscribers (id) ON DELETE CASCADE,
    email               text NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'sending', 'sent', 'failed', 'suppressed', 'cancelled')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz,
    claimed_at          timestamptz,
    sent_at             timestamptz,
    provider_message_id text,
    error               text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT email_log_once UNIQUE (newsletter_id, subscriber_id)
);
CREATE INDEX email_log_pending_idx ON email_log (newsletter_id, id) WHERE status = 'pending';
CREATE INDEX email_log_sending_idx ON email_log (claimed_at) WHERE status = 'sending';

-- One row per (mail, url), never per recipient: who clicked goes to email_link_history.
CREATE TABLE email_links (
    id         bigserial PRIMARY KEY,
    mail_kind  text NOT NULL CHECK (mail_kind IN ('digest', 'newsletter')),
    mail_id    bigint NOT NULL,                   -- digest_runs.id or newsletters.id
    url        text NOT NULL,
    url_hash   bytea NOT NULL,                    -- sha256(url): long URLs do not fit a btree key
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT email_links_once UNIQUE (mail_kind, mail_id, url_hash)
);

CREATE TABLE email_link_history (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('click', 'open')),
    link_id       bigint REFERENCES email_links (id) ON DELETE CASCADE,   -- NULL for opens
    mail_kind     text NOT NULL,
    mail_id       bigint NOT NULL,
    subscriber_id bigint,
    ip            inet,
    user_agent    text,
    is_machine    boolean NOT NULL DEFAULT false,
    machine_reason text,
    occurred_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX email_link_history_mail_idx ON email_link_history (mail_kind, mail_id, kind);

CREATE TABLE legacy_link_codes (
    code          text PRIMARY KEY,
    link_id       bigint NOT NULL REFERENCES email_links (id) ON DELETE CASCADE,
    subscriber_id bigint,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE webhook_events (
    id           bigserial PRIMARY KEY,
    sg_event_id  text NOT NULL,
    event        text NOT NULL,
    email        text,
    payload      jsonb NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    processed_at timestamptz,
    error        text,
    CONSTRAINT webhook_events_once UNIQUE (sg_event_id)
);
CREATE INDEX webhook_events_unprocessed_idx ON webhook_events (id) WHERE processed_at IS NULL;

CREATE TABLE suppressions (
    id         bigserial PRIMARY KEY,
    email      text NOT NULL,                     -- stored lower-cased
    reason     text NOT NULL CHECK (reason IN ('unsubscribe', 'bounce', 'block', 'spamreport', 'soft_bounce', 'manual')),
    source     text,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT suppressions_once UNIQUE (email)
);
