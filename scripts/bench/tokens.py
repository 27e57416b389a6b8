"""Subscriber link tokens: app/platform/tokens.py (our HMAC signer) against itsdangerous, the library a
user would reach for.

    .venv/bin/python scripts/bench/tokens.py

Per token, in microseconds: make (every mail carries two) and verify (every unsubscribe and
preference page view). itsdangerous is measured only when installed (`pip install itsdangerous`);
it is not a project dependency. Whatever the speed, tokens already sent in mails must keep
verifying: tests/web/test_pages.py and the golden tokens there pin the format.
"""

from __future__ import annotations

import os
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

from app.platform import config, tokens  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
N = 20_000


def per_call_us(fn) -> float:
    return min(timeit.repeat(fn, number=N, repeat=5)) / N * 1e6


def main() -> None:
    ours = tokens.make("unsubscribe", 123456, 3, "newsletter:42")
    assert tokens.verify("unsubscribe", ours).subscriber_id == 123456
    rows = [
        (
            "ours (app/platform/tokens.py)",
            per_call_us(lambda: tokens.make("unsubscribe", 123456, 3, "newsletter:42")),
            per_call_us(lambda: tokens.verify("unsubscribe", ours)),
            len(ours),
        )
    ]
    try:
        from itsdangerous import URLSafeSerializer
    except ImportError:
        print("itsdangerous is not installed: `pip install itsdangerous` to compare")
    else:
        s = URLSafeSerializer(config.get().secret_key, salt="unsubscribe")
        theirs = s.dumps([123456, 3, "newsletter:42"])
        assert s.loads(theirs) == [123456, 3, "newsletter:42"]
        rows.append(
            (
                "itsdangerous URLSafeSerializer",
                per_call_us(lambda: s.dumps([123456, 3, "newsletter:42"])),
                per_call_us(lambda: s.loads(theirs)),
                len(theirs),
            )
        )
    print(f"{'signer':<34} {'make µs':>9} {'verify µs':>10} {'length':>7}")
    for name, make, verify, length in rows:
        print(f"{name:<34} {make:>9.1f} {verify:>10.1f} {length:>7}")
    ours, peer = rows[0], (rows[1] if len(rows) > 1 else None)
    for figure, col in (("make, per token", 1), ("verify, per token", 2)):
        record(
            "subscriber link tokens",
            figure,
            ours[col],
            "µs",
            baseline=peer[col] if peer else None,
            baseline_label="itsdangerous URLSafeSerializer" if peer else "",
            higher_is_better=False,
            calls=N,
            token_length=ours[3],
            peer=("itsdangerous" if peer else "itsdangerous not installed"),
            **({"peer_token_length": peer[3]} if peer else {}),
        )


if __name__ == "__main__":
    main()
