"""Option values: ages for ``prune --older-than``, bounded numbers, lists from the environment."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from pikku_celery.cli.options import int_between, json_value, listed, parse_age


@pytest.mark.parametrize(
    ("text", "age"),
    [
        ("30d", dt.timedelta(days=30)),
        ("12h", dt.timedelta(hours=12)),
        ("90m", dt.timedelta(minutes=90)),
        ("45s", dt.timedelta(seconds=45)),
        (" 7D ", dt.timedelta(days=7)),
        ("0s", dt.timedelta(0)),
    ],
)
def test_ages(text: str, age: dt.timedelta) -> None:
    assert parse_age(text) == age


@pytest.mark.parametrize("text", ["", "30", "d", "1.5h", "-3d", "3w", "30days", "9" * 30 + "d"])
def test_what_is_not_an_age(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_age(text)


def test_bounded_numbers() -> None:
    batch = int_between(1, 10)
    assert batch("10") == 10
    for bad in ("0", "11", "ten"):
        with pytest.raises(argparse.ArgumentTypeError):
            batch(bad)


def test_lists_from_options_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIKKU_X", "failed, cancelled")
    assert listed(["completed", "failed,cancelled"], "PIKKU_X") == [
        "completed",
        "failed",
        "cancelled",
    ]
    assert listed(None, "PIKKU_X") == ["failed", "cancelled"]
    monkeypatch.delenv("PIKKU_X")
    assert listed(None, "PIKKU_X") is None


def test_json_values_and_how_to_quote_what_is_not_one() -> None:
    assert json_value('{"approved": true}') == {"approved": True}
    assert json_value('"yes"') == "yes" and json_value("null") is None
    for bad in ("yes", "{approved: true}", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="quote it for the shell"):
            json_value(bad)
