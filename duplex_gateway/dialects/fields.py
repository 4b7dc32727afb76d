"""Typed readers for fields of client JSON objects, shared by the Realtime parsers.

Each reader returns the value in its Python type or raises a :class:`ProtocolError`
naming the field (``param``), so every bad field becomes a coded ``error`` event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError

__all__ = [
    "JsonObject",
    "as_bool",
    "as_int",
    "as_ms",
    "as_number",
    "as_object",
    "as_str",
    "get_field",
    "invalid",
    "is_missing",
    "join",
    "max_tokens",
    "opt_object",
    "opt_str",
]

JsonObject = dict[str, object]
_MISSING: Any = object()


def invalid(param: str, message: str, code: ErrorCode = ErrorCode.INVALID_VALUE) -> ProtocolError:
    return ProtocolError(code, message, param=param)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def get_field(obj: Mapping[str, object], key: str, path: str, *, required: bool) -> object:
    """``obj[key]``; :data:`_MISSING` when absent (MISSING_FIELD if ``required``)."""
    if key in obj:
        return obj[key]
    if required:
        raise invalid(join(path, key), f"missing required field '{join(path, key)}'", ErrorCode.MISSING_FIELD)
    return _MISSING


def is_missing(value: object) -> bool:
    return value is _MISSING


def as_str(value: object, param: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise invalid(param, f"'{param}' must be a string")
    if nonempty and not value:
        raise invalid(param, f"'{param}' must not be empty")
    return value


def opt_str(obj: Mapping[str, object], key: str, path: str) -> str | None:
    """An optional string field: absent or null gives ``None``."""
    value = get_field(obj, key, path, required=False)
    if is_missing(value) or value is None:
        return None
    return as_str(value, join(path, key))


def as_bool(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(param, f"'{param}' must be a boolean")
    return value


def as_number(value: object, param: str) -> float:
    """A finite JSON number (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(param, f"'{param}' must be a number")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        raise invalid(param, f"'{param}' is out of range") from None
    if not math.isfinite(number):
        raise invalid(param, f"'{param}' must be a finite number")
    return number


def as_int(value: object, param: str, *, minimum: int | None = None) -> int:
    """A whole number (an integral float such as ``3.0`` is accepted)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(param, f"'{param}' must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise invalid(param, f"'{param}' must be an integer")
        value = int(value)
    if minimum is not None and value < minimum:
        raise invalid(param, f"'{param}' must be >= {minimum}")
    return value


def as_ms(value: object, param: str) -> int:
    """A non-negative duration in milliseconds; fractions are rounded down."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(param, f"'{param}' must be a number of milliseconds")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise invalid(param, f"'{param}' must be a finite number of milliseconds")
        value = math.floor(value)
    if value < 0:
        raise invalid(param, f"'{param}' must be >= 0")
    return value


def as_object(value: object, param: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise invalid(param, f"'{param}' must be an object")
    return value


def opt_object(obj: Mapping[str, object], key: str, path: str) -> Mapping[str, object] | None:
    """An optional nested object: absent or null gives ``None``."""
    value = get_field(obj, key, path, required=False)
    if is_missing(value) or value is None:
        return None
    return as_object(value, join(path, key))


def max_tokens(value: object, param: str) -> int | None:
    """A token limit: a positive integer, or ``"inf"`` (None: no limit)."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "unlimited"):
        return None
    return as_int(value, param, minimum=1)
