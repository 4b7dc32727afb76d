"""Silero VAD on real speech, and the TurnDetector state machine on synthetic scores."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from duplex_gateway.audio.codec import encode
from duplex_gateway.audio.convert import InputConverter
from duplex_gateway.audio.turn_detector import SpeechPause, SpeechStart, SpeechStop, TurnDetector, TurnEvent
from duplex_gateway.audio.vad import (
    WINDOW_MS,
    WINDOW_SAMPLES,
    SileroVad,
    SileroVadStream,
    VadWindow,
    default_model_path,
)
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import TurnDetection
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS, load_speech

# --- SileroVad ---------------------------------------------------------------------------


def spoken(events: list[TurnEvent]) -> list[TurnEvent]:
    """The turn boundaries alone (pause hints left out)."""
    return [e for e in events if not isinstance(e, SpeechPause)]


def test_model_is_found_and_has_the_expected_signature() -> None:
    path = default_model_path()
    assert path.name == "silero_vad.onnx" and path.is_file()
    vad = SileroVad.shared()
    probability, state = vad.infer(np.zeros((1, 576), dtype=np.float32), np.zeros((2, 1, 128), np.float32))
    assert 0.0 <= probability <= 1.0
    assert state.shape == (2, 1, 128)


def test_shared_model_is_loaded_once_even_under_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    real_load = SileroVad.load
    loads: list[int] = []

    def slow_load(path: object = None) -> SileroVad:
        loads.append(1)
        time.sleep(0.05)  # widen the window in which a racing thread could load again
        return real_load()

    monkeypatch.setattr(SileroVad, "_shared", None)
    monkeypatch.setattr(SileroVad, "load", staticmethod(slow_load))
    seen: list[SileroVad] = []
    barrier = threading.Barrier(8)

    def get() -> None:
        barrier.wait()
        seen.append(SileroVad.shared())

    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1
    assert len(seen) == 8 and len({id(v) for v in seen}) == 1
    assert SileroVadStream()._model is SileroVad.shared()


def _speech_windows(windows: list[VadWindow], start_ms: int, end_ms: int) -> list[float]:
    return [w.probability for w in windows if start_ms < w.end_ms - WINDOW_MS and w.end_ms <= end_ms]


def test_speech_scores_high_and_silence_low() -> None:
    stream = SileroVad.shared().stream()
    windows = stream.process(load_speech(16000))
    assert [w.end_ms for w in windows] == [WINDOW_MS * (i + 1) for i in range(len(windows))]
    inside = _speech_windows(windows, SPEECH_START_MS + 100, SPEECH_END_MS - 100)
    before = _speech_windows(windows, 0, SPEECH_START_MS - 64)
    after = _speech_windows(windows, SPEECH_END_MS + 300, 10**9)
    assert np.median(inside) > 0.9
    assert np.mean(np.array(inside) > 0.5) > 0.85
    assert max(before) < 0.1
    assert max(after) < 0.1


@pytest.mark.parametrize("level", [0.01, 0.05, 0.2])
def test_white_noise_is_not_speech(level: float) -> None:
    rng = np.random.default_rng(int(level * 1000))
    noise = (rng.standard_normal(16000 * 3) * level).astype(np.float32)
    windows = SileroVad.shared().stream().process(noise)
    assert max(w.probability for w in windows) < 0.3
    assert spoken(TurnDetector(TurnDetection()).feed_many(windows)) == []


def test_digital_silence_is_not_speech() -> None:
    windows = SileroVad.shared().stream().process(np.zeros(16000 * 2, dtype=np.float32))
    assert len(windows) == 62
    assert max(w.probability for w in windows) < 0.05


def test_chunking_does_not_change_results() -> None:
    speech = load_speech(16000)
    whole = SileroVad.shared().stream().process(speech)
    stream = SileroVad.shared().stream()
    rng = np.random.default_rng(3)
    chunked: list[VadWindow] = []
    i = 0
    while i < speech.size:
        n = int(rng.integers(1, 1400))
        chunked.extend(stream.process(speech[i : i + n]))
        i += n
    assert [w.end_ms for w in chunked] == [w.end_ms for w in whole]
    assert np.allclose([w.probability for w in chunked], [w.probability for w in whole], atol=1e-6)
    assert stream.buffered_samples == speech.size % WINDOW_SAMPLES
    assert stream.processed_ms == len(whole) * WINDOW_MS


def test_streams_are_independent_and_reset_restarts() -> None:
    speech = load_speech(16000)[:16000]
    a = SileroVad.shared().stream()
    b = SileroVad.shared().stream()
    first = a.process(speech)
    b.process(np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 0.1)
    assert a.process(np.zeros(0, dtype=np.float32)) == []
    a.reset()
    assert a.processed_ms == 0 and a.buffered_samples == 0
    assert a.process(speech) == first


def test_input_is_not_retained_by_reference() -> None:
    stream = SileroVad.shared().stream()
    buf = load_speech(16000)[8000:8700].copy()  # 188 samples stay buffered
    stream.process(buf)
    buf[:] = 0.0
    reference = SileroVad.shared().stream()
    reference.process(load_speech(16000)[8000:8700])
    tail = load_speech(16000)[8700:9300]
    assert stream.process(tail) == reference.process(tail)


def test_rejects_non_mono_input() -> None:
    with pytest.raises(ValueError):
        SileroVad.shared().stream().process(np.zeros((2, 512), dtype=np.float32))


@pytest.mark.parametrize(("encoding", "rate"), [(Encoding.G711_ULAW, 8000), (Encoding.PCM16, 24000)])
def test_end_to_end_wire_audio_to_turn_events(encoding: Encoding, rate: int) -> None:
    # Client audio in 20 ms chunks -> converter's 16 kHz tap -> VAD -> turn events,
    # with the timestamps landing where the fixture's sentence really is.
    wire = encode(load_speech(rate), encoding)
    conv = InputConverter(AudioFormat(encoding=encoding, rate=rate), 24000)
    stream = SileroVad.shared().stream()
    detector = TurnDetector(TurnDetection(prefix_padding_ms=300, silence_duration_ms=500))
    step = rate // 50 * encoding.bytes_per_sample
    events: list[TurnEvent] = []
    for i in range(0, len(wire), step):
        _, feed = conv.convert_with_vad_feed(wire[i : i + step])
        events.extend(spoken(detector.feed_many(stream.process(feed))))
    assert len(events) == 2
    start, stop = events
    assert isinstance(start, SpeechStart) and isinstance(stop, SpeechStop)
    assert SPEECH_START_MS - 300 - 64 <= start.audio_start_ms <= SPEECH_START_MS - 300 + 128
    assert SPEECH_END_MS + 500 - 64 <= stop.audio_end_ms <= SPEECH_END_MS + 500 + 200


# --- TurnDetector ------------------------------------------------------------------------


def _windows(probabilities: list[float], first_end_ms: int = WINDOW_MS) -> list[tuple[int, float]]:
    return [(first_end_ms + i * WINDOW_MS, p) for i, p in enumerate(probabilities)]


def _detector(**kwargs: Any) -> TurnDetector:
    return TurnDetector(TurnDetection(**kwargs))


def test_start_reports_onset_minus_prefix_padding() -> None:
    td = _detector(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500)
    # Silent until 1024 ms, then speech: onset is the start of window 33 (1024 ms).
    events = spoken(td.feed_many(_windows([0.1] * 32 + [0.9] * 10)))
    assert events == [SpeechStart(1024 - 300)]
    assert td.in_speech


def test_start_is_declared_after_min_speech_run() -> None:
    td = _detector(threshold=0.5, prefix_padding_ms=0)
    assert td.feed(32, 0.1) is None
    assert td.feed(64, 0.9) is None  # 32 ms of speech: not yet
    assert td.feed(96, 0.9) == SpeechStart(32)  # 64 ms: declared, from the onset


def test_single_window_click_is_ignored() -> None:
    td = _detector(threshold=0.5)
    assert spoken(td.feed_many(_windows([0.1, 0.95, 0.1, 0.1, 0.97, 0.2, 0.1] * 5))) == []
    assert not td.in_speech


def test_min_speech_ms_is_configurable() -> None:
    td = TurnDetector(TurnDetection(prefix_padding_ms=0), min_speech_ms=0)
    assert td.feed(32, 0.9) == SpeechStart(0)
    slow = TurnDetector(TurnDetection(prefix_padding_ms=0), min_speech_ms=160)
    assert spoken(slow.feed_many(_windows([0.9] * 4))) == []
    assert slow.feed(160, 0.9) == SpeechStart(0)


def test_prefix_padding_is_clamped_at_zero() -> None:
    td = _detector(prefix_padding_ms=300)
    assert spoken(td.feed_many(_windows([0.2, 0.2, 0.9, 0.9]))) == [SpeechStart(0)]  # onset 64 - 300 < 0


def test_stop_after_silence_duration() -> None:
    td = _detector(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=200)
    events = spoken(td.feed_many(_windows([0.9] * 10 + [0.05] * 10)))
    # Silence starts at 320 ms; 200 ms later falls inside the 7th silent window (ends 544 ms).
    assert events == [SpeechStart(0), SpeechStop(544)]
    assert not td.in_speech


def test_zero_silence_duration_stops_on_first_silent_window() -> None:
    td = _detector(prefix_padding_ms=0, silence_duration_ms=0)
    assert spoken(td.feed_many(_windows([0.9, 0.9, 0.1]))) == [SpeechStart(0), SpeechStop(96)]


def test_hysteresis_middle_band_does_not_start_the_silence_timer() -> None:
    # threshold 0.5 -> negative threshold 0.35: scores of 0.4 keep the turn alive.
    td = _detector(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=100)
    assert td.neg_threshold == pytest.approx(0.35)
    events = spoken(td.feed_many(_windows([0.9, 0.9] + [0.4] * 30)))
    assert events == [SpeechStart(0)]
    assert td.in_speech


def test_hysteresis_middle_band_neither_resets_nor_hides_a_running_timer() -> None:
    td = _detector(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=150)
    spoken(td.feed_many(_windows([0.9, 0.9])))
    # Silence starts at 64 ms; a 0.4 window does not cancel it, so 150 ms on it ends.
    events = spoken(td.feed_many(_windows([0.1, 0.4, 0.1, 0.4, 0.1], first_end_ms=96)))
    assert events == [SpeechStop(224)]


def test_speech_above_threshold_cancels_the_silence_timer() -> None:
    td = _detector(threshold=0.5, prefix_padding_ms=0, silence_duration_ms=128)
    probs = [0.9, 0.9, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1]
    # The pause at 64..160 ms is 96 ms < 128 ms; the 0.6 window resets it; the second
    # pause starts at 192 ms and reaches 128 ms at the window ending 320 ms.
    assert spoken(td.feed_many(_windows(probs))) == [SpeechStart(0), SpeechStop(320)]


def test_low_threshold_keeps_a_positive_negative_threshold() -> None:
    td = _detector(threshold=0.1)
    assert td.neg_threshold == pytest.approx(0.01)


def test_two_turns_and_start_never_precedes_previous_stop() -> None:
    td = _detector(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=96)
    probs = [0.0] * 20 + [0.9] * 5 + [0.0] * 4 + [0.9] * 5 + [0.0] * 5
    events = spoken(td.feed_many(_windows(probs)))
    # Turn 1: onset 640 ms. Silence from 800 ms; 96 ms later it stops at 896 ms.
    # Turn 2: onset 928 ms; 928 - 300 would reach back into turn 1, so it starts at 896.
    assert events == [SpeechStart(340), SpeechStop(896), SpeechStart(896), SpeechStop(1184)]


def test_reset_forgets_speech_and_history() -> None:
    td = _detector(prefix_padding_ms=0)
    spoken(td.feed_many(_windows([0.9, 0.9])))
    assert td.in_speech
    td.reset()
    assert not td.in_speech
    assert td.feed(32, 0.1) is None
    assert spoken(td.feed_many(_windows([0.9, 0.9], first_end_ms=64))) == [SpeechStart(32)]


def test_nan_probability_is_treated_as_silence() -> None:
    td = _detector(prefix_padding_ms=0, silence_duration_ms=0)
    assert spoken(td.feed_many(_windows([0.9, 0.9, float("nan")]))) == [SpeechStart(0), SpeechStop(96)]


def test_threshold_from_config_is_used() -> None:
    td = _detector(threshold=0.8, prefix_padding_ms=0)
    assert spoken(td.feed_many(_windows([0.7] * 10))) == []
    assert spoken(td.feed_many(_windows([0.85, 0.85], first_end_ms=352))) == [SpeechStart(320)]


def test_a_pause_is_announced_when_the_silence_timer_starts() -> None:
    td = TurnDetector(TurnDetection(silence_duration_ms=96, prefix_padding_ms=0))
    events = td.feed_many(_windows([0.9, 0.9, 0.05, 0.9, 0.05, 0.05, 0.05, 0.05]))
    assert events == [SpeechStart(0), SpeechPause(64), SpeechPause(128), SpeechStop(224)]
    # A window in the hysteresis band neither starts a pause nor ends it.
    td = TurnDetector(TurnDetection(silence_duration_ms=1000))
    assert spoken(td.feed_many(_windows([0.9, 0.9]))) == [SpeechStart(0)]
    assert td.feed_many(_windows([0.4, 0.4], first_end_ms=96)) == []
