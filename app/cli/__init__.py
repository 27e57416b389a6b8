"""`python -m app COMMAND`: operator commands. Each domain module registers its own subcommands."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

from app.platform import config, observability

# Modules exposing register(subparsers); each adds its commands with set_defaults(func=...).
COMMAND_MODULES = ("app.cli.core", "app.cli.scheduler", "app.cli.newsletter", "app.cli.mail_stop", "app.cli.tracking")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        register = getattr(module, "register", None)
        if register:
            register(sub)
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


def print_json(value) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


logging.getLogger("urllib3").setLevel(logging.WARNING)
