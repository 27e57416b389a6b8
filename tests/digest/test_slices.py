"""A claimed batch is built and sent in slices of about DIGEST_BUILD_EVENTS loaded events
(digest/send.py): a worker thread holds one slice's mails, the emergency stop keeps the slices not
started from being built, and one run's problem stays in its slice's outcome while the record
stays one per batch."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from app.operations import sending
from app.operations.audit import Operator
from app.platform import db, mail_stop
from app.platform.providers.base import SendResult
from app.platform.providers.file import FileProvider
from app.platform.providers.smtp import SMTPProvider
from digest import build as digest_build
from digest import send as digest_send
from tests import factories
from tests.digest_support import SmtpSink, run_row


class WatchedSMTP(SMTPProvider):
    """The real SMTP provider, noting each call's size and whether the mails of the calls before
    it are still alive when it is made."""

    def __init__(self, url: str):
        super().__init__(url, pool_size=2)
        self.calls: list[int] = []
        self.alive_before: list[int] = []
        self._earlier: list[weakref.ref] = []
        self.after_first = None

    def send_batch(self, mails, progress=None):
        gc.collect()
        self.alive_before.append(sum(ref() is not None for ref in self._earlier))
        self._earlier += [weakref.ref(m) for m in mails]
        self.calls.append(len(mails))
        results = super().send_batch(mails, progress)
        if self.after_first and len(self.calls) == 1:
            self.after_first()
        return results


@pytest.fixture
def relay():
    sink = SmtpSink().start()
    provider = WatchedSMTP(sink.url)
    yield provider, sink
    provider.close()
    sink.stop()


def _runs(n: int) -> list[int]:
    runs = []
    for i in range(n):
        sid = factories.subscriber(f"u{i}")
        factories.events(f"u{i}", 3, payload={"title": f"Post {i}", "url": f"https://example.com/p/{i}"})
        runs.append(factories.digest_run(sid))
    return runs


def test_a_batch_goes_out_slice_by_slice_and_a_thread_holds_one_slice_of_mails(relay, settings):
    provider, sink = relay
    settings(digest_build_events=9, tracking=True)  # 3 runs of 3 events
    runs = _runs(8)
    counts = digest_send.process(runs, provider=provider)
    assert counts == {"sent": 8, "skipped": 0, "retry": 0, "failed": 0}
    assert provider.calls == [3, 3, 2]
    assert provider.alive_before == [0, 0, 0]  # the slices sent before were let go
    assert len(sink.messages()) == 8
    rows = [run_row(r) for r in runs]
    assert {r["status"] for r in rows} == {"sent"}
    # recorded as the batch goes (digest/send.py Recorder: every RECORD_EVERY results or
    # SEND_CHECK_SECONDS, so how many writes depends on the machine's speed): each run once
    assert db.query("SELECT count(*) FROM digest_runs WHERE completed_at IS NOT NULL") == [(8,)]
    # each slice rewrote its own links: every mail's links are tracked and distinct per run
    assert db.query("SELECT count(DISTINCT mail_id) FROM email_links WHERE mail_kind = 'digest'") == [(8,)]


def test_the_emergency_stop_after_one_slice_leaves_the_others_unbuilt_and_pending(relay, settings, monkeypatch):
    provider, sink = relay
    settings(digest_build_events=6)  # 2 runs of 3 events
    runs = _runs(6)
    built = []
    real = digest_build.build_slice

    def counting(cur, part, *args):
        built.append(len(part))
        return real(cur, part, *args)

    monkeypatch.setattr(digest_send, "build_slice", counting)

    def stop_now():  # engaged once the first slice was sent, seen at the next check between slices
        sending.stop_sending(Operator("test"), "drill")
        time.sleep(mail_stop.SEND_CHECK_SECONDS + 0.05)

    provider.after_first = stop_now
    counts = digest_send.process(runs, provider=provider)
    assert counts["sent"] == 2 and counts["released"] == 4
    assert built == [2] and provider.calls == [2]
    assert len(sink.messages()) == 2
    rows = [run_row(r) for r in runs[2:]]
    assert all(r["status"] == "pending" and r["attempts"] == 0 for r in rows)
    sending.resume_sending(Operator("test"))
    assert digest_send.process(runs[2:], provider=provider)["sent"] == 4
    assert len(sink.messages()) == 6


def test_a_broken_slice_retries_alone_and_the_slices_around_it_are_sent(relay, settings, monkeypatch):
    provider, sink = relay
    settings(digest_build_events=6)  # 2 runs of 3 events
    runs = _runs(6)
    real = digest_build.build_slice

    def second_slice_breaks(cur, part, *args):
        if part[0].user_id == "u2":
            raise RuntimeError("a library surprise while building")
        return real(cur, part, *args)

    monkeypatch.setattr(digest_send, "build_slice", second_slice_breaks)
    counts = digest_send.process(runs, provider=provider)
    assert counts == {"sent": 4, "skipped": 0, "retry": 2, "failed": 0}
    status = {r: run_row(r)["status"] for r in runs}
    assert [status[r] for r in runs] == ["sent", "sent", "pending", "pending", "sent", "sent"]
    assert all("library surprise" in run_row(r)["last_error"] for r in runs[2:4])
    assert len(sink.messages()) == 4


def test_slices_hold_at_most_the_budget_and_a_larger_run_goes_alone():
    from types import SimpleNamespace

    sizes = {1: 20, 2: 20, 3: 50, 4: 5, 5: 0, 6: 30}
    batch = digest_build.Batch({}, {sid: [object()] * n for sid, n in sizes.items()}, {})
    runs = [SimpleNamespace(subscriber_id=sid) for sid in sizes]
    seen = [[r.subscriber_id for r in part] for part in batch.slices(runs, 40)]  # type: ignore[arg-type]
    assert seen == [[1, 2], [3], [4, 5, 6]]
    assert batch.events == {}  # each slice's events let go
    ordinary = digest_build.Batch({}, {sid: [object()] * 20 for sid in range(100)}, {})
    everyone = [SimpleNamespace(subscriber_id=sid) for sid in range(100)]
    assert len(list(ordinary.slices(everyone, 2000))) == 1  # type: ignore[arg-type]


class TwoAtATime(FileProvider):
    """The file provider, two mails per call; its second call waits past the recorder's interval
    first (a slow relay) and the relay refuses both of its mails."""

    max_batch = 2

    def __init__(self, directory):
        super().__init__(str(directory))
        self.calls = 0

    def deliver(self, prepared, progress):
        self.calls += 1
        if self.calls == 2:
            time.sleep(mail_stop.SEND_CHECK_SECONDS + 0.05)
        return super().deliver(prepared, progress)

    def _write(self, m, raw):
        if self.calls == 2:
            return SendResult(ok=False, error="550 refused", permanent=True)
        return super()._write(m, raw)


def test_a_result_reported_at_the_end_of_one_call_is_never_read_as_the_next_call_s(tmp_path, settings):
    """The provider reports a call's last result after its last poll; left in the Progress, the next
    call's first flush read it by that call's positions and recorded a refused mail as sent."""
    settings(digest_build_events=1000)  # one slice, two provider calls
    runs = _runs(4)
    counts = digest_send.process(runs, provider=TwoAtATime(tmp_path))
    assert counts == {"sent": 2, "skipped": 0, "retry": 0, "failed": 2}
    assert [run_row(r)["status"] for r in runs] == ["sent", "sent", "failed", "failed"]
