"""LinkRewriter: every http(s) link tracked, one email_links row per (mail, url), opt-outs."""

from __future__ import annotations

import re

import pytest

from app.platform import db
from tracking import codes, links

HTML = """<html><body>
<p><a href="https://example.com/a?x=1&amp;y=2">A</a> <a class="btn" href='http://example.com/b'>B</a>
<a href="mailto:hi@example.com">mail</a> <a href="#top">top</a> <a href="tel:+123">tel</a>
<a href="http://localhost:8000/u/TOKEN">unsubscribe</a>
<a href="http://localhost:8000/preferences/TOKEN">preferences</a>
<area shape="rect" href="https://example.com/map">
<a href="https://example.com/a?x=1&amp;y=2">A again</a>
<link rel="stylesheet" href="https://example.com/style.css">
</p></body></html>"""


@pytest.fixture(autouse=True)
def base_url(settings):
    settings(base_url="http://localhost:8000", tracking=True)


def hrefs(html: str) -> list[str]:
    return re.findall(r"""href=["']([^"']*)["']""", html)


def click_targets(html: str) -> list[codes.Click]:
    return [codes.decode_click(h.rsplit("/c/", 1)[1]) for h in hrefs(html) if "/c/" in h]


def link_rows():
    return db.query("SELECT id, mail_kind, mail_id, url FROM email_links ORDER BY id")


def test_rewrites_http_links_and_adds_pixel():
    out = links.LinkRewriter("newsletter", 42).rewrite(HTML, 7)
    found = hrefs(out)
    assert "mailto:hi@example.com" in found and "#top" in found and "tel:+123" in found
    assert "http://localhost:8000/u/TOKEN" in found
    assert "http://localhost:8000/preferences/TOKEN" in found
    assert "https://example.com/style.css" in found  # not an <a>: left alone
    assert "https://example.com/b" not in " ".join(found)
    rows = link_rows()
    # &amp; is unescaped: the stored URL is what a browser would have followed.
    assert [r[3] for r in rows] == ["https://example.com/a?x=1&y=2", "http://example.com/b", "https://example.com/map"]
    assert {(r[1], r[2]) for r in rows} == {("newsletter", 42)}
    targets = click_targets(out)
    assert len(targets) == 4
    ids = {r[3]: r[0] for r in rows}
    assert targets[0] == codes.Click(ids["https://example.com/a?x=1&y=2"], 7)
    assert targets[-1] == targets[0]  # same URL, same row
    # no picture in this mail: the pixel is a 1x1 table's background, not an <img> (issue 22.9)
    pixel = re.search(
        r'<table role="presentation" width="1" height="1" [^>]*background="http://localhost:8000/o/([^"]+)\.gif"', out
    )
    assert pixel and codes.decode_open(pixel.group(1)) == codes.Open("newsletter", 42, 7)
    assert out.index(pixel.group(0)) < out.index("</body>")
    assert 'class="btn" href="http://localhost:8000/c/' in out  # other attributes kept


def test_one_row_per_mail_and_url_not_per_recipient():
    rewriter = links.LinkRewriter("digest", 5)
    outs = [rewriter.rewrite(HTML, sub) for sub in range(1, 51)]
    assert len(link_rows()) == 3
    # A second rewriter (another worker, a retry) reuses the same rows.
    links.LinkRewriter("digest", 5).rewrite(HTML, 99)
    assert len(link_rows()) == 3
    assert {t.subscriber_id for out in outs for t in click_targets(out)} == set(range(1, 51))
    # Another mail gets its own rows for the same URLs.
    links.LinkRewriter("newsletter", 5).rewrite(HTML, 1)
    assert len(link_rows()) == 6


def test_url_hash_stored_by_postgres_is_the_one_python_computes():
    urls = ["https://example.test/ü?q=1&r=2", "https://example.test/a b", "https://例え.テスト/😀"]
    ids = links.ensure_links("digest", 8, urls)
    again = links.ensure_links("digest", 8, urls[::-1])  # found, not created: same ids
    assert ids == again and sorted(ids) == sorted(urls)
    rows = db.query("SELECT url, url_hash FROM email_links WHERE mail_id = 8")
    assert {url: bytes(h) for url, h in rows} == {u: links.url_hash(u) for u in urls}


def test_rewriter_caches_link_ids(monkeypatch):
    rewriter = links.LinkRewriter("newsletter", 1)
    rewriter.rewrite(HTML, 1)
    calls = []
    monkeypatch.setattr(links, "ensure_links", lambda *a: calls.append(a) or {})
    for sub in range(2, 20):
        rewriter.rewrite(HTML, sub)
    assert calls == []  # no DB work for recipients after the first


def test_new_url_for_later_recipient_costs_one_write():
    rewriter = links.LinkRewriter("newsletter", 1)
    rewriter.rewrite('<a href="https://a.example/">a</a>', 1)
    out = rewriter.rewrite('<a href="https://a.example/">a</a><a href="https://b.example/">b</a>', 2)
    assert [r[3] for r in link_rows()] == ["https://a.example/", "https://b.example/"]
    assert len(click_targets(out)) == 2


def test_tracking_off_and_subscriber_opt_out_send_clean_html(settings):
    assert links.LinkRewriter("newsletter", 1).rewrite(HTML, 1, enabled=False) == HTML
    settings(tracking=False)
    assert links.LinkRewriter("newsletter", 1).rewrite(HTML, 1) == HTML
    assert link_rows() == []


def test_html_without_body_gets_pixel_appended_and_no_links_is_fine():
    out = links.LinkRewriter("newsletter", 1).rewrite("<p>hello</p>", 1)
    assert out.startswith('<p>hello</p><table role="presentation"') and "<img" not in out
    assert link_rows() == []


def test_a_mail_with_pictures_gets_the_pixel_as_an_img_and_one_without_gets_none():
    """Issue 22.9: a spam filter reads a short mail whose only <img> is the pixel as an image mail."""
    with_picture = links.LinkRewriter("newsletter", 1).rewrite('<p>hi</p><img src="https://x.example/a.png"></body>', 1)
    pixel = re.search(r'<img src="http://localhost:8000/o/([^"]+)\.gif" width="1" height="1"', with_picture)
    assert pixel and codes.decode_open(pixel.group(1)) == codes.Open("newsletter", 1, 1)
    assert with_picture.index(pixel.group(0)) < with_picture.index("</body>")
    without = links.LinkRewriter("newsletter", 1).rewrite("<p>hi</p></body>", 1)
    assert "<img" not in without.lower() and without.count("/o/") == 2  # the attribute and the CSS, one URL
    code = re.search(r'background="http://localhost:8000/o/([^"]+)\.gif"', without).group(1)
    assert f"url(http://localhost:8000/o/{code}.gif)" in without and codes.decode_open(code) == codes.Open(
        "newsletter", 1, 1
    )


def test_already_tracked_links_are_not_wrapped_twice():
    once = links.LinkRewriter("newsletter", 1).rewrite('<a href="https://x.example/">x</a>', 1)
    twice = links.LinkRewriter("newsletter", 1).rewrite(once, 1)
    assert click_targets(twice) == click_targets(once)
    assert len(link_rows()) == 1


def test_unknown_mail_kind_is_refused():
    with pytest.raises(ValueError):
        links.LinkRewriter("sms", 1)


def test_concurrent_workers_agree_on_one_row_per_url():
    from concurrent.futures import ThreadPoolExecutor

    html = "".join(f'<a href="https://race.example/{i}">{i}</a>' for i in range(30))

    def render(sub):
        return click_targets(links.LinkRewriter("newsletter", 8).rewrite(html, sub))

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(render, range(1, 13)))
    assert len(link_rows()) == 30
    assert {tuple(t.link_id for t in r) for r in results} == {tuple(r[0] for r in link_rows())}
