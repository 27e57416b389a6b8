"""How commands print structured results."""

from __future__ import annotations

import json
import sys


def print_json(value) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
