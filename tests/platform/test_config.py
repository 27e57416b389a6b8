"""Settings are declared once (app/platform/config.py); the table in docs/configuration.md is generated from them."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from app.platform import config

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

CONFIGURATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_doc_table_is_the_generated_one():
    text = CONFIGURATION_DOC.read_text()
    table = re.search(r"<!-- settings:start -->\n(.*?)\n<!-- settings:end -->", text, re.S).group(1)
    assert table == config.markdown_table(), (
        "run `python -m app settings --markdown` and paste it into docs/configuration.md"
    )


def test_every_setting_has_a_doc_and_reads_its_own_variable(monkeypatch):
    samples = {"int": "7", "float": "0.5", "bool": "off", "str": "x", "tuple": "a, b"}
    expected = {"int": 7, "float": 0.5, "bool": False, "str": "x", "tuple": ("a", "b")}
    for f in fields(config.Settings):
        assert f.metadata.get("doc"), f.name
        if f.name in (
            "base_url",
            "default_locale",
            "default_quiet_hours",
            *config._SPECIAL,
        ):  # read by load() with their own rules
            continue
        monkeypatch.setenv(config.env_name(f.name), samples[f.type])
        assert getattr(config.load(), f.name) == expected[f.type], f.name
        monkeypatch.delenv(config.env_name(f.name))


def test_a_malformed_number_names_its_variable(monkeypatch):
    monkeypatch.setenv("DIGEST_MAX_ITEMS", "fifty")
    with pytest.raises(config.ConfigError, match="DIGEST_MAX_ITEMS must be an integer"):
        config.load()


def test_default_locale_is_stored_in_one_spelling_and_an_unknown_one_refused(monkeypatch):
    monkeypatch.setenv("DEFAULT_LOCALE", "pt_br")
    assert config.load().default_locale == "pt-BR"
    monkeypatch.setenv("DEFAULT_LOCALE", "klingon")
    with pytest.raises(config.ConfigError, match="DEFAULT_LOCALE must be a locale"):
        config.load()


def test_default_quiet_hours_are_a_window_or_nothing(monkeypatch):
    monkeypatch.setenv("DEFAULT_QUIET_HOURS", "22:00-07:00")
    assert config.load().default_quiet_hours == "22:00-07:00"
    for bad in ("22:00", "22:00-22:00", "7:00-22:00", "night"):
        monkeypatch.setenv("DEFAULT_QUIET_HOURS", bad)
        with pytest.raises(config.ConfigError, match="DEFAULT_QUIET_HOURS"):
            config.load()
