"""The Realtime dialect of a WebRTC call: audio on the tracks, paced by the gateway, and OpenAI's
WebRTC-only events for what the track played."""

from __future__ import annotations

import json

import pytest

from duplex_gateway.dialects.base import PacedDialect
from duplex_gateway.dialects.live_pacing import LEAD_MS
from duplex_gateway.dialects.realtime_webrtc import CLEAR_TRACK, MEDIA_FORMAT, WebRtcRealtimeDialect
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import UNSET, SessionConfig, TurnDetection


def _ms(ms: int) -> bytes:
    return b"\x01\x00" * (48 * ms)


def _started(turn_detection: TurnDetection | None = None) -> WebRtcRealtimeDialect:
    dialect = WebRtcRealtimeDialect(session_id="s", call_id="rtc_1", max_message_bytes=1 << 20)
    config = SessionConfig(
        input_format=MEDIA_FORMAT,
        output_format=MEDIA_FORMAT,
        turn_detection=turn_detection or TurnDetection(),
    )
    assert dialect.render(ev.SessionCreated(session_id="s", config=config), seq=1) is not None
    return dialect


def _reply(dialect: WebRtcRealtimeDialect, ms: int, *, at: float = 0.0, seq: int = 2) -> None:
    dialect.tick(at)
    dialect.render(ev.ResponseCreated(response_id="r1"), seq=seq)
    delta = ev.AudioDelta(
        response_id="r1", item_id="i1", audio=_ms(ms), rate=48_000, encoded=True, encoding=Encoding.PCM16
    )
    assert dialect.render(delta, seq=seq + 1) is None  # never on the data channel


def _run(dialect: WebRtcRealtimeDialect, start: float, until: float) -> tuple[list[Frame], float | None]:
    """Pump as the host's timer would, up to ``until``: every frame, and the next wake-up."""
    frames: list[Frame] = []
    wake: float | None = start
    while wake is not None and wake <= until:
        out, wake = dialect.pump(wake)
        frames.extend(out)
    return frames, wake


def _events(frames: list[Frame]) -> list[str]:
    return [json.loads(f)["type"] for f in frames if isinstance(f, str)]


def _track_ms(frames: list[Frame]) -> float:
    return sum(MEDIA_FORMAT.duration_ms(len(f)) for f in frames if isinstance(f, bytes))


def test_it_is_paced() -> None:
    assert isinstance(_started(), PacedDialect)


def test_the_incoming_track_is_caller_audio_in_the_tracks_format() -> None:
    (append,) = _started().parse(_ms(20))
    assert isinstance(append, cmd.InputAudioAppend)
    assert (append.encoding, append.rate, len(append.audio)) == (Encoding.PCM16, 48_000, 1920)


def test_the_tracks_are_decoded_to_the_engines_rates() -> None:
    """The transport hands over, and takes, PCM16 at the engine's rates: the session converts nothing."""
    dialect = WebRtcRealtimeDialect(
        session_id="s",
        call_id="rtc_1",
        max_message_bytes=1 << 20,
        input_format=AudioFormat(encoding=Encoding.PCM16, rate=16_000),
        output_format=AudioFormat(encoding=Encoding.PCM16, rate=22_050),
    )
    (append,) = dialect.parse(b"\x01\x00" * 320)
    assert isinstance(append, cmd.InputAudioAppend)
    assert (append.rate, len(append.audio)) == (16_000, 640)
    dialect.render(ev.ResponseCreated(response_id="r1"), seq=1)
    reply = ev.AudioDelta(
        response_id="r1",
        item_id="i1",
        audio=b"\x01\x00" * 2205,
        rate=22_050,
        encoded=True,
        encoding=Encoding.PCM16,
    )
    assert dialect.render(reply, seq=2) is None
    frames, _ = _run(dialect, 0.0, 0.0)
    assert sum(len(f) for f in frames if isinstance(f, bytes)) == 4410  # 100 ms, on the track as it came
    with pytest.raises(ValueError, match="22050"):
        dialect.render(
            ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(20), rate=48_000, encoded=True), seq=3
        )


def test_a_session_update_keeps_the_tracks_audio_formats() -> None:
    update = {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "instructions": "Be brief.",
            "audio": {
                "output": {"format": {"type": "audio/pcmu"}},
                "input": {"format": {"type": "audio/pcma"}},
            },
        },
    }
    (command,) = _started().parse(json.dumps(update))
    assert isinstance(command, cmd.SessionUpdate)
    assert command.session.instructions == "Be brief."
    assert command.session.input_format is UNSET and command.session.output_format is UNSET


def test_a_reply_plays_on_the_track_in_real_time_between_started_and_stopped() -> None:
    dialect = _started()
    _reply(dialect, 1000)
    first, _ = dialect.pump(0.0)
    assert _events(first) == ["output_audio_buffer.started"]
    assert isinstance(first[0], str) and json.loads(first[0])["response_id"] == "r1"
    assert _track_ms(first) <= LEAD_MS + 40  # a lead ahead, no more
    later, _ = _run(dialect, 0.02, 0.5)
    assert _track_ms(first + later) <= 500 + LEAD_MS + 40
    dialect.tick(0.5)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=4)
    rest, wake = _run(dialect, 0.5, 5.0)
    assert wake is None
    assert _track_ms(first + later + rest) == pytest.approx(1000)
    assert _events(rest) == ["output_audio_buffer.stopped"]
    assert CLEAR_TRACK not in rest
    assert not [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]


def test_stopped_waits_until_the_reply_has_played() -> None:
    dialect = _started()
    _reply(dialect, 300)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=4)
    frames, _ = dialect.pump(0.0)
    assert "output_audio_buffer.stopped" not in _events(frames)
    frames, _ = _run(dialect, 0.0, 0.25)
    assert "output_audio_buffer.stopped" not in _events(frames)
    frames, _ = _run(dialect, 0.25, 1.0)
    assert _events(frames) == ["output_audio_buffer.stopped"]


def test_a_cancelled_reply_clears_the_track_and_is_truncated_at_what_was_heard() -> None:
    dialect = _started()
    _reply(dialect, 2000)
    _run(dialect, 0.0, 0.3)
    dialect.take_commands()
    dialect.tick(0.3)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=4)
    frames, wake = dialect.pump(0.3)
    assert frames[0] == CLEAR_TRACK  # the lead the track holds is dropped too
    assert _events(frames) == ["output_audio_buffer.cleared"]
    truncate = [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]
    assert [(t.item_id, t.audio_end_ms) for t in truncate] == [("i1", 300)]
    assert (_track_ms(frames), wake) == (0.0, None)


def test_speech_over_a_reply_made_before_it_plays_cuts_it_here() -> None:
    dialect = _started()
    _reply(dialect, 2000)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=4)
    _run(dialect, 0.0, 0.4)
    dialect.tick(0.4)
    dialect.render(ev.SpeechStarted(audio_start_ms=400, item_id="u2"), seq=5)
    frames, _ = dialect.pump(0.4)
    assert CLEAR_TRACK in frames and _events(frames) == ["output_audio_buffer.cleared"]
    truncate = [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]
    assert [(t.item_id, t.audio_end_ms) for t in truncate] == [("i1", 400)]


def test_speech_over_a_reply_still_being_made_is_the_sessions_to_judge() -> None:
    dialect = _started()
    _reply(dialect, 2000)
    _run(dialect, 0.0, 0.4)
    dialect.tick(0.4)
    dialect.render(ev.SpeechStarted(audio_start_ms=400, item_id="u2"), seq=4)
    frames, _ = _run(dialect, 0.4, 0.6)
    assert CLEAR_TRACK not in frames and _track_ms(frames) > 0


def test_without_interrupt_response_speech_does_not_cut() -> None:
    dialect = _started(TurnDetection(interrupt_response=False))
    _reply(dialect, 2000)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=4)
    _run(dialect, 0.0, 0.4)
    dialect.tick(0.4)
    dialect.render(ev.SpeechStarted(audio_start_ms=400, item_id="u2"), seq=5)
    assert CLEAR_TRACK not in dialect.pump(0.4)[0]


def test_the_clients_clear_stops_the_track_with_the_sessions_own_event() -> None:
    dialect = _started()
    _reply(dialect, 2000)
    _run(dialect, 0.0, 0.3)
    dialect.tick(0.3)
    frame = dialect.render(ev.OutputAudioCleared(response_id="r1"), seq=4)
    assert frame is not None and json.loads(frame)["type"] == "output_audio_buffer.cleared"
    frames, _ = dialect.pump(0.3)
    assert frames == [CLEAR_TRACK]  # said once, by the session's event


def test_the_clients_clear_of_a_reply_already_made_names_the_reply_it_cut() -> None:
    # The engine is done, the track still plays: the session cancels nothing and names no reply,
    # so the cut says which reply's audio was cleared (OpenAI's event requires the id).
    dialect = _started()
    _reply(dialect, 2000)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=4)
    _run(dialect, 0.0, 0.3)
    dialect.tick(0.3)
    assert dialect.render(ev.OutputAudioCleared(response_id=None), seq=5) is None
    frames, _ = dialect.pump(0.3)
    assert frames[0] == CLEAR_TRACK
    cleared = [json.loads(f) for f in frames if isinstance(f, str)]
    assert [(e["type"], e["response_id"]) for e in cleared] == [("output_audio_buffer.cleared", "r1")]
    truncate = [c for c in dialect.take_commands() if isinstance(c, cmd.ConversationItemTruncate)]
    assert [(t.item_id, t.audio_end_ms) for t in truncate] == [("i1", 300)]


def test_a_held_reply_resumes_where_it_paused() -> None:
    dialect = _started()
    _reply(dialect, 2000)
    before, _ = _run(dialect, 0.0, 0.5)
    dialect.tick(0.5)
    pause = ev.OverlapDecision(
        policy="backchannel", action="pause", reason="overlap_speech", response_id="r1"
    )
    dialect.render(pause, seq=4)
    during, wake = _run(dialect, 0.5, 1.5)
    assert _track_ms(during) == 0.0 and wake is None
    dialect.tick(1.5)
    dialect.render(
        ev.OverlapDecision(policy="backchannel", action="resume", reason="short_ack", response_id="r1"), seq=5
    )
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=6)
    after, _ = _run(dialect, 1.5, 10.0)
    assert _track_ms(before + during + after) == pytest.approx(2000)
    assert _events(before + during + after) == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
