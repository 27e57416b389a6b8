"""SendGrid v3 mail/send: one POST per batch of up to 1000 recipients.

Per-recipient content, and why substitutions: v3 personalizations carry their own to, subject,
headers, custom_args and substitutions, but `content` is shared by the whole request. Newsletter
mails differ per recipient only in small places (name, unsubscribe/preferences URLs, tracked link
codes, the open pixel), so the batch is factored into ONE shared body plus per-personalization
`substitutions`:
  - the HTML is split into constant markup and "slots" (attribute values "…" and text nodes >…<);
    every mail rendered from the same template has the same constants (Mustache escapes `"<>` in
    values, so a value can never change the markup structure);
  - slots that differ between recipients become tags ([[nl:h12]]) in the shared body, and each
    personalization substitutes its own value; the plain-text part is factored the same way by line;
  - mails are grouped by template (OutgoingMail.template: a newsletter's variant) and structure
    first (the constant markup, the number of text lines): each group shares a body of its own, so
    a newsletter's variants in several languages in one batch are one request per language, never
    one body for all; a mail whose structure no other has
    (e.g. an unescaped {{{var}}} containing markup) or whose substitutions would exceed SendGrid's
    10,000-byte limit is sent in its own request, so the factoring can only cost extra requests,
    never change what a recipient receives.
Mails with identical content (digests never are; a newsletter without per-recipient variables is)
simply share the body with no substitutions.

Idempotency: SendGrid has no documented idempotency header for mail/send. Each personalization
carries our per-row key in custom_args["idempotency_key"] (comes back in every webhook event) and
the request carries `Idempotency-Key` (a hash of its row keys) for proxies/providers that honour it.
The window where a crash after SendGrid's 202 but before our commit re-sends is one batch.

Status mapping: 2xx ok; 429 -> ThrottledError(retry_after from X-RateLimit-Reset or Retry-After);
5xx, timeouts, connection errors -> TransientError; 401/403/413 and other 4xx -> PermanentError.
A 400 names the fields it refused (`personalizations.3.to.0.email`): those recipients fail alone
and the rest of the request is sent again without them; a 400 naming no recipient refuses the
whole request. Every mail is validated locally first (mail.validate), so most bad recipients
never reach SendGrid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import operator
import re
import time
from typing import cast

import httpx
import orjson

from app.platform import config, mail
from app.platform.providers.base import (
    STOPPED,
    OutgoingMail,
    PermanentError,
    Progress,
    Provider,
    SendResult,
    ThrottledError,
    TransientError,
)

log = logging.getLogger("app.platform.providers.sendgrid")
# httpx logs every request at INFO: one line per 1000-recipient batch is noise; errors are logged here.
logging.getLogger("httpx").setLevel(logging.WARNING)

MAX_PERSONALIZATIONS = 1000
MAX_SUBSTITUTION_BYTES = 10_000
# Requests one batch may send again after SendGrid named recipients it refused.
MAX_REFUSAL_ROUNDS = 10
_PERSONALIZATION_FIELD = re.compile(r"personalizations\.(\d{1,4})\b")
HTML_SLOTS = re.compile(r'("[^"<>]*"|>[^<>]*<)')


class SendGridProvider(Provider):
    name = "sendgrid"
    max_batch = MAX_PERSONALIZATIONS
    # 500 recipients per API call: as fast as 1,000 in scripts/bench/newsletter.py, with less worker
    # memory at peak, and still few calls and 429s.
    preferred_batch = MAX_PERSONALIZATIONS // 2

    def __init__(
        self,
        api_key: str | None = None,
        api_url: str | None = None,
        timeout: float = 30.0,
        client: httpx.Client | None = None,
    ):
        settings = config.get()
        self.api_key = api_key if api_key is not None else settings.sendgrid_api_key
        self.api_url = api_url or settings.sendgrid_api_url
        self.default_from = settings.mail_from
        # One pooled client per provider instance: keep-alive connections reused across batches.
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
        )

    def close(self) -> None:
        self.client.close()

    # -- sending ---------------------------------------------------------------------------------
    def prepare(self, m: OutgoingMail) -> OutgoingMail:
        """What SendGrid would refuse for this recipient, refused here alone."""
        mail.validate(m)
        to = mail.check_address(m.to)
        if mail.needs_smtputf8(to):
            raise mail.MailBuildError(f"SendGrid cannot send to {to!r}: a non-ASCII local part needs SMTPUTF8")
        return dataclasses.replace(
            m, to=to, to_name=mail.one_line(m.to_name), from_addr=m.from_addr and mail.sender(m.from_addr)
        )

    def deliver(self, prepared: list[tuple[OutgoingMail, OutgoingMail]], progress: Progress) -> list[SendResult]:
        """One API call per request group: a stop request is honoured between two calls."""
        mails = [m for _, m in prepared]
        results: list[SendResult | None] = [None] * len(mails)
        rounds = [MAX_REFUSAL_ROUNDS]
        accepted = False
        for payload, indexes in build_requests(mails, self.default_from):
            progress.poll()
            if progress.stop_requested():
                for i in indexes:
                    results[i] = STOPPED
                    progress.add(i, STOPPED)
                continue
            try:
                self._send_group(mails, payload, indexes, results, rounds)
                for i in indexes:
                    sent = results[i]
                    if sent is not None:  # _send_group gives every index of the group a result
                        progress.add(i, sent)
                        accepted = accepted or sent.ok
            except Rejected as exc:
                if len(mails) == 1:
                    raise
                # This request's recipients are refused; the batch's other requests still go.
                for i in indexes:
                    if results[i] is None:
                        results[i] = SendResult(ok=False, error=str(exc), permanent=True)
            except (ThrottledError, TransientError, PermanentError) as exc:
                if not accepted:
                    raise  # nothing of this batch was accepted: the caller handles the whole batch
                # Earlier groups were accepted: report only the rest as failed, never the whole batch.
                permanent = isinstance(exc, PermanentError)
                for i in range(len(mails)):
                    if results[i] is None:
                        results[i] = SendResult(ok=False, error=f"sendgrid: {exc}", permanent=permanent)
                return cast(list[SendResult], results)  # every index has its result now
        return cast(list[SendResult], results)

    def _send_group(self, mails, payload: dict, indexes: list[int], results: list, rounds: list) -> None:
        """POST one request. When SendGrid refuses it because of some recipients (a 400 naming
        `personalizations.N`), those fail alone and the request goes again without them, at most
        MAX_REFUSAL_ROUNDS times per batch. A 400 naming no recipient refuses the whole request."""
        keys = [mails[i].idempotency_key for i in indexes]
        try:
            message_id = self._post(payload, keys)
        except Rejected as exc:
            bad = {indexes[k] for k in exc.personalizations if k < len(indexes)}
            if not bad or exc.global_fields or len(bad) == len(indexes) or rounds[0] <= 0:
                raise
            rounds[0] -= 1
            for i in bad:
                results[i] = SendResult(ok=False, error=f"sendgrid refused this recipient: {exc}", permanent=True)
            rest = [i for i in indexes if i not in bad]
            for sub_payload, sub in build_requests([mails[i] for i in rest], self.default_from):
                self._send_group(mails, sub_payload, [rest[k] for k in sub], results, rounds)
            return
        for i in indexes:
            results[i] = SendResult(ok=True, message_id=message_id)

    def _post(self, payload: dict, keys: list[str]) -> str | None:
        body = orjson.dumps(payload)
        headers = {
            "Authorization": f"Bearer {self.api_key}",
            "Content-Type": "application/json",
            "Idempotency-Key": hashlib.sha256("\n".join(keys).encode()).hexdigest(),
        }
        try:
            response = self.client.post(self.api_url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise TransientError(f"timeout talking to SendGrid: {exc}") from exc
        except httpx.TransportError as exc:
            raise TransientError(f"cannot reach SendGrid: {exc}") from exc
        _release(response)
        status = response.status_code
        if 200 <= status < 300:
            return response.headers.get("X-Message-Id")
        detail = _error_detail(response)
        if status == 429:
            raise ThrottledError(f"429 rate limited: {detail}", retry_after=_retry_after(response))
        if status >= 500:
            raise TransientError(f"SendGrid {status}: {detail}")
        if status == 400:
            raise Rejected(f"SendGrid {status}: {detail}", _error_fields(response))
        raise PermanentError(f"SendGrid {status}: {detail}")


class Rejected(PermanentError):
    """A 400: `personalizations` are the indexes SendGrid blamed; `global_fields` anything else it
    named (from, subject, content…), which no recipient can be blamed for."""

    def __init__(self, message: str, fields: list[str]):
        super().__init__(message)
        self.personalizations: set[int] = set()
        self.global_fields: list[str] = []
        for name in fields:
            match = _PERSONALIZATION_FIELD.match(name)
            if match:
                self.personalizations.add(int(match.group(1)))
            else:
                self.global_fields.append(name)


def _release(response: httpx.Response) -> None:
    """An httpx Response and its stream point at each other (Response.stream is a BoundSyncStream
    that holds the response): a reference cycle, so the response, its request and the request's
    body — a batch's megabytes of JSON — waited for the cyclic collector, which a worker runs rarely
    (actors/broker.py CollectorTuning). Worker RSS grew with every call until a full collection
    (scripts/bench/newsletter.py: 240-290 MB peak for 200,000 recipients). The body has been read
    (a non-streaming call): pointing the stream at an empty one breaks the cycle, and reference
    counting frees it all when the caller lets go."""
    response.stream = httpx.ByteStream(b"")


def _error_fields(response: httpx.Response) -> list[str]:
    try:
        errors = response.json().get("errors") or []
        return [str(e["field"]) for e in errors[:MAX_PERSONALIZATIONS] if isinstance(e, dict) and e.get("field")]
    except Exception:
        return []


def _error_detail(response: httpx.Response) -> str:
    try:
        errors = response.json().get("errors") or []
        text = "; ".join(str(e.get("message", e)) for e in errors[:5])
    except Exception:
        text = response.text
    return (text or response.reason_phrase or "")[:500]


def _retry_after(response: httpx.Response) -> float | None:
    reset = response.headers.get("X-RateLimit-Reset")
    if reset:
        try:
            value = float(reset)
            # An epoch timestamp (SendGrid) or, from some proxies, seconds to wait.
            return max(0.0, value - time.time()) if value > 1e9 else max(0.0, value)
        except ValueError:
            pass
    retry = response.headers.get("Retry-After")
    if retry:
        try:
            return max(0.0, float(retry))
        except ValueError:
            pass
    return None


# -- request building -----------------------------------------------------------------------------
def _personalization(mail: OutgoingMail, subject: str) -> dict:
    to = {"email": mail.to}
    if mail.to_name:
        to["name"] = mail.to_name
    p: dict = {"to": [to]}
    if mail.subject != subject:
        p["subject"] = mail.subject
    if mail.headers:
        p["headers"] = {k: str(v) for k, v in mail.headers.items()}
    custom = {k: str(v) for k, v in mail.custom_args.items()}
    custom["idempotency_key"] = mail.idempotency_key
    p["custom_args"] = custom
    return p


def _payload(first: OutgoingMail, default_from: str, html: str, text: str, personalizations: list) -> dict:
    content = []
    if text:
        content.append({"type": "text/plain", "value": text})
    content.append({"type": "text/html", "value": html})
    return {
        "personalizations": personalizations,
        "from": _address(first.from_addr or default_from),
        "subject": first.subject,
        "content": content,
    }


def _address(value: str) -> dict:
    value = value.strip()
    if value.endswith(">") and "<" in value:
        name, _, email = value[:-1].rpartition("<")
        name = name.strip().strip('"')
        return {"email": email.strip(), "name": name} if name else {"email": email.strip()}
    return {"email": value}


def build_requests(mails: list[OutgoingMail], default_from: str) -> list[tuple[dict, list[int]]]:
    """[(payload, indexes of the mails it carries)]: as few requests as the content allows."""
    requests: list[tuple[dict, list[int]]] = []
    by_from: dict[str | None, list[int]] = {}
    for i, m in enumerate(mails):
        by_from.setdefault(m.from_addr, []).append(i)
    for indexes in by_from.values():
        first = mails[indexes[0]]
        if all(mails[i].html == first.html and mails[i].text == first.text for i in indexes):
            personalizations = [_personalization(mails[i], first.subject) for i in indexes]
            requests.append((_payload(first, default_from, first.html, first.text, personalizations), indexes))
            continue
        # Mails share a body only with mails of their template and shape (the same constant markup, as
        # many text lines): a newsletter's variants in other languages each get a body of their own —
        # a batch of three languages is three requests, never one body for all.
        split: dict[int, tuple[list[str], list[str]]] = {}
        shapes: dict[tuple, list[int]] = {}
        for i in indexes:
            parts, lines = HTML_SLOTS.split(mails[i].html), (mails[i].text or "").split("\n")
            split[i] = (parts, lines)
            shapes.setdefault((mails[i].template, tuple(parts[0::2]), len(lines)), []).append(i)
        alone = [group[0] for group in shapes.values() if len(group) == 1]
        if alone:
            log.info("sendgrid: %d mail(s) could not share a batch body; sent with their own content", len(alone))
        for group in shapes.values():
            requests.extend(_factor(mails, group, split, default_from))
    return requests


def _factor(mails: list[OutgoingMail], indexes: list[int], split: dict, default_from: str):
    """The requests of mails of one shape: one shared body with substitutions, and a request of its
    own for a mail whose substitutions would be too large."""
    first = mails[indexes[0]]
    ref_html, ref_lines = split[indexes[0]]
    ref_slots = ref_html[1::2]
    varying_h: set[int] = set()
    varying_t: set[int] = set()
    for i in indexes[1:]:
        parts, lines = split[i]
        varying_h.update(itertools.compress(range(len(ref_slots)), map(operator.ne, parts[1::2], ref_slots)))
        varying_t.update(itertools.compress(range(len(lines)), map(operator.ne, lines, ref_lines)))

    prefix = "[[nl:"
    n = 0
    while prefix in first.html or prefix in (first.text or ""):
        n += 1
        prefix = f"[[nl{n}:"
    html_tags = {k: f"{prefix}h{k}]]" for k in varying_h}
    text_tags = {k: f"{prefix}t{k}]]" for k in varying_t}

    grouped, personalizations, loners = [], [], []
    for i in indexes:
        parts, lines = split[i]
        slots = parts[1::2]
        subs = {tag: slots[k] for k, tag in html_tags.items()}
        subs.update({tag: lines[k] for k, tag in text_tags.items()})
        if sum(len(k.encode()) + len(v.encode()) for k, v in subs.items()) > MAX_SUBSTITUTION_BYTES:
            loners.append(i)
            continue
        p = _personalization(mails[i], first.subject)
        if subs:
            p["substitutions"] = subs
        grouped.append(i)
        personalizations.append(p)

    requests = []
    if grouped:
        html_parts = list(ref_html)
        for k, tag in html_tags.items():
            html_parts[2 * k + 1] = tag
        text_lines = list(ref_lines)
        for k, tag in text_tags.items():
            text_lines[k] = tag
        shared_text = "\n".join(text_lines) if first.text else ""
        requests.append((_payload(first, default_from, "".join(html_parts), shared_text, personalizations), grouped))
    if loners:
        log.info("sendgrid: %d mail(s) had too much to substitute; sent with their own content", len(loners))
        for i in loners:
            mail = mails[i]
            requests.append(
                (_payload(mail, default_from, mail.html, mail.text, [_personalization(mail, mail.subject)]), [i])
            )
    return requests


def render_personalization(payload: dict, index: int) -> dict:
    """What recipient `index` of a payload receives (used by the fake server and tests)."""
    p = payload["personalizations"][index]
    subs = p.get("substitutions", {})
    content = {}
    for part in payload["content"]:
        value = part["value"]
        for tag, sub in subs.items():
            value = value.replace(tag, sub)
        content[part["type"]] = value
    return {
        "to": p["to"][0]["email"],
        "subject": p.get("subject", payload["subject"]),
        "html": content.get("text/html", ""),
        "text": content.get("text/plain", ""),
        "headers": p.get("headers", {}),
        "custom_args": p.get("custom_args", {}),
    }
