"""The Live API's error codes and wording, and the strict field readers that raise them.

The host turns every :class:`~duplex_gateway.vocabulary.errors.ProtocolError` into an
``ErrorEvent`` that carries only the gateway's :class:`~duplex_gateway.vocabulary.errors.ErrorCode`.
A refusal of the Live dialect's own is a :class:`LiveProtocolError`: the same error with the Live
code beside it, which the dialect remembers until it renders the error (:func:`live_code`).

Wording follows OpenAI's house style ("Unknown parameter: 'session.voice'."), since clients and
people match on it; where OpenAI documents no code for a case the gateway's own name is used.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping

from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError

__all__ = [
    "DELEGATION_MODE_MISMATCH",
    "FUNCTION_CALL_OUTPUTS_REQUIRED",
    "GATEWAY_TO_LIVE",
    "INVALID_TYPE",
    "INVALID_VALUE",
    "MISSING_REQUIRED_PARAMETER",
    "NOT_SUPPORTED",
    "SESSION_ALREADY_STARTED",
    "SESSION_NOT_STARTED",
    "UNKNOWN_PARAMETER",
    "LiveProtocolError",
    "bad_value",
    "check_fields",
    "decode_base64",
    "live_code",
    "missing",
    "quote_list",
    "read_bool",
    "read_int",
    "read_object",
    "read_str",
    "refuse",
    "unknown",
    "wrong_type",
]

# OpenAI documents these three for the Live API (the first two are in the gateway's vocabulary).
UNKNOWN_PARAMETER = ErrorCode.UNKNOWN_PARAMETER.value
FUNCTION_CALL_OUTPUTS_REQUIRED = ErrorCode.FUNCTION_CALL_OUTPUTS_REQUIRED.value
# OpenAI's codes of the same meaning on its other APIs.
MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
INVALID_TYPE = "invalid_type"
INVALID_VALUE = "invalid_value"
# No source names these; the gateway's names (the last two in its vocabulary).
SESSION_NOT_STARTED = "session_not_started"
SESSION_ALREADY_STARTED = ErrorCode.SESSION_ALREADY_STARTED.value
DELEGATION_MODE_MISMATCH = ErrorCode.DELEGATION_MODE_MISMATCH.value
#: A Live feature the gateway's vocabulary has no command or event for yet.
NOT_SUPPORTED = "not_supported"

#: The Live code of an error the session (not the dialect) raised, by the gateway's code.
GATEWAY_TO_LIVE: Mapping[ErrorCode, str] = {
    ErrorCode.MISSING_FIELD: MISSING_REQUIRED_PARAMETER,
    ErrorCode.INVALID_VALUE: INVALID_VALUE,
    ErrorCode.INVALID_BASE64: INVALID_VALUE,
    ErrorCode.UNKNOWN_EVENT: INVALID_VALUE,
    ErrorCode.SESSION_NOT_CONFIGURED: SESSION_NOT_STARTED,
}


class LiveProtocolError(ProtocolError):
    """A :class:`ProtocolError` the Live dialect raised, with the Live API's ``code`` for it."""

    def __init__(
        self,
        live: str,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
    ) -> None:
        super().__init__(code, message, param=param, event_id=event_id)
        self.live = live

    def with_event_id(self, event_id: str | None) -> ProtocolError:
        if event_id is None or self.event_id is not None:
            return self
        return LiveProtocolError(self.live, self.code, self.message, param=self.param, event_id=event_id)


def live_code(code: ErrorCode) -> str:
    """The Live code for an error the gateway raised outside the dialect."""
    return GATEWAY_TO_LIVE.get(code, code.value)


#: The gateway's code for each Live code its vocabulary has no member of the same name for.
_NEAREST: Mapping[str, ErrorCode] = {
    MISSING_REQUIRED_PARAMETER: ErrorCode.MISSING_FIELD,
    SESSION_NOT_STARTED: ErrorCode.SESSION_NOT_CONFIGURED,
    NOT_SUPPORTED: ErrorCode.UNSUPPORTED_BY_ENGINE,
}
_GATEWAY_CODES = frozenset(code.value for code in ErrorCode)


def refuse(live: str, message: str, *, param: str | None = None) -> LiveProtocolError:
    """A refusal with a Live code; the gateway code is the same one where the vocabulary has it, else the nearest."""
    gateway = ErrorCode(live) if live in _GATEWAY_CODES else _NEAREST.get(live, ErrorCode.INVALID_VALUE)
    return LiveProtocolError(live, gateway, message, param=param)


def quote_list(values: Iterable[object]) -> str:
    """``'a', 'b', and 'c'``, as OpenAI lists supported values."""
    quoted = [f"'{value}'" for value in values]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def missing(param: str) -> LiveProtocolError:
    return refuse(MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{param}'.", param=param)


def unknown(param: str, why: str = "") -> LiveProtocolError:
    return refuse(UNKNOWN_PARAMETER, f"Unknown parameter: '{param}'.{why}", param=param)


def bad_value(param: str, value: object, supported: Iterable[object] | None = None) -> LiveProtocolError:
    shown = str(value)[:100]
    tail = f" Supported values are: {quote_list(supported)}." if supported is not None else ""
    return refuse(INVALID_VALUE, f"Invalid value: '{shown}'.{tail}", param=param)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "an integer" if isinstance(value, int) else "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def wrong_type(param: str, expected: str, value: object) -> LiveProtocolError:
    message = f"Invalid type for '{param}': expected {expected}, but got {_json_kind(value)} instead."
    return refuse(INVALID_TYPE, message, param=param)


def check_fields(
    obj: Mapping[str, object],
    allowed: Iterable[str],
    path: str,
    *,
    why: Mapping[str, str] | None = None,
) -> None:
    """Refuse the first field of ``obj`` outside ``allowed``, as the Live API's strict schema does.

    ``why``: an explanation for fields that are known but not accepted here (startup-only ones).
    """
    permitted = set(allowed)
    for key in obj:
        if key not in permitted:
            param = f"{path}.{key}" if path else key
            raise unknown(param, (why or {}).get(key, ""))


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def read_object(
    obj: Mapping[str, object], key: str, path: str, *, required: bool = False
) -> Mapping[str, object] | None:
    """A nested object; ``None`` when absent or null (and not required)."""
    value = obj.get(key)
    if value is None:
        if required:
            raise missing(_at(path, key))
        return None
    if not isinstance(value, dict):
        raise wrong_type(_at(path, key), "an object", value)
    return value


def read_str(obj: Mapping[str, object], key: str, path: str, *, required: bool = False) -> str | None:
    """A string field; ``None`` when absent or null (and not required)."""
    value = obj.get(key)
    if value is None:
        if required:
            raise missing(_at(path, key))
        return None
    if not isinstance(value, str):
        raise wrong_type(_at(path, key), "a string", value)
    return value


def read_bool(obj: Mapping[str, object], key: str, path: str) -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise wrong_type(_at(path, key), "a boolean", value)
    return value


def read_int(obj: Mapping[str, object], key: str, path: str, *, minimum: int = 0) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(_at(path, key), "an integer", value)
    if value < minimum:
        raise refuse(
            INVALID_VALUE,
            f"Invalid '{_at(path, key)}': integer below minimum value. Expected a value >= {minimum}, "
            f"but got {value} instead.",
            param=_at(path, key),
        )
    return value


def decode_base64(value: str, param: str) -> bytes:
    """Strict base64 (no stray characters), as audio must be."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise refuse(
            INVALID_VALUE, f"Invalid '{param}': the audio is not valid base64.", param=param
        ) from None
