"""The turn detector's ``semantic_vad`` mode: candidates for the end-of-turn model, its verdict, the longest wait."""

from __future__ import annotations

import itertools

import pytest

from duplex_gateway.audio.turn_detector import (
    SEMANTIC_CANDIDATE_MS,
    SEMANTIC_EAGERNESS,
    SEMANTIC_REASSESS_MS,
    SpeechCandidate,
    SpeechPause,
    SpeechStart,
    SpeechStop,
    TurnDetector,
    TurnEvent,
)
from duplex_gateway.audio.vad import WINDOW_MS
from duplex_gateway.vocabulary.session_config import TurnDetection, TurnDetectionMode


def _semantic(eagerness: str = "auto") -> TurnDetector:
    return TurnDetector(TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD, eagerness=eagerness))


def _feed(detector: TurnDetector, start_ms: int, end_ms: int, probability: float) -> list[TurnEvent]:
    """Windows from ``start_ms`` to ``end_ms`` at one probability."""
    return detector.feed_many((t, probability) for t in range(start_ms + WINDOW_MS, end_ms + 1, WINDOW_MS))


def test_a_short_silence_is_a_candidate_not_a_stop() -> None:
    detector = _semantic()
    events = _feed(detector, 0, 1024, 0.9) + _feed(detector, 1024, 1024 + 640, 0.05)
    assert isinstance(events[0], SpeechStart)
    assert isinstance(events[1], SpeechPause)
    candidates = [e for e in events if isinstance(e, SpeechCandidate)]
    assert len(candidates) == 1
    (candidate,) = candidates
    assert candidate.speech_end_ms == 1024
    assert candidate.audio_end_ms - candidate.speech_end_ms >= SEMANTIC_CANDIDATE_MS
    assert not any(isinstance(e, SpeechStop) for e in events)
    assert detector.in_speech and detector.awaiting(candidate)


def test_the_models_verdict_ends_the_turn_where_the_candidate_was() -> None:
    detector = _semantic()
    events = _feed(detector, 0, 1024, 0.9) + _feed(detector, 1024, 1024 + 320, 0.05)
    candidate = next(e for e in events if isinstance(e, SpeechCandidate))
    stop = detector.end_turn(candidate)
    assert stop == SpeechStop(candidate.audio_end_ms)
    assert not detector.in_speech
    assert detector.last_speech_end_ms == 1024
    assert detector.end_turn(candidate) is None  # once


def test_speech_that_resumes_voids_the_candidate() -> None:
    detector = _semantic()
    events = _feed(detector, 0, 1024, 0.9) + _feed(detector, 1024, 1024 + 320, 0.05)
    candidate = next(e for e in events if isinstance(e, SpeechCandidate))
    _feed(detector, 1344, 1344 + 320, 0.9)
    assert not detector.awaiting(candidate)
    assert detector.end_turn(candidate) is None
    assert detector.in_speech


def test_a_long_silence_is_judged_again_and_ends_at_the_longest_wait() -> None:
    detector = _semantic("high")
    wait = SEMANTIC_EAGERNESS["high"].max_wait_ms
    events = _feed(detector, 0, 1024, 0.9) + _feed(detector, 1024, 1024 + wait + 64, 0.05)
    candidates = [e for e in events if isinstance(e, SpeechCandidate)]
    silences = [c.audio_end_ms - c.speech_end_ms for c in candidates]
    assert len(candidates) == 1 + (wait - SEMANTIC_CANDIDATE_MS) // SEMANTIC_REASSESS_MS
    assert all(b - a >= SEMANTIC_REASSESS_MS - WINDOW_MS for a, b in itertools.pairwise(silences))
    stops = [e for e in events if isinstance(e, SpeechStop)]
    assert len(stops) == 1 and stops[0].audio_end_ms - 1024 >= wait


@pytest.mark.parametrize(
    ("eagerness", "wait"), [("low", 8000), ("medium", 4000), ("high", 2000), ("auto", 4000)]
)
def test_eagerness_sets_the_longest_wait_as_openai_does(eagerness: str, wait: int) -> None:
    assert _semantic(eagerness).silence_duration_ms == wait
    lower = SEMANTIC_EAGERNESS["low"].threshold
    assert lower >= SEMANTIC_EAGERNESS["medium"].threshold >= SEMANTIC_EAGERNESS["high"].threshold


def test_server_vad_keeps_its_silence_and_makes_no_candidates() -> None:
    detector = TurnDetector(TurnDetection(silence_duration_ms=500))
    events = _feed(detector, 0, 1024, 0.9) + _feed(detector, 1024, 1024 + 640, 0.05)
    assert not any(isinstance(e, SpeechCandidate) for e in events)
    assert [type(e) for e in events] == [SpeechStart, SpeechPause, SpeechStop]
