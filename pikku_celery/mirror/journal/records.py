"""The journal's record: framed so that a reader tells a whole record from one cut short
or damaged, the one thing the death of a writer at any instant can leave behind.

Segments and the checkpoint log are both sequences of these records.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

__all__ = ["encode_record", "parse_record"]

# A record: its body's length, the crc32 of that length and the body, the body (one
# byte for the kind's length, the kind, the payload; UTF-8).
_U32: Final = struct.Struct("<I")
_HEAD: Final = struct.Struct("<II")
# No event comes near this: a length past it is damage, not a record to wait for.
_MAX_BODY: Final = 1 << 30

_KIND_PREFIXES: dict[str, bytes] = {}


def _kind_prefix(kind: str) -> bytes:
    prefix = _KIND_PREFIXES.get(kind)
    if prefix is None:
        raw = kind.encode()
        if len(raw) > 255:
            raise ValueError(f"an event kind is at most 255 bytes: {kind[:40]!r}…")
        prefix = _KIND_PREFIXES.setdefault(kind, bytes((len(raw),)) + raw)
    return prefix


def encode_record(kind: str, payload: str | bytes) -> bytes:
    """A record of ``payload`` (text, or its UTF-8 bytes)."""
    prefix = _KIND_PREFIXES.get(kind) or _kind_prefix(kind)
    body = prefix + (payload if isinstance(payload, bytes) else payload.encode())
    size = len(body)
    return _HEAD.pack(size, zlib.crc32(body, zlib.crc32(_U32.pack(size)))) + body


def parse_record(buffer: bytes, pos: int) -> tuple[int, str, str] | int:
    """The record at ``pos``: (its end, kind, payload); else the bytes from ``pos`` it needs
    to be whole (more than the buffer holds), or -1 for bytes that are no record."""
    if len(buffer) - pos < _HEAD.size:
        return _HEAD.size
    length: int
    crc: int
    length, crc = _HEAD.unpack_from(buffer, pos)
    if length == 0 or length > _MAX_BODY:
        return -1
    end = pos + _HEAD.size + length
    if end > len(buffer):
        return _HEAD.size + length
    body = buffer[pos + _HEAD.size : end]
    if zlib.crc32(body, zlib.crc32(buffer[pos : pos + 4])) != crc:
        return -1
    size = body[0]
    if 1 + size > length:
        return -1
    try:
        return end, body[1 : 1 + size].decode(), body[1 + size :].decode()
    except UnicodeDecodeError:
        return -1
