"""The Live dialect of a WebRTC call: started by its POST, Live events on the channel, audio on the tracks."""

from __future__ import annotations

import json

import pytest

from duplex_gateway.dialects.base import PacedDialect
from duplex_gateway.dialects.live_errors import LiveProtocolError
from duplex_gateway.dialects.live_pacing import LEAD_MS
from duplex_gateway.dialects.live_webrtc import WebRtcLiveDialect, check_webrtc_session, opening_event
from duplex_gateway.dialects.realtime_webrtc import CLEAR_TRACK
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import SessionConfig

#: An engine that hears at 16 kHz and speaks at 24 kHz: the tracks are decoded to, and encoded from, those.
IN16 = AudioFormat(encoding=Encoding.PCM16, rate=16_000)
OUT24 = AudioFormat(encoding=Encoding.PCM16, rate=24_000)


def _out(ms: int) -> bytes:
    return b"\x01\x00" * (24 * ms)


def _dialect() -> WebRtcLiveDialect:
    return WebRtcLiveDialect(
        session_id="sess_1",
        call_id="sess_1",
        expires_at=1_900_000_000,
        max_message_bytes=1 << 20,
        input_format=IN16,
        output_format=OUT24,
    )


def _started(session: dict[str, object] | None = None) -> tuple[WebRtcLiveDialect, SessionConfig]:
    """A dialect whose opening ``session.start`` (the POST's session) the session has taken."""
    dialect = _dialect()
    (update, *_) = dialect.parse(opening_event(session or {"model": "gpt-live-1"}))
    assert isinstance(update, cmd.SessionUpdate)
    config = SessionConfig().apply(update.session)
    started = dialect.render(ev.SessionCreated(session_id="sess_1", config=config), seq=1)
    assert started is not None and json.loads(started)["type"] == "session.started"
    return dialect, config


def _run(dialect: WebRtcLiveDialect, start: float, until: float) -> tuple[list[Frame], float | None]:
    """Pump as the host's timer would, up to ``until``: every frame, and the next wake-up."""
    frames: list[Frame] = []
    wake: float | None = start
    while wake is not None and wake <= until:
        out, wake = dialect.pump(wake)
        frames.extend(out)
    return frames, wake


def _track_ms(frames: list[Frame]) -> float:
    return sum(OUT24.duration_ms(len(f)) for f in frames if isinstance(f, bytes))


def _truncations(dialect: WebRtcLiveDialect) -> list[tuple[str, int]]:
    return [
        (c.item_id, c.audio_end_ms)
        for c in dialect.take_commands()
        if isinstance(c, cmd.ConversationItemTruncate)
    ]


def test_it_is_paced() -> None:
    assert isinstance(_dialect(), PacedDialect)


def test_the_posts_session_starts_it_with_the_tracks_formats() -> None:
    dialect, config = _started({"model": "gpt-live-1", "instructions": "Be brief."})
    # The engine's rates, as the transport decodes the tracks: not the Live API's 24 kHz default both ways.
    assert (config.input_format, config.output_format) == (IN16, OUT24)
    assert config.instructions == "Be brief." and config.model == "gpt-live-1"
    assert config.turn_detection is not None and config.turn_detection.interrupt_response
    started = dialect.render(ev.SessionCreated(session_id="sess_1", config=config), seq=2)
    assert started is not None
    session = json.loads(started)["session"]
    assert session["id"] == "sess_1" and session["audio"]["format"] == {"type": "audio/pcm", "rate": 24_000}


def test_the_incoming_track_is_the_callers_audio_and_the_session_timeline() -> None:
    dialect, _ = _started()
    (append,) = dialect.parse(b"\x01\x00" * 320)  # 20 ms at 16 kHz
    assert isinstance(append, cmd.InputAudioAppend)
    assert (append.encoding, append.rate, len(append.audio)) == (Encoding.PCM16, 16_000, 640)
    dialect.parse(b"\x01\x00" * 320)
    assert dialect.state.now_ms() == 40
    assert dialect.parse(b"") == ()


def test_track_audio_before_the_session_started_is_not_the_sessions() -> None:
    assert _dialect().parse(b"\x01\x00" * 320) == ()


def test_audio_on_the_channel_and_a_second_start_are_refused() -> None:
    dialect, _ = _started()
    with pytest.raises(LiveProtocolError) as appended:
        dialect.parse(json.dumps({"type": "session.input_audio.append", "audio": "AAAA", "event_id": "a1"}))
    assert appended.value.live == "invalid_value" and appended.value.param == "type"
    assert "audio track" in appended.value.message and appended.value.event_id == "a1"
    with pytest.raises(ProtocolError) as again:
        dialect.parse(opening_event({"model": "gpt-live-1"}))
    assert again.value.code is ErrorCode.SESSION_ALREADY_STARTED
    # The rest of the Live client events are the WebSocket's.
    (mute,) = dialect.parse(json.dumps({"type": "session.input_audio.mute"}))
    assert isinstance(mute, cmd.InputAudioMute) and mute.muted


def test_the_reply_goes_on_the_track_in_real_time_and_what_played_is_acknowledged() -> None:
    dialect, _ = _started()
    dialect.tick(0.0)
    audio = ev.AudioDelta(response_id="r1", item_id="i1", audio=_out(1000), rate=24_000)
    assert dialect.render(audio, seq=2) is None  # never as a session.output_audio.delta
    first, _ = dialect.pump(0.0)
    assert first and all(isinstance(f, bytes) for f in first)
    assert _track_ms(first) <= LEAD_MS + 40  # a lead ahead, no more
    rest, wake = _run(dialect, 0.02, 5.0)
    assert wake is None and _track_ms(first + rest) == pytest.approx(1000)
    assert b"".join(f for f in first + rest if isinstance(f, bytes)) == _out(1000)
    acks = [c for c in dialect.take_commands() if isinstance(c, cmd.PlaybackAck)]
    assert acks and acks[-1].played_ms >= 800 and {a.item_id for a in acks} == {"i1"}


def test_speech_over_a_reply_made_ahead_clears_the_track_and_truncates_at_what_played() -> None:
    dialect, _ = _started()
    dialect.tick(0.0)
    dialect.render(ev.ResponseCreated(response_id="r1"), seq=2)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_out(2000), rate=24_000), seq=3)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=4)
    _run(dialect, 0.0, 0.4)
    dialect.take_commands()
    dialect.tick(0.4)
    dialect.render(ev.SpeechStarted(item_id="u2", audio_start_ms=400), seq=5)
    frames, wake = dialect.pump(0.4)
    # The lead already on the track goes too: it stops at once.
    assert frames == [CLEAR_TRACK] and wake is None
    assert _truncations(dialect) == [("i1", 400)]
    assert dialect.pump(0.5) == ([], None)


def test_a_cancelled_reply_clears_the_track_before_anything_else() -> None:
    dialect, _ = _started()
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_out(2000), rate=24_000), seq=2)
    _run(dialect, 0.0, 0.3)
    dialect.take_commands()
    dialect.tick(0.3)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=3)
    frames, _ = dialect.pump(0.3)
    assert frames[0] == CLEAR_TRACK and _track_ms(frames) == 0
    assert _truncations(dialect) == [("i1", 300)]


def test_a_reply_held_then_cut_is_truncated_at_what_played_before_the_hold() -> None:
    """A reply made as it plays: the session holds its audio while the caller's speech is judged, the
    lead plays out, and the verdict cancels it. What was heard reaches the session then."""
    dialect, _ = _started()
    dialect.tick(0.0)
    dialect.render(ev.ResponseCreated(response_id="r1"), seq=2)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_out(500), rate=24_000), seq=3)
    _run(dialect, 0.0, 0.45)
    dialect.tick(0.45)
    pause = ev.OverlapDecision(
        policy="backchannel", action="pause", reason="overlap_speech", response_id="r1"
    )
    dialect.render(pause, seq=4)
    _run(dialect, 0.45, 0.9)  # the rest of the lead plays out; nothing more comes
    dialect.take_commands()
    dialect.tick(0.9)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=5)
    assert _truncations(dialect) == [("i1", 500)]


def test_the_posts_session_is_read_as_session_start_reads_it() -> None:
    assert (
        check_webrtc_session({"model": "gpt-live-1", "audio": {"output": {"voice": "marin"}}}).voice
        == "marin"
    )
    cases: list[tuple[object, str, str | None]] = [
        ({}, "missing_required_parameter", "session.model"),
        ({"model": "m", "voice": "x"}, "unknown_parameter", "session.voice"),
        ({"model": "m", "delegation": {"type": "decisions"}}, "not_supported", "session.delegation.type"),
        ({"model": 5}, "invalid_type", "session.model"),
        (None, "missing_required_parameter", "session"),
        ([], "invalid_type", "session"),
    ]
    for session, code, param in cases:
        with pytest.raises(LiveProtocolError) as refused:
            check_webrtc_session(session)
        assert (refused.value.live, refused.value.param) == (code, param), session


def test_a_format_is_the_tracks_not_the_sessions() -> None:
    with pytest.raises(LiveProtocolError) as refused:
        check_webrtc_session({"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 24_000}}})
    assert (refused.value.live, refused.value.param) == ("unknown_parameter", "session.audio.format")
    assert "WebRTC" in refused.value.message


def test_the_opening_event_is_session_start_with_the_posts_session() -> None:
    session = {
        "model": "gpt-live-1",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    }
    assert json.loads(opening_event(session)) == {"type": "session.start", "session": session}
    dialect = _dialect()
    commands = dialect.parse(opening_event(session))
    assert [type(c) for c in commands] == [cmd.SessionUpdate, cmd.ConversationItemCreate]
