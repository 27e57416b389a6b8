"""How an area adds its commands to the command line (each module's register(sub), called by
app/cli/__init__.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add(sub, name: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """The command `name`, which runs func(args) and whose help is func's docstring; its arguments are
    added to the parser returned."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=" ".join((func.__doc__ or "").split()))
    parser.set_defaults(func=func)
    return parser
