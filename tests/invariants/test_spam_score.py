"""What a spam filter makes of our mail (issue 22.9): the demo newsletter (two short paragraphs) and a
demo digest, sent through the real send paths with tracking on to a local SMTP sink, scored by
SpamAssassin without network tests (`spamassassin -L -t`). Skipped where the command is missing
(Debian: `apt-get install spamassassin`). The scores land in test-artifacts/spam-scores.txt."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.newsletter import outbox
from app.platform import db, providers
from app.subscribers import categories
from digest import send as digest_send
from scripts import demo_data
from tests import factories
from tests.digest_support import sink_as_provider
from tests.newsletter_support import drain

SPAMASSASSIN = shutil.which("spamassassin")
pytestmark = pytest.mark.skipif(
    SPAMASSASSIN is None, reason="spamassassin not installed (apt-get install spamassassin)"
)

TARGET = 1.0
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def sink(settings):
    # A production-like sender: an https base URL on the default port, the postal address shown.
    with sink_as_provider(
        settings,
        tracking=True,
        base_url="https://notify.example.test",
        mail_postal_address="Demo Ltd, 1 Example Street, Lisbon",
    ) as s:
        yield s


def score(raw: bytes) -> tuple[float, str]:
    """(score, the rules that hit) of one message, local tests only."""
    out = subprocess.run([SPAMASSASSIN, "-L", "-t"], input=raw, capture_output=True, check=True).stdout.decode()
    found = re.search(r"^X-Spam-Status: \w+, score=(-?[\d.]+)", out, re.M)
    assert found, out[:2000]
    report = out.split("Content analysis details:", 1)[-1].strip()
    return float(found.group(1)), report


def record(name: str, value: float, report: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / "spam-scores.txt").open("a") as f:
        f.write(f"{name}: {value}\n{report}\n\n")
    print(f"SpamAssassin {name}: {value}")


def demo_subscribers() -> None:
    for user_id, email, name, tz in demo_data.DEMO_USERS:
        factories.subscriber(user_id, email=email, name=name, timezone=tz)


def test_the_demo_newsletter_is_not_an_image_mail(sink):
    demo_subscribers()
    newsletter_id = demo_data.demo_newsletter()
    outbox.create_outbox(newsletter_id)
    drain(newsletter_id, providers.get_provider())
    messages = sink.messages()
    assert len(messages) == len(demo_data.DEMO_USERS)
    html = messages[0].get_body(("html",)).get_content()
    assert "/o/" in html and "<img" not in html  # tracked, but no picture to weigh against the words
    value, report = score(messages[0].as_bytes())
    record("demo newsletter", value, report)
    assert "HTML_IMAGE_ONLY" not in report
    assert value < TARGET, report


def test_a_demo_digest_scores_low(sink):
    demo_subscribers()
    for key, values in demo_data.CATEGORIES.items():
        categories.upsert(key, categories.validate(values)[0])
    (sid,) = db.query("SELECT id FROM subscribers WHERE user_id = 'demo-ana'")[0]
    for i, (post, title) in enumerate(demo_data.POSTS):
        for j, (actor_id, actor) in enumerate(demo_data.ACTORS[1:5]):
            factories.events(
                "demo-ana",
                1,
                category=("like", "comment", "follow")[(i + j) % 3],
                entity_id=post,
                actor=actor_id,
                actor_name=actor,
                payload={
                    "actor_avatar_url": demo_data.avatar_url(actor),
                    "entity_title": title,
                    "entity_url": f"https://example.test/posts/{post}",
                },
            )
    assert digest_send.process([factories.digest_run(sid)])["sent"] == 1
    (message,) = sink.messages()
    value, report = score(message.as_bytes())
    record("demo digest", value, report)
    assert value < TARGET, report
