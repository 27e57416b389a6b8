"""`notify providers`: the providers mail goes through, in order (MAIL_PROVIDERS, or MAIL_PROVIDER),
and each one's circuit breaker as this host's worker processes see it.

A breaker lives in each sending process (app/platform/providers/failover.py); this command runs in
a process of its own, so it reads what the workers published (notify_provider_breaker_state in the
metrics directory, PROMETHEUS_MULTIPROC_DIR): the worst state among the live processes."""

from __future__ import annotations

from app.cli import commands
from app.cli.output import print_json
from app.platform import metrics, providers
from app.platform.providers.failover import STATE_VALUES

_NAMES = {value: state for state, value in STATE_VALUES.items()}


def cmd_providers(args) -> int:
    """the providers mail goes through, in order, and each one's circuit breaker (closed, half-open,
    open) as the workers on this host see it"""
    order = providers.configured()
    seen = metrics.breaker_states()
    print_json(
        {
            "failover": len(order) > 1,
            "providers": [
                {
                    "name": name,
                    # one provider alone has no breaker: nothing to fail over to
                    "breaker": (_NAMES.get(seen[name], "unknown") if name in seen else "closed")
                    if len(order) > 1
                    else None,
                    "reported": name in seen,  # False: no live process on this host has used it yet
                }
                for name in order
            ],
        }
    )
    return 0


def register(sub) -> None:
    commands.add(sub, "providers", cmd_providers)
