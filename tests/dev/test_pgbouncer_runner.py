"""scripts/dev/pgbouncer.py without the pgbouncer binary: skipped with a warning on a developer's
machine, a failure under CI (a pass that never ran must not look green)."""

from __future__ import annotations

import pytest

from scripts.dev import pgbouncer

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)


@pytest.fixture
def no_binary(monkeypatch):
    monkeypatch.setattr(pgbouncer, "find_binary", lambda: None)
    monkeypatch.setattr(pgbouncer.subprocess, "call", lambda *a, **k: pytest.fail("the command must not run"))


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_missing_pgbouncer_is_skipped_outside_ci(no_binary, monkeypatch, capsys, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert pgbouncer.main(["--", "true"]) == 0
    assert "WARNING: pgbouncer is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_missing_pgbouncer_fails_under_ci(no_binary, monkeypatch, capsys, ci):
    monkeypatch.setenv("CI", ci)
    assert pgbouncer.main(["--", "true"]) == 1
    assert "ERROR: pgbouncer is not installed" in capsys.readouterr().err
