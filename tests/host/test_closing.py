"""The failure table: every failure has one verdict, with codes the protocol documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from duplex_gateway.engine import port
from duplex_gateway.host.closing import (
    ENGINE_OPEN_FAILURES,
    FAILURES,
    Close,
    Failure,
    close_code,
    close_for,
    engine_call_failure,
    engine_open_failure,
    protocol_failure,
    update_refusal,
)
from duplex_gateway.session.machine import CloseSession, Handshake, Session
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import CloseCode, ErrorCode, ProtocolError
from duplex_gateway.vocabulary.session_config import SessionConfig

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _documented_close_codes() -> set[int]:
    """The codes in docs/protocol.md's "Close codes" table."""
    text = PROTOCOL.read_text(encoding="utf-8")
    section = text.split("## Close codes", 1)[1].split("\n## ", 1)[0]
    return {int(code) for code in re.findall(r"^\| (\d{4}) \|", section, flags=re.MULTILINE)}


def _documented_error_rows() -> dict[str, str]:
    """docs/protocol.md's error-code table rows, by code (a row naming two codes counts for both)."""
    rows: dict[str, str] = {}
    for line in PROTOCOL.read_text(encoding="utf-8").splitlines():
        cells = line.split(" | ")
        if not line.startswith("| `") or len(cells) != 2:
            continue
        for code in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[code] = cells[1]
    return rows


def test_every_failure_has_a_verdict() -> None:
    assert set(FAILURES) == set(Failure)


def test_every_close_code_is_a_documented_close_code() -> None:
    documented = _documented_close_codes()
    for failure, verdict in FAILURES.items():
        if verdict.close is None:
            continue
        assert isinstance(verdict.close, CloseCode), failure
        assert int(verdict.close) in documented, failure


def test_the_close_code_an_error_row_names_is_the_tables() -> None:
    rows = _documented_error_rows()
    for failure, verdict in FAILURES.items():
        if verdict.error is None or verdict.close is None or verdict.error.value not in rows:
            continue
        named = re.findall(r"close (\d{4})", rows[verdict.error.value])
        if named:
            assert int(verdict.close) in {int(code) for code in named}, failure


def test_failures_that_end_the_session_name_why() -> None:
    for failure, verdict in FAILURES.items():
        if verdict.close is None:
            assert verdict.reason is None, failure  # nothing is closed, so nothing is said
    # The refusals that close with 1013 are the documented try-again-later ones.
    try_again = {f for f, v in FAILURES.items() if v.close is CloseCode.TRY_AGAIN_LATER and v.error}
    assert {FAILURES[f].error for f in try_again} == {
        ErrorCode.SESSION_LIMIT,
        ErrorCode.ENGINE_UNAVAILABLE,
        ErrorCode.SERVER_SHUTTING_DOWN,
    }


def test_close_for_and_close_code() -> None:
    assert close_for(Failure.SLOW_CONSUMER) == Close(CloseCode.SLOW_CONSUMER, "slow consumer")
    assert close_for(Failure.OBSERVER_DONE, "call_ended") == Close(CloseCode.NORMAL, "call_ended")
    assert close_code(Failure.KEY_REFUSED) == 1008
    with pytest.raises(ValueError, match="needs a reason"):
        close_for(Failure.KEY_REFUSED)  # the denial's own code is its reason
    with pytest.raises(ValueError, match="does not close"):
        close_for(Failure.BAD_MESSAGE)
    with pytest.raises(ValueError, match="does not close"):
        close_code(Failure.ENGINE_CALL_FAILED)


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (Failure.IDLE, "no message from the client for 30 s"),
        (Failure.MAX_DURATION, "of 60 minutes."),
        (Failure.RESUME_TIMEOUT, "the client did not come back"),
    ],
)
def test_an_expiry_is_told_and_closed_as_the_table_says(failure: Failure, message: str) -> None:
    """The session names an expiry's error event from its close code; the table must agree."""
    session = Session(
        session_id="sess_1",
        capabilities=port.EngineCapabilities(name="test", input_rate=24_000, output_rate=24_000),
        defaults=SessionConfig(turn_detection=None),
        handshake=Handshake.REALTIME,
    )
    close = close_for(failure)
    outputs = session.expire(close.reason, close.code, message)
    errors = [o for o in outputs if isinstance(o, ev.ErrorEvent)]
    closes = [o for o in outputs if isinstance(o, CloseSession)]
    assert [e.code for e in errors] == [FAILURES[failure].error]
    assert closes == [CloseSession(reason=close.reason, code=close.code)]


def test_engine_open_failures() -> None:
    assert engine_open_failure(port.EngineSessionLimit()) == (
        Failure.ENGINE_FULL,
        "the engine has no room for another session",
    )
    assert engine_open_failure(port.EngineUnavailable("warming up")) == (
        Failure.ENGINE_UNAVAILABLE,
        "warming up",
    )
    assert engine_open_failure(TimeoutError()) == (Failure.ENGINE_UNAVAILABLE, "the engine is not available")
    assert engine_open_failure(ValueError("a bug")) is None  # not a refusal: it propagates
    assert all(FAILURES[f].close is CloseCode.TRY_AGAIN_LATER for f in ENGINE_OPEN_FAILURES.values())


def test_engine_call_failures_cost_the_call_only() -> None:
    refused = engine_call_failure(port.EngineRefused("bad_input", "no images"))
    assert refused[0] is Failure.ENGINE_REFUSED_CALL and refused[1].startswith("the engine refused it: ")
    assert engine_call_failure(RuntimeError()) == (
        Failure.ENGINE_CALL_FAILED,
        "the engine failed: RuntimeError",
    )
    for failure in (
        Failure.ENGINE_REFUSED_CALL,
        Failure.ENGINE_CALL_FAILED,
        Failure.ENGINE_UPDATE_UNANSWERED,
    ):
        assert FAILURES[failure].error is ErrorCode.ENGINE_ERROR and FAILURES[failure].close is None


def test_update_refusals() -> None:
    assert update_refusal(port.EngineRefused("invalid_value", "no such voice"), 5.0) == (
        "invalid_value",
        "no such voice",
    )
    assert update_refusal(TimeoutError(), 5.0) == ("engine_error", "no answer in 5 s")
    assert update_refusal(OSError(), 5.0) == ("engine_error", "the engine failed: OSError")


def test_only_an_unauthorized_protocol_error_closes() -> None:
    assert protocol_failure(ProtocolError(ErrorCode.UNAUTHORIZED, "sign it")) is Failure.UNAUTHORIZED
    assert close_for(Failure.UNAUTHORIZED) == Close(CloseCode.POLICY_VIOLATION, "unauthorized")
    for code in ErrorCode:
        if code is not ErrorCode.UNAUTHORIZED:
            assert protocol_failure(ProtocolError(code, "x")) is Failure.BAD_MESSAGE
    assert FAILURES[Failure.BAD_MESSAGE].close is None
