"""A digest in another language costs what an English one does (issue 39, item 11: within 10 %).

    .venv/bin/python scripts/bench/locales.py [--rounds 7] [--digests 300]

Builds and renders the same 20-event digest (the render benchmark's shape) for a reader in each
shipped locale (pt-BR, es, fr, de, ru, ar, ja) — the context (digest/context.py: wording, plurals,
lists, dates through the locale's Translator) and the three templates, which is what a worker does
per digest after loading events —
in rounds that alternate the locales (en, pt-BR, en, es, …, en, ja), so a noisy neighbour hits
every locale alike. Prints the median microseconds per digest of each locale beside English's, and
each locale's cost against English as the median over its pairs (a locale's run against the English
run just before it). Catalogs and CLDR data are loaded before timing (once per process, as
in a worker).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "development")

from app.platform import config, i18n  # noqa: E402
from app.subscribers.categories import Category  # noqa: E402
from digest import context, group, render  # noqa: E402
from scripts.bench.shared import record  # noqa: E402

config.reload()
LOCALES = tuple(t for t in i18n.SHIPPED if t != "en")  # every shipped locale: pt-BR, es, fr, de, ru, ar, ja
CATEGORIES = {
    "like": Category("like", "Likes", verb="liked"),
    "comment": Category("comment", "Comments", verb="commented on"),
    "follow": Category("follow", "Follows", verb="followed"),
}


def build_and_render(locale: str, now: datetime) -> None:
    actors = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal"]
    events = [
        group.Event(
            j,
            ("like", "comment", "follow")[j % 3],
            "post",
            f"post-{j % 6}",
            f"actor-{j % 8}",
            actors[j % 8],
            now - timedelta(minutes=j * 37),
        )
        for j in range(20)
    ]
    digest = group.build(events, 50)
    for g in digest.groups:
        g.title, g.url = f"Post {g.entity_id}", "https://example.test/p/1"
    ctx = context.build(
        digest,
        context.Reader(
            name="Bench User",
            cadence="daily",
            timezone="Europe/Lisbon",
            last_digest_at=now - timedelta(days=3),
            unsubscribe_url="https://example.test/u/T",
            preferences_url="https://example.test/p/T",
            locale=locale,
        ),
        categories=CATEGORIES,
        now=now,
    )
    render.render(ctx)


def per_digest_us(locale: str, digests: int, now: datetime) -> float:
    started = time.perf_counter()
    for _ in range(digests):
        build_and_render(locale, now)
    return (time.perf_counter() - started) / digests * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--digests", type=int, default=300, help="digests per locale per round")
    args = p.parse_args(argv)
    now = datetime(2026, 3, 10, 9, tzinfo=UTC)
    for locale in ("en", *LOCALES):  # warm: catalogs, CLDR data, compiled templates
        for _ in range(20):
            build_and_render(locale, now)
    times: dict[str, list[float]] = {locale: [] for locale in ("en", *LOCALES)}
    ratios: dict[str, list[float]] = {locale: [] for locale in LOCALES}
    for round_ in range(args.rounds):
        for locale in LOCALES:  # a pair shares the machine's mood; who goes first swaps every round
            order = ("en", locale) if round_ % 2 == 0 else (locale, "en")
            runs = {name: per_digest_us(name, args.digests, now) for name in order}
            times["en"].append(runs["en"])
            times[locale].append(runs[locale])
            ratios[locale].append(runs[locale] / runs["en"])
    english = statistics.median(times["en"])
    print(f"digest context + render, 20 events, {args.rounds} rounds of pairs (us per digest, medians):")
    print(f"  {'en':<6} {english:7.0f}")
    worst = 0.0
    for locale in LOCALES:
        median = statistics.median(times[locale])
        paired = statistics.median(ratios[locale]) - 1
        worst = max(worst, paired)
        print(f"  {locale:<6} {median:7.0f}  {paired:+.1%} vs en (median of the pairs)")
    print(f"the slowest locale is {worst:+.1%} against English (target: within +10 %)")
    record(
        "digest in another language (context + render, 20 events)",
        "slowest of " + ", ".join(LOCALES),
        round(english * (1 + worst), 1),
        "µs",
        baseline=round(english, 1),
        baseline_label="en, same rounds",
        target="within 10 % of en",
        met=worst <= 0.10,
        higher_is_better=False,
        rounds=args.rounds,
        per_locale_us={locale: round(statistics.median(times[locale]), 1) for locale in LOCALES},
    )
    print(f"(i18n translators cached: {i18n._translator.cache_info().currsize})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
