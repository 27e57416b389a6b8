"""Test send: a newsletter rendered for a few given addresses and handed straight to the provider,
in any status (a draft included), so an operator can look at it in a real inbox before the real send.

It never touches the outbox or the newsletter's status: no email_log row, no tracked links (the
newsletter's click statistics stay the audience's), custom_args `mail_kind` "newsletter_test" (the
webhook counts nothing for it, but a bounce or complaint still suppresses the address, as for any
mail). An address that belongs to a subscriber is rendered as that subscriber's mail (name, working
unsubscribe and preference links); any other address gets empty variables and links that
open the service's "this link is not valid" page. Suppressed addresses are refused: a test must not hurt reputation.
While the emergency stop holds all mail (app/platform/mail_stop.py), test sends are refused too.
"""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.newsletter import template, variants
from app.platform import config, db, i18n, mail, mail_stop, tokens
from app.platform.addresses import canonical
from app.platform.errors import Conflict, NotFound, Unavailable
from app.platform.providers import get_provider
from app.platform.providers.base import OutgoingMail, ProviderError
from app.platform.validation import Body, LocaleKey
from app.subscribers import mailable, records, streams

log = logging.getLogger("app.newsletter.test_send")

MAX_ADDRESSES = 10
KIND = "newsletter_test"
# Where a non-subscriber's unsubscribe and preference links point: the page for an unknown link.
PLACEHOLDER_TOKEN = "test-send"


class TestSendInput(Body):
    to: Annotated[
        list[records.Email],
        Field(
            min_length=1,
            max_length=MAX_ADDRESSES,
            description=f"1 to {MAX_ADDRESSES} addresses; duplicates are sent once",
        ),
    ]
    locale: Annotated[
        LocaleKey | None,
        Field(
            description='send the variant a reader of this locale gets (docs/i18n.md, "Newsletters in several '
            "languages\"), its words in that language; absent or null: each address gets its subscriber's "
            "variant (DEFAULT_LOCALE's for an address of no subscriber)"
        ),
    ] = None

    def addresses(self) -> list[str]:
        """The addresses as given, in the given order, each address once (two spellings of one
        address, README "Address identity", are one: the first is kept)."""
        first: dict[str, str] = {}
        for address in self.to:
            first.setdefault(canonical(address), address)
        return list(first.values())


class TestResult(BaseModel):
    email: str = Field(
        description='the address\'s canonical form (README "Address identity"); the mail went to the address as given'
    )
    status: Literal["sent", "failed", "suppressed"]
    error: str | None = None


class ProviderUnavailable(Unavailable):
    """The provider call failed as a whole: nothing was sent."""

    code = "provider_unavailable"

    def __init__(self, reason: str):
        super().__init__(f"the mail provider refused the test send; nothing was sent: {reason}")


class Stopped(Conflict):
    """All outgoing mail is stopped: nothing was sent."""

    code = "sending_stopped"


def send(newsletter_id: int, addresses: list[str], provider=None, locale: str | None = None) -> list[TestResult]:
    """One result per address (email: its canonical form; sent, failed with an error, or suppressed),
    in the order given; each mail goes to the address as given. `locale` (normalised): the variant a
    reader of it gets, for every address; None: each address its subscriber's. Raises NotFound,
    Stopped (the emergency stop), or ProviderUnavailable when the provider call failed as a whole."""
    found = db.query("SELECT subject, html, text, from_addr, variants FROM newsletters WHERE id = %s", (newsletter_id,))
    if not found:
        raise NotFound("no newsletter with that id")
    subject, html, text, from_addr, stored_variants = found[0]
    stored_variants = stored_variants or {}
    stop = mail_stop.state()
    if stop is not None:
        raise Stopped(
            f"all outgoing mail is stopped (since {stop['engaged_at']} by {stop['engaged_by']}: "
            f"{stop['reason'] or 'no reason given'}); nothing was sent"
        )
    keys = {address: canonical(address) for address in addresses}
    known = {
        row[0]: row[1:]
        for row in db.query(
            "SELECT DISTINCT ON (canonical_email) canonical_email, id, name, user_id, token_version, locale "
            "FROM subscribers "
            "WHERE canonical_email = ANY (%s) ORDER BY canonical_email, id",
            (list(keys.values()),),
        )
    }
    suppressed = {
        row[0]
        for row in db.query(
            f"SELECT a FROM unnest(%s::text[]) a WHERE {mailable.address_refusal('a')} IS NOT NULL",
            (list(keys.values()),),
        )
    }

    def compiled(variant: str | None) -> template.Compiled:
        if variant is None:
            return template.compiled_for(newsletter_id, subject, html, text)
        v = stored_variants[variant]
        return template.compiled_for(newsletter_id, v["subject"], v["html"], v.get("text"), variant)

    results = {
        address: TestResult(email=keys[address], status="suppressed")
        for address in addresses
        if keys[address] in suppressed
    }
    mails = []
    for address in addresses:
        if keys[address] in suppressed:
            continue
        subscriber = known.get(keys[address])
        reader = locale or (subscriber[4] if subscriber is not None else None)
        variant = variants.choose(stored_variants, reader)
        words = variants.render_locale(variant, reader)
        mails.append(_render(newsletter_id, compiled(variant), address, subscriber, from_addr, words))
    if mails:
        provider = provider or get_provider()
        try:
            outcomes = provider.send_batch(mails)
        except ProviderError as exc:
            log.warning("newsletter %s: test send to %d address(es) failed: %s", newsletter_id, len(mails), exc)
            raise ProviderUnavailable(str(exc)) from exc
        for sent, outcome in zip(mails, outcomes):
            key = keys[sent.to]
            results[sent.to] = (
                TestResult(email=key, status="sent")
                if outcome.ok
                else TestResult(email=key, status="failed", error=outcome.error or "refused")
            )
    log.info("newsletter %s: test send %s", newsletter_id, ", ".join(f"{r.email}={r.status}" for r in results.values()))
    return [results[address] for address in addresses]


def _render(
    newsletter_id: int, compiled: template.Compiled, address: str, subscriber, from_addr, locale: str | None
) -> OutgoingMail:
    if subscriber is not None:
        sub_id, name, user_id, token_version, _ = subscriber
        unsubscribe_url = tokens.unsubscribe_url(sub_id, token_version, streams.NEWSLETTER_MAIL_SCOPE)
        preferences_url = tokens.preferences_url(sub_id, token_version)
        headers = mail.unsubscribe_headers(unsubscribe_url)
    else:
        name, user_id, headers = "", "", {}
        base = config.get().base_url
        unsubscribe_url = f"{base}/u/{PLACEHOLDER_TOKEN}"
        preferences_url = f"{base}/preferences/{PLACEHOLDER_TOKEN}"
    rendered = compiled.render(
        {
            "name": name or "",
            "email": address,
            "user_id": user_id or "",
            "unsubscribe_url": unsubscribe_url,
            "preferences_url": preferences_url,
            "locale": locale,
        }
    )
    # Translators: the subject of a test send; keep the brackets, so the editor sees it is one.
    prefixed = i18n.translator(locale).gettext("[Test] {subject}", subject=rendered.subject)
    return OutgoingMail(
        to=address,
        to_name=name or "",
        subject=mail.one_line(prefixed),
        html=rendered.html,
        text=rendered.text,
        from_addr=from_addr,
        headers=headers,
        idempotency_key=f"newsletter-{newsletter_id}-test-{uuid.uuid4().hex}",
        template=f"newsletter-{newsletter_id}-test-{locale or 'default'}",
        custom_args={"mail_kind": KIND, "mail_id": str(newsletter_id)},
    )
