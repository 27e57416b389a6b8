"""`notify providers`: the providers mail goes through, in order (MAIL_PROVIDERS, or MAIL_PROVIDER),
and each one's circuit breaker as this host's worker processes see it.

A breaker lives in each sending process (app/platform/providers/failover.py); this command runs in
a process of its own, so it reads what the workers published (notify_provider_breaker_state and
its companions in the metrics directory, PROMETHEUS_MULTIPROC_DIR) through failover.status(), the
reader the dashboard uses too: the worst state among the live processes, since when, and the
failures counted in the last PROVIDER_BREAKER_WINDOW_SECONDS."""

from __future__ import annotations

from datetime import UTC, datetime

from app.cli import commands
from app.cli.output import print_json
from app.platform.providers import failover


def _when(unix: float | None) -> str | None:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="seconds") if unix else None


def cmd_providers(args) -> int:
    """the providers mail goes through, in order, and each one's circuit breaker (closed, half-open,
    open) as the workers on this host see it"""
    shown = failover.status()
    print_json(
        {
            "failover": len(shown) > 1,
            "providers": [
                {
                    "name": p.name,
                    "breaker": p.breaker,  # one provider alone has no breaker: nothing to fail over to
                    "since": _when(p.since),
                    "recent_failures": p.failures,
                    "last_failure": _when(p.last_failure),
                    "reported": p.reported,  # False: no live process on this host has used it yet
                }
                for p in shown
            ],
        }
    )
    return 0


def register(sub) -> None:
    commands.add(sub, "providers", cmd_providers)
