"""Every setting comes from the environment, read once, here (Heroku conventions)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields


class ConfigError(RuntimeError):
    """A setting is missing or malformed; raised at start-up, never mid-request."""


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


DEV_SECRET_KEY = "dev-insecure-secret-key-change-me"


@dataclass(frozen=True)
class Settings:
    env: str = "development"
    database_url: str = "postgresql://localhost/notify"
    redis_url: str = "redis://localhost:6379/0"
    secret_key: str = DEV_SECRET_KEY
    # Older keys still verify tokens and tracking codes after a rotation (comma separated).
    secret_key_fallbacks: tuple = ()
    base_url: str = "http://localhost:8000"
    sentry_dsn: str = ""
    db_pool_size: int = 10
    db_pool_timeout_seconds: float = 10.0
    # Ingestion limits
    max_body_bytes: int = 1024 * 1024
    max_batch_events: int = 1000
    max_payload_bytes: int = 16 * 1024
    # Revocation of an API key is effective within this many seconds on every web process.
    api_key_cache_seconds: float = 10.0
    # Group commit: the writer waits at most this long to gather more requests into one transaction.
    ingest_group_wait_ms: float = 1.0
    ingest_group_max_events: int = 5000
    # Migrations
    migration_lock_timeout: str = "5s"
    migration_retries: int = 10
    # Mail
    mail_provider: str = "file"
    mail_from: str = "Notify <notify@localhost>"
    smtp_url: str = "smtp://localhost:1025"
    mail_file_dir: str = "mail-out"
    unsubscribe_mailto: str = ""
    sendgrid_api_key: str = ""
    sendgrid_api_url: str = "https://api.sendgrid.com/v3/mail/send"
    sendgrid_webhook_public_key: str = ""
    sendgrid_webhook_max_age_seconds: int = 600
    dkim_domain: str = ""
    dkim_selector: str = ""
    dkim_private_key: str = ""
    tracking: bool = True
    # Click/open history is buffered in the web process and written every this many seconds: the
    # window of history rows a SIGKILLed web process can lose (SIGTERM flushes them).
    tracking_flush_seconds: float = 0.2
    tracking_buffer_max_rows: int = 200_000
    # Clicks/opens this soon after delivery are link scanners / proxy prefetches (is_machine).
    tracking_scanner_seconds: int = 10
    sendgrid_webhook_max_body_bytes: int = 8 * 1024 * 1024
    # Digest pipeline
    digest_max_items: int = 50
    digest_stagger_seconds: int = 3600
    digest_processing_timeout_seconds: int = 900
    digest_max_attempts: int = 5
    scheduler_interval_seconds: float = 30.0
    digest_template_dir: str = ""            # empty: digest/templates
    digest_claim_batch: int = 100            # runs claimed and sent per actor message
    digest_plan_batch: int = 10_000          # subscribers planned per statement (each batch commits)
    digest_event_page: int = 1000
    digest_max_events: int = 100_000         # per run; older-first, the rest waits for the next digest
    digest_queue_max_depth: int = 200        # checker never lets the digest queue grow past this
    digest_reenqueue_seconds: int = 300      # a pending run enqueued this long ago is enqueued again
    digest_retry_base_seconds: int = 60      # backoff after a transient send failure: base * 2^attempts
    smtp_pool_size: int = 8                  # concurrent SMTP connections per worker process
    smtp_timeout_seconds: float = 30.0
    smtp_async: bool = True                  # drive the pool from one asyncio loop (off: a thread per connection)
    # Newsletter
    send_batch_size: int = 100
    reclaim_after_seconds: int = 1800
    provider_rate_per_second: float = 0.0
    soft_bounce_limit: int = 3
    # Send chains (concurrent send_batch message loops) per newsletter; ~ worker threads for it.
    newsletter_send_chains: int = 4
    # Transient provider failures retried with backoff this many times before a row is `failed`.
    newsletter_max_attempts: int = 8

    @property
    def is_development(self) -> bool:
        return self.env in ("development", "test")

    @property
    def secret_keys(self) -> tuple:
        """Signing key first, then fallbacks that still verify."""
        return (self.secret_key, *self.secret_key_fallbacks)


def load() -> Settings:
    env = os.environ.get("APP_ENV", "development").strip().lower()
    secret = os.environ.get("SECRET_KEY", "")
    if not secret:
        if env not in ("development", "test"):
            raise ConfigError(
                f"SECRET_KEY is not set (APP_ENV={env}). Set SECRET_KEY to a long random string; "
                "it signs unsubscribe tokens and tracking codes."
            )
        secret = DEV_SECRET_KEY
    fallbacks = tuple(k.strip() for k in os.environ.get("SECRET_KEY_FALLBACKS", "").split(",") if k.strip())
    return Settings(
        env=env,
        database_url=os.environ.get("DATABASE_URL", "postgresql://localhost/notify"),
        redis_url=os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
        secret_key=secret,
        secret_key_fallbacks=fallbacks,
        base_url=os.environ.get("BASE_URL", "http://localhost:8000").rstrip("/"),
        sentry_dsn=os.environ.get("SENTRY_DSN", ""),
        db_pool_size=_int("DB_POOL_SIZE", 10),
        db_pool_timeout_seconds=_float("DB_POOL_TIMEOUT_SECONDS", 10.0),
        max_body_bytes=_int("MAX_BODY_BYTES", 1024 * 1024),
        max_batch_events=_int("MAX_BATCH_EVENTS", 1000),
        max_payload_bytes=_int("MAX_PAYLOAD_BYTES", 16 * 1024),
        api_key_cache_seconds=_float("API_KEY_CACHE_SECONDS", 10.0),
        ingest_group_wait_ms=_float("INGEST_GROUP_WAIT_MS", 1.0),
        ingest_group_max_events=_int("INGEST_GROUP_MAX_EVENTS", 5000),
        migration_lock_timeout=os.environ.get("MIGRATION_LOCK_TIMEOUT", "5s"),
        migration_retries=_int("MIGRATION_RETRIES", 10),
        mail_provider=os.environ.get("MAIL_PROVIDER", "file"),
        mail_from=os.environ.get("MAIL_FROM", "Notify <notify@localhost>"),
        smtp_url=os.environ.get("SMTP_URL", "smtp://localhost:1025"),
        mail_file_dir=os.environ.get("MAIL_FILE_DIR", "mail-out"),
        unsubscribe_mailto=os.environ.get("UNSUBSCRIBE_MAILTO", ""),
        sendgrid_api_key=os.environ.get("SENDGRID_API_KEY", ""),
        sendgrid_api_url=os.environ.get("SENDGRID_API_URL", "https://api.sendgrid.com/v3/mail/send"),
        sendgrid_webhook_public_key=os.environ.get("SENDGRID_WEBHOOK_PUBLIC_KEY", ""),
        sendgrid_webhook_max_age_seconds=_int("SENDGRID_WEBHOOK_MAX_AGE_SECONDS", 600),
        dkim_domain=os.environ.get("DKIM_DOMAIN", ""),
        dkim_selector=os.environ.get("DKIM_SELECTOR", ""),
        dkim_private_key=os.environ.get("DKIM_PRIVATE_KEY", ""),
        tracking=_bool("TRACKING", True),  # TRACKING=off sends clean links and no pixel
        tracking_flush_seconds=_float("TRACKING_FLUSH_SECONDS", 0.2),
        tracking_buffer_max_rows=_int("TRACKING_BUFFER_MAX_ROWS", 200_000),
        tracking_scanner_seconds=_int("TRACKING_SCANNER_SECONDS", 10),
        sendgrid_webhook_max_body_bytes=_int("SENDGRID_WEBHOOK_MAX_BODY_BYTES", 8 * 1024 * 1024),
        digest_max_items=_int("DIGEST_MAX_ITEMS", 50),
        digest_stagger_seconds=_int("DIGEST_STAGGER_SECONDS", 3600),
        digest_processing_timeout_seconds=_int("DIGEST_PROCESSING_TIMEOUT_SECONDS", 900),
        digest_max_attempts=_int("DIGEST_MAX_ATTEMPTS", 5),
        scheduler_interval_seconds=_float("SCHEDULER_INTERVAL_SECONDS", 30.0),
        digest_template_dir=os.environ.get("DIGEST_TEMPLATE_DIR", ""),
        digest_claim_batch=_int("DIGEST_CLAIM_BATCH", 100),
        digest_plan_batch=_int("DIGEST_PLAN_BATCH", 10_000),
        digest_event_page=_int("DIGEST_EVENT_PAGE", 1000),
        digest_max_events=_int("DIGEST_MAX_EVENTS", 100_000),
        digest_queue_max_depth=_int("DIGEST_QUEUE_MAX_DEPTH", 200),
        digest_reenqueue_seconds=_int("DIGEST_REENQUEUE_SECONDS", 300),
        digest_retry_base_seconds=_int("DIGEST_RETRY_BASE_SECONDS", 60),
        smtp_pool_size=_int("SMTP_POOL_SIZE", 8),
        smtp_timeout_seconds=_float("SMTP_TIMEOUT_SECONDS", 30.0),
        smtp_async=_bool("SMTP_ASYNC", True),
        send_batch_size=_int("SEND_BATCH_SIZE", 100),
        reclaim_after_seconds=_int("RECLAIM_AFTER_SECONDS", 1800),
        provider_rate_per_second=_float("PROVIDER_RATE_PER_SECOND", 0.0),
        soft_bounce_limit=_int("SOFT_BOUNCE_LIMIT", 3),
        newsletter_send_chains=_int("NEWSLETTER_SEND_CHAINS", 4),
        newsletter_max_attempts=_int("NEWSLETTER_MAX_ATTEMPTS", 8),
    )


_settings: Settings | None = None


def get() -> Settings:
    global _settings
    if _settings is None:
        _settings = load()
    return _settings


def reload() -> Settings:
    """Re-read the environment (tests and the CLI after changing os.environ)."""
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
    _settings = Settings(**{**{f.name: getattr(previous, f.name) for f in fields(Settings)}, **changes})
    return previous


def restore(previous: Settings) -> None:
    global _settings
    _settings = previous
