"""`notify COMMAND` (the console script) or `python -m app COMMAND`: operator commands, one module
per area, each registering its own subcommands: core (migrate, API keys, settings, metrics
exporter, rekey-addresses), scheduler (the scheduler process), digest (digest-now, preview-digest),
newsletter (newsletter-status), mail_stop (the emergency stop), tracking (legacy link import),
providers (the providers in use and their circuit breakers)."""

from __future__ import annotations

import argparse
import logging
import sys

from app.cli import core, digest, mail_stop, newsletter, providers, scheduler, tracking
from app.platform import config, observability

# Each adds its commands with set_defaults(func=...).
COMMAND_MODULES = (core, scheduler, digest, newsletter, mail_stop, tracking, providers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="notify", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    observability.setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        config.get()
    except config.ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    result = args.func(args)
    return int(result or 0)


logging.getLogger("urllib3").setLevel(logging.WARNING)
