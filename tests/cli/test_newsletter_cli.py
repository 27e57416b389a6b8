"""`python -m app newsletter-status ID`: a draft waits for its send instead of reporting 100 %."""

from __future__ import annotations

import argparse
import threading
from datetime import UTC, datetime, time

from app.cli import newsletter as newsletter_cli
from app.newsletter import service
from app.platform import db
from tests import factories


def status_args(newsletter_id: int, once: bool = False) -> argparse.Namespace:
    return argparse.Namespace(id=newsletter_id, once=once, interval=0.05)


def test_a_draft_is_not_sent_yet(capsys):
    nl = factories.newsletter()
    assert newsletter_cli.cmd_status(status_args(nl, once=True)) == 0
    out = capsys.readouterr().out
    assert "0.0%" in out and "draft: not sent yet" in out and "100" not in out


def test_status_on_a_draft_waits_for_the_send_and_follows_it_to_the_end(capsys):
    factories.seed_subscribers(3)
    nl = factories.newsletter()

    def send_later():
        service.request_send(nl, {"kind": "all"})
        db.query("UPDATE newsletters SET status = 'done', completed_at = now() WHERE id = %s", (nl,))

    timer = threading.Timer(0.5, send_later)
    timer.start()
    try:
        assert newsletter_cli.cmd_status(status_args(nl)) == 0
    finally:
        timer.join()
    lines = capsys.readouterr().out.splitlines()
    assert "draft: not sent yet" in lines[0]
    assert any("100.0%  done" in line for line in lines), lines


def test_unknown_newsletter_is_an_error(capsys):
    assert newsletter_cli.cmd_status(status_args(999_999, once=True)) == 1
    assert "no newsletter 999999" in capsys.readouterr().err


def test_a_scheduled_newsletter_says_when_it_starts(capsys):
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "all"}, send_at=datetime(2999, 3, 29, 8, tzinfo=UTC), local_time=time(9))
    assert newsletter_cli.cmd_status(status_args(nl, once=True)) == 0
    out = capsys.readouterr().out
    assert "scheduled: starts 2999-03-29T08:00:00+00:00, each recipient at 09:00 their time" in out
