"""The session's life: its phases, the one table that moves them, and what each phase lets in."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from duplex_gateway.engine import port
from duplex_gateway.session.machine import (
    PHASE_TRANSITIONS,
    Handshake,
    Happening,
    Lifecycle,
    OpenEngine,
    Phase,
    PhaseError,
    Session,
)
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import CloseCode, ErrorCode
from duplex_gateway.vocabulary.session_config import SessionConfig, SessionPatch

CAPS = port.EngineCapabilities(name="test", input_rate=24_000, output_rate=24_000)


def make(handshake: Handshake) -> Session:
    return Session(
        session_id="sess_1",
        capabilities=CAPS,
        defaults=SessionConfig(turn_detection=None),
        handshake=handshake,
    )


def types(outputs: Sequence[object]) -> list[str]:
    return [o.type if isinstance(o, ev.ServerEvent) else type(o).__name__ for o in outputs]


# -- the table ---------------------------------------------------------------------------------


def test_the_table_names_every_move_a_session_makes() -> None:
    assert dict(PHASE_TRANSITIONS) == {
        (Phase.AWAITING_CONFIG, Happening.CONFIGURED): Phase.OPENING,
        (Phase.OPENING, Happening.ENGINE_OPENED): Phase.OPEN,
        (Phase.AWAITING_CONFIG, Happening.CARRIED_ON): Phase.OPEN,
        (Phase.OPEN, Happening.CARRIED_ON): Phase.OPEN,
        (Phase.AWAITING_CONFIG, Happening.CLOSED): Phase.CLOSED,
        (Phase.OPENING, Happening.CLOSED): Phase.CLOSED,
        (Phase.OPEN, Happening.CLOSED): Phase.CLOSED,
        (Phase.CLOSED, Happening.ENGINE_OPENED): Phase.CLOSED,
    }


def test_every_phase_but_the_last_can_close_and_nothing_leaves_the_last() -> None:
    for phase in Phase:
        if phase is not Phase.CLOSED:
            assert PHASE_TRANSITIONS[phase, Happening.CLOSED] is Phase.CLOSED
    assert {after for (before, _), after in PHASE_TRANSITIONS.items() if before is Phase.CLOSED} == {
        Phase.CLOSED
    }


@pytest.mark.parametrize(
    ("phase", "happening"),
    [pair for pair in itertools.product(Phase, Happening) if pair not in PHASE_TRANSITIONS],
    ids=lambda value: value.value,
)
def test_a_pair_the_table_lacks_raises_and_leaves_the_phase(phase: Phase, happening: Happening) -> None:
    life = Lifecycle(phase)
    with pytest.raises(PhaseError):
        life.move(happening)
    assert life.phase is phase


def test_the_lifecycle_remembers_the_phase_it_closed_from() -> None:
    life = Lifecycle(Phase.AWAITING_CONFIG)
    life.move(Happening.CONFIGURED)
    life.move(Happening.CLOSED)
    assert life.phase is Phase.CLOSED and life.closed_from is Phase.OPENING
    life.move(Happening.ENGINE_OPENED)  # an open that raced the close changes nothing
    assert life.phase is Phase.CLOSED and life.closed_from is Phase.OPENING


# -- the session's phases ------------------------------------------------------------------------


def test_a_realtime_session_starts_open() -> None:
    s = make(Handshake.REALTIME)
    assert s.phase is Phase.OPEN and s.configured and not s.closed
    with pytest.raises(PhaseError):
        s.engine_opened()  # no engine is being opened


def test_a_duplex_session_opens_through_its_first_update() -> None:
    s = make(Handshake.DUPLEX)
    seen = [(s.phase, s.configured)]
    assert types(s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)) == ["OpenEngine"]
    seen.append((s.phase, s.configured))
    assert types(s.engine_opened()) == ["session.created"]
    seen.append((s.phase, s.configured))
    assert types(s.receive(cmd.SessionClose(), now=1))[-2:] == ["session.closed", "CloseSession"]
    seen.append((s.phase, s.configured))
    assert seen == [
        (Phase.AWAITING_CONFIG, False),
        (Phase.OPENING, False),
        (Phase.OPEN, True),
        (Phase.CLOSED, True),  # closed once configured: it still was
    ]


def test_only_keep_alives_and_the_update_reach_a_session_before_it_is_open() -> None:
    s = make(Handshake.DUPLEX)
    assert types(s.receive(cmd.SessionHeartbeat(), now=0)) == ["session.heartbeat_ack"]
    (error,) = s.receive(cmd.InputAudioClear(), now=0)
    assert isinstance(error, ev.ErrorEvent) and error.code is ErrorCode.SESSION_NOT_CONFIGURED
    assert isinstance(s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)[0], OpenEngine)
    # Opening: a second update waits for the first, and the phase stays.
    (error,) = s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)
    assert isinstance(error, ev.ErrorEvent) and error.code is ErrorCode.SESSION_NOT_CONFIGURED
    assert s.phase is Phase.OPENING


def test_a_session_closed_while_opening_was_never_configured() -> None:
    s = make(Handshake.DUPLEX)
    s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)
    assert types(s.shut_down())[-2:] == ["session.closed", "CloseSession"]
    assert s.closed and not s.configured
    # The engine's open finishing late moves nothing; the session handles nothing more.
    assert types(s.engine_opened()) == ["session.created"]
    assert s.phase is Phase.CLOSED
    assert s.receive(cmd.SessionHeartbeat(), now=1) == []
    assert s.shut_down() == [] and s.engine_event(port.EngineClosed(reason="gone")) == []


def test_an_engine_that_closes_ends_the_session_once() -> None:
    s = make(Handshake.REALTIME)
    out = s.engine_event(port.EngineClosed(reason="engine_gone"))
    assert types(out) == ["session.closed", "CloseSession"] and s.closed
    assert s.expire("idle", CloseCode.IDLE_TIMEOUT, "late") == []
