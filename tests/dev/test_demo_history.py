"""`make run`'s week of demo history (scripts/demo_history.py) gives every dashboard chart something
to show, can be loaded again without piling up, leaves other rows alone and sends nothing."""

from __future__ import annotations

from app.platform import db
from app.web.admin import stats
from scripts import demo_history
from tests import factories


def test_demo_history_fills_every_chart_and_reloads_in_place():
    mine = factories.subscriber("someone-else")
    factories.suppression("keep@x.test")
    first = demo_history.load()
    second = demo_history.load()
    assert first == second and first["mails"] > 2000
    d = stats.compute("7d")
    assert d.unavailable == []
    assert sum(d.sent["digest"]) > 1000 and sum(d.sent["newsletter"]) > 500
    assert 0.2 < d.rate("open") < 0.6 and 0.02 < d.rate("click") < 0.3
    assert sum(d.bounces) > 0 and d.lateness_total[1] > d.lateness_total[0] > 0
    assert db.query(
        "SELECT count(*) FROM subscribers WHERE user_id LIKE 'demo-history-%%' AND digest_cadence = 'off'"
    ) == [(demo_history.USERS,)]
    assert db.query("SELECT count(*) FROM digest_runs WHERE status <> 'sent'") == [(0,)]
    assert db.query("SELECT status FROM newsletters WHERE subject LIKE '[demo]%%' ORDER BY id") == [
        ("done",),
        ("done",),
        ("paused",),
    ]
    # the dashboard says when each started (issue 41: a started send never shows "not yet")
    assert db.query("SELECT count(*) FROM newsletters WHERE subject LIKE '[demo]%%' AND started_at IS NULL") == [(0,)]
    assert db.query("SELECT id FROM subscribers WHERE user_id = 'someone-else'") == [(mine,)]
    assert db.query("SELECT count(*) FROM suppressions WHERE email = 'keep@x.test'") == [(1,)]
