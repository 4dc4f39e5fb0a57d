"""The stored forms of times, booleans and retry delays (docs/data-contract.md)."""

from __future__ import annotations

import datetime as dt

import pytest

from pikku_celery.durations import format_duration, parse_duration
from pikku_celery.errors import InvalidDuration, UnreadableValue
from pikku_celery.schema import format_timestamp, parse_timestamp, read_flag

UTC = dt.timezone.utc


def test_a_time_is_written_as_iso_utc_with_microseconds_and_z() -> None:
    at = dt.datetime(2026, 12, 1, 8, 9, 14, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert format_timestamp(at) == "2026-12-01T07:09:14.000005Z"
    with pytest.raises(ValueError, match="aware"):
        format_timestamp(dt.datetime(2026, 12, 1))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T07:09:14.822425Z", dt.datetime(2026, 12, 1, 7, 9, 14, 822425, tzinfo=UTC)),
        ("2026-12-01T07:09:14.822Z", dt.datetime(2026, 12, 1, 7, 9, 14, 822000, tzinfo=UTC)),
        ("2026-12-01 07:09:14", dt.datetime(2026, 12, 1, 7, 9, 14, tzinfo=UTC)),
        ("2026-12-01T07:09:14.1234567Z", dt.datetime(2026, 12, 1, 7, 9, 14, 123456, tzinfo=UTC)),
        ("2026-12-01T00:30:00-07:00", dt.datetime(2026, 12, 1, 7, 30, tzinfo=UTC)),
        ("2026-12-01T09:30+0200", dt.datetime(2026, 12, 1, 7, 30, tzinfo=UTC)),
        ("2026-12-01", dt.datetime(2026, 12, 1, tzinfo=UTC)),
    ],
)
def test_a_time_is_read_in_any_iso_form(text: str, expected: dt.datetime) -> None:
    read = parse_timestamp(text)
    assert read == expected and read.tzinfo == UTC


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01T00:00:00Z", "1764572954"])
def test_a_time_in_no_iso_form_is_a_clear_error(text: str) -> None:
    with pytest.raises(UnreadableValue, match="data-contract"):
        parse_timestamp(text)


@pytest.mark.parametrize(
    ("stored", "read"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("true", True),
        ("false", False),
        ("FALSE", False),
        ("t", True),
        ("f", False),
        ("1", True),
        ("0", False),
        (None, None),
    ],
)
def test_a_boolean_is_read_in_any_form_either_system_writes(stored: object, read: object) -> None:
    assert read_flag(stored) is read


@pytest.mark.parametrize(
    ("value", "text"),
    [(180, "180s"), (0.2, "200ms"), (0.0004, "0s"), (1.0006, "1001ms"), ("2days", "172800s")],
)
def test_a_delay_is_written_as_a_whole_number_and_a_unit(value: object, text: str) -> None:
    assert format_duration(value) == text  # type: ignore[arg-type]


def test_a_stored_delay_reads_in_the_old_and_the_new_form() -> None:
    assert parse_duration("200ms") == parse_duration("0.2") == dt.timedelta(milliseconds=200)
    assert parse_duration("180s") == parse_duration("180") == dt.timedelta(seconds=180)
    with pytest.raises(InvalidDuration):
        parse_duration("exponential")
