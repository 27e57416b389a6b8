-- The emergency stop for all outgoing mail (app/mail_stop.py): one row while it is engaged, none
-- otherwise. Every claim of a digest run or a newsletter row checks for it, and every send loop
-- checks it between two mails, so engaging it stops each sender within a second.
CREATE TABLE mail_stop (
    engaged     boolean PRIMARY KEY DEFAULT true CHECK (engaged),
    engaged_at  timestamptz NOT NULL DEFAULT now(),
    engaged_by  text NOT NULL,
    reason      text NOT NULL DEFAULT ''
);
