"""Context appends and muting: the commands the Live API needs, handled by the session."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from duplex_gateway.engine import port
from duplex_gateway.session.engine_calls import AddFunctionOutput, AddItem, ProcessInput, StartResponse
from duplex_gateway.session.machine import Session
from duplex_gateway.session.settings import Handshake
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetection

CAPS = port.EngineCapabilities(name="test", input_rate=24_000, output_rate=24_000)


def _session(config: SessionConfig | None = None) -> Session:
    return Session(
        session_id="s",
        capabilities=CAPS,
        defaults=config or SessionConfig(turn_detection=None),
        handshake=Handshake.REALTIME,
    )


@pytest.mark.parametrize("channel", ["instructions", "thinking"])
def test_general_context_is_a_system_item_and_asks_for_no_reply(channel: str) -> None:
    session = _session()
    out = session.receive(cmd.ContextAppend(event_id="c1", channel=channel, content="Be brief."), now=0.0)
    (add,) = [o for o in out if isinstance(o, AddItem)]
    assert (add.role, add.text) == ("system", "Be brief.")
    (appended,) = [o for o in out if isinstance(o, ctx.ContextAppended)]
    assert (appended.channel, appended.item_id, appended.event_id) == (channel, add.item_id, "c1")
    assert not any(isinstance(o, StartResponse | ev.ResponseCreated) for o in out)


def test_commentary_is_spoken_when_nobody_is_speaking() -> None:
    session = _session()
    out = session.receive(cmd.ContextAppend(channel="commentary", content="Say hello."), now=0.0)
    assert [type(o) for o in out if isinstance(o, StartResponse | ev.ResponseCreated)] == [
        StartResponse,
        ev.ResponseCreated,
    ]
    # While a reply is speaking, more commentary joins the context and waits for the model.
    again = session.receive(cmd.ContextAppend(channel="commentary", content="And goodbye."), now=0.1)
    assert not any(isinstance(o, StartResponse) for o in again)
    assert any(isinstance(o, ctx.ContextAppended) for o in again)


def test_an_answer_to_a_delegation_is_the_output_of_its_call() -> None:
    session = _session()
    out = session.receive(
        cmd.ContextAppend(channel="thinking", content="3 pm", delegation_id="call_1", item_id="item_x"),
        now=0.0,
    )
    (output,) = [o for o in out if isinstance(o, AddFunctionOutput)]
    assert (output.call_id, output.output, output.item_id) == ("call_1", "3 pm", "item_x")
    (appended,) = [o for o in out if isinstance(o, ctx.ContextAppended)]
    assert (appended.item_id, appended.delegation_id) == ("item_x", "call_1")


@pytest.mark.parametrize(("channel", "content"), [("shouting", "x"), ("thinking", "  ")])
def test_a_bad_append_is_refused(channel: str, content: str) -> None:
    out = _session().receive(cmd.ContextAppend(event_id="e", channel=channel, content=content), now=0.0)
    (error,) = out
    assert (
        isinstance(error, ev.ErrorEvent) and error.code is ErrorCode.INVALID_VALUE and error.event_id == "e"
    )


@pytest.mark.parametrize(
    ("fmt", "silent"),
    [
        (AudioFormat(encoding=Encoding.PCM16, rate=24_000), b"\x00"),
        (AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000), b"\xff"),
        (AudioFormat(encoding=Encoding.G711_ALAW, rate=8_000), b"\xd5"),
    ],
)
def test_a_muted_caller_is_heard_as_silence_of_the_same_length(fmt: AudioFormat, silent: bytes) -> None:
    session = _session(SessionConfig(turn_detection=None, input_format=fmt))
    assert session.receive(cmd.InputAudioMute(muted=True), now=0.0) == [ctx.InputAudioMuted(muted=True)]
    (muted,) = session.receive(cmd.InputAudioAppend(audio=b"\x12\x34" * 80), now=0.1)
    assert isinstance(muted, ProcessInput) and muted.audio == silent * 160
    assert session.receive(cmd.InputAudioMute(muted=False), now=0.2) == [ctx.InputAudioMuted(muted=False)]
    (heard,) = session.receive(cmd.InputAudioAppend(audio=b"\x12\x34" * 80), now=0.3)
    assert isinstance(heard, ProcessInput) and heard.audio == b"\x12\x34" * 80


def test_live_error_codes_are_in_the_vocabulary() -> None:
    assert {c.value for c in ErrorCode} >= {
        "unknown_parameter",
        "function_call_outputs_required",
        "session_already_started",
        "delegation_mode_mismatch",
    }


# -- commentary that comes while someone speaks ------------------------------------------------------


def _replies(outputs: Sequence[object]) -> list[object]:
    return [o for o in outputs if isinstance(o, StartResponse | ev.ResponseCreated)]


def test_commentary_during_a_reply_is_said_once_the_reply_is_done() -> None:
    session = _session()
    session.engine_event(port.EngineResponseStarted(response_id="resp_engine"), now=0.0)
    during = session.receive(cmd.ContextAppend(channel="commentary", content="It is 3 pm."), now=0.1)
    assert _replies(during) == []  # the model is speaking: it is not cut off for this
    assert any(isinstance(o, ctx.ContextAppended) for o in during)
    done = session.engine_event(port.EngineResponseDone(response_id="resp_engine"), now=0.5)
    (start, created) = _replies(done)
    assert isinstance(start, StartResponse) and isinstance(created, ev.ResponseCreated)
    assert start.response_id == created.response_id != "resp_engine"
    # Said once: the end of the reply that said it owes nothing more.
    session.engine_event(port.EngineResponseStarted(response_id=start.response_id), now=0.6)
    after = session.engine_event(port.EngineResponseDone(response_id=start.response_id), now=1.0)
    assert _replies(after) == []


def test_a_reply_that_failed_still_leaves_the_commentary_to_be_said() -> None:
    session = _session()
    session.engine_event(port.EngineResponseStarted(response_id="resp_engine"), now=0.0)
    session.receive(cmd.ContextAppend(channel="commentary", content="It is 3 pm."), now=0.1)
    done = session.engine_event(port.EngineResponseDone(response_id="resp_engine", status="failed"), now=0.2)
    assert [type(o) for o in _replies(done)] == [StartResponse, ev.ResponseCreated]


def _feed(session: Session, start_ms: int, ms: int, prob: float) -> Sequence[object]:
    """``ms`` of caller audio from ``start_ms`` whose 32 ms VAD windows all score ``prob``."""
    windows = [(end, prob) for end in range(start_ms + 32, start_ms + ms + 1, 32)]
    return session.input_processed(bytes(24 * ms * 2), float(ms), windows)


def test_commentary_while_the_caller_speaks_is_answered_by_their_turns_reply_alone() -> None:
    vad = TurnDetection(prefix_padding_ms=100, silence_duration_ms=200)
    session = _session(SessionConfig(turn_detection=vad))
    _feed(session, 0, 320, 0.01)
    speech = _feed(session, 320, 320, 0.95)
    assert any(isinstance(o, ev.SpeechStarted) for o in speech)
    during = session.receive(cmd.ContextAppend(channel="commentary", content="It is 3 pm."), now=0.7)
    assert _replies(during) == []  # the caller is speaking: the model waits
    turn = _feed(session, 640, 320, 0.01)
    (created,) = [o for o in _replies(turn) if isinstance(o, ev.ResponseCreated)]
    # That reply has the commentary in its context: its end starts no second one.
    session.engine_event(port.EngineResponseStarted(response_id=created.response_id), now=1.0)
    done = session.engine_event(port.EngineResponseDone(response_id=created.response_id), now=2.0)
    assert _replies(done) == []


def test_commentary_while_the_caller_speaks_is_said_after_a_reply_they_talk_over() -> None:
    vad = TurnDetection(prefix_padding_ms=100, silence_duration_ms=200, interrupt_response=False)
    session = _session(SessionConfig(turn_detection=vad))
    session.engine_event(port.EngineResponseStarted(response_id="resp_engine"), now=0.0)
    _feed(session, 0, 320, 0.95)
    session.receive(cmd.ContextAppend(channel="commentary", content="It is 3 pm."), now=0.4)
    # The reply ends while the caller still speaks: nobody is quiet yet.
    assert _replies(session.engine_event(port.EngineResponseDone(response_id="resp_engine"), now=0.5)) == []
    # Their turn's reply is the one that says it, and the only one.
    turn = _feed(session, 320, 640, 0.01)
    (created,) = [o for o in _replies(turn) if isinstance(o, ev.ResponseCreated)]
    session.engine_event(port.EngineResponseStarted(response_id=created.response_id), now=1.5)
    assert (
        _replies(session.engine_event(port.EngineResponseDone(response_id=created.response_id), now=2.0))
        == []
    )
