"""Digest template rendering: why app/platform/mustache.py compiles chevron's tokens into Python.

    .venv/bin/python scripts/bench/render.py

Renders one 20-event digest (the digest benchmark's shape) with the shipped templates three ways:
  compiled        app/platform/mustache.py over chevron's cached tokens (what the sender uses)
  chevron tokens  chevron.render over the same cached token list (the library's fast path)
  chevron source  chevron.render over the template text (tokenized per mail)
and checks all three give the same output. Microseconds per digest, all three templates together.
"""

from __future__ import annotations

import os
import sys
import timeit
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

import chevron  # noqa: E402

from app.platform import config  # noqa: E402
from digest import context, group, render  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
NAMES = ("subject.txt", "digest.html", "digest.txt")


def digest_context() -> dict:
    now = datetime.now(UTC)
    actors = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal"]
    events = [
        group.Event(
            j,
            ("like", "comment", "follow")[j % 3],
            "post",
            f"post-{j % 6}",
            f"actor-{j % 8}",
            actors[j % 8],
            now - timedelta(minutes=j),
        )
        for j in range(20)
    ]
    d = group.build(events, 50)
    for g in d.groups:
        g.title, g.url = f"Post {g.entity_id}", "https://example.test/p/1"
    ctx = context.build(
        d,
        context.Reader(
            name="Bench User",
            cadence="daily",
            timezone="UTC",
            last_digest_at=now - timedelta(days=1),
            unsubscribe_url="https://example.test/u/T",
            preferences_url="https://example.test/p/T",
        ),
        categories={},
        now=now,
    )
    return {**ctx, "subject": "Your daily digest"}


def main() -> int:
    ctx = digest_context()
    ts = render.TemplateSet(render.DEFAULT_DIR)
    compiled = [ts.get(name) for name in NAMES]
    ways = {
        "compiled": lambda: [c.template.render(ctx) for c in compiled],
        "chevron tokens": lambda: [chevron.render(list(c.tokens), ctx) for c in compiled],
    }
    outputs = {name: fn() for name, fn in ways.items()}
    assert outputs["compiled"] == outputs["chevron tokens"], "the compiled renderer differs from chevron"
    raw = [(render.DEFAULT_DIR / name).read_text() for name in NAMES]
    ways["chevron source"] = lambda: [chevron.render(text, ctx) for text in raw]  # premailer not applied
    print("digest render, 20 events, subject + HTML + text (us per digest):")
    runs = 500
    us = {}
    for name, fn in ways.items():
        us[name] = timeit.timeit(fn, number=runs) / runs * 1e6
        print(f"  {name:<15} {us[name]:7.0f}")
    record(
        "digest render (20 events; subject + HTML + text)",
        "render time per digest",
        us["compiled"],
        "µs",
        baseline=us["chevron tokens"],
        baseline_label="chevron.render over cached tokens",
        higher_is_better=False,
        chevron_source_us=round(us["chevron source"], 1),
        runs=runs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
