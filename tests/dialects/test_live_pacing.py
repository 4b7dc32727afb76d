"""A Live session's reply audio in real time (the playout's pace, what it says was heard, cuts), and the
vocabulary the Live API added: context appends acknowledged, mute, notices, the Live error codes."""

from __future__ import annotations

import base64
import json

import pytest

from duplex_gateway.dialects.base import PacedDialect
from duplex_gateway.dialects.live_pacing import LEAD_MS, RESPONSES_HERE, LivePlayout, PacedLiveDialect
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetection

PCM24 = AudioFormat(encoding=Encoding.PCM16, rate=24_000)


def _ms(ms: int) -> bytes:
    return b"\x01\x00" * (24 * ms)


def _sent_ms(due: list[tuple[str, bytes]]) -> float:
    return sum(PCM24.duration_ms(len(audio)) for _, audio in due)


def test_audio_goes_out_no_faster_than_it_plays_a_lead_ahead() -> None:
    playout = LivePlayout(PCM24, lead_ms=100, chunk_ms=40)
    playout.queue("r1", "i1", _ms(1000))
    due, wake = playout.due(0.0)
    # Chunks go until what is sent runs more than the lead ahead of the clock.
    assert 100 <= _sent_ms(due) <= 140 and wake is not None
    total = _sent_ms(due)
    now = 0.0
    while wake is not None:
        now = wake
        due, wake = playout.due(now)
        total += _sent_ms(due)
        assert total - now * 1000 <= 100 + 40 + 1e-6
    assert total == pytest.approx(1000) and now == pytest.approx(0.86, abs=0.05)


def test_what_was_heard_is_what_the_clock_says_played() -> None:
    playout = LivePlayout(PCM24, lead_ms=100, chunk_ms=40)
    playout.queue("r1", "i1", _ms(500))
    playout.due(0.0)
    heard = playout.heard(0.05)
    assert heard is not None and (heard.response_id, heard.item_id, heard.played_ms) == ("r1", "i1", 50)
    cut = playout.clear(0.07)
    assert cut is not None and cut.played_ms == 70
    assert not playout.playing(0.07) and playout.due(0.08) == ([], None)
    assert playout.clear(0.09) is None  # nothing was playing


def _started() -> PacedLiveDialect:
    dialect = PacedLiveDialect(session_id="live_test", expires_at=1_900_000_000, max_message_bytes=1 << 20)
    (update, *_) = dialect.parse(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
    assert isinstance(update, cmd.SessionUpdate)
    config = SessionConfig().apply(update.session)
    assert dialect.render(ev.SessionCreated(session_id="s", config=config), seq=1) is not None
    return dialect


def test_a_live_session_takes_turns_by_itself() -> None:
    dialect = PacedLiveDialect(session_id="s", expires_at=0, max_message_bytes=1 << 20)
    (update, *_) = dialect.parse(json.dumps({"type": "session.start", "session": {"model": "m"}}))
    assert isinstance(update, cmd.SessionUpdate)
    config = SessionConfig(turn_detection=None).apply(update.session)
    assert config.turn_detection == TurnDetection(create_response=True, interrupt_response=True)
    assert config.auto_response  # an engine with turn-taking of its own decides


def test_the_paced_dialect_sends_reply_audio_from_pump_and_acks_what_played() -> None:
    dialect = _started()
    assert isinstance(dialect, PacedDialect)
    dialect.tick(10.0)
    audio = ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(1000), rate=24_000)
    assert dialect.render(audio, seq=2) is None
    frames, wake = dialect.pump(10.0)
    wires = [json.loads(frame) for frame in frames]
    assert {w["type"] for w in wires} == {"session.output_audio.delta"}
    assert len({w["event_id"] for w in wires}) == len(wires)
    assert b"".join(base64.b64decode(w["delta"]) for w in wires) == _ms(1000)[: len(wires) * 1920]
    assert wake is not None and wake > 10.0
    acks: list[cmd.PlaybackAck] = []
    now = wake
    while wake is not None:
        now = wake
        _, wake = dialect.pump(now)
        acks.extend(c for c in dialect.take_commands() if isinstance(c, cmd.PlaybackAck))
    assert acks and all(a.response_id == "r1" and a.item_id == "i1" for a in acks)
    played = [a.played_ms for a in acks]
    assert played == sorted(played) and played[-1] <= (now - 10.0) * 1000 + 1


def test_a_cancelled_reply_stops_at_once_and_is_truncated_where_the_caller_stopped_hearing_it() -> None:
    dialect = _started()
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(2000), rate=24_000), seq=2)
    _, wake = dialect.pump(0.0)
    while wake is not None and wake <= 0.3:
        _, wake = dialect.pump(wake)
    dialect.take_commands()
    dialect.tick(0.3)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=3)
    truncate = [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]
    assert [(t.item_id, t.audio_end_ms) for t in truncate] == [("i1", 300)]
    assert dialect.pump(0.31) == ([], None)  # nothing more of it goes out


def test_a_reply_that_ends_by_itself_plays_to_its_end() -> None:
    dialect = _started()
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(300), rate=24_000), seq=2)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=3)
    sent = 0.0
    now: float | None = 0.0
    while now is not None:
        frames, now = dialect.pump(now)
        sent += sum(PCM24.duration_ms(len(base64.b64decode(json.loads(f)["delta"]))) for f in frames)
    assert sent == pytest.approx(300)
    assert not [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]


def _pump_until(dialect: PacedLiveDialect, now: float, until: float) -> tuple[float, float | None]:
    """Pump as the host's timer would, up to ``until``: the audio sent (ms) and the next wake-up."""
    sent = 0.0
    wake: float | None = now
    while wake is not None and wake <= until:
        frames, wake = dialect.pump(wake)
        sent += sum(PCM24.duration_ms(len(base64.b64decode(json.loads(f)["delta"]))) for f in frames)
    return sent, wake


def _decision(action: str) -> ev.OverlapDecision:
    return ev.OverlapDecision(policy="backchannel", action=action, reason="overlap_speech", response_id="r1")


def _held_at_half_a_second() -> tuple[PacedLiveDialect, float]:
    """A 2 s reply played for 0.5 s, then held: the dialect, and the audio sent before the hold (ms)."""
    dialect = _started()
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(2000), rate=24_000), seq=2)
    before, _ = _pump_until(dialect, 0.0, 0.5)
    dialect.tick(0.5)
    assert dialect.render(_decision("pause"), seq=3) is None  # the Live API has no such event
    return dialect, before


def test_a_held_reply_sends_nothing_more_and_a_backchannel_resumes_it_where_it_paused() -> None:
    dialect, before = _held_at_half_a_second()
    during, wake = _pump_until(dialect, 0.5, 1.5)
    assert during == 0.0 and wake is None  # the lead already sent plays out; nothing follows it
    dialect.tick(1.5)
    assert dialect.render(_decision("resume"), seq=4) is None
    after, _ = _pump_until(dialect, 1.5, 10.0)
    # Every millisecond goes out once: the caller hears a gap, nothing lost, nothing twice.
    assert before + during + after == pytest.approx(2000)
    assert not [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]


def test_a_held_reply_cut_by_a_barge_in_is_truncated_at_what_was_heard_before_the_hold() -> None:
    dialect, before = _held_at_half_a_second()
    _pump_until(dialect, 0.5, 1.1)
    dialect.take_commands()
    dialect.tick(1.1)
    dialect.render(_decision("barge_in"), seq=4)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=5)
    truncate = [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]
    # All that was sent had played by the cut, and nothing was sent after the pause.
    assert [(t.item_id, t.audio_end_ms) for t in truncate] == [("i1", round(before))]
    assert 500 <= before <= 500 + LEAD_MS + 40
    assert dialect.pump(1.2) == ([], None)


def test_a_reply_whose_audio_the_session_held_is_truncated_at_what_played_when_it_is_cut() -> None:
    """A reply made as it plays: on a pause the session holds the engine's audio, not the dialect,
    so nothing of it is playing when the verdict cancels it; what played still reaches the session."""
    dialect = _started()
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(500), rate=24_000), seq=2)
    sent, _ = _pump_until(dialect, 0.0, 0.45)
    dialect.tick(0.45)
    dialect.render(_decision("pause"), seq=3)
    _pump_until(dialect, 0.45, 1.0)
    dialect.take_commands()
    dialect.tick(1.0)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=4)
    truncate = [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]
    assert sent == 500 and [(t.item_id, t.audio_end_ms) for t in truncate] == [("i1", 500)]


def test_the_lead_is_small() -> None:
    assert LEAD_MS <= 150  # what a caller may hear after a barge-in, beyond the detection's own delay


# -- the vocabulary the Live API added -------------------------------------------------------------


def test_context_mute_and_notice_events_render_as_the_live_apis() -> None:
    dialect = _started()
    appended = dialect.render(ctx.ContextAppended(channel="thinking", item_id="i1", event_id="t1"), seq=2)
    assert appended is not None
    assert json.loads(appended) == {
        "type": "session.thinking.appended",
        "event_id": "event_2",
        "start_ms": 0,
        "end_ms": 0,
        "client_event_id": "t1",
    }
    muted = [dialect.render(ctx.InputAudioMuted(muted=m), seq=3) for m in (True, False)]
    assert [json.loads(m or "{}")["type"] for m in muted] == [
        "session.input_audio.muted",
        "session.input_audio.unmuted",
    ]
    info = dialect.render(ctx.Notice(code="c", message="m"), seq=4)
    assert info is not None and json.loads(info) == {
        "type": "info",
        "event_id": "event_4",
        "code": "c",
        "message": "m",
    }


def test_a_responses_delegation_session_starts_and_is_told_the_engine_answers_by_itself() -> None:
    dialect = PacedLiveDialect(session_id="s", expires_at=0, max_message_bytes=1 << 20)
    delegation = {"type": "responses", "responses": {"model": "gpt-5.6-luna"}}
    (update, *_) = dialect.parse(
        json.dumps({"type": "session.start", "session": {"model": "m", "delegation": delegation}})
    )
    assert isinstance(update, cmd.SessionUpdate)
    started = dialect.render(
        ev.SessionCreated(session_id="s", config=SessionConfig().apply(update.session)), seq=1
    )
    assert started is not None and json.loads(started)["type"] == "session.started"
    frames, _ = dialect.pump(0.0)
    assert [json.loads(f)["type"] for f in frames] == ["info"]
    assert json.loads(frames[0])["code"] == RESPONSES_HERE.code
    assert dialect.pump(0.1) == ([], None)  # said once


def test_the_live_codes_of_the_vocabulary_are_the_refusals_own() -> None:
    dialect = _started()
    with pytest.raises(ProtocolError) as again:
        dialect.parse(json.dumps({"type": "session.start", "session": {"model": "m"}}))
    assert again.value.code is ErrorCode.SESSION_ALREADY_STARTED
    with pytest.raises(ProtocolError) as unknown:
        dialect.parse(json.dumps({"type": "session.close", "x": 1}))
    assert unknown.value.code is ErrorCode.UNKNOWN_PARAMETER
