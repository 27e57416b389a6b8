-- Leases (app/lease.py): who holds a role — the scheduler's leadership, a newsletter's outbox
-- builder — and until when. A row, not a session advisory lock, so that the service works behind
-- PgBouncer in transaction pooling mode, where consecutive transactions of one client may run on
-- different server sessions. Expiry is judged by the database's clock alone.
CREATE TABLE leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
