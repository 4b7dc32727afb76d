"""Logging set-up: human-readable text or one JSON object per line, with the session's id.

The session host binds its session id to the running task (:func:`bind_session`);
every task it starts inherits it, so a record logged anywhere on a session's
behalf (its writer, its engine link, the engine) carries ``session_id``
without passing it around. Fields given with ``extra=`` become top-level JSON
keys, which is how the per-session summary line carries its numbers.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from contextvars import ContextVar
from typing import Any, Literal, TextIO

__all__ = [
    "ClientFaultFilter",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "bind_session",
    "configure_logging",
    "current_session",
]

LogFormat = Literal["text", "json"]

_SESSION: ContextVar[str | None] = ContextVar("duplex_gateway_session_id", default=None)

#: Attributes every LogRecord has; anything else on a record came from ``extra=``. uvicorn's
#: ``color_message`` (the message again, with terminal colour codes) is no field either.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


def bind_session(session_id: str | None) -> None:
    """Records logged from this task (and tasks it starts from now on) name ``session_id``."""
    _SESSION.set(session_id)


def current_session() -> str | None:
    return _SESSION.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message``, ``session_id``, extras, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        session_id = getattr(record, "session_id", None) or _SESSION.get()
        if session_id is not None:
            out["session_id"] = session_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # default=str: an extra that is not JSON (an enum, a path) is written as text, never dropped.
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")


#: What uvicorn logs with a traceback although the client caused it (its WebSocket layer then
#: closes 1007): one warning line, so a client cannot fill the log with tracebacks.
_CLIENT_FAULTS = frozenset({"Invalid UTF-8 sequence received from client."})


class ClientFaultFilter(logging.Filter):
    """A client's bad input, as uvicorn logs it, becomes a warning without a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in _CLIENT_FAULTS:
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure_logging(level: str, fmt: LogFormat, stream: TextIO | None = None) -> None:
    """Send every record (the gateway's, uvicorn's, the engines') through one handler in ``fmt``.

    uvicorn must be started with ``log_config=None`` so its loggers propagate here
    instead of writing their own format.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        # Another set-up (uvicorn's own dictConfig) may have given them handlers of their own.
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
        # A dictConfig (uvicorn's default, or another app's) disables the loggers it did not
        # name and may have set a level of its own: the root's level decides from here on.
        uvicorn_logger.disabled = False
        uvicorn_logger.setLevel(logging.NOTSET)
    error_logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultFilter) for f in error_logger.filters):
        error_logger.addFilter(ClientFaultFilter())
