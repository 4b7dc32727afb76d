"""Caller speech over a reply in the session: held, then resumed (a backchannel) or cut (an interruption)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duplex_gateway.engine import port
from duplex_gateway.session.engine_calls import AppendAudio, AssessTurn, BargeInEngine, ClearInput, Output
from duplex_gateway.session.machine import Session
from duplex_gateway.session.overlap import BackchannelRule
from duplex_gateway.session.settings import Handshake
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.session_config import (
    OVERLAP_EVENT,
    SessionConfig,
    TurnDetection,
    TurnDetectionMode,
)

CAPS = port.EngineCapabilities(name="test", input_rate=24_000, output_rate=24_000)
RULE = BackchannelRule(barge_in_ms=400, settle_ms=250, max_hold_ms=2_000)


def _session(mode: TurnDetectionMode = TurnDetectionMode.SEMANTIC_VAD, **config: object) -> Session:
    td = TurnDetection(mode=mode, prefix_padding_ms=100)
    config.setdefault("include", (OVERLAP_EVENT,))
    return Session(
        session_id="s",
        capabilities=CAPS,
        defaults=SessionConfig(turn_detection=td, **config),  # type: ignore[arg-type]
        handshake=Handshake.REALTIME,
        backchannels=RULE,
    )


class Caller:
    """The caller's audio on its clock: VAD windows of 32 ms, 20 ms of PCM per window's worth."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.ms = 0
        self.now = 10.0

    def say(self, ms: int, prob: float) -> list[Output]:
        windows = [(end, prob) for end in range(self.ms + 32, self.ms + ms + 1, 32)]
        out = self.session.input_processed(bytes(48 * ms), float(ms), windows, now=self.now)
        self.ms += ms
        self.now += ms / 1000
        return list(out)


def _of(outputs: Sequence[Output], kind: Any) -> list[Any]:
    return [o for o in outputs if isinstance(o, kind)]


def _replying(session: Session, caller: Caller) -> str:
    """A turn answered: the reply has started and one chunk of it has reached the client."""
    caller.say(320, 0.01)
    caller.say(1024, 0.95)
    out = caller.say(320, 0.01)
    (assess,) = _of(out, AssessTurn)
    (created,) = _of(session.turn_assessed(assess, 0.95), ev.ResponseCreated)
    rid: str = created.response_id
    session.engine_event(port.EngineResponseStarted(response_id=rid), now=caller.now)
    first = session.engine_event(port.EngineAudio(response_id=rid, pcm=bytes(960)), now=caller.now)
    assert _of(first, ev.AudioDelta)
    caller.say(640, 0.01)
    return rid


def _audio(session: Session, rid: str, now: float) -> list[Output]:
    return list(session.engine_event(port.EngineAudio(response_id=rid, pcm=bytes(960)), now=now))


def test_a_backchannel_holds_the_reply_then_resumes_it_with_nothing_lost() -> None:
    session = _session()
    caller = Caller(session)
    rid = _replying(session, caller)
    out = caller.say(96, 0.95)
    (pause,) = _of(out, ev.OverlapDecision)
    assert (pause.action, pause.response_id) == ("pause", rid)
    assert not _of(out, ev.SpeechStarted)  # a client that stops its playback on it must not yet
    held = [_audio(session, rid, caller.now) for _ in range(3)]
    assert held == [[], [], []]
    out = caller.say(192, 0.95) + caller.say(320, 0.01)
    decisions = _of(out, ev.OverlapDecision)
    assert [d.action for d in decisions] == ["resume"]
    assert decisions[0].audio_end_ms is not None and decisions[0].audio_start_ms is not None
    assert len(_of(out, ev.AudioDelta)) == 3  # what the engine made meanwhile, in order
    assert not _of(out, ev.SpeechStarted | ev.ResponseDone | BargeInEngine)
    assert not _of(out, AppendAudio)  # the backchannel is no turn: the engine never hears it
    assert session.response_active
    assert _of(_audio(session, rid, caller.now), ev.AudioDelta)  # and the reply flows again
    done = session.engine_event(port.EngineResponseDone(response_id=rid), now=caller.now)
    (finished,) = _of(done, ev.ResponseDone)
    assert finished.status == "completed"


def test_speech_that_goes_on_cuts_the_reply_where_it_was_held() -> None:
    session = _session()
    caller = Caller(session)
    rid = _replying(session, caller)
    onset = caller.ms
    out = caller.say(96, 0.95)
    assert [d.action for d in _of(out, ev.OverlapDecision)] == ["pause"]
    assert _audio(session, rid, caller.now) == []
    out = caller.say(480, 0.95)
    (barge,) = _of(out, ev.OverlapDecision)
    assert barge.action == "barge_in"
    (started,) = _of(out, ev.SpeechStarted)
    assert started.audio_start_ms == onset - 100  # the true start, less the prefix padding
    (done,) = _of(out, ev.ResponseDone)
    assert (done.response_id, done.status) == (rid, "cancelled")
    assert _of(out, BargeInEngine)
    assert not _of(out, ev.AudioDelta)  # what was held is never sent
    assert sum(a.pcm.__len__() for a in _of(out, AppendAudio)) > 0  # the turn has its audio
    assert _audio(session, rid, caller.now) == []  # fenced
    # The turn goes on as any other.
    out = caller.say(640, 0.95) + caller.say(320, 0.01)
    assert not _of(out, ev.SpeechStarted)


def test_server_vad_interrupts_at_once_as_openai_does() -> None:
    session = _session(TurnDetectionMode.SERVER_VAD)
    caller = Caller(session)
    caller.say(320, 0.01)
    caller.say(1024, 0.95)
    out = caller.say(640, 0.01)
    (created,) = _of(out, ev.ResponseCreated)
    session.engine_event(port.EngineResponseStarted(response_id=created.response_id), now=caller.now)
    out = caller.say(96, 0.95)
    assert _of(out, ev.SpeechStarted) and _of(out, ev.ResponseDone)
    assert not _of(out, ev.OverlapDecision)


def test_server_vad_holds_when_the_session_asks_for_backchannels() -> None:
    session = _session(TurnDetectionMode.SERVER_VAD, overlap_policy="backchannel")
    caller = Caller(session)
    caller.say(320, 0.01)
    caller.say(1024, 0.95)
    out = caller.say(640, 0.01)
    (created,) = _of(out, ev.ResponseCreated)
    session.engine_event(port.EngineResponseStarted(response_id=created.response_id), now=caller.now)
    out = caller.say(96, 0.95)
    assert [d.action for d in _of(out, ev.OverlapDecision)] == ["pause"]
    assert not _of(out, ev.SpeechStarted)


def test_a_cleared_input_ends_the_hold_and_the_reply_resumes() -> None:
    session = _session()
    caller = Caller(session)
    rid = _replying(session, caller)
    caller.say(96, 0.95)
    assert _audio(session, rid, caller.now) == []
    out = session.receive(cmd.InputAudioClear(), now=caller.now)
    assert _of(out, ClearInput)
    (resume,) = _of(out, ev.OverlapDecision)
    assert (resume.action, resume.reason) == ("resume", "input_cleared")
    assert len(_of(out, ev.AudioDelta)) == 1


def test_a_reply_cancelled_during_the_hold_leaves_the_speech_a_turn() -> None:
    session = _session()
    caller = Caller(session)
    rid = _replying(session, caller)
    caller.say(96, 0.95)
    out = session.receive(cmd.ResponseCancel(), now=caller.now)
    (done,) = _of(out, ev.ResponseDone)
    assert (done.response_id, done.status) == (rid, "cancelled")
    (ended,) = _of(out, ev.OverlapDecision)
    assert (ended.action, ended.reason) == ("barge_in", "response_ended")
    assert _of(out, ev.SpeechStarted)


def test_the_clock_ends_a_hold_whose_audio_stopped_coming() -> None:
    session = _session()
    caller = Caller(session)
    rid = _replying(session, caller)
    heard_at = caller.now
    caller.say(96, 0.95)
    due = session.next_timer
    assert due == heard_at + RULE.max_hold_ms / 1000
    assert session.tick(due - 0.5) == []
    out = session.tick(due)
    (ended,) = _of(out, ev.OverlapDecision)
    assert (ended.action, ended.reason) == ("barge_in", "hold_expired")  # last heard: speech
    assert _of(out, ev.ResponseDone)[0].response_id == rid


def test_a_reply_that_finishes_during_a_backchannel_finishes_after_it() -> None:
    session = _session()
    caller = Caller(session)
    rid = _replying(session, caller)
    caller.say(96, 0.95)
    assert session.engine_event(port.EngineResponseDone(response_id=rid), now=caller.now) == []
    assert session.response_active
    out = caller.say(320, 0.01)
    kinds = [type(o) for o in out if isinstance(o, ev.OverlapDecision | ev.ResponseDone)]
    assert kinds == [ev.OverlapDecision, ev.ResponseDone]
    assert _of(out, ev.ResponseDone)[0].status == "completed"
    assert not session.response_active


def test_a_realtime_client_that_did_not_ask_hears_no_overlap_events_and_keeps_its_reply() -> None:
    session = _session(include=())
    caller = Caller(session)
    rid = _replying(session, caller)
    out = caller.say(96, 0.95)
    assert not _of(out, ev.OverlapDecision | ev.SpeechStarted)
    assert _audio(session, rid, caller.now) == []
    out = caller.say(192, 0.95) + caller.say(320, 0.01)
    assert not _of(out, ev.OverlapDecision)
    assert len(_of(out, ev.AudioDelta)) == 1 and session.response_active
