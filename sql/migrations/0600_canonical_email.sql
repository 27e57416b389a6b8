-- Issue 25.4, step 1 of 3: one identity per address (I8; app/addresses.py `canonical`, README
-- "Address identity"). Every suppression check, webhook application, erasure and duplicate check
-- compares the canonical form, stored once per row:
--   subscribers.canonical_email      set by the one writer path (app/subscribers.py), indexed (0602)
--   webhook_events.canonical_email   set when the event is stored (tracking/webhook_store.py)
--   suppressions.email               holds the canonical form itself (rewritten by 0601)
-- Nullable columns without a default: catalog changes only, no rewrite; the runner's short
-- lock_timeout keeps the brief exclusive locks from queueing writers (webhook_events is
-- partitioned: the column reaches every partition the same way).
--
-- The canonical form needs Python's `idna` (UTS 46 mapping tables Postgres has no equivalent
-- of), so the backfill is a Python step of the runner (0601, app/subscribers/rekey.py), not SQL. Rejected: a
-- PL/pgSQL port of UTS 46 (a second definition that would drift from the one the application
-- compares with), PL/Python (an untrusted language most managed Postgres services do not offer).
--
-- One property of the Python definition is used here: for an ASCII address the canonical form is
-- its lower-case form (tests/subscribers/test_address_identity.py proves it over generated input). So a row
-- written without the key — by a writer that does not know the column: the previous release's
-- processes during a deploy, a seeding script, an operator in psql — gets it from these triggers
-- when its address is ASCII. A non-ASCII address needs the application: a subscriber without its
-- key cannot be stored once 0601 added the constraint (rather than stored where no suppression
-- would match it); a webhook event without one gets it when the worker applies it.
-- COLLATE "C": lower() maps only A-Z whatever the database's locale (no Turkish dotless i).
-- The subscribers update trigger also recomputes an ASCII key when the address changes and the
-- key does not, so such a writer cannot leave the key of the previous address behind. The WHEN
-- clauses keep the function from being called at all for the application's own writes.
ALTER TABLE subscribers ADD COLUMN IF NOT EXISTS canonical_email text;
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS canonical_email text;

CREATE OR REPLACE FUNCTION ascii_canonical_email() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF octet_length(NEW.email) = length(NEW.email) THEN   -- ASCII (UTF-8: one byte per character)
        NEW.canonical_email := lower(NEW.email COLLATE "C");
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS subscribers_canonical_email_insert ON subscribers;
CREATE TRIGGER subscribers_canonical_email_insert BEFORE INSERT ON subscribers
    FOR EACH ROW WHEN (NEW.canonical_email IS NULL)
    EXECUTE FUNCTION ascii_canonical_email();
DROP TRIGGER IF EXISTS subscribers_canonical_email_update ON subscribers;
CREATE TRIGGER subscribers_canonical_email_update BEFORE UPDATE ON subscribers
    FOR EACH ROW WHEN (NEW.canonical_email IS NULL
                       OR (NEW.email IS DISTINCT FROM OLD.email
                           AND NEW.canonical_email IS NOT DISTINCT FROM OLD.canonical_email))
    EXECUTE FUNCTION ascii_canonical_email();
DROP TRIGGER IF EXISTS webhook_events_canonical_email ON webhook_events;
CREATE TRIGGER webhook_events_canonical_email BEFORE INSERT ON webhook_events
    FOR EACH ROW WHEN (NEW.canonical_email IS NULL AND NEW.email IS NOT NULL)
    EXECUTE FUNCTION ascii_canonical_email();
