-- Operator dashboard (/admin, app/admin/): sign-in sessions and the audit trail of what operators changed.
-- Sessions live server-side so that signing out, or revoking the API key, ends them at once; the
-- browser holds only a signed random token whose sha256 is stored here.
CREATE TABLE admin_sessions (
    id           bigserial PRIMARY KEY,
    token_hash   bytea NOT NULL UNIQUE,
    api_key_id   bigint NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    ip           inet,
    user_agent   text
);

-- Who (API key id and its name at the time), when, what, on which target. Never updated or deleted
-- by the application.
CREATE TABLE admin_audit (
    id           bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    api_key_id   bigint NOT NULL,
    api_key_name text NOT NULL,
    action       text NOT NULL,
    target       text NOT NULL,
    detail       jsonb NOT NULL DEFAULT '{}',
    ip           inet
);
CREATE INDEX admin_audit_target_idx ON admin_audit (target, at);
