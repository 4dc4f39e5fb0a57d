"""Turning values into the JSON text the store writes, strictly and once.

Everything is checked before a statement is sent, so a value the database
would refuse (or silently change) never leaves a half-written transition.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Mapping
from typing import Any, Final

from pikku_celery.errors import PayloadTooLarge, SerializationError

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "JsonCodec", "error_document"]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024

# A NUL character in a JSON string: an odd run of backslashes before u0000.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_NULL: Final = "null"


class JsonCodec:
    """Encodes values as compact JSON text for one kind of database."""

    __slots__ = ("_allow_nul", "max_bytes")

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, allow_nul: bool = True):
        self.max_bytes = max_bytes
        # PostgreSQL's jsonb cannot hold U+0000 in a string; SQLite's text can.
        self._allow_nul = allow_nul

    def encode(self, value: Any, what: str) -> str:
        if value is None and self.max_bytes >= len(_NULL):
            return _NULL  # most tasks return nothing: their result costs no json.dumps
        try:
            text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
            size = len(text.encode("utf-8"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(
                f"The {what} cannot be stored as JSON ({exc}); return JSON types "
                "(dict, list, str, int, float, bool, None) or convert the value first."
            ) from exc
        if size > self.max_bytes:
            raise PayloadTooLarge(
                f"The {what} is {size} bytes of JSON, over the limit of {self.max_bytes}; "
                "store a reference to the data (a key, a URL) instead of the data itself, "
                "or raise the limit: the pikku_max_payload_bytes setting of the Celery app "
                "(or PIKKU_MAX_PAYLOAD_BYTES in the environment), or "
                "WorkflowStore(url, max_payload_bytes=...) for a store of your own."
            )
        if not self._allow_nul and "\\u0000" in text and _JSON_NUL.search(text):
            raise SerializationError(
                f"The {what} holds a NUL character (U+0000) in a string, which PostgreSQL "
                "cannot store in JSON; remove it or encode the bytes (base64)."
            )
        return text

    def check_key(self, key: str, what: str) -> None:
        """A JSON object key must be text the database can hold as it is."""
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(
                f"The {what} {_short(key)!r} is not valid unicode (a lone surrogate); "
                "use a key made of real characters."
            ) from exc
        if not self._allow_nul and "\x00" in key:
            raise SerializationError(
                f"The {what} {_short(key)!r} holds a NUL character (U+0000), which "
                "PostgreSQL cannot store; remove it from the key."
            )


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def error_document(
    error: BaseException | Mapping[str, Any] | str, *, formatted: str | None = None
) -> dict[str, Any]:
    """The stored shape of an error: ``{type, message, traceback, stack}``, and ``code``
    when the error has one. ``formatted``: the exception's traceback as text already
    (Celery's ``einfo.traceback``), which is then not formatted again.

    ``stack`` holds the traceback again under the name a Pikku reader looks
    for; ``code`` is a stable machine-readable name (``VERSION_CONFLICT``),
    as Pikku's errors carry, only ever a string.
    """
    if isinstance(error, BaseException):
        cls = type(error)
        name = (
            cls.__qualname__
            if cls.__module__ == "builtins"
            else (f"{cls.__module__}.{cls.__qualname__}")
        )
        tb = formatted or (
            "".join(traceback.format_exception(cls, error, error.__traceback__))
            if error.__traceback__ is not None
            else None
        )
        document: dict[str, Any] = {
            "type": name,
            "message": str(error),
            "traceback": tb,
            "stack": tb,
        }
        code = getattr(error, "code", None)
        if isinstance(code, str) and code:
            document["code"] = code
        return document
    if isinstance(error, str):
        return {"type": None, "message": error, "traceback": None, "stack": None}
    if isinstance(error, Mapping):
        document = dict(error)
        document.setdefault("type", None)
        document.setdefault("message", "")
        document.setdefault("traceback", document.get("stack"))
        document.setdefault("stack", document["traceback"])
        if document.get("code") is not None and not isinstance(document["code"], str):
            # Pikku reads ``code`` as a string: 7 and "7" must mean one thing to both.
            document["code"] = str(document["code"])
        return document
    raise SerializationError(
        f"An error must be an exception, a message or a mapping, not {type(error).__name__}; "
        "pass the exception itself."
    )
