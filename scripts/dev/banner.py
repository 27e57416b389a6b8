"""`python -m scripts.dev.banner`: what `make run` prints before it starts the processes — every
address of the development instance, taken from the settings every process reads (BASE_URL,
MAIL_VIEWER_URL, FEED_DEMO_URL), so the banner names the host the mails and pages link."""

from __future__ import annotations

import sys

from app.platform import config


def lines(settings: config.Settings) -> list[str]:
    base = settings.base_url
    return [
        f"web: {base}  dashboard: {base}/admin  API reference: {base}/docs",
        f"mail viewer: {settings.mail_viewer_url}  feed demo: {settings.feed_demo_url}",
        "keys and settings: .env (another terminal: . ./.env; .venv/bin/notify --help)",
    ]


def main() -> int:
    print("\n".join(lines(config.get())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
