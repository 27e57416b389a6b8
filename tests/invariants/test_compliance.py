"""Compliance by construction: every newsletter and digest shows a working unsubscribe link and
the sender's postal address (MAIL_POSTAL_ADDRESS), in the HTML and the text part."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from app.newsletter import template
from app.platform import config, db, tokens
from digest import send as digest_send
from tests import factories
from tests.digest_support import sink_as_provider
from tests.newsletter_support import counts, drain, start
from tests.platform.test_config_production import GOOD_KEY, PRODUCTION_VARS

ADDRESS = "Example & Co Ltd, 1 Main St, Springfield"
ESCAPED = "Example &amp; Co Ltd, 1 Main St, Springfield"
CONTEXT = {
    "name": "A",
    "email": "a@example.com",
    "user_id": "u1",
    "unsubscribe_url": "https://x.example/u/TOKEN",
    "preferences_url": "https://x.example/preferences/P",
}


@pytest.mark.parametrize(
    "source,expected",
    [
        ("<p>{{unsubscribe_url}}</p>", True),
        ("<p>{{{unsubscribe_url}}}</p>", True),
        ("<p>{{& unsubscribe_url }}</p>", True),
        ("<p>{{! {{unsubscribe_url}} }}</p>", False),  # a Mustache comment
        ('<p><!-- <a href="{{unsubscribe_url}}">u</a> --></p>', False),  # an HTML comment
        ('<!-- x --><a href="{{unsubscribe_url}}">u</a>', True),  # after a closed comment
        ('{{#name}}<a href="{{unsubscribe_url}}">u</a>{{/name}}', False),  # not rendered for everyone
        ('{{^name}}<a href="{{unsubscribe_url}}">u</a>{{/name}}', False),
        ('{{#name}}x{{/name}}<a href="{{unsubscribe_url}}">u</a>', True),
        ("<p>{{preferences_url}}</p>", False),
    ],
)
def test_which_templates_count_as_showing_the_link(source, expected):
    assert template.always_renders(template.tokenize(source), "unsubscribe_url", html=True) is expected


def test_the_footer_is_added_where_the_link_is_missing_and_only_there():
    bare = template.Compiled("s", "<html><body><p>Hi {{name}}</p></BODY></html>", None, ADDRESS).render(CONTEXT)
    assert bare.html.count("https://x.example/u/TOKEN") == 1 and "https://x.example/preferences/P" in bare.html
    assert bare.html.index(ESCAPED) < bare.html.index("</BODY>")  # inside the body
    assert ADDRESS not in bare.html  # escaped in HTML
    assert bare.text.count("Unsubscribe: https://x.example/u/TOKEN") == 1 and bare.text.count(ADDRESS) == 1

    linked = template.Compiled(
        "s", '<p><a href="{{unsubscribe_url}}">Leave</a></p>', "Bye: {{unsubscribe_url}}", ADDRESS
    ).render(CONTEXT)
    assert linked.html.count("https://x.example/u/TOKEN") == 1 and linked.html.count(ESCAPED) == 1
    assert "preferences" not in linked.html  # the address alone
    assert linked.text == f"Bye: https://x.example/u/TOKEN\n\n--\n{ADDRESS}\n"

    # The parts are decided independently; an address written by the template is not repeated.
    mixed = template.Compiled(
        "s", f'<a href="{{{{unsubscribe_url}}}}">u</a> {ESCAPED}', "no link here", ADDRESS
    ).render(CONTEXT)
    assert mixed.html == f'<a href="https://x.example/u/TOKEN">u</a> {ESCAPED}'
    assert mixed.text.count("https://x.example/u/TOKEN") == 1 and mixed.text.count(ADDRESS) == 1

    # A link that only some recipients would see: the footer adds one everybody sees.
    guarded = template.Compiled("s", '{{#name}}<a href="{{unsubscribe_url}}">u</a>{{/name}}', None, "")
    assert guarded.render({**CONTEXT, "name": ""}).html.count("https://x.example/u/TOKEN") == 1


def test_development_without_an_address_shows_no_address_line():
    rendered = template.Compiled("s", "<p>Hi</p>", "Hi", "").render(CONTEXT)
    assert (
        rendered.text == "Hi\n\n--\nYou get this newsletter because you have an account with newsletters turned on.\n"
        "Unsubscribe: https://x.example/u/TOKEN\n"
        "Email preferences: https://x.example/preferences/P\n"
    )
    assert "<br>" not in rendered.html.split("Email preferences</a>")[1]


def test_a_newsletter_without_the_link_gets_a_working_one_in_both_parts(fake, provider, settings, client):
    settings(mail_postal_address=ADDRESS)
    factories.seed_subscribers(3)
    nl = factories.newsletter(html="<html><body><p>Hello {{name}}, big news.</p></body></html>")
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 3}
    for mail in fake.delivered.values():
        unsubscribe = mail["headers"]["List-Unsubscribe"].strip("<>").split(">")[0]
        assert mail["html"].count(f'href="{unsubscribe}"') == 1 and mail["html"].count(ESCAPED) == 1
        assert mail["text"].count(f"Unsubscribe: {unsubscribe}") == 1 and mail["text"].count(ADDRESS) == 1
        token = urlsplit(unsubscribe).path.removeprefix("/u/")
        claims = tokens.verify("unsubscribe", token)
        ((sid,),) = db.query("SELECT id FROM subscribers WHERE email = %s", (mail["to"],))
        assert claims is not None and claims.subscriber_id == sid
        page = client.get(urlsplit(unsubscribe).path)
        assert page.status_code == 200


def test_a_newsletter_with_the_link_gets_no_second_one(fake, provider, settings):
    settings(mail_postal_address=ADDRESS)
    factories.seed_subscribers(2)
    nl = factories.newsletter(text="Hello {{name}}\nUnsubscribe: {{unsubscribe_url}}\n")  # factories.HTML has it
    start(nl)
    drain(nl, provider)
    assert counts(nl) == {"sent": 2}
    for mail in fake.delivered.values():
        unsubscribe = mail["headers"]["List-Unsubscribe"].strip("<>").split(">")[0]
        assert mail["html"].count(unsubscribe) == 1 and mail["text"].count(unsubscribe) == 1
        assert mail["html"].count(ESCAPED) == 1 and mail["text"].count(ADDRESS) == 1


@pytest.fixture
def sink(settings):
    with sink_as_provider(settings, mail_postal_address=ADDRESS) as s:
        yield s


def test_every_digest_shows_the_link_and_the_postal_address(sink):
    for user in ("u1", "u2"):
        sid = factories.subscriber(user)
        factories.events(user, 2, entity_id="p1")
        factories.digest_run(sid)
    (rid1,), (rid2,) = db.query("SELECT id FROM digest_runs ORDER BY id")
    assert digest_send.process([rid1, rid2])["sent"] == 2
    messages = sink.messages()
    assert len(messages) == 2
    for msg in messages:
        unsubscribe = msg["List-Unsubscribe"].strip("<>").split(">")[0]
        html = msg.get_body(("html",)).get_content()
        text = msg.get_body(("plain",)).get_content()
        assert unsubscribe in html and unsubscribe in text
        assert html.count(ESCAPED) == 1 and text.count(ADDRESS) == 1


def test_multi_line_addresses_become_one_line(monkeypatch):
    monkeypatch.setenv("APP_ENV", "development")
    monkeypatch.setenv("MAIL_POSTAL_ADDRESS", "Example Ltd\n 1 Main St \n\nSpringfield")
    assert config.load().mail_postal_address == "Example Ltd, 1 Main St, Springfield"
    monkeypatch.delenv("MAIL_POSTAL_ADDRESS")
    for env in ("development", "test"):
        monkeypatch.setenv("APP_ENV", env)
        assert config.load().mail_postal_address == ""


def _production(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARS}
    return {
        **env,
        "APP_ENV": "production",
        "SECRET_KEY": GOOD_KEY,
        "SENDGRID_WEBHOOK_ALLOW_UNSIGNED": config.ALLOW_UNSIGNED_WEBHOOK,
        **extra,
    }


def test_production_refuses_to_start_without_a_postal_address(monkeypatch):
    for name, value in _production().items():
        monkeypatch.setenv(name, value)
    for blank in (None, "", "  \n "):
        if blank is None:
            monkeypatch.delenv("MAIL_POSTAL_ADDRESS", raising=False)
        else:
            monkeypatch.setenv("MAIL_POSTAL_ADDRESS", blank)
        with pytest.raises(config.ConfigError, match="MAIL_POSTAL_ADDRESS is not set"):
            config.load()
    monkeypatch.setenv("MAIL_POSTAL_ADDRESS", ADDRESS)
    assert config.load().mail_postal_address == ADDRESS

    for cmd in (["-c", "import app.web"], ["-m", "app", "list-api-keys"]):
        proc = subprocess.run([sys.executable, *cmd], env=_production(), capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "MAIL_POSTAL_ADDRESS is not set" in proc.stderr, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-c", "import app.web"],
        env=_production(MAIL_POSTAL_ADDRESS=ADDRESS),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
