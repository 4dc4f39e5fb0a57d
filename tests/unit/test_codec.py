from __future__ import annotations

import json
import math
import traceback

import pytest

from pikku_celery.errors import PayloadTooLarge, SerializationError
from pikku_celery.store.codec import JsonCodec, error_document


def test_encodes_compact_utf8_json() -> None:
    assert JsonCodec().encode({"a": [1, "ü"]}, "result") == '{"a":[1,"ü"]}'


@pytest.mark.parametrize("bad", [object(), {1, 2}, math.nan, -math.inf, "\udc80"])
def test_refuses_what_json_cannot_hold(bad: object) -> None:
    with pytest.raises(SerializationError, match="result cannot be stored as JSON"):
        JsonCodec().encode(bad, "result")


def test_refuses_recursive_structures() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(SerializationError):
        JsonCodec().encode(loop, "result")


def test_size_limit_counts_utf8_bytes() -> None:
    codec = JsonCodec(max_bytes=10)
    codec.encode("ééé", "result")  # 8 bytes with quotes
    with pytest.raises(PayloadTooLarge, match="over the limit of 10"):
        codec.encode("ééééé", "result")  # 10 bytes of text + 2 quotes


def test_nul_is_refused_only_where_the_database_cannot_hold_it() -> None:
    assert json.loads(JsonCodec(allow_nul=True).encode("a\x00", "r")) == "a\x00"
    with pytest.raises(SerializationError, match="NUL"):
        JsonCodec(allow_nul=False).encode({"k": ["a\x00"]}, "r")
    # A literal backslash followed by u0000 is text, not a NUL.
    assert JsonCodec(allow_nul=False).encode("\\u0000", "r") == '"\\\\u0000"'


def test_error_document_shapes() -> None:
    try:
        raise ValueError("bad card")
    except ValueError as exc:
        document = error_document(exc)
    assert document["type"] == "ValueError"
    assert document["message"] == "bad card"
    assert "Traceback" in document["traceback"]
    assert error_document(PayloadTooLarge())["type"] == "pikku_celery.errors.PayloadTooLarge"
    assert error_document("plain") == {
        "type": None,
        "message": "plain",
        "traceback": None,
        "stack": None,
    }
    assert error_document({"message": "m", "code": 7}) == {
        "type": None,
        "message": "m",
        "traceback": None,
        "stack": None,
        "code": "7",
    }
    with pytest.raises(SerializationError):
        error_document(42)  # type: ignore[arg-type]


def test_an_error_with_its_traceback_formatted_already_is_not_formatted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        raise ValueError("boom")
    except ValueError as exc:
        error = exc

    def never(*_: object) -> list[str]:
        raise AssertionError("the traceback was formatted again")

    monkeypatch.setattr(traceback, "format_exception", never)
    document = error_document(error, formatted="Traceback (most recent call last): ...")
    assert document["traceback"] == document["stack"] == "Traceback (most recent call last): ..."
    assert (document["type"], document["message"]) == ("ValueError", "boom")
