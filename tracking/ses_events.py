"""Amazon SES events (the `Message` of a verified SNS Notification) as stored webhook rows.

SES publishes in two formats, both accepted: identity notifications (`notificationType`: Bounce,
Complaint, Delivery) and configuration-set event publishing (`eventType`: Bounce, Complaint,
Delivery, Send, Reject, Open, Click, DeliveryDelay, Subscription, Rendering Failure). Subscribe
only one of them per identity: each SNS message is a new event, so both would count a delivery twice
(a suppression is the same either way).

One SNS message is one SES event, which may name several recipients (one bounce for three of them):
one row per recipient, id `ses:<SNS MessageId>:<n>`, so a redelivered message is stored once and
every recipient gets its own row (what an erasure deletes); each row's raw event then names only its
own recipient (the recipient list and `mail.destination` narrowed, the mail's headers left out).
The mail is found by `mail.messageId` (what the SES provider records as provider_message_id).

The vocabulary is tracking/webhook_apply.py's:
  Bounce Permanent                          → bounce (suppressed)
  Bounce Transient / Undetermined           → deferred (a soft bounce: SES has given up on this
                                              message, so each counts once)
  DeliveryDelay                             → deferred, not counted (`attempt` "delay"): SES is still
                                              trying, may report the delay more than once, and the
                                              Transient bounce that ends its tries is what counts
  Complaint (feedback type not `not-spam`)  → spamreport (suppressed); `not-spam` → not_spam
  Delivery → delivered; Send → processed; Reject, Rendering Failure → dropped (SES's own refusal,
  no suppression); Open → open; Click → click; Subscription → unsubscribe when the recipient
  unsubscribed from all (SES list management), else subscription.
"""

from __future__ import annotations

import copy
import logging

import orjson

from tracking import webhook_intake

log = logging.getLogger("tracking.ses_events")

# (the event's object key, its recipient list key or None for mail.destination, the address key
# inside a list item or None when items are plain addresses)
_RECIPIENTS = {
    "Bounce": ("bounce", "bouncedRecipients", "emailAddress"),
    "Complaint": ("complaint", "complainedRecipients", "emailAddress"),
    "Delivery": ("delivery", "recipients", None),
    "DeliveryDelay": ("deliveryDelay", "delayedRecipients", "emailAddress"),
    "Send": ("send", None, None),
    "Reject": ("reject", None, None),
    "Rendering Failure": ("failure", None, None),
    "Open": ("open", None, None),
    "Click": ("click", None, None),
    "Subscription": ("subscription", None, None),
}


def _name(kind: str, detail: dict) -> str:
    if kind == "Bounce":
        return "bounce" if str(detail.get("bounceType", "")).lower() == "permanent" else "deferred"
    if kind == "Complaint":
        return "not_spam" if detail.get("complaintFeedbackType") == "not-spam" else "spamreport"
    if kind == "Subscription":
        preferences = detail.get("newTopicPreferences")
        unsubscribed = isinstance(preferences, dict) and preferences.get("unsubscribeAll") is True
        return "unsubscribe" if unsubscribed else "subscription"
    return {
        "Delivery": "delivered",
        "DeliveryDelay": "deferred",
        "Send": "processed",
        "Reject": "dropped",
        "Rendering Failure": "dropped",
        "Open": "open",
        "Click": "click",
    }[kind]


def rows_from_message(sns_message_id: str, message: str) -> list[tuple]:
    """The rows of one SES event; [] (logged) for a message that is not one (SNS's own test
    notifications, a type SES added later)."""
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError:
        log.warning("SNS notification %s: Message is not JSON; nothing stored", sns_message_id)
        return []
    if not isinstance(event, dict):
        return []
    kind = event.get("eventType") or event.get("notificationType")
    mail = event.get("mail")
    if not isinstance(kind, str) or kind not in _RECIPIENTS or not isinstance(mail, dict):
        log.info("SNS notification %s: not an SES event we apply (%r); nothing stored", sns_message_id, kind)
        return []
    key, list_key, address_key = _RECIPIENTS[kind]
    found = event.get(key)
    detail: dict = found if isinstance(found, dict) else {}
    recipients = detail.get(list_key) if list_key else mail.get("destination")
    if not isinstance(recipients, list):
        return []
    name = _name(kind, detail)
    message_id = mail.get("messageId") if isinstance(mail.get("messageId"), str) else None
    rows = []
    for n, recipient in enumerate(recipients):
        address = recipient.get(address_key) if address_key and isinstance(recipient, dict) else recipient
        if not isinstance(address, str) or not address.strip():
            continue
        raw = event
        destination = mail.get("destination")
        if len(recipients) > 1 or (isinstance(destination, list) and len(destination) > 1):
            # This recipient's row names no other recipient: an erasure of one, which deletes the
            # rows of its address, leaves no trace of it in another's row.
            raw = copy.copy(event)
            raw["mail"] = {k: v for k, v in mail.items() if k not in ("headers", "commonHeaders")}
            raw["mail"]["destination"] = [address]
            if list_key:
                raw[key] = {**detail, list_key: [recipient]}
        payload = {"provider": "ses", "message_id": message_id, "raw": raw}
        if kind == "DeliveryDelay":
            payload["attempt"] = "delay"  # webhook_apply counts a deferral only at attempt 1
        if kind == "Click" and isinstance(detail.get("link"), str):
            payload["url"] = detail["link"]
        rows.append(webhook_intake.row(f"ses:{sns_message_id}:{n}", name, address, payload))
    return rows
