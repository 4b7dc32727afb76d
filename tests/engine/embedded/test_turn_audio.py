"""TurnAudio: the turn's audio, trimmed for a monologue, and whether what followed a point was quiet."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from duplex_gateway.engine.embedded.turn_audio import QUIET_RATIO, TurnAudio


def _tone(n: int, amplitude: int) -> bytes:
    return (np.sin(np.arange(n) / 5.0) * amplitude).astype("<i2").tobytes()


def test_a_monologue_keeps_its_most_recent_audio_and_counts_all_of_it() -> None:
    turn = TurnAudio(max_bytes=10)
    turn.append(b"\x01\x00" * 4)
    turn.append(b"\x02\x00" * 4)
    assert turn.total == 16
    assert turn.snapshot() == b"\x01\x00" + b"\x02\x00" * 4
    turn.clear()
    assert len(turn) == 0 and turn.total == 0


def test_silence_after_speech_is_quiet_and_speech_after_it_is_not() -> None:
    turn = TurnAudio(max_bytes=1 << 20)
    turn.append(_tone(16000, 8000))
    paused = turn.mark()
    turn.append(_tone(3200, 100))  # room noise
    assert turn.quiet_since(paused)
    turn.append(_tone(3200, 8000))  # the caller talks again
    assert not turn.quiet_since(paused)


def test_a_mark_from_a_turn_since_cleared_is_not_quiet() -> None:
    turn = TurnAudio(max_bytes=1 << 20)
    turn.append(_tone(1600, 8000))
    old = turn.mark()
    turn.clear()
    turn.append(_tone(160, 8000))
    assert turn.since(old) < 0
    assert not turn.quiet_since(old)


@given(
    st.lists(st.binary(min_size=1, max_size=301), min_size=1, max_size=12),
    st.lists(st.binary(min_size=1, max_size=301), max_size=12),
)
def test_the_running_answer_is_the_whole_computation(before: list[bytes], after: list[bytes]) -> None:
    """Chunks of any length, odd ones included, give what the RMS over the whole audio gives."""
    turn = TurnAudio(max_bytes=1 << 20)
    for chunk in before:
        turn.append(chunk)
    mark = turn.mark()
    for chunk in after:
        turn.append(chunk)
    whole = b"".join(before + after)
    head = len(b"".join(before))
    samples = np.frombuffer(whole[: len(whole) - len(whole) % 2], dtype="<i2").astype(np.float64)
    # The mark falls between samples when the bytes before it are odd; the running sum counts
    # the straddling sample after it, as the expected value does.
    tail = samples[head // 2 :]
    tail_bytes = len(whole) - head
    if tail_bytes < 2 or len(whole) < 2:
        assert turn.quiet_since(mark)
        return
    tail_rms = float(np.sqrt(np.sum(tail**2) / (tail_bytes // 2)))
    whole_rms = float(np.sqrt(np.sum(samples**2) / (len(whole) // 2)))
    if abs(tail_rms - QUIET_RATIO * whole_rms) > 1e-6 * max(1.0, whole_rms):
        assert turn.quiet_since(mark) == (tail_rms <= QUIET_RATIO * whole_rms)
