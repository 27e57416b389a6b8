"""The dashboard's figures against real rows (tests/factories.py): what is counted in which hour,
what is left out, the rates' and lateness' definitions, the indexes the windows use, a statement
that times out, and the per-range cache."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.platform import db
from app.web.admin import charts, render, stats
from tests import factories

NOW = datetime(2026, 3, 10, 12, 30, tzinfo=UTC)  # 24 h window: 03-09 13:00 to 03-10 13:00


def at(hour: int, minute: int = 0, second: int = 0, day: int = 10) -> datetime:
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


def hit(kind: str, mail_kind: str, mail_id: int, subscriber_id: int | None, when: datetime, machine: bool = False):
    link = None
    if kind == "click":
        link = factories.insert(
            "email_links",
            mail_kind=mail_kind,
            mail_id=mail_id,
            url="https://example.com/",
            url_hash=f"{mail_kind}{mail_id}{when}".encode(),
        )
    factories.insert(
        "email_link_history",
        kind=kind,
        link_id=link,
        mail_kind=mail_kind,
        mail_id=mail_id,
        subscriber_id=subscriber_id,
        is_machine=machine,
        occurred_at=when,
    )


def webhook(event: str, when: datetime, **payload) -> None:
    factories.insert(
        "webhook_events",
        sg_event_id=f"sg-{event}-{when.isoformat()}-{len(payload)}",
        event=event,
        email="x@x.test",
        payload=f'{{"event": "{event}"}}',
        received_at=when,
        processed_at=when,
    )


@pytest.fixture
def history():
    """Three sent digests in the window (lateness 600 s, 30 s, 300 s), one just before it, a failed
    and a skipped one; two newsletter mails sent at 11:xx; opens, clicks (some by machines, one of
    an erased subscriber), bounces and a complaint."""
    a, b, c = (factories.subscriber(u) for u in ("a", "b", "c"))
    run_a = factories.digest_run(a, status="sent", scheduled_for=at(12), completed_at=at(12, 10))
    run_b = factories.digest_run(b, status="sent", scheduled_for=at(12, 19, 30), completed_at=at(12, 20))
    run_c = factories.digest_run(c, status="sent", scheduled_for=at(9), completed_at=at(9, 5))
    factories.digest_run(
        a, status="sent", scheduled_for=at(12, 50, day=9), completed_at=at(12, 59, day=9), period=at(0, day=9).date()
    )
    factories.digest_run(b, status="failed", scheduled_for=at(8), completed_at=at(8, 1), period=at(0, day=9).date())
    factories.digest_run(c, status="skipped", scheduled_for=at(7), completed_at=at(7, 1), period=at(0, day=8).date())
    nl = factories.newsletter_row(status="done")
    factories.outbox_row(nl, a, sent_at=at(11))
    factories.outbox_row(nl, b, sent_at=at(11, 30))
    factories.outbox_row(nl, c, status="failed")

    hit("open", "digest", run_a, a, at(12, 40))
    hit("click", "digest", run_a, a, at(12, 41))
    hit("open", "digest", run_b, b, at(12, 20, 2), machine=True)  # a scanner: run_b is not opened
    hit("click", "digest", run_c, c, at(10))  # clicked without the pixel: opened
    hit("open", "newsletter", nl, a, at(11, 5))
    hit("open", "newsletter", nl, a, at(11, 6))  # the same mail opened twice
    hit("open", "newsletter", nl, None, at(11, 40))  # an erased subscriber's open
    hit("open", "digest", 999, a, at(12, 5))  # a mail sent before the window

    webhook("bounce", at(12, 5))
    webhook("bounce", at(12, 6), type="blocked")
    webhook("spamreport", at(10, 15))
    webhook("delivered", at(10))
    webhook("bounce", at(12, day=9))  # before the window
    return {"a": run_a, "b": run_b, "c": run_c}


def index(d: stats.Dashboard, hour: datetime) -> int:
    return d.window.hours.index(hour)


def test_window_is_whole_utc_hours_ending_with_the_current_one():
    w = stats.window("24h", NOW)
    assert (w.since, w.until, len(w.hours)) == (at(13, day=9), at(13), 24)
    assert w.hours[-1] == at(12)
    seven = stats.window("7d", NOW.astimezone(timezone(timedelta(hours=5, minutes=30))))
    assert (seven.since, seven.until, len(seven.hours)) == (at(13, day=3), at(13), 168)


def test_mails_sent_per_hour(history):
    d = stats.compute("24h", NOW)
    assert d.unavailable == []
    assert d.sent["digest"][index(d, at(12))] == 2 and d.sent["digest"][index(d, at(9))] == 1
    assert sum(d.sent["digest"]) == 3  # not the failed, skipped or older ones
    assert d.sent["newsletter"][index(d, at(11))] == 2 and sum(d.sent["newsletter"]) == 2


def test_open_and_click_rates_are_shares_of_the_mails_sent_each_hour(history):
    d = stats.compute("24h", NOW)
    assert d.opened["digest"][index(d, at(12))] == 1  # run_a; run_b's only open was a machine's
    assert d.opened["digest"][index(d, at(9))] == 1  # run_c: a click counts as an open
    assert d.clicked["digest"][index(d, at(12))] == 1 and d.clicked["digest"][index(d, at(9))] == 1
    assert d.opened["newsletter"][index(d, at(11))] == 1  # opened twice, counted once; the erased one not
    assert d.rate("open") == pytest.approx(3 / 5) and d.rate("click") == pytest.approx(2 / 5)
    assert d.rate("open", index(d, at(12))) == pytest.approx(1 / 2)
    assert d.rate("open", index(d, at(3))) is None  # nothing sent: no rate, not 0 %
    assert d.rates("click")[index(d, at(9))] == 1.0


def test_bounces_and_complaints_per_hour(history):
    d = stats.compute("24h", NOW)
    assert d.bounces[index(d, at(12))] == 2  # a block is a bounce
    assert d.complaints[index(d, at(10))] == 1
    assert (sum(d.bounces), sum(d.complaints)) == (2, 1)


def test_digest_lateness_percentiles(history):
    d = stats.compute("24h", NOW)
    assert d.lateness_p50[index(d, at(12))] == pytest.approx(315)  # of 600 s and 30 s
    assert d.lateness_p95[index(d, at(12))] == pytest.approx(571.5)
    assert d.lateness_p50[index(d, at(9))] == pytest.approx(300)
    assert d.lateness_p50[index(d, at(10))] is None
    assert d.lateness_total == (pytest.approx(300), pytest.approx(570))


def test_seven_days_reach_further_back(history):
    d = stats.compute("7d", NOW)
    assert sum(d.sent["digest"]) == 4 and sum(d.bounces) == 3
    assert d.sent["digest"][index(d, at(12, day=9))] == 1


def test_an_early_sent_run_counts_as_zero_lateness():
    sub = factories.subscriber("u")
    factories.digest_run(sub, status="sent", scheduled_for=at(12, 5), completed_at=at(12))
    assert stats.compute("24h", NOW).lateness_total == (0, 0)


def test_empty_database():
    d = stats.compute("7d", NOW)
    assert sum(d.sent["digest"]) == 0 and d.rate("open") is None and d.lateness_total == (None, None)
    for name in charts.CHARTS:
        assert b"<svg" in charts.svg(name, d)
        assert render.describe(name, d)


def test_a_statement_that_times_out_leaves_only_its_figure_out(history, monkeypatch, caplog):
    monkeypatch.setattr(stats, "STATEMENT_TIMEOUT", "50ms")
    monkeypatch.setattr(stats, "_BOUNCES_SQL", "SELECT now(), 1, 1 FROM pg_sleep(2)")
    d = stats.compute("24h", NOW)
    assert d.unavailable == ["bounces"] and d.bounces is None
    assert sum(d.sent["digest"]) == 3 and d.lateness_total is not None
    assert "unavailable" in render.describe("bounces", d)
    assert b"did not finish in time" in charts.svg("bounces", d)
    assert "took longer than 50ms" in caplog.text


def test_the_windows_use_the_partial_indexes():
    w = stats.window("24h", NOW)
    with db.raw_cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + stats._SENT_SQL, w.params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "digest_runs_sent_idx" in plan and "email_log_sent_idx" in plan


def test_figures_are_cached_per_range(settings):
    settings(admin_cache_seconds=60)
    stats.cache.clear()
    first = stats.cache.get("24h")
    assert stats.cache.get("24h") is first and stats.cache.get("7d") is not first
    settings(admin_cache_seconds=0)
    assert stats.cache.get("24h") is not first
    stats.cache.clear()


def test_charts_are_drawn_once_per_computation(history):
    d = stats.compute("24h", NOW)
    first = charts.svg("sent", d)
    assert charts.svg("sent", d) is first
    assert charts.svg("sent", stats.compute("24h", NOW)) == first  # deterministic output


def test_mails_held_and_released_per_hour():
    """Held: runs by the hour quiet hours first held them (held_at); released: those of them sent,
    by the hour they went out. A run held and not sent yet is held only; an ordinary one is neither."""
    a, b, c = (factories.subscriber(u) for u in ("a", "b", "c"))
    factories.digest_run(a, cadence="immediately", status="sent", held_at=at(2, 10), completed_at=at(7, 0, 5))
    factories.digest_run(b, cadence="immediately", status="sent", held_at=at(3), completed_at=at(7, 2))
    factories.digest_run(c, cadence="immediately", status="pending", held_at=at(11, 30))  # still waiting
    factories.digest_run(c, status="sent", completed_at=at(7, 1))  # never held
    factories.digest_run(  # held before the window, released in it
        a, status="sent", held_at=at(12, day=9), completed_at=at(14, day=9), period=at(0, day=9).date()
    )
    d = stats.compute("24h", NOW)
    assert d.unavailable == []
    assert d.held[index(d, at(2))] == 1 and d.held[index(d, at(3))] == 1 and d.held[index(d, at(11))] == 1
    assert sum(d.held) == 3
    assert d.released[index(d, at(7))] == 2 and d.released[index(d, at(14, day=9))] == 1
    assert sum(d.released) == 3
    assert "3 held, 3 released" in render.describe("held", d)
    svg = charts.svg("held", d)
    assert b"<svg" in svg and b"released" in svg


def test_the_held_figures_use_their_partial_indexes():
    w = stats.window("24h", NOW)
    with db.raw_cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + stats._HELD_SQL, w.params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "digest_runs_held_idx" in plan and "digest_runs_released_idx" in plan
