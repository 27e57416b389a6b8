"""Every setting is declared once, here: name, type, default and meaning in one field of Settings.
The environment variable is the field name in upper case; `load()` reads and type-checks each one,
and the configuration table in docs/configuration.md is generated from the same declarations
(`python -m app settings --markdown`; tests/platform/test_config.py checks they agree).

A `.env` file (ENV_FILE; `make run` writes one) is read first: each of its variables that the
environment does not set is set from it, so every command of a checkout (the CLI, the processes)
sees the same development settings, and the environment always wins."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from urllib.parse import urlsplit

import babel
import dotenv


class ConfigError(RuntimeError):
    """A setting is missing or malformed; raised at start-up, never mid-request."""


DEV_SECRET_KEY = "dev-insecure-secret-key-change-me"
MIN_SECRET_KEY_LENGTH = 32
MIN_RETENTION_DAYS = 7  # a weekly digest's events must outlive its week
# Where the built-in key, unsigned webhooks and the mail viewer are allowed. Anything else
# (production, staging, a typo) gets the production rules.
DEVELOPMENT_ENVS = ("development", "test")
# The value SENDGRID_WEBHOOK_ALLOW_UNSIGNED must have: long and explicit on purpose.
ALLOW_UNSIGNED_WEBHOOK = "i-understand-anyone-can-post-events"


def setting(default, doc: str, *, shown: str | None = None):
    """A field of Settings: its default, what it means, and how docs/configuration.md shows the default."""
    return field(default=default, metadata={"doc": doc, "shown": shown})


@dataclass(frozen=True)
class Settings:
    # -- platform
    env: str = setting(
        "production",
        "`development` or `test` allow the built-in key, unsigned webhooks and "
        "the dev mail viewer; anything else (or unset) is production: start-up fails "
        "without a SECRET_KEY of 32+ characters other than the built-in one, "
        "without SENDGRID_WEBHOOK_PUBLIC_KEY or the opt-out, and without "
        "MAIL_POSTAL_ADDRESS. `make run`/`demo`/"
        "`migrate`/`bench` and `Procfile.dev` set `development`, and `make run` writes it "
        "to `.env`, so `notify …` in the next terminal runs in development too",
    )
    env_file: str = setting(
        ".env",
        "a file of `NAME=value` lines read before anything else (python-dotenv; relative to the "
        "working directory): a variable the environment sets wins over the file. `make run` writes "
        "the development settings and the demo API keys there (git-ignored); empty: no file",
    )
    database_url: str = setting("postgresql://localhost/notify", "Postgres; created if missing by `migrate`")
    migration_database_url: str = setting(
        "",
        "Postgres for `migrate` alone. Behind PgBouncer in transaction "
        "pooling mode, point it at Postgres itself (or a session-mode pool): "
        "the migrator needs one session for its advisory lock and for "
        '`lock_timeout` around CREATE INDEX CONCURRENTLY (docs/operations.md "Running '
        'behind PgBouncer")',
        shown="DATABASE_URL",
    )
    redis_url: str = setting("redis://localhost:6379/0", "Dramatiq's broker")
    secret_key: str = setting(
        DEV_SECRET_KEY,
        "signs tokens and tracking codes (`openssl rand -hex 32`)",
        shown="dev key (development/test only)",
    )
    secret_key_fallbacks: tuple = setting((), "older keys (comma separated) that still verify after a rotation")
    base_url: str = setting(
        "http://127.0.0.1:8000",
        "public URL of the web process: every link in mails and pages starts with it (`make run` writes it to `.env`)",
    )
    sentry_dsn: str = setting("", "when set, web and workers report errors (Starlette + Dramatiq integrations)")
    db_pool_size: int = setting(10, "peewee pool per process")
    db_pool_timeout_seconds: float = setting(10.0, "how long a request waits for a pooled connection")
    malloc_arenas: int = setting(
        2,
        "glibc malloc arenas per web and worker process (0: glibc's default, 8 per "
        "core): a threaded process with fewer arenas fragments less; 2 lowered a "
        "SendGrid newsletter worker's peak RSS at the same speed "
        "(scripts/bench/newsletter.py)",
    )
    memory_give_back_seconds: float = setting(
        10.0,
        "a worker process with no message in flight returns glibc's free pages to the system "
        "(malloc_trim) at most this often, so memory that a digest wave or a large send freed "
        "leaves the process between waves (docs/scaling.md: memory); 0: never",
    )
    worker_idle_poll_ms: int = setting(
        250,
        "the longest an idle worker process waits before looking at a Redis queue "
        "again (Dramatiq's worker_timeout, 1,000 by default): a busy hour's first "
        "batch and a send-now mail start at most this late. The price is polling: "
        "two idle worker processes used 1.0 % of a core at 1,000, 3.6 % at 250 and "
        "7.5 % at 100",
    )
    # -- metrics
    prometheus_multiproc_dir: str = setting(
        ".var/metrics",
        "where every process of a deployment writes its Prometheus "
        "values (prometheus-client multiprocess mode; relative paths are "
        "under the checkout); created at start-up, read by `GET /metrics` "
        "(web, or `python -m app metrics-exporter` on a worker-only host). "
        "One directory per deployment and host: empty it when the deployment starts "
        'from scratch (docs/observability.md "Metrics")',
    )
    metrics_token: str = setting(
        "",
        "a Bearer token that may read `GET /metrics` besides admin API keys "
        "(compared in constant time; unset: admin keys only)",
    )
    # -- operator dashboard (/admin)
    admin_session_hours: float = setting(
        8.0,
        "how long an /admin sign-in lasts: the signed cookie and the server-side "
        "session expire together (signing out or revoking the key ends it at once)",
    )
    admin_login_max_failures: int = setting(
        10,
        "/admin sign-in attempts checked per client address in 15 minutes, "
        "each counted before its key is looked at (parallel attempts "
        "cannot slip past; a successful sign-in clears the count); then "
        "sign-in answers 429 until the window ends (each failure is also "
        "answered only after a 1 s pause)",
    )
    admin_cache_seconds: float = setting(
        60.0, "the dashboard's figures and charts are computed at most this often per web process and range"
    )
    # -- ingestion
    http_header_timeout_seconds: float = setting(
        10.0,
        "a web connection that has not sent a request's complete "
        "headers this long after it opened (or after the previous "
        "response) gets 408 and is closed: a client trickling header "
        "bytes holds no connection for longer (app/platform/slow_clients.py; "
        "0: no deadline)",
    )
    max_body_bytes: int = setting(1024 * 1024, "largest request body", shown="1 MiB")
    max_batch_events: int = setting(1000, "events per POST /v1/events")
    max_payload_bytes: int = setting(16 * 1024, "an event's payload as JSON", shown="16 KiB")
    api_key_cache_seconds: float = setting(
        10.0,
        "revocation delay bound; also how long an unknown key is "
        "remembered as unknown (a key created meanwhile works within it)",
    )
    ingest_group_wait_ms: float = setting(1.0, "group commit: how long the writer waits to gather more requests")
    ingest_group_max_events: int = setting(5000, "group commit: most events in one transaction")
    # -- migrations
    migration_lock_timeout: str = setting(
        "200ms",
        "lock_timeout of each migration statement, and of the "
        "scheduler's partition DDL: the longest a writer queues behind "
        "it (scripts/bench/migrations.py)",
    )
    migration_retries: int = setting(10, "retries (with backoff) of a migration that hit the lock timeout")
    # -- retention
    retention_days: int = setting(
        90,
        "digest_events, webhook_events and email_link_history are partitioned by "
        "month; a month goes whole (dropped, not DELETEd) once its newest row is older "
        "than this, digest events never included in a digest counted first (docs/operations.md "
        '"Retention"). 0 keeps everything; otherwise at least 7 (a weekly digest '
        "must see its week)",
    )
    # -- mail
    mail_provider: str = setting(
        "file", "`smtp`, `sendgrid`, `ses`, `postmark`, `mailgun` or `file` (`make run` uses the dev SMTP sink)"
    )
    mail_from: str = setting("Notify <notify@localhost>", "default sender: exactly one mailbox")
    smtp_url: str = setting("smtp://localhost:1025", "`smtp://user:pass@host:port`, `?starttls=1`, or `smtps://`")
    mail_file_dir: str = setting("mail-out", "where the `file` provider writes .eml files")
    mail_viewer_url: str = setting(
        "http://127.0.0.1:8025/dev/mail",
        "where the page at `/` links the development mail viewer (`scripts/dev/mailviewer.py`; "
        "its port is MAIL_VIEWER_PORT); shown in development only",
    )
    feed_demo_url: str = setting(
        "http://127.0.0.1:8026/?user=demo-ana",
        "where the page at `/` links the in-app feed demo (`scripts/dev/feeddemo.py`; its port is FEED_DEMO_PORT); "
        "shown in development only",
    )
    unsubscribe_mailto: str = setting("", "adds a mailto: target to List-Unsubscribe")
    mail_postal_address: str = setting(
        "",
        "the sender's postal address, shown in the footer of every newsletter "
        'and digest (HTML and text; line breaks become ", "); required '
        "outside development/test, where empty means no address line",
    )
    sendgrid_api_key: str = setting("", "SendGrid API key")
    sendgrid_api_url: str = setting("https://api.sendgrid.com/v3/mail/send", "SendGrid v3 mail/send endpoint")
    sendgrid_webhook_public_key: str = setting(
        "", "verifies signed SendGrid event webhooks (base64 DER); required outside development"
    )
    sendgrid_webhook_allow_unsigned: bool = setting(
        False,
        f"set to exactly `{ALLOW_UNSIGNED_WEBHOOK}` to run production without that key (anyone can then "
        "post events: suppress addresses, fake statistics); logged as a WARNING at start-up",
        shown="—",
    )
    sendgrid_webhook_max_age_seconds: int = setting(600, "oldest signed webhook timestamp accepted")
    sendgrid_webhook_max_body_bytes: int = setting(8 * 1024 * 1024, "largest webhook body", shown="8 MiB")
    # -- the other providers' webhooks (tracking/sns.py, postmark_events.py, mailgun_events.py): a route
    # whose secret is not set answers 404; in production it is required for a provider MAIL_PROVIDER names
    ses_sns_topic_arns: tuple = setting(
        (),
        "the SNS topics (comma-separated ARNs) whose signed messages `/webhooks/ses` accepts and whose "
        "subscriptions it confirms; empty: the route answers 404. Required outside development when "
        "the mail providers include `ses`",
    )
    sns_signing_cert_file: str = setting(
        "",
        "a PEM file of SNS signing certificates used instead of fetching each message's "
        "`SigningCertURL` (offline deployments, tests); the URL is still checked",
    )
    sns_max_age_seconds: int = setting(
        3900,
        "oldest SNS message `Timestamp` accepted (SNS keeps the publish time on its retries, which "
        "end within an hour); five minutes ahead is the most accepted",
    )
    postmark_webhook_user: str = setting(
        "",
        "HTTP basic auth user Postmark's webhook URL carries (`https://USER:PASSWORD@host/webhooks/postmark`); "
        "with POSTMARK_WEBHOOK_PASSWORD, required outside development when the mail providers include `postmark`",
    )
    postmark_webhook_password: str = setting("", "HTTP basic auth password of Postmark's webhook URL")
    mailgun_webhook_signing_key: str = setting(
        "",
        "Mailgun's HTTP webhook signing key: `/webhooks/mailgun` verifies the HMAC-SHA256 of each "
        "request's timestamp and token with it; required outside development when the mail providers include `mailgun`",
    )
    mailgun_webhook_max_age_seconds: int = setting(
        900, "oldest Mailgun webhook timestamp accepted (either direction); each token is accepted once within it"
    )
    # -- HTTP API providers (docs/sending.md "Providers")
    ses_region: str = setting("us-east-1", "the AWS region of the SES v2 API (`ses`)")
    ses_endpoint_url: str = setting("", "the SES v2 API's base URL", shown="`https://email.{SES_REGION}.amazonaws.com`")
    aws_access_key_id: str = setting(
        "", "SES credentials; empty: botocore's chain (profile, web identity, the instance or task role)"
    )
    aws_secret_access_key: str = setting("", "with AWS_ACCESS_KEY_ID")
    aws_session_token: str = setting("", "with temporary credentials")
    ses_configuration_set: str = setting(
        "", "the SES configuration set every mail names (its event destination feeds /webhooks/ses)"
    )
    postmark_server_token: str = setting("", "Postmark server API token (`postmark`)")
    postmark_api_url: str = setting("https://api.postmarkapp.com", "Postmark's API base URL")
    postmark_digest_stream: str = setting("outbound", "the Postmark message stream of digests (transactional)")
    postmark_newsletter_stream: str = setting("broadcast", "the Postmark message stream of newsletters (broadcast)")
    mailgun_api_key: str = setting("", "Mailgun API key (`mailgun`)")
    mailgun_domain: str = setting("", "the Mailgun sending domain")
    mailgun_api_url: str = setting(
        "https://api.mailgun.net", "Mailgun's API base URL; EU domains: `https://api.eu.mailgun.net`"
    )
    mail_providers: tuple = setting(
        (),
        "failover: providers in order of preference (`postmark,ses`); each mail goes through the first "
        "whose circuit breaker is closed. Empty: MAIL_PROVIDER alone. The breakers are per process",
    )
    provider_breaker_failures: int = setting(
        3, "definite failures of a provider (refused connection, 5xx, 429, …) within the window that open its breaker"
    )
    provider_breaker_window_seconds: float = setting(30.0, "the window PROVIDER_BREAKER_FAILURES counts in")
    provider_breaker_cooldown_seconds: float = setting(
        30.0, "an open breaker lets one batch probe its provider again (half-open) after this long"
    )
    provider_timeout_seconds: float = setting(
        30.0,
        "HTTP providers: how long a call may take; a call that times out after it was sent is "
        "ambiguous (it may have been accepted): retried on the same provider only",
    )
    dkim_domain: str = setting("", "DKIM signing domain (with DKIM_SELECTOR and DKIM_PRIVATE_KEY)")
    dkim_selector: str = setting("", "DKIM selector")
    dkim_private_key: str = setting("", "PEM key, or a path to one")
    # -- brand (the mail layout around digests and newsletter bodies: app/platform/mail_layout.py)
    brand_name: str = setting(
        "Notify",
        "the name at the top of every digest and wrapped newsletter (and the logo's "
        "alt text); plain text, at most 100 characters",
    )
    brand_logo_url: str = setting(
        "", "an `https://` URL of a logo shown instead of the name (32 px high); unset: the name as text"
    )
    brand_color: str = setting(
        "#1f5fbf", "accent colour of links, the name and the card's top edge (`#rgb` or `#rrggbb`)"
    )
    brand_background: str = setting("#f4f5f7", "colour around the card (`#rgb` or `#rrggbb`)")
    default_locale: str = setting(
        "en",
        "the language of a subscriber who has set none, and the last step before English of every "
        "locale's fallback chain (a BCP 47 tag: `en`, `pt-BR`, `de`; docs/i18n.md)",
    )
    default_quiet_hours: str = setting(
        "",
        "quiet hours of a subscriber who has set none, `START-END` in their own zone (`22:00-07:00`): "
        "digests and notification mail due inside wait for the end; empty: none (mail goes when it is due)",
    )
    default_max_mails_per_day: int = setting(
        0,
        "most mails a subscriber gets in their local day when they have set no budget (digests, send-now, "
        "critical and newsletter mail count; send-now mail over it folds into the next digest, newsletters "
        "wait for the next day); 0: no limit",
    )
    name_fallback: str = setting(
        "",
        "what `{{name}}` shows for a subscriber without a name, in newsletters and the greeting of "
        'every mail ("Hi," when empty, "Hi friend," with `friend`); at most 60 characters',
    )
    # -- tracking
    tracking: bool = setting(True, "`off` sends clean links and no open pixel")
    tracking_flush_seconds: float = setting(
        0.2, "click/open history buffered this long (what a SIGKILLed web process can lose; SIGTERM loses none)"
    )
    tracking_buffer_max_rows: int = setting(200_000, "most buffered history rows per web process")
    tracking_scanner_seconds: int = setting(10, "clicks/opens this soon after delivery are link scanners")
    forwarded_allow_ips: str = setting(
        "127.0.0.1,::1",
        "trusted proxies (IPs/CIDRs, `*` = all): only behind one "
        "of these is `X-Forwarded-For` read, right to left, skipping "
        "trusted hops; uvicorn reads the same variable",
    )
    # -- digests
    digest_max_items: int = setting(50, 'entities shown per digest ("and N more")')
    digest_stagger_seconds: int = setting(3600, "spread of a slot's sends (stable per subscriber)")
    digest_processing_timeout_seconds: int = setting(
        300,
        "a batch's worker is presumed dead when its claim was not renewed this long (a live one renews "
        'it, app/platform/holds.py; docs/operations.md "Failure handling": how it was chosen)',
    )
    digest_max_attempts: int = setting(5, "attempts before a run is `failed`")
    scheduler_interval_seconds: float = setting(30.0, "scheduler tick")
    digest_template_dir: str = setting("", "override digest/templates")
    digest_claim_batch: int = setting(100, "runs claimed and sent per actor message")
    digest_build_events: int = setting(
        1000, "loaded events a worker thread builds and sends at a time: a batch goes out in slices (memory)"
    )
    digest_plan_batch: int = setting(10_000, "subscribers planned per statement (each batch commits)")
    digest_event_page: int = setting(1000, "events loaded per page")
    digest_max_events: int = setting(100_000, "events per run; the rest waits for the next digest")
    digest_queue_max_depth: int = setting(200, "the checker never lets the digest queue grow past this")
    digest_reenqueue_seconds: int = setting(300, "a pending run enqueued this long ago is enqueued again")
    digest_retry_base_seconds: int = setting(60, "backoff after a retryable failure: base x 2^attempts")
    immediate_max_per_hour: int = setting(
        4,
        'send-now mails (cadence `immediately`, priority high, "send now" '
        "categories) per subscriber in any hour; more waits for the next "
        "allowed one (0 = no limit)",
    )
    unseen_grace_seconds: int = setting(
        0,
        'how long a send-now mail (cadence `immediately`, priority high, "send now" '
        "categories) waits before it is built: what the subscriber saw in the app "
        "meanwhile (the feed's seen/read marks) is left out, and a mail left with "
        "nothing unseen is not sent. 0 sends at once",
    )
    feed_token_seconds: int = setting(
        3600,
        "how long a feed token (POST /v1/subscribers/{user_id}/feed-token) is valid; "
        "`ttl_seconds` in the request may ask for less",
    )
    feed_allowed_origins: tuple = setting(
        (),
        "origins (comma separated, e.g. `https://app.example.com`) whose pages may call "
        "/v1/feed* from the browser (CORS); empty: none",
    )
    feed_stream_max_connections: int = setting(
        200, "open GET /v1/feed/stream connections per web process; more are refused with 503"
    )
    feed_stream_poll_seconds: float = setting(
        2.0, "how often an open feed stream looks for new items and count changes"
    )
    feed_stream_heartbeat_seconds: float = setting(
        15.0, "a comment line this often on a quiet feed stream, so proxies keep it open"
    )
    immediate_recheck_seconds: int = setting(
        3600,
        "how often every `immediately` subscriber is looked at anyway (events left behind by a pause or a resubscribe)",
    )
    smtp_pool_size: int = setting(
        8,
        "SMTP connections each worker process starts with and may always hold (fewer only "
        "if the relay refuses them); the threaded pool (SMTP_ASYNC=0) holds no more. "
        "Two worker processes at 8 fit a stock Postfix (50 per client)",
    )
    smtp_pool_max: int = setting(
        256,
        "most SMTP connections per worker process. The async pool grows towards it "
        "only while more connections raise the measured throughput: to a relay far "
        "away (every mail takes 10 ms or more beyond the worker's own event-loop "
        "delays) in a few big steps, to a relay next "
        "door by doublings that are undone when they do not pay, so it stays at "
        'SMTP_POOL_SIZE. A relay that refuses one more (421 or "too many '
        "connections\" at the greeting, a refused connect) sets the process's most "
        "where it refused, for 5 minutes, then a tenth higher at a time; no mail fails "
        "for it (app/platform/providers/smtp_sizing.py)",
    )
    smtp_timeout_seconds: float = setting(30.0, "per SMTP step; a batch starts no mail after twice this")
    smtp_idle_timeout_seconds: float = setting(
        30.0,
        "an SMTP connection unused this long is closed (QUIT): a burst's "
        "connections go back to the relay instead of holding its "
        "processes (Postfix itself drops a silent client after 300 s)",
    )
    smtp_async: bool = setting(True, "drive the pool from one asyncio loop (off: a thread per connection)")
    # -- newsletters
    send_batch_size: int = setting(
        0,
        "rows per claim and per provider call; 0: the provider's own size "
        "(SendGrid 500 recipients per API call; SMTP 1,000, the best measured by "
        "scripts/bench/knobs.py), capped by what the provider accepts",
        shown="0 (provider's own)",
    )
    reclaim_after_seconds: int = setting(
        300, "a `sending` row is presumed lost when its claim was not renewed this long (a live worker renews it)"
    )
    provider_rate_per_second: float = setting(0.0, "shared send ceiling (0: none); 429s lower it adaptively")
    soft_bounce_limit: int = setting(3, "deferrals before an address is suppressed")
    newsletter_send_chains: int = setting(
        4,
        "send loops a newsletter starts with (each holds a worker thread for "
        "at most a few seconds at a time); more are added while they mostly "
        "wait for the provider and the CPU has room (app/newsletter/growth.py)",
    )
    newsletter_send_chains_max: int = setting(
        16, "at most this many send loops per newsletter (NEWSLETTER_SEND_CHAINS or less: no growth)"
    )
    newsletter_max_attempts: int = setting(8, "retryable failures before a row is `failed`")

    @property
    def is_development(self) -> bool:
        return self.env in DEVELOPMENT_ENVS

    @property
    def secret_keys(self) -> tuple:
        """Signing key first, then fallbacks that still verify."""
        return (self.secret_key, *self.secret_key_fallbacks)


def env_name(name: str) -> str:
    return "APP_ENV" if name == "env" else name.upper()


def _parse(f, raw: str):
    kind = (
        f.type
        if isinstance(f.type, type)
        else {"int": int, "float": float, "bool": bool, "str": str, "tuple": tuple}[f.type]
    )
    if kind is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            word = "an integer" if kind is int else "a number"
            raise ConfigError(f"{env_name(f.name)} must be {word}, got {raw!r}") from None
    return raw


def _secret_keys(env: str) -> tuple[str, tuple]:
    """SECRET_KEY and its fallbacks. Outside development/test the key in this repository (or a
    short guessable one) would let anyone forge unsubscribe tokens and tracking codes."""
    secret = os.environ.get("SECRET_KEY", "")
    fallbacks = tuple(k.strip() for k in os.environ.get("SECRET_KEY_FALLBACKS", "").split(",") if k.strip())
    if env in DEVELOPMENT_ENVS:
        return secret or DEV_SECRET_KEY, fallbacks
    if not secret:
        raise ConfigError(
            f"SECRET_KEY is not set (APP_ENV={env}). Set SECRET_KEY to a long random string "
            f"(at least {MIN_SECRET_KEY_LENGTH} characters, e.g. `openssl rand -hex 32`); it signs "
            "unsubscribe tokens and tracking codes. For local development set APP_ENV=development."
        )
    if secret == DEV_SECRET_KEY or DEV_SECRET_KEY in fallbacks:
        raise ConfigError(
            f"SECRET_KEY / SECRET_KEY_FALLBACKS contain the development key from the repository "
            f"(APP_ENV={env}): anyone could forge tokens. Set SECRET_KEY to a new random string "
            f"(`openssl rand -hex 32`) and remove the development key from SECRET_KEY_FALLBACKS."
        )
    if len(secret) < MIN_SECRET_KEY_LENGTH:
        raise ConfigError(
            f"SECRET_KEY is {len(secret)} characters (APP_ENV={env}); use at least "
            f"{MIN_SECRET_KEY_LENGTH} random characters (`openssl rand -hex 32`). Keep the old one "
            "in SECRET_KEY_FALLBACKS so links already sent keep working."
        )
    return secret, fallbacks


def _webhook_allow_unsigned(env: str, public_key: str) -> bool:
    """Outside development/test an unsigned SendGrid webhook lets anyone on the internet suppress
    any address or fake delivery statistics, so it needs a key or a deliberate, greppable opt-out."""
    raw = os.environ.get("SENDGRID_WEBHOOK_ALLOW_UNSIGNED", "").strip()
    if raw and raw != ALLOW_UNSIGNED_WEBHOOK:
        raise ConfigError(
            f"SENDGRID_WEBHOOK_ALLOW_UNSIGNED must be exactly {ALLOW_UNSIGNED_WEBHOOK!r} (or unset), got {raw!r}"
        )
    allowed = bool(raw)
    if env not in DEVELOPMENT_ENVS and not public_key and not allowed:
        raise ConfigError(
            f"SENDGRID_WEBHOOK_PUBLIC_KEY is not set (APP_ENV={env}): /webhooks/sendgrid would accept "
            "unsigned events from anyone. Set SENDGRID_WEBHOOK_PUBLIC_KEY to the verification key "
            "from SendGrid (Settings > Mail Settings > Signed Event Webhook), or, to accept unsigned "
            f"events anyway, set SENDGRID_WEBHOOK_ALLOW_UNSIGNED={ALLOW_UNSIGNED_WEBHOOK}."
        )
    return allowed


def _postal_address(env: str, raw: str) -> str:
    """Anti-spam law (CAN-SPAM, and what Gmail/Yahoo expect of bulk senders) wants the sender's
    postal address in every commercial mail: production does not start without one."""
    address = ", ".join(line.strip() for line in raw.splitlines() if line.strip())
    if not address and env not in DEVELOPMENT_ENVS:
        raise ConfigError(
            f"MAIL_POSTAL_ADDRESS is not set (APP_ENV={env}): every newsletter and digest must show the "
            'sender\'s postal address. Set MAIL_POSTAL_ADDRESS, e.g. "Example Ltd, 1 Main St, Springfield" '
            "(for local development set APP_ENV=development)."
        )
    return address


# Read by load() itself: their rules depend on APP_ENV and on each other.
# The brand values go into every mail's HTML and CSS: check_brand() refuses what could inject.
_BRAND = ("brand_name", "brand_logo_url", "brand_color", "brand_background", "name_fallback")
_SPECIAL = {
    "env",
    "secret_key",
    "secret_key_fallbacks",
    "sendgrid_webhook_allow_unsigned",
    "mail_postal_address",
    *_BRAND,
}


def load_env_file() -> str | None:
    """Set the variables of ENV_FILE that the environment does not set; the file's path if read."""
    path = os.environ.get("ENV_FILE", Settings.env_file)
    if not path or not os.path.isfile(path):
        return None
    dotenv.load_dotenv(path, override=False)
    return path


def load() -> Settings:
    load_env_file()
    values = {}
    for f in fields(Settings):
        raw = os.environ.get(env_name(f.name))
        if f.name not in _SPECIAL and raw is not None and raw != "":
            values[f.name] = _parse(f, raw)
    # Unset means production: a deploy that forgets APP_ENV fails on the missing SECRET_KEY instead
    # of signing with the key in this repository. `make run`/`make demo`/... set development.
    env = os.environ.get("APP_ENV", "").strip().lower() or Settings.env
    values["env"] = env
    values["secret_key"], values["secret_key_fallbacks"] = _secret_keys(env)
    values["sendgrid_webhook_allow_unsigned"] = _webhook_allow_unsigned(
        env, values.get("sendgrid_webhook_public_key", "")
    )
    values["mail_postal_address"] = _postal_address(env, os.environ.get("MAIL_POSTAL_ADDRESS", ""))
    values["base_url"] = values.get("base_url", Settings.base_url).rstrip("/")
    values["default_locale"] = _default_locale(values.get("default_locale", Settings.default_locale))
    _check_quiet_hours(values.get("default_quiet_hours", ""))
    if values.get("default_max_mails_per_day", 0) < 0:
        raise ConfigError("DEFAULT_MAX_MAILS_PER_DAY must be 0 (no limit) or more")
    values.update({name: raw.strip() for name in _BRAND if (raw := os.environ.get(env_name(name)))})
    retention = values.get("retention_days", Settings.retention_days)
    if retention < 0 or 0 < retention < MIN_RETENTION_DAYS:
        raise ConfigError(
            f"RETENTION_DAYS must be 0 (keep everything) or at least {MIN_RETENTION_DAYS}, got {retention}"
        )
    settings = Settings(**values)
    check_brand(settings)
    return settings


def _default_locale(raw: str) -> str:
    """DEFAULT_LOCALE in its one spelling (`pt_br` -> `pt-BR`; app/platform/i18n.py normalises
    subscribers' tags the same way), or a ConfigError: every mail of a subscriber without a locale
    would otherwise fall back to English without a word."""
    try:
        parsed = babel.Locale.parse(raw.strip().replace("-", "_"))
    except (babel.UnknownLocaleError, ValueError) as exc:
        raise ConfigError(
            f"DEFAULT_LOCALE must be a locale such as `en`, `pt-BR` or `de`, got {raw!r}: {exc}"
        ) from None
    return "-".join(part for part in (parsed.language, parsed.script, parsed.territory, parsed.variant) if part)


_QUIET_HOURS = re.compile(r"\s*(([01][0-9]|2[0-3]):[0-5][0-9])\s*-\s*(([01][0-9]|2[0-3]):[0-5][0-9])\s*")


def _check_quiet_hours(raw: str) -> None:
    """DEFAULT_QUIET_HOURS is START-END as HH:MM-HH:MM with START != END, or empty
    (app/subscribers/quiet_hours.py parse_setting reads it)."""
    if not raw.strip():
        return
    found = _QUIET_HOURS.fullmatch(raw)
    if found is None or found[1] == found[3]:
        raise ConfigError(
            "DEFAULT_QUIET_HOURS must be START-END as HH:MM-HH:MM (22:00-07:00), two different times, "
            f"or empty; got {raw!r}"
        )


_COLOUR = re.compile(r"#(?:[0-9a-fA-F]{3}){1,2}")
_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f\"'<>\\`()]")


def check_brand(settings: Settings) -> None:
    """The brand settings go into every mail's HTML and CSS: only values that cannot carry markup
    or CSS pass (ConfigError names the variable)."""
    for name in ("brand_color", "brand_background"):
        value = getattr(settings, name)
        if not _COLOUR.fullmatch(value):
            raise ConfigError(f"{env_name(name)} must be a colour as #rgb or #rrggbb, got {value!r}")
    logo = settings.brand_logo_url
    if logo:
        parts = urlsplit(logo)
        if parts.scheme != "https" or not parts.hostname or _URL_UNSAFE.search(logo) or len(logo) > 2000:
            raise ConfigError(
                f"BRAND_LOGO_URL must be an https:// URL without quotes, spaces, brackets or backslashes, got {logo!r}"
            )
    for name, limit, required in (("brand_name", 100, True), ("name_fallback", 60, False)):
        value = getattr(settings, name)
        if (required and not value.strip()) or len(value) > limit or not value.isprintable():
            raise ConfigError(
                f"{env_name(name)} must be {'1 to ' if required else 'at most '}{limit} printable "
                f"characters on one line, got {value!r}"
            )


def markdown_table() -> str:
    """The configuration table of docs/configuration.md, from the declarations."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        shown = f.metadata.get("shown")
        if shown is None:
            shown = (
                ("on" if f.default else "off")
                if isinstance(f.default, bool)
                else ", ".join(f.default)
                if isinstance(f.default, tuple)
                else f.default
            )
        rows.append(f"| `{env_name(f.name)}` | {shown if shown != '' else '—'} | {f.metadata['doc']} |")
    return "\n".join(rows)


_settings: Settings | None = None


def get() -> Settings:
    global _settings
    if _settings is None:
        _settings = load()
    return _settings


def reload() -> Settings:
    """Re-read the environment and ENV_FILE (tests and the CLI after changing os.environ)."""
    global _settings
    _settings = load()
    return _settings


def override(**changes) -> Settings:
    """Replace some settings in process (tests). Returns the previous settings."""
    global _settings
    previous = get()
    known = {f.name for f in fields(Settings)}
    unknown = set(changes) - known
    if unknown:
        raise ConfigError(f"unknown settings: {sorted(unknown)}")
    replaced = Settings(**{**{f.name: getattr(previous, f.name) for f in fields(Settings)}, **changes})
    check_brand(replaced)
    _settings = replaced
    return previous


def restore(previous: Settings) -> None:
    global _settings
    _settings = previous


load_env_file()  # at import, before any module reads os.environ (LOG_LEVEL, PROMETHEUS_MULTIPROC_DIR)
