"""The dashboard's charts: matplotlib figures rendered server-side to SVG, served as images.

Why matplotlib: a chart is then a plain image from our own origin — no JavaScript bundle to vendor
or load from a CDN, nothing for the pages' strict Content-Security-Policy to allow (an SVG loaded
by <img> never runs script) — and it is the library scripts/bench already uses for its reports.
Only the object-oriented API (Figure, never pyplot: no global figure state), rendered one at a
time under a lock because matplotlib's settings are process-wide. Output is deterministic for the
same figures (fixed hash salt, no date stamp), cached with the figures they were drawn from.

matplotlib is imported on the first chart only: its import is slow and large (python -X importtime,
RSS), which every web process would otherwise pay for a page operators open now and then.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any

from app.web.admin.stats import KINDS, Dashboard

CHARTS = ("sent", "rates", "bounces", "lateness", "held")
TITLES = {
    "sent": "Mails sent per hour",
    "rates": "Open and click rates (of the mails sent each hour)",
    "bounces": "Bounces and complaints per hour",
    "lateness": "Digest lateness (scheduled slot to sent)",
    "held": "Mails held by quiet hours and released per hour",
}
COLOURS = {
    "digest": "#1d4ed8",
    "newsletter": "#f59e0b",
    "open": "#15803d",
    "click": "#7c3aed",
    "bounce": "#b42318",
    "complaint": "#0f172a",
    "p50": "#1d4ed8",
    "p95": "#b42318",
    "held": "#64748b",
    "released": "#15803d",
}
_RC: dict[Any, Any] = {  # matplotlib types its keys as a Literal of every rc name
    "svg.fonttype": "none",
    "svg.hashsalt": "notify-admin",
    "font.size": 10,
    "font.family": ["DejaVu Sans", "sans-serif"],
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "#d9e2ec",
    "axes.edgecolor": "#9aa5b1",
}
_lock = threading.Lock()
_cache: dict[tuple, bytes] = {}


def svg(name: str, data: Dashboard) -> bytes:
    """The chart as SVG bytes; drawn once per Dashboard (the figures' cache decides freshness)."""
    key = (name, data.window.name, data.computed_at)
    with _lock:
        hit = _cache.get(key)
        if hit is None:
            if len(_cache) > 4 * len(CHARTS):
                _cache.clear()
            hit = _cache[key] = _draw(name, data)
        return hit


def _nan(values) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def _draw(name: str, data: Dashboard) -> bytes:
    import matplotlib  # lazy: see the module docstring
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.0, 3.0), layout="constrained")
        ax = fig.add_subplot()
        hours = list(data.window.hours)
        width = 1 / 24 * 0.85  # bar width in days (matplotlib's date unit)
        drawn = _PLOTS[name](ax, data, hours, width)
        if not drawn:
            ax.text(
                0.5,
                0.5,
                "no data: the query did not finish in time",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#52606d",
            )
        _date_axis(ax, matplotlib, data)
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
        return out.getvalue()


def _date_axis(ax, matplotlib, data: Dashboard) -> None:
    import matplotlib.dates as mdates  # lazy with matplotlib

    locator = mdates.AutoDateLocator(minticks=4, maxticks=9, tz=data.window.since.tzinfo)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=data.window.since.tzinfo))
    ax.set_xlim(data.window.since, data.window.until)
    ax.set_xlabel("hour (UTC)", color="#52606d")
    ax.margins(x=0)


def _counts(ax) -> None:
    """A count axis: whole-number ticks only (no "0.5 bounces"); the default locator is a MaxNLocator."""
    ax.yaxis.get_major_locator().set_params(integer=True)


def _sent(ax, data, hours, width) -> bool:
    if not data.sent:
        return False
    bottom = [0] * len(hours)
    for kind in KINDS:
        values = data.sent[kind]
        ax.bar(
            hours,
            values,
            width=width,
            bottom=bottom,
            align="edge",
            color=COLOURS[kind],
            label="digests" if kind == "digest" else "newsletters",
        )
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("mails")
    ax.set_ylim(bottom=0, top=max(max(bottom), 1) * 1.1)
    _counts(ax)
    ax.legend(loc="upper left", frameon=False, ncols=2)
    return True


def _rates(ax, data, hours, width) -> bool:
    opens, clicks = data.rates("open"), data.rates("click")
    if opens is None:
        return False
    mids = [h + (hours[1] - hours[0]) / 2 for h in hours]
    ax.plot(mids, [v * 100 for v in _nan(opens)], color=COLOURS["open"], marker="o", markersize=2.5, label="opened")
    ax.plot(mids, [v * 100 for v in _nan(clicks)], color=COLOURS["click"], marker="o", markersize=2.5, label="clicked")
    ax.set_ylabel("% of mails sent")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left", frameon=False, ncols=2)
    return True


def _bounces(ax, data, hours, width) -> bool:
    if data.bounces is None:
        return False
    ax.bar(hours, data.bounces, width=width, align="edge", color=COLOURS["bounce"], label="bounces")
    ax.bar(
        hours,
        data.complaints,
        width=width,
        align="edge",
        bottom=data.bounces,
        color=COLOURS["complaint"],
        label="complaints",
    )
    top = max((b + c for b, c in zip(data.bounces, data.complaints)), default=0)
    ax.set_ylabel("events")
    ax.set_ylim(bottom=0, top=max(top, 1) * 1.15)
    _counts(ax)
    ax.legend(loc="upper left", frameon=False, ncols=2)
    return True


def _lateness(ax, data, hours, width) -> bool:
    if data.lateness_p50 is None:
        return False
    known = [v for v in data.lateness_p95 if v is not None]
    scale, unit = (60.0, "minutes") if known and max(known) >= 120 else (1.0, "seconds")
    mids = [h + (hours[1] - hours[0]) / 2 for h in hours]
    for label, values in (("p50", data.lateness_p50), ("p95", data.lateness_p95)):
        ax.plot(mids, [v / scale for v in _nan(values)], color=COLOURS[label], marker="o", markersize=2.5, label=label)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0, top=max(max(known) / scale if known else 1, 1) * 1.15)
    ax.legend(loc="upper left", frameon=False, ncols=2)
    return True


def _held(ax, data, hours, width) -> bool:
    """Side by side in each hour: the mails held (first held that hour) and the held mails sent."""
    if data.held is None:
        return False
    half = width / 2
    ax.bar(hours, data.held, width=half, align="edge", color=COLOURS["held"], label="held")
    shifted = [h + (hours[1] - hours[0]) * 0.85 / 2 for h in hours]
    ax.bar(shifted, data.released, width=half, align="edge", color=COLOURS["released"], label="released")
    top = max([*data.held, *data.released, 0])
    ax.set_ylabel("mails")
    ax.set_ylim(bottom=0, top=max(top, 1) * 1.15)
    _counts(ax)
    ax.legend(loc="upper left", frameon=False, ncols=2)
    return True


_PLOTS = {"sent": _sent, "rates": _rates, "bounces": _bounces, "lateness": _lateness, "held": _held}
