"""Failover (MAIL_PROVIDERS=postmark,ses): the circuit breaker on its own, then newsletters and
digests against two real local fakes — the primary's outage sends mail through the secondary with
one mail per recipient across both, the breaker closes again after recovery, and an ambiguous
outcome stays with its provider."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import time

import pytest

from app.cli import providers as providers_cli
from app.platform import config, db, metrics, providers
from app.platform.providers.base import Progress
from app.platform.providers.failover import CLOSED, HALF_OPEN, OPEN, Breaker, FailoverProvider
from app.platform.providers.postmark import PostmarkProvider
from digest import send as digest_send
from tests import factories
from tests.fake_providers import FakePostmark, FakeSES
from tests.newsletter_support import counts, drain, start
from tests.platform.test_http_providers import mails, make

COOLDOWN = 60.0  # never ends by itself during a test (a loaded machine would make it race): cooled_down()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def gauge(name: str) -> float:
    return metrics.PROVIDER_BREAKER_STATE.labels(name)._value.get()


def test_the_breaker_opens_after_failures_in_its_window_and_probes_once_after_the_cooldown():
    clock = Clock()
    b = Breaker("unit-a", failures=3, window=10, cooldown=30, clock=clock)
    b.failed()
    clock.now += 11  # out of the window: forgotten
    b.failed()
    b.failed()
    assert b.state == CLOSED and b.allow()
    b.failed()
    assert b.state == OPEN and not b.allow() and gauge("unit-a") == 2
    clock.now += 29
    assert not b.allow()
    clock.now += 1
    assert b.allow() and b.state == HALF_OPEN and gauge("unit-a") == 1  # the probe
    assert not b.allow()  # one probe at a time
    b.failed()
    assert b.state == OPEN and not b.allow()
    clock.now += 30
    assert b.allow()
    b.succeeded()
    assert b.state == CLOSED and b.allow() and gauge("unit-a") == 0


def test_a_probe_that_sent_nothing_lets_the_next_one_probe():
    clock = Clock()
    b = Breaker("unit-b", failures=1, window=10, cooldown=5, clock=clock)
    b.failed()
    clock.now += 5
    assert b.allow() and not b.allow()
    b.released()
    assert b.allow() and b.state == HALF_OPEN


@pytest.fixture
def two(settings, redis_client):
    """(primary Postmark fake, secondary SES fake), MAIL_PROVIDERS=postmark,ses."""
    with FakePostmark() as primary, FakeSES() as secondary:
        settings(
            mail_providers=("postmark", "ses"),
            tracking=False,
            provider_timeout_seconds=1.0,
            provider_breaker_failures=2,
            provider_breaker_window_seconds=30.0,
            provider_breaker_cooldown_seconds=COOLDOWN,
            postmark_server_token=FakePostmark.TOKEN,
            postmark_api_url=primary.url,
            ses_region=FakeSES.REGION,
            ses_endpoint_url=secondary.url,
            aws_access_key_id=FakeSES.KEY,
            aws_secret_access_key=FakeSES.SECRET,
        )
        yield primary, secondary
        providers.close_all()


def failover() -> FailoverProvider:
    provider = providers.get_provider()
    assert isinstance(provider, FailoverProvider)
    return provider


def cooled_down() -> None:
    """The cool-down has passed, for every breaker of the process's failover provider."""
    for breaker in failover().breakers.values():
        breaker.clock = lambda: time.monotonic() + 2 * COOLDOWN


def sent_by(newsletter_id: int) -> dict:
    return dict(
        db.query(
            "SELECT provider, count(*) FROM email_log WHERE newsletter_id = %s AND status = 'sent' GROUP BY provider",
            (newsletter_id,),
        )
    )


def cli_states() -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        providers_cli.cmd_providers(None)
    shown = json.loads(out.getvalue())
    assert shown["failover"] is True
    return {p["name"]: p["breaker"] for p in shown["providers"]}


def test_an_outage_of_the_primary_sends_through_the_secondary_once_and_mail_returns_after_it(two, settings):
    primary, secondary = two
    settings(send_batch_size=10)
    factories.seed_subscribers(40)
    primary.fail_next(100, 503)
    nl = factories.newsletter()
    start(nl)
    drain(nl, None)
    assert counts(nl) == {"sent": 40} and sent_by(nl) == {"ses": 40}
    assert primary.calls == 2 and not primary.accepted  # two 503s opened its breaker; then skipped
    # exactly one mail per recipient across both providers
    both = primary.recipients() + secondary.recipients()
    assert both == collections.Counter({f"user{i}@example.com": 1 for i in range(1, 41)})
    assert failover().states() == {"postmark": OPEN, "ses": CLOSED}
    assert cli_states() == {"postmark": "open", "ses": "closed"}

    primary._plan.clear()  # the primary recovers
    cooled_down()
    nl2 = factories.newsletter()
    start(nl2)
    drain(nl2, None)
    assert sent_by(nl2) == {"postmark": 40}  # the half-open probe succeeded: back on the primary
    assert failover().states() == {"postmark": CLOSED, "ses": CLOSED}
    assert cli_states() == {"postmark": "closed", "ses": "closed"}
    rows = db.query("SELECT provider, provider_message_id FROM email_log WHERE newsletter_id = %s", (nl2,))
    assert all(mid.startswith("pm-") for _, mid in rows)


def test_a_digest_fails_over_and_records_the_provider_that_took_it(two):
    primary, secondary = two
    primary.fail_next(1, 503)
    sid = factories.subscriber("u1")
    factories.events("u1", 2)
    rid = factories.digest_run(sid)
    assert digest_send.process([rid])["sent"] == 1
    ((provider, message_id),) = db.query("SELECT provider, provider_message_id FROM digest_runs WHERE id = %s", (rid,))
    assert provider == "ses" and message_id.startswith("ses-digest-run-")
    assert not primary.accepted and len(secondary.accepted) == 1


def test_a_throttled_primary_fails_over_too(two):
    primary, secondary = two
    primary.fail_next(1, 429)
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    start(nl)
    drain(nl, None)
    assert sent_by(nl) == {"ses": 3} and not primary.accepted and len(secondary.accepted) == 3


def test_an_ambiguous_outcome_is_never_sent_through_the_secondary(two, settings):
    """The primary took the mail and its answer never came: the row is pinned to the primary. Its
    retries go there alone — even while the primary's breaker is open — and never to the secondary."""
    primary, secondary = two
    settings(send_batch_size=1)
    factories.seed_subscribers(1)
    primary.hang_next(1, 2.0)
    nl = factories.newsletter()
    start(nl)
    drain(nl, None, max_rounds=1)
    ((status, provider),) = db.query("SELECT status, provider FROM email_log")
    assert status == "pending" and provider == "postmark"
    assert sum(primary.accepted.values()) == 1 and not secondary.accepted

    primary.fail_next(2, 503)  # the primary is down now, and its breaker opens
    for _ in range(2):
        db.query("UPDATE email_log SET next_attempt_at = NULL")  # skip the backoff
        drain(nl, None, max_rounds=1)
    assert failover().states()["postmark"] == OPEN
    ((status, provider),) = db.query("SELECT status, provider FROM email_log")
    assert status == "pending" and provider == "postmark" and not secondary.accepted

    db.query("UPDATE email_log SET next_attempt_at = NULL")
    drain(nl, None)
    assert counts(nl) == {"sent": 1} and sent_by(nl) == {"postmark": 1}
    assert not secondary.accepted  # never through the secondary
    assert primary.calls == 4


def test_all_breakers_open_holds_the_mail_as_throttled(two, settings, redis_client):
    primary, secondary = two
    primary.fail_next(2, 503)
    secondary.fail_next(2, 503)
    settings(send_batch_size=1)
    factories.seed_subscribers(3)
    nl = factories.newsletter()
    start(nl)
    (stats,) = drain(nl, None, max_rounds=1)
    assert failover().states() == {"postmark": OPEN, "ses": OPEN}
    assert stats.retry_in is not None and stats.retry_in > 30  # held as throttled until a cool-down ends
    assert counts(nl).get("sent", 0) == 0 and "failed" not in counts(nl)
    cooled_down()
    redis_client.flushdb()  # the shared throttle's wait has passed too
    db.query("UPDATE email_log SET next_attempt_at = NULL")
    drain(nl, None)
    assert counts(nl) == {"sent": 3}
    assert sum((primary.recipients() + secondary.recipients()).values()) == 3


def test_an_ambiguous_digest_stays_with_its_provider(two):
    """The digest path of the pin: digest_runs.provider is set by the ambiguous attempt and read back
    by the claim; the retries go to the primary even while a 503 opens its breaker."""
    primary, secondary = two
    sid = factories.subscriber("u1")
    factories.events("u1", 2)
    rid = factories.digest_run(sid)
    primary.hang_next(1, 2.0)
    assert digest_send.process([rid])["retry"] == 1
    primary.fail_next(2, 503)
    for _ in range(2):
        db.query("UPDATE digest_runs SET next_attempt_at = NULL")  # skip the backoff
        assert digest_send.process([rid])["retry"] == 1
    assert failover().states()["postmark"] == OPEN
    ((status, provider),) = db.query("SELECT status, provider FROM digest_runs WHERE id = %s", (rid,))
    assert status == "pending" and provider == "postmark"
    db.query("UPDATE digest_runs SET next_attempt_at = NULL")
    assert digest_send.process([rid])["sent"] == 1
    ((provider, message_id),) = db.query("SELECT provider, provider_message_id FROM digest_runs WHERE id = %s", (rid,))
    assert provider == "postmark" and message_id.startswith("pm-digest-run-")
    assert not secondary.accepted and primary.calls == 4


def test_the_registry_builds_failover_only_for_two_or_more(settings):
    settings(mail_provider="file", mail_providers=())
    assert providers.configured() == ["file"] and providers.get_provider().name == "file"
    settings(mail_providers=("Postmark",))
    assert isinstance(providers.get_provider(), PostmarkProvider)
    settings(mail_providers=("postmark", "ses", "mailgun"))
    chain = failover()
    assert [m.name for m in chain.members] == ["postmark", "ses", "mailgun"]
    assert chain.max_batch == 500 and chain.preferred_batch == 500
    settings(mail_providers=("postmark", "nope"))
    with pytest.raises(config.ConfigError, match="MAIL_PROVIDERS"):
        providers.get_provider()
    providers.close_all()


def test_a_stop_is_honoured_whichever_provider_the_batch_is_at():
    """A stop requested while the batch is at the failover provider: its mails come back STOPPED,
    none started at either provider, and the primary's breaker has no verdict."""
    with FakeSES() as primary, FakePostmark() as secondary:
        chain = FailoverProvider([make("ses", primary.url, lanes=1), make("postmark", secondary.url)])
        progress = Progress(lambda new: True, every=1, interval=0)  # the first poll asks to stop
        results = chain.send_batch(mails(3), progress)
        assert chain.states() == {"ses": CLOSED, "postmark": CLOSED}
        chain.close()
    assert all(r.stopped for r in results)
    assert primary.calls == 0 and secondary.calls == 0
