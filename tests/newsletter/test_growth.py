"""Send chains added while they mostly wait for the provider (app/newsletter/growth.py)."""

from __future__ import annotations

import pytest

from app.newsletter import growth, sender
from app.platform import host, queue
from tests import factories
from tests.digest_support import sink_as_provider
from tests.newsletter_support import counts, start


@pytest.mark.pure
@pytest.mark.parametrize(
    "provider, elapsed, idle, expected",
    [
        (0.8, 1.0, 0.5, True),  # mostly waiting, CPU to spare
        (0.3, 1.0, 0.5, False),  # mostly rendering
        (0.8, 1.0, 0.1, False),  # waiting, but the host is busy: more chains would only contend
        (0.1, 0.15, 0.9, False),  # too early to judge
    ],
)
def test_the_decision(provider, elapsed, idle, expected):
    assert growth.wants_more(provider, elapsed, idle) is expected


@pytest.mark.pure
def test_host_idle_share_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    idle = host.HostIdle(str(stat), interval=0)
    stat.write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")  # 100 busy + 100 idle jiffies since
    assert idle.share() == pytest.approx(0.5)
    assert host.HostIdle(str(tmp_path / "missing"), interval=0).share() == 1.0


def test_grow_adds_one_chain_per_interval_up_to_the_cap(redis_client):
    assert growth.grow(7, start_chains=2, max_chains=2) is False  # no room: no growth at all
    assert growth.grow(7, start_chains=2, max_chains=4) is True
    assert queue.depth("newsletter") == 1
    assert growth.grow(7, start_chains=2, max_chains=4) is False  # within the interval
    redis_client.delete("notify:newsletter:7:grew")  # as if the interval had passed
    assert growth.grow(7, start_chains=2, max_chains=4) is True
    redis_client.delete("notify:newsletter:7:grew")
    assert growth.grow(7, start_chains=2, max_chains=4) is False  # two extra already this hour
    assert queue.depth("newsletter") == 2
    assert int(redis_client.get(growth.extra_key(7))) == 3


def test_a_redis_failure_only_means_no_growth(settings):
    settings(redis_url="redis://127.0.0.1:9/0")
    assert growth.grow(7, start_chains=1, max_chains=4) is False


def test_the_send_loop_measures_its_provider_time(redis_client, settings):
    with sink_as_provider(settings, send_batch_size=10) as sink:
        sink.delay = 0.02
        factories.seed_subscribers(30)
        nl = factories.newsletter()
        start(nl)
        stats = sender.send_batch(nl, reenqueue=False, budget_seconds=60)
    assert stats.sent == 30 and counts(nl) == {"sent": 30}
    assert stats.provider_seconds >= 0.02 * 3  # three batches, each waited for at least one reply
    assert stats.grew is False  # reenqueue=False: never adds chains
