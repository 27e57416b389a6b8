"""Templates: premailer once, tags kept, the compiled renderer equals chevron, escaping, operator files."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta

import chevron
import pytest

from app.platform import mustache
from app.subscribers.categories import Category
from digest import context, group, render

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

HOSTILE = '<script>alert("x")</script> & <img src=x onerror=y>'


def _ctx(
    name=HOSTILE,
    title="Post <b>1</b>",
    url="https://example.test/p?a=1&b=2",
    avatar="https://example.test/a.png",
    label=HOSTILE,
):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    events = [group.Event(i, "like", "post", "p1", f"a{i}", name, now + timedelta(minutes=i)) for i in range(3)]
    events.append(group.Event(3, "comment", "post", "p2", "a0", name, now))
    d = group.build(events, 1)
    d.groups[0].title, d.groups[0].url = title, url
    d.avatars["a2"] = avatar
    registry = {"like": Category("like", label, verb="liked")}
    return context.build(
        d,
        context.Reader(
            name="Ana",
            cadence="daily",
            timezone="Europe/Lisbon",
            last_digest_at=now - timedelta(days=1),
            unsubscribe_url="https://x.test/u/TOKEN",
            preferences_url="https://x.test/preferences/T",
        ),
        categories=registry,
        now=now + timedelta(hours=3),
    )


def test_compiled_html_keeps_every_mustache_tag_and_inlines_css():
    ts = render.TemplateSet(render.DEFAULT_DIR)
    source = (render.DEFAULT_DIR / "digest.html").read_text()
    compiled = ts.get("digest.html")
    # the layout adds the reader's language and direction (<html lang dir>), then the template's own tags
    assert [t for t in compiled.tokens if t[0] != "literal"] == [("variable", "lang"), ("variable", "dir")] + [
        t for t in chevron.tokenizer.tokenize(source) if t[0] != "literal"
    ]
    html = "".join(v for k, v in compiled.tokens if k == "literal")
    assert "<style" not in html and 'style="' in html
    assert 'href="' in html and "%7B" not in html and "%20" not in html


def test_hostile_actor_names_are_escaped_in_html():
    out = render.render(_ctx())
    assert "<script>" not in out.html and "<img src=x" not in out.html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img" in out.html
    assert "Post &lt;b&gt;1&lt;/b&gt;" in out.html
    assert 'href="https://example.test/p?a=1&amp;b=2"' in out.html
    assert HOSTILE in out.text  # plain text is not HTML
    assert "\n" not in out.subject
    assert out.subject.startswith(HOSTILE)  # the subject is a header, not HTML: never entity-escaped
    assert "&amp;" not in out.subject


def test_entity_block_with_link_lines_time_avatar_and_more():
    out = render.render(_ctx(name="Eli", title="Launch notes", label="Likes"))
    assert out.subject == "Eli, Eli and Eli liked Launch notes — and 1 more update"
    assert '<a href="https://example.test/p?a=1&amp;b=2"' in out.html and ">Launch notes</a>" in out.html
    assert 'src="https://example.test/a.png"' in out.html and "Eli, Eli and Eli liked" in out.html
    assert "2 h ago" in out.html and "4 updates since yesterday." in out.html
    assert "…and 1 more update on 1 other post\n" in out.text
    assert "* Launch notes\n  https://example.test/p?a=1&b=2\n  - Eli, Eli and Eli liked (2 h ago)" in out.text
    no_link = render.render(_ctx(url="", avatar=""))
    assert '<a href="https://example.test' not in no_link.html and "<img" not in no_link.html.split("<body")[1]


def test_compiled_renderer_equals_chevron():
    ts = render.TemplateSet(render.DEFAULT_DIR)
    for ctx in (_ctx(), _ctx(name="Bo", url="")):
        ctx = {**ctx, "subject": "s"}
        for name in ("digest.html", "digest.txt", "subject.txt"):
            c = ts.get(name)
            assert c.template.render(ctx) == chevron.render(list(c.tokens), ctx), name


def test_mustache_semantics():
    t = mustache.Template(
        chevron.tokenizer.tokenize(
            "{{#items}}[{{name}}{{#flag}}!{{/flag}}]{{/items}}{{^items}}none{{/items}}{{a.b}}{{{raw}}}{{! c }}"
        )
    )
    assert (
        t.render({"items": [{"name": "x", "flag": True}, {"name": "<y>"}], "a": {"b": 1}, "raw": "<r>"})
        == "[x!][&lt;y&gt;]1<r>"
    )
    assert t.render({"items": []}) == "none"
    with pytest.raises(mustache.MustacheError):
        mustache.Template(chevron.tokenizer.tokenize("{{> partial}}"))


def test_operator_template_dir_is_used_and_recompiled_on_change(tmp_path, settings, monkeypatch):
    for name in render.NAMES:
        shutil.copy(render.DEFAULT_DIR / name, tmp_path / name)
    (tmp_path / "subject.txt").write_text("Custom {{cadence}} subject")
    settings(digest_template_dir=str(tmp_path))
    assert render.render(_ctx()).subject == "Custom daily subject"
    monkeypatch.setattr(render, "STAT_EVERY_SECONDS", 0)
    import os

    (tmp_path / "subject.txt").write_text("Changed {{cadence}}!")
    st = os.stat(tmp_path / "subject.txt")
    os.utime(tmp_path / "subject.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    assert render.render(_ctx()).subject == "Changed daily!"


def test_missing_template_is_a_clear_error(tmp_path, settings):
    settings(digest_template_dir=str(tmp_path))
    with pytest.raises(render.TemplateError):
        render.render(_ctx())
