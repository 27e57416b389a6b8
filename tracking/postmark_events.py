"""Postmark webhooks: the basic-auth check, and each record as a stored webhook row.

Postmark signs nothing: its webhook URL carries HTTP basic auth credentials
(`https://USER:PASSWORD@host/webhooks/postmark`), which `authorized` compares with
POSTMARK_WEBHOOK_USER and POSTMARK_WEBHOOK_PASSWORD in constant time (both compared, always, so
the time says nothing of which one was wrong). HTTPS keeps them secret on the way.

One request is one record (`RecordType`). Its id: `postmark:<ID>` for Bounce and SpamComplaint
records (Postmark's bounce id, the same on every redelivery), else `postmark:sha256:<hash of the
record>` (Delivery, Open, Click and SubscriptionChange carry no id; a redelivery is the same record).
The mail is found by `MessageID` (what the Postmark provider records as provider_message_id).

The vocabulary is tracking/webhook_apply.py's. Bounce by `Type` (Postmark's bounce types):
  HardBounce, BadEmailAddress, ManuallyDeactivated  → bounce (suppressed)
  Blocked                                           → bounce type blocked (suppressed as `block`)
  SpamComplaint                                     → spamreport (suppressed)
  Unsubscribe                                       → unsubscribe (suppressed)
  Transient, SoftBounce, DnsError                   → deferred (a soft bounce, counted once per message)
  anything else (AutoResponder, AddressChange, DMARCPolicy, Unknown, ...)
                                                    → bounce_other: counted, nothing suppressed
    (an out-of-office reply or our own DMARC trouble says nothing bad about the address)
SpamComplaint → spamreport; SubscriptionChange with SuppressSending true → by its
SuppressionReason: HardBounce → bounce, SpamComplaint → spamreport, else unsubscribe (with false:
subscription_change, nothing lifted: a resubscribe is the subscriber's own, on our pages);
Delivery → delivered; Open → open; Click → click.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from tracking import webhook_intake

HARD = {"HardBounce", "BadEmailAddress", "ManuallyDeactivated"}
SOFT = {"Transient", "SoftBounce", "DnsError"}
RECORDS = {"Bounce", "SpamComplaint", "SubscriptionChange", "Delivery", "Open", "Click"}


class Unusable(ValueError):
    """The body is not a Postmark record (400)."""


def authorized(header: str | None, user: str, password: str) -> bool:
    """Whether the Authorization header carries exactly these basic auth credentials."""
    if not header or not user or not password:
        return False
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or len(encoded) > 1024:
        return False
    try:
        given = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    given_user, _, given_password = given.partition(b":")
    user_ok = hmac.compare_digest(given_user, user.encode())
    password_ok = hmac.compare_digest(given_password, password.encode())
    return user_ok and password_ok


def _bounce(kind: object) -> tuple[str, str | None]:
    if not isinstance(kind, str):
        return "bounce_other", None
    if kind in HARD:
        return "bounce", None
    if kind == "Blocked":
        return "bounce", "blocked"
    if kind == "SpamComplaint":
        return "spamreport", None
    if kind == "Unsubscribe":
        return "unsubscribe", None
    if kind in SOFT:
        return "deferred", None
    return "bounce_other", None


def _subscription_change(record: dict) -> str:
    if record.get("SuppressSending") is not True:
        return "subscription_change"
    reason = record.get("SuppressionReason")
    return {"HardBounce": "bounce", "SpamComplaint": "spamreport"}.get(str(reason), "unsubscribe")


def rows_from_record(record: object) -> list[tuple]:
    """The row of one Postmark record ([] for a RecordType not applied here); Unusable if the body
    is not a record at all."""
    if not isinstance(record, dict) or not isinstance(record.get("RecordType"), str):
        raise Unusable("body must be a JSON object with a RecordType")
    kind = record["RecordType"]
    if kind not in RECORDS:
        return []
    blocked = None
    if kind == "Bounce":
        name, blocked = _bounce(record.get("Type"))
    elif kind == "SpamComplaint":
        name = "spamreport"
    elif kind == "SubscriptionChange":
        name = _subscription_change(record)
    else:
        name = {"Delivery": "delivered", "Open": "open", "Click": "click"}[kind]
    address = record.get("Email") if kind in ("Bounce", "SpamComplaint") else record.get("Recipient")
    bounce_id = record.get("ID")
    if kind in ("Bounce", "SpamComplaint") and isinstance(bounce_id, int) and not isinstance(bounce_id, bool):
        event_id = f"postmark:{bounce_id}"
    else:
        event_id = webhook_intake.content_id("postmark:sha256:", record)
    message_id = record.get("MessageID")
    payload: dict = {"provider": "postmark", "message_id": message_id if isinstance(message_id, str) else None}
    if blocked:
        payload["type"] = blocked
    if kind == "Click" and isinstance(record.get("OriginalLink"), str):
        payload["url"] = record["OriginalLink"]
    payload["raw"] = record
    return [webhook_intake.row(event_id, name, address if isinstance(address, str) else None, payload)]
