"""A caller speaking over a Live reply the engine has already finished making, but which is still playing:
the paced dialect cuts it where the caller stopped hearing it (the session has no reply left to interrupt)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

from duplex_gateway.dialects.live_pacing import PacedLiveDialect
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetection

PCM24 = AudioFormat(encoding=Encoding.PCM16, rate=24_000)


def _ms(ms: int) -> bytes:
    return b"\x01\x00" * (24 * ms)


def _started() -> tuple[PacedLiveDialect, SessionConfig]:
    dialect = PacedLiveDialect(session_id="live_test", expires_at=1_900_000_000, max_message_bytes=1 << 20)
    (update, *_) = dialect.parse(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
    assert isinstance(update, cmd.SessionUpdate)
    config = SessionConfig().apply(update.session)
    assert dialect.render(ev.SessionCreated(session_id="s", config=config), seq=1) is not None
    return dialect, config


def _play_until(dialect: PacedLiveDialect, until: float) -> float:
    """Pump as the host does up to ``until``: the audio sent (ms)."""
    sent = 0.0
    frames, wake = dialect.pump(0.0)
    while True:
        sent += sum(PCM24.duration_ms(len(base64.b64decode(json.loads(f)["delta"]))) for f in frames)
        if wake is None or wake > until:
            return sent
        frames, wake = dialect.pump(wake)


def _made_whole(dialect: PacedLiveDialect, ms: int) -> None:
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(ms), rate=24_000), seq=2)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=3)


def _truncations(dialect: PacedLiveDialect) -> list[tuple[str, int]]:
    return [
        (c.item_id, c.audio_end_ms)
        for c in dialect.take_commands()
        if isinstance(c, cmd.ConversationItemTruncate)
    ]


def test_speech_over_a_reply_made_before_it_cuts_it_where_the_caller_stopped_hearing_it() -> None:
    dialect, _ = _started()
    _made_whole(dialect, 2000)  # all of it made before any of it played
    _play_until(dialect, 0.3)
    dialect.take_commands()
    dialect.tick(0.3)
    assert dialect.render(ev.SpeechStarted(audio_start_ms=5000, item_id="caller_1"), seq=4) is None
    assert _truncations(dialect) == [("i1", 300)]
    assert dialect.pump(0.31) == ([], None)  # nothing more of it goes out
    assert _truncations(dialect) == []  # cut once


def test_speech_after_the_reply_played_out_cuts_nothing() -> None:
    dialect, _ = _started()
    _made_whole(dialect, 200)
    assert _play_until(dialect, 1.0) == 200
    dialect.take_commands()
    dialect.tick(1.0)
    dialect.render(ev.SpeechStarted(audio_start_ms=5000, item_id="caller_1"), seq=4)
    assert _truncations(dialect) == []


def test_without_interrupt_response_the_reply_plays_on_over_the_caller() -> None:
    dialect, config = _started()
    quiet = replace(config, turn_detection=TurnDetection(create_response=True, interrupt_response=False))
    dialect.render(ev.SessionUpdated(session_id="s", config=quiet), seq=2)
    _made_whole(dialect, 1000)
    _play_until(dialect, 0.3)
    dialect.take_commands()
    dialect.tick(0.3)
    dialect.render(ev.SpeechStarted(audio_start_ms=5000, item_id="caller_1"), seq=4)
    assert _truncations(dialect) == []
    assert dialect.pump(0.5)[0]  # its audio goes on


def test_a_reply_still_being_made_is_left_to_the_sessions_interruption() -> None:
    dialect, _ = _started()
    dialect.tick(0.0)
    dialect.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=_ms(2000), rate=24_000), seq=2)
    _play_until(dialect, 0.3)
    dialect.take_commands()
    dialect.tick(0.3)
    dialect.render(ev.SpeechStarted(audio_start_ms=5000, item_id="caller_1"), seq=3)
    assert _truncations(dialect) == []  # the session interrupts it; its cancellation cuts it
    dialect.tick(0.32)
    dialect.render(ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"), seq=4)
    assert _truncations(dialect) == [("i1", 320)]
