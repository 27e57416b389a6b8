"""Click redirect, open pixel, legacy codes, scanner/proxy flags, stats, legacy CSV import."""

from __future__ import annotations

import datetime as dt
import os

import psycopg2
import pytest
from starlette.testclient import TestClient

from app.platform import db
from tests import factories
from tracking import codes, legacy, links, recorder, resolve, stats

UA_HUMAN = "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_0) AppleWebKit/605.1.15 Version/17.0 Safari/605.1.15"


@pytest.fixture(autouse=True)
def fresh_caches(settings):
    settings(base_url="http://localhost:8000", tracking=True, tracking_scanner_seconds=10)
    resolve.clear_caches()
    yield
    recorder.recorder().flush()
    resolve.clear_caches()


def history(kind: str = "click"):
    recorder.recorder().flush()
    return db.query(
        "SELECT link_id, mail_kind, mail_id, subscriber_id, host(ip), user_agent, is_machine, "
        "machine_reason FROM email_link_history WHERE kind = %s ORDER BY id",
        (kind,),
    )


def sent_newsletter(sent_ago_seconds: float | None = 3600) -> tuple[int, int]:
    """A newsletter sent to u1 that long ago (None: no send time); (its id, u1's id)."""
    sub_id, nl_id = factories.subscriber("u1", "U1@Example.com"), factories.newsletter_row()
    sent_at = None if sent_ago_seconds is None else dt.datetime.now(dt.UTC) - dt.timedelta(seconds=sent_ago_seconds)
    factories.outbox_row(nl_id, sub_id, "u1@example.com", sent_at=sent_at)
    return nl_id, sub_id


def click_path(mail_kind: str, mail_id: int, sub_id: int, url: str) -> str:
    html = links.LinkRewriter(mail_kind, mail_id).rewrite(f'<a href="{url}">x</a>', sub_id)
    return "/c/" + html.split("/c/", 1)[1].split('"', 1)[0]


def test_click_redirects_to_the_link_row_and_records_history(client):
    nl_id, sub_id = sent_newsletter()
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/page?a=1&b=2")
    # Through the local proxy (FORWARDED_ALLOW_IPS default): the hop it appended is the client.
    behind_proxy = TestClient(client.app, client=("127.0.0.1", 50000))
    r = behind_proxy.get(
        path, headers={"User-Agent": UA_HUMAN, "X-Forwarded-For": "203.0.113.9, 198.51.100.7"}, follow_redirects=False
    )
    assert r.status_code == 302
    assert r.headers["location"] == "https://example.com/page?a=1&b=2"
    assert "no-store" in r.headers["cache-control"]
    ((link_id,),) = db.query("SELECT id FROM email_links")
    assert history() == [(link_id, "newsletter", nl_id, sub_id, "198.51.100.7", UA_HUMAN, False, None)]


def test_non_ascii_and_header_breaking_urls_are_escaped_in_location(client):
    nl_id, sub_id = sent_newsletter()
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/caf\u00e9?q=a b")
    r = client.get(path, follow_redirects=False)
    assert r.status_code == 302
    assert r.headers["location"] == "https://example.com/caf%C3%A9?q=a%20b"


@pytest.mark.parametrize("code", ["nope", "1AQFeAy5kaa30hoVu", "1" + "x" * 30, "A" * 250])
def test_unknown_or_forged_code_is_a_404_page_without_redirect(client, code):
    r = client.get(f"/c/{code}", follow_redirects=False)
    assert r.status_code == 404
    assert "location" not in r.headers
    assert "text/html" in r.headers["content-type"]
    assert history() == []


def test_valid_mac_for_a_missing_link_is_404(client):
    r = client.get("/c/" + codes.click_code(999_999, 1), follow_redirects=False)
    assert r.status_code == 404


def test_url_in_query_string_cannot_choose_the_target(client):
    nl_id, sub_id = sent_newsletter()
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/")
    r = client.get(path + "?url=https://evil.example/&redirect=https://evil.example/", follow_redirects=False)
    assert r.headers["location"] == "https://example.com/"


def test_link_rows_are_cached_after_first_click(client, monkeypatch):
    nl_id, sub_id = sent_newsletter()
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/")
    assert client.get(path, follow_redirects=False).status_code == 302
    monkeypatch.setattr(resolve, "_load_link", lambda *a: pytest.fail("DB lookup for a cached link"))
    for _ in range(5):
        assert client.get(path, follow_redirects=False).status_code == 302
    assert len(history()) == 6


def test_legacy_code_redirects_like_a_new_one(client):
    nl_id, sub_id = sent_newsletter()
    ((link_id,),) = db.query(
        "INSERT INTO email_links (mail_kind, mail_id, url, url_hash) VALUES "
        "('newsletter', %s, 'https://old.example/x', %s) RETURNING id",
        (nl_id, links.url_hash("https://old.example/x")),
    )
    db.query(
        "INSERT INTO legacy_link_codes (code, link_id, subscriber_id) VALUES ('OLD-abc123', %s, %s)", (link_id, sub_id)
    )
    r = client.get("/c/OLD-abc123", headers={"User-Agent": UA_HUMAN}, follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "https://old.example/x"
    assert history()[0][:4] == (link_id, "newsletter", nl_id, sub_id)


def test_import_legacy_links_csv_then_click(client, tmp_path):
    nl_id, sub_id = sent_newsletter()
    csv_file = tmp_path / "legacy.csv"
    csv_file.write_text(
        "code,url,mail,recipient\n"
        f"L1,https://old.example/a,newsletter:{nl_id},{sub_id}\n"
        f"L2,https://old.example/a,newsletter:{nl_id},u1@example.COM\n"
        "L3,https://old.example/b,digest:77,\n"
        "bad code,https://old.example/c,newsletter:1,\n"
        "L4,ftp://old.example/c,newsletter:1,\n"
        "L5,https://old.example/c,campaign:1,\n"
        f"L6,https://old.example/a,newsletter:{nl_id},nobody@example.com\n"
    )
    with open(csv_file) as f:
        report = legacy.import_csv(f)
    assert report.imported == 4 and report.unknown_recipients == 1
    assert [e[0] for e in report.errors] == [5, 6, 7]
    # One link row per (mail, url): L1, L2 and L6 share one.
    assert db.query("SELECT mail_kind, mail_id, url FROM email_links ORDER BY id") == [
        ("newsletter", nl_id, "https://old.example/a"),
        ("digest", 77, "https://old.example/b"),
    ]
    assert db.query("SELECT code, subscriber_id FROM legacy_link_codes ORDER BY code") == [
        ("L1", sub_id),
        ("L2", sub_id),
        ("L3", None),
        ("L6", None),
    ]
    with open(csv_file) as f:  # re-running is harmless
        again = legacy.import_csv(f)
    assert again.imported == 0 and again.already_present == 4 and again.conflicts == 0
    assert client.get("/c/L3", follow_redirects=False).headers["location"] == "https://old.example/b"


def test_cli_command_is_registered(tmp_path, capsys):
    from app import cli

    csv_file = tmp_path / "l.csv"
    csv_file.write_text("X1,https://old.example/a,newsletter:5,\n")
    assert cli.main(["import-legacy-links", str(csv_file)]) == 0
    assert "1 imported" in capsys.readouterr().out


def test_open_pixel_records_open(client):
    from app.web.tracking import PIXEL_GIF

    # A code's subscriber must exist: history of an erased one is stored anonymised.
    factories.subscriber("u34", "u34@example.com", id=34)
    r = client.get(
        links.pixel_url("digest", 12, 34).replace("http://localhost:8000", ""), headers={"User-Agent": UA_HUMAN}
    )
    assert r.status_code == 200 and r.content == PIXEL_GIF and r.headers["content-type"] == "image/gif"
    assert history("open") == [(None, "digest", 12, 34, None, UA_HUMAN, False, None)]
    bad = client.get("/o/1garbage.gif")
    assert bad.status_code == 404 and bad.content == PIXEL_GIF
    assert len(history("open")) == 1


def test_machine_traffic_is_flagged_and_counted_apart(client):
    nl_id, sub_id = sent_newsletter(sent_ago_seconds=3600)
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/")
    client.get(path, headers={"User-Agent": UA_HUMAN}, follow_redirects=False)
    client.head(path, headers={"User-Agent": UA_HUMAN}, follow_redirects=False)
    client.get(path, headers={"User-Agent": "Mozilla/5.0 (compatible; Barracuda Sentinel)"}, follow_redirects=False)
    client.get(path, headers={"User-Agent": ""}, follow_redirects=False)
    pixel = links.pixel_url("newsletter", nl_id, sub_id).replace("http://localhost:8000", "")
    client.get(pixel, headers={"User-Agent": UA_HUMAN})
    client.get(pixel, headers={"User-Agent": "Mozilla/5.0"})  # Apple MPP agent
    behind_proxy = TestClient(client.app, client=("127.0.0.1", 50000))
    behind_proxy.get(pixel, headers={"User-Agent": UA_HUMAN, "X-Forwarded-For": "17.58.1.2"})  # Apple network
    clicks = history("click")
    assert [c[6:] for c in clicks] == [
        (False, None),
        (True, "head_request"),
        (True, "scanner_agent"),
        (True, "no_user_agent"),
    ]
    opens = history("open")
    assert [o[6:] for o in opens] == [(False, None), (True, "apple_mpp"), (True, "apple_mpp")]
    s = stats.mail_stats("newsletter", nl_id)
    assert s["clicks"]["human"] == 1 and s["clicks"]["machine"] == 3 and s["clicks"]["unique_human"] == 1
    assert s["clicks"]["machine_reasons"] == {"head_request": 1, "scanner_agent": 1, "no_user_agent": 1}
    assert s["opens"]["human"] == 1 and s["opens"]["machine"] == 2
    assert s["links"][0]["human"] == 1 and s["links"][0]["machine"] == 3


def test_click_right_after_delivery_is_a_scanner(client):
    nl_id, sub_id = sent_newsletter(sent_ago_seconds=1)
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/")
    client.get(path, headers={"User-Agent": UA_HUMAN}, follow_redirects=False)
    assert history()[0][6:] == (True, "soon_after_delivery")


def test_digest_delivery_time_comes_from_the_run(client):
    sub_id = factories.subscriber("u2", "u2@example.com")
    now = dt.datetime.now(dt.UTC)
    runs = [
        factories.digest_run(sub_id, period=period, status="sent", completed_at=now - dt.timedelta(seconds=ago))
        for period, ago in (("2026-01-01", 2), ("2026-01-02", 600))
    ]
    for rid in runs:
        client.get(
            click_path("digest", rid, sub_id, "https://example.com/"),
            headers={"User-Agent": UA_HUMAN},
            follow_redirects=False,
        )
    assert [h[6] for h in history()] == [True, False]


def test_history_survives_a_database_outage(monkeypatch):
    rec = recorder.HistoryRecorder(url="postgresql://127.0.0.1:1/nowhere")
    rec._pid = __import__("os").getpid()  # no background thread: flush by hand
    rec.add(recorder.copy_line("open", None, "digest", 1, 1, None, "ua", False, None, 0.0))
    with pytest.raises(psycopg2.OperationalError):  # nowhere to connect to
        rec.flush()
    assert rec.pending() == 1  # kept for the next attempt
    rec._url = None
    assert rec.flush() == 1
    assert len(history("open")) == 1


def test_every_flush_finds_its_staging_table_whatever_server_session_it_gets():
    """Behind PgBouncer (transaction pooling) consecutive flushes of one writer may run in different
    server sessions, and a temp table lives in one session only. In the PgBouncer pass another
    client keeps the session of the first flush (PgBouncer lends the most recently used one), so
    the second flush runs in another."""
    rec = recorder.HistoryRecorder()
    rec._pid = os.getpid()  # no background thread: flush by hand
    other = db.connect_raw()
    try:
        rec.add(recorder.copy_line("open", None, "digest", 1, 1, None, "ua", False, None, 0.0))
        assert rec.flush() == 1
        with other.cursor() as cur:
            cur.execute("SELECT 1")  # an open transaction keeps its server session
        rec.add(recorder.copy_line("open", None, "digest", 1, 1, None, "ua", False, None, 1.0))
        assert rec.flush() == 1
    finally:
        other.close()
        rec._conn.close()
    assert len(history("open")) == 2


def test_a_link_deleted_before_the_flush_does_not_lose_the_other_clicks(client):
    nl_id, sub_id = sent_newsletter()
    keep = click_path("newsletter", nl_id, sub_id, "https://example.com/keep")
    gone = click_path("newsletter", nl_id, sub_id, "https://example.com/gone")
    for path in (keep, gone, keep):
        assert client.get(path, follow_redirects=False).status_code == 302
    db.query("DELETE FROM email_links WHERE url = 'https://example.com/gone'")
    rows = history()
    assert len(rows) == 2 and recorder.recorder().pending() == 0


def test_codes_from_before_a_key_rotation_still_redirect(client, settings):
    nl_id, sub_id = sent_newsletter()
    settings(secret_key="key-2025")
    path = click_path("newsletter", nl_id, sub_id, "https://example.com/rotated")
    settings(secret_key="key-2026", secret_key_fallbacks=("key-2025",))
    assert client.get(path, follow_redirects=False).headers["location"] == "https://example.com/rotated"
    settings(secret_key="key-2026", secret_key_fallbacks=())
    assert client.get(path, follow_redirects=False).status_code == 404


def test_concurrent_first_clicks_share_one_lookup(monkeypatch):
    import asyncio
    import threading

    nl_id, sub_id = sent_newsletter()
    click_path("newsletter", nl_id, sub_id, "https://example.com/hot")
    ((link_id,),) = db.query("SELECT id FROM email_links")
    calls, real = [], resolve._load_link
    gate = threading.Event()

    def slow_load(lid):
        calls.append(lid)
        gate.wait(5)
        return real(lid)

    monkeypatch.setattr(resolve, "_load_link", slow_load)

    async def main():
        tasks = [asyncio.ensure_future(resolve.link(link_id)) for _ in range(20)]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*tasks)

    found = asyncio.run(main())
    assert calls == [link_id]
    assert {f.location for f in found} == {b"https://example.com/hot"}


def test_import_reports_a_code_already_mapped_elsewhere_as_conflict(tmp_path):
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("K1,https://old.example/a,newsletter:1,\n")
    second.write_text("K1,https://old.example/other,newsletter:1,\n")
    with open(first) as f:
        assert legacy.import_csv(f).imported == 1
    with open(second) as f:
        report = legacy.import_csv(f)
    assert report.conflicts == 1 and report.imported == 0
    assert db.query("SELECT l.url FROM legacy_link_codes c JOIN email_links l ON l.id = c.link_id") == [
        ("https://old.example/a",)
    ]
