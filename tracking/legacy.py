"""Click codes issued by a previous system (`notify import-legacy-links FILE.csv`): the one owner of
`legacy_link_codes`. They resolve forever (tracking/resolve.py reads them).

CSV columns (a header row `code,url,mail,recipient` is optional):
  code       the old code exactly as it appears in sent mails (the path segment after /c/);
             1-200 characters, no whitespace or '/'
  url        the http(s) URL the old code redirected to
  mail       "<kind>:<id>" with kind digest or newsletter, e.g. "newsletter:42" (newsletters.id)
             or "digest:17" (digest_runs.id): the mail the link belongs to. The mail row does not
             have to exist here (old mails usually don't); it only groups links for stats.
  recipient  our subscriber id (digits), or the recipient's email (looked up by its canonical
             form, README "Address identity": any case, IDNA or full-width spelling finds the
             subscriber), or empty when the old code was not per-recipient

Each (mail, url) becomes one email_links row (shared with anything already there), each code one
legacy_link_codes row. Re-running the same file is harmless: existing codes are kept as they are
(a code already mapped to a different link is reported as a conflict, never overwritten). Bad lines
are reported with their line number and skipped.
"""

from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass, field

from app.platform import db
from app.platform.addresses import canonical
from app.subscribers import records
from tracking import codes, links

log = logging.getLogger("tracking.legacy")

CHUNK = 5000
_MAIL_RE = re.compile(r"^(digest|newsletter):(\d{1,18})$")


@dataclass
class ImportReport:
    lines: int = 0
    imported: int = 0
    already_present: int = 0
    conflicts: int = 0
    unknown_recipients: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line number, message)


def parse_line(row: list[str]) -> tuple | str:
    """(code, url, mail_kind, mail_id, recipient) or an error message."""
    if len(row) != 4:
        return f"expected 4 columns (code,url,mail,recipient), got {len(row)}"
    code, url, mail, recipient = (c.strip() for c in row)
    if not codes.is_legacy_shaped(code):
        return "code must be 1-200 characters without whitespace, '/' or NUL"
    if not url.lower().startswith(("http://", "https://")) or len(url) > links.MAX_URL_LENGTH:
        return "url must be an http(s) URL"
    m = _MAIL_RE.match(mail)
    if not m:
        return "mail must look like newsletter:42 or digest:17"
    if recipient and not recipient.isdigit() and "@" not in recipient:
        return "recipient must be a subscriber id, an email address or empty"
    return code, url, m.group(1), int(m.group(2)), recipient


def _import_chunk(items: list[tuple], report: ImportReport) -> None:
    link_ids: dict[tuple, int] = {}
    by_mail: dict[tuple, list[str]] = {}
    for _, url, kind, mail_id, _ in items:
        by_mail.setdefault((kind, mail_id), []).append(url)
    for (kind, mail_id), urls in by_mail.items():
        for url, link_id in links.ensure_links(kind, mail_id, urls).items():
            link_ids[(kind, mail_id, url)] = link_id
    by_email = records.ids_by_address(sorted({canonical(r) for *_, r in items if "@" in r}))
    values = []
    for code, url, kind, mail_id, recipient in items:
        subscriber_id: int | None
        if recipient.isdigit():
            subscriber_id = int(recipient)
        elif recipient:
            subscriber_id = by_email.get(canonical(recipient))
            if subscriber_id is None:
                report.unknown_recipients += 1
        else:
            subscriber_id = None
        values.append((code, link_ids[(kind, mail_id, url)], subscriber_id))
    with db.raw_cursor() as cur:
        inserted = db.execute_values(
            cur,
            "INSERT INTO legacy_link_codes (code, link_id, subscriber_id) VALUES %s "
            "ON CONFLICT (code) DO NOTHING RETURNING code",
            values,
            page_size=len(values),
            fetch=True,
        )
        report.imported += len(inserted)
        new = {r[0] for r in inserted}
        old = [v for v in values if v[0] not in new]
        if old:
            cur.execute("SELECT code, link_id FROM legacy_link_codes WHERE code = ANY(%s)", ([v[0] for v in old],))
            existing = dict(cur.fetchall())
            for code, link_id, _ in old:
                if existing.get(code) == link_id:
                    report.already_present += 1
                else:
                    report.conflicts += 1
                    log.warning(
                        "legacy code %r already maps to link %s, not %s: kept", code, existing.get(code), link_id
                    )


def import_csv(stream) -> ImportReport:
    """Every line of a CSV stream, in committed chunks of CHUNK codes."""
    report = ImportReport()
    pending: list[tuple] = []
    seen_codes: set[str] = set()
    for lineno, row in enumerate(csv.reader(stream), start=1):
        if not row or all(not c.strip() for c in row):
            continue
        if lineno == 1 and [c.strip().lower() for c in row] == ["code", "url", "mail", "recipient"]:
            continue
        report.lines += 1
        parsed = parse_line(row)
        if isinstance(parsed, str):
            report.errors.append((lineno, parsed))
            continue
        if codes.decode_click(parsed[0]) is not None:
            report.errors.append((lineno, "code collides with a current-format code; refusing it"))
            continue
        if parsed[0] in seen_codes:
            report.errors.append((lineno, "code repeated in this file; the first line wins"))
            continue
        seen_codes.add(parsed[0])
        pending.append(parsed)
        if len(pending) >= CHUNK:
            _import_chunk(pending, report)
            pending = []
    if pending:
        _import_chunk(pending, report)
    return report


def anonymise(cur: db.Cursor, subscriber_id: int) -> None:
    """Right to erasure: the codes keep resolving (a sent mail's link never breaks) for nobody in particular."""
    cur.execute("UPDATE legacy_link_codes SET subscriber_id = NULL WHERE subscriber_id = %s", (subscriber_id,))
