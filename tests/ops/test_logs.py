"""Logging set-up: the JSON lines (with the session's id and extras) and the text format."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys

import pytest

from duplex_gateway.ops.logs import (
    JsonFormatter,
    TextFormatter,
    bind_session,
    configure_logging,
    current_session,
)


def record(message: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "duplex_gateway.test", logging.INFO, __file__, 1, message, args or ("world",), None
    )
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_line_has_time_level_logger_message_and_extras() -> None:
    line = JsonFormatter().format(record(turns=3, first_audio_ms={"count": 1, "min": 1.5}))
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "info" and data["logger"] == "duplex_gateway.test"
    assert data["message"] == "hello world"
    assert data["ts"].endswith("+00:00") and "T" in data["ts"]
    assert data["turns"] == 3 and data["first_audio_ms"] == {"count": 1, "min": 1.5}
    assert "args" not in data and "msg" not in data and "levelno" not in data


async def test_json_line_names_the_session_bound_to_the_task_and_its_children() -> None:
    async def session(session_id: str) -> list[dict[str, object]]:
        bind_session(session_id)

        async def child() -> str:
            return JsonFormatter().format(record())

        lines = [JsonFormatter().format(record()), await asyncio.create_task(child())]
        return [json.loads(line) for line in lines]

    a, b = await asyncio.gather(session("sess_a"), session("sess_b"))
    assert [d["session_id"] for d in a] == ["sess_a", "sess_a"]
    assert [d["session_id"] for d in b] == ["sess_b", "sess_b"]
    assert current_session() is None  # this task bound nothing
    assert "session_id" not in json.loads(JsonFormatter().format(record()))
    # An explicit session_id (a line logged on a session's behalf elsewhere) wins.
    assert json.loads(JsonFormatter().format(record(session_id="sess_c")))["session_id"] == "sess_c"


def test_json_line_carries_the_traceback_and_odd_values_as_text() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    rec.path = object()
    data = json.loads(JsonFormatter().format(rec))
    assert data["exc"].startswith("Traceback") and "ValueError: boom" in data["exc"]
    assert isinstance(data["path"], str)


def test_text_format_reads_as_before() -> None:
    line = TextFormatter().format(record())
    assert line.endswith(" INFO duplex_gateway.test: hello world")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_configure_logging_routes_uvicorn_through_the_same_handler(fmt: str) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        configure_logging("info", fmt, stream)  # type: ignore[arg-type]
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
        logging.getLogger("duplex_gateway.test").debug("not at info")
        out = stream.getvalue().strip().splitlines()
        assert len(out) == 1
        if fmt == "json":
            assert json.loads(out[0])["message"] == "Started server process [42]"
        else:
            assert out[0].endswith("uvicorn.error: Started server process [42]")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_uvicorns_coloured_copy_of_the_message_is_left_out() -> None:
    data = json.loads(JsonFormatter().format(record(color_message="\x1b[36mhello\x1b[0m")))
    assert "color_message" not in data and data["message"] == "hello world"


def test_a_clients_invalid_utf8_is_one_warning_line_not_a_traceback() -> None:
    # Found by tests/reliability: uvicorn logs a client's invalid UTF-8 (it closes 1007) with a
    # traceback, so any client could fill the log with them.
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        configure_logging("info", "text", stream)
        try:
            b"\xff".decode()
        except UnicodeDecodeError:
            logging.getLogger("uvicorn.error").exception("Invalid UTF-8 sequence received from client.")
        try:
            raise RuntimeError("a bug")
        except RuntimeError:
            logging.getLogger("uvicorn.error").exception("Exception in ASGI application\n")
        out = stream.getvalue()
        assert "WARNING uvicorn.error: Invalid UTF-8 sequence received from client." in out
        assert (
            out.count("Traceback") == 1 and "RuntimeError: a bug" in out
        )  # a real fault keeps its traceback
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
