"""Recognition from wheel-shipped models: pocketsphinx partials and Whisper finals on real speech."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from duplex_gateway.engine.embedded.asr import (
    SAMPLE_RATE,
    FinalRecognizer,
    PartialRecognizerPool,
    pcm16_to_float32,
    whisper_model_path,
)
from tests.fixtures import load_speech

CHUNK = SAMPLE_RATE // 10 * 2  # 100 ms of PCM16


def test_pcm16_to_float32() -> None:
    pcm = np.array([0, 16384, -32768, 32767], dtype="<i2").tobytes() + b"\x01"  # odd trailing byte
    assert pcm16_to_float32(pcm).tolist() == [0.0, 0.5, -1.0, 32767 / 32768]
    assert pcm16_to_float32(b"").size == 0


# -- partials ------------------------------------------------------------------------------


def test_partials_stream_as_audio_arrives(partial_pool: PartialRecognizerPool, speech_pcm: bytes) -> None:
    recognizer = partial_pool.acquire()
    try:
        partials: list[str] = []
        started = time.perf_counter()
        for offset in range(0, len(speech_pcm), CHUNK):
            text = recognizer.feed(speech_pcm[offset : offset + CHUNK])
            if text is not None:
                partials.append(text)
        final = recognizer.end()
        elapsed = time.perf_counter() - started
    finally:
        partial_pool.release(recognizer)
    audio_s = len(speech_pcm) / 2 / SAMPLE_RATE
    print(
        f"\npocketsphinx: {audio_s:.2f} s in 100 ms chunks took {elapsed:.3f} s (RTF {elapsed / audio_s:.3f})"
    )
    assert len(partials) >= 3  # the hypothesis grows while the sentence is spoken
    assert all(a != b for a, b in itertools.pairwise(partials))  # only changes are reported
    assert "weather" in " ".join(partials) + " " + final  # rough, but it hears the key word


def test_silence_gives_no_partial(partial_pool: PartialRecognizerPool) -> None:
    recognizer = partial_pool.acquire()
    try:
        texts = [recognizer.feed(bytes(CHUNK)) for _ in range(10)]
        assert all(text in (None, "") for text in texts)
        assert recognizer.end() == ""
    finally:
        partial_pool.release(recognizer)


def test_odd_and_empty_chunks_are_accepted(partial_pool: PartialRecognizerPool) -> None:
    recognizer = partial_pool.acquire()
    try:
        assert recognizer.feed(b"") is None
        recognizer.feed(b"\x00\x01\x02")  # an odd byte is dropped, not misaligned
        recognizer.reset()
        assert recognizer.hypothesis == ""
    finally:
        partial_pool.release(recognizer)


def test_long_utterance_restarts_to_bound_memory(partial_pool: PartialRecognizerPool) -> None:
    recognizer = partial_pool.acquire(max_utterance_s=1.0)
    try:
        for _ in range(30):  # 3 s of audio into a 1 s utterance bound
            recognizer.feed(bytes(CHUNK))
            assert recognizer._utterance_bytes <= SAMPLE_RATE * 2
    finally:
        partial_pool.release(recognizer)


def test_decoders_are_reused(partial_pool: PartialRecognizerPool) -> None:
    partial_pool.prewarm(1)
    created = partial_pool.created
    first = partial_pool.acquire()
    decoder = first.decoder
    partial_pool.release(first)
    second = partial_pool.acquire()
    assert second.decoder is decoder and partial_pool.created == created
    partial_pool.release(second)


def test_pool_is_shared(partial_pool: PartialRecognizerPool) -> None:
    assert PartialRecognizerPool.shared() is partial_pool


# -- finals ----------------------------------------------------------------------------------


def test_whisper_model_ships_in_its_wheel() -> None:
    path = whisper_model_path()
    assert (path / "model.bin").is_file() and (path / "tokenizer.json").is_file()


def test_final_transcript_of_the_fixture(final_recognizer: FinalRecognizer) -> None:
    speech = load_speech()
    started = time.perf_counter()
    text = final_recognizer.transcribe(speech)
    elapsed = time.perf_counter() - started
    print(f"\nwhisper tiny.en int8: {len(speech) / SAMPLE_RATE:.2f} s turn in {elapsed:.3f} s: {text!r}")
    words = text.lower()
    assert "weather" in words and "tuesday" in words


def test_final_accepts_pcm16(final_recognizer: FinalRecognizer, speech_pcm: bytes) -> None:
    assert "weather" in final_recognizer.transcribe(speech_pcm).lower()


@pytest.mark.parametrize(
    "samples",
    [
        np.zeros(SAMPLE_RATE * 2, np.float32),  # digital silence
        np.full(SAMPLE_RATE, 1e-4, np.float32),  # below the silence gate
        np.zeros(100, np.float32),  # too short for a word
        np.zeros(0, np.float32),
    ],
    ids=["silence", "hum", "short", "empty"],
)
def test_no_speech_is_empty_without_running_whisper(
    final_recognizer: FinalRecognizer, samples: np.ndarray
) -> None:
    started = time.perf_counter()
    assert final_recognizer.transcribe(samples) == ""
    assert time.perf_counter() - started < 0.05


def test_noise_is_not_words(final_recognizer: FinalRecognizer) -> None:
    noise = np.random.default_rng(7).standard_normal(SAMPLE_RATE * 2).astype(np.float32) * 0.3
    assert final_recognizer.transcribe(noise) == ""


def test_clipped_and_non_finite_input_does_not_fail(final_recognizer: FinalRecognizer) -> None:
    loud = load_speech() * 30.0  # badly clipped after the recognizer's clamp
    loud[:10] = np.nan
    loud[10:20] = np.inf
    assert isinstance(final_recognizer.transcribe(loud), str)


def test_shared_model_is_loaded_once(final_recognizer: FinalRecognizer) -> None:
    assert FinalRecognizer.shared(cpu_threads=2) is final_recognizer
