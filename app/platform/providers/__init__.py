"""Mail providers behind one interface (base.py); chosen by MAIL_PROVIDER.

  smtp      pooled connections reused across batches (app/platform/providers/smtp.py), driven by one
            asyncio loop (smtp_async.py; a thread per connection with smtplib when SMTP_ASYNC=0),
            sized by throughput and the relay's learned limit (smtp_sizing.py)
  file      writes .eml files to MAIL_FILE_DIR, for development (app/platform/providers/file.py)
  sendgrid  SendGrid v3 mail/send (app/platform/providers/sendgrid.py)
  ses       Amazon SES v2 SendEmail, our raw MIME, SigV4 by botocore (ses.py)
  postmark  Postmark /email/batch (postmark.py)
  mailgun   Mailgun messages.mime, our raw MIME (mailgun.py)
            (the three share http_api.py: status mapping, definite and ambiguous failures)

MAIL_PROVIDERS (`postmark,ses`: two or more, in order) makes get_provider() a FailoverProvider over
them (failover.py: a circuit breaker per provider; ambiguous outcomes never move).

get_provider() returns one shared instance per process (providers are thread-safe), rebuilt when
the settings change (tests override SMTP_URL and friends).
"""

from __future__ import annotations

import importlib
import threading

from app.platform import config
from app.platform.providers.base import Provider

PROVIDERS = {
    "smtp": "app.platform.providers.smtp:SMTPProvider",
    "file": "app.platform.providers.file:FileProvider",
    "sendgrid": "app.platform.providers.sendgrid:SendGridProvider",
    "ses": "app.platform.providers.ses:SESProvider",
    "postmark": "app.platform.providers.postmark:PostmarkProvider",
    "mailgun": "app.platform.providers.mailgun:MailgunProvider",
}

_lock = threading.Lock()
_instances: dict[str, tuple] = {}  # name -> (settings it was built with, provider)


def provider_class(name: str):
    target = PROVIDERS.get(name)
    if target is None:
        raise config.ConfigError(f"MAIL_PROVIDER must be one of {', '.join(sorted(PROVIDERS))}, got {name!r}")
    return _load(target)


def _load(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)  # lazy: sendgrid code loads only when used


FAILOVER = "failover"
_FAILOVER_CLASS = "app.platform.providers.failover:FailoverProvider"


def configured() -> list[str]:
    """The providers mail goes through, in order: MAIL_PROVIDERS, or MAIL_PROVIDER alone."""
    settings = config.get()
    names = [n.strip().lower() for n in settings.mail_providers if n.strip()]
    return names or [settings.mail_provider.strip().lower()]


def _build(name: str) -> Provider:
    if name == FAILOVER:  # each member its own instance: the failover provider closes them
        names = configured()
        unknown = [n for n in names if n not in PROVIDERS]
        if unknown:
            raise config.ConfigError(
                f"MAIL_PROVIDERS names unknown providers {unknown}: use {', '.join(sorted(PROVIDERS))}"
            )
        return _load(_FAILOVER_CLASS)([provider_class(n)() for n in names])
    return provider_class(name)()


def get_provider(name: str | None = None) -> Provider:
    settings = config.get()
    if name is None:
        names = configured()
        name = FAILOVER if len(names) > 1 else names[0]
    name = name.strip().lower()
    entry = _instances.get(name)
    if entry is not None and entry[0] is settings:
        return entry[1]
    with _lock:
        entry = _instances.get(name)
        if entry is not None and entry[0] is settings:
            return entry[1]
        provider = _build(name)
        _instances[name] = (settings, provider)
    if entry is not None:
        entry[1].close()
    return provider


def close_all() -> None:
    """Worker shutdown and tests: close pooled connections."""
    with _lock:
        entries = list(_instances.values())
        _instances.clear()
    for _, provider in entries:
        provider.close()
