"""The batched VAD: many streams in one model call give each stream exactly its own probabilities."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from duplex_gateway.audio.vad import SileroVad, SileroVadStream
from duplex_gateway.audio.vad_batch import VadBatcher
from tests.fixtures import load_speech


def _streams_audio(count: int) -> list[np.ndarray]:
    speech = load_speech().astype(np.float32)
    # Each stream hears the speech at another offset and loudness, so their states differ.
    return [np.roll(speech, 1600 * index) * (0.4 + 0.1 * index) for index in range(count)]


async def test_batched_windows_equal_one_stream_at_a_time() -> None:
    model = SileroVad.shared()
    batcher = VadBatcher(model, max_batch=4)  # fewer than the streams: batches split
    try:
        audios = _streams_audio(6)
        expected = [SileroVadStream(model).process(audio) for audio in audios]
        streams = [SileroVadStream(model) for _ in audios]
        got: list[list[tuple[int, float]]] = [[] for _ in audios]

        async def feed(index: int) -> None:
            audio = audios[index]
            # Ragged chunks (10 to 70 ms) so one request may hold several windows.
            step = 160 * (1 + index)
            for offset in range(0, audio.size, step):
                windows = await batcher.windows(streams[index], audio[offset : offset + step])
                got[index].extend((w.end_ms, w.probability) for w in windows)

        await asyncio.gather(*(feed(index) for index in range(len(audios))))
        for mine, theirs in zip(got, expected, strict=True):
            assert [end for end, _ in mine] == [w.end_ms for w in theirs]
            np.testing.assert_allclose([p for _, p in mine], [w.probability for w in theirs], atol=1e-4)
    finally:
        batcher.close()


async def test_a_model_failure_fails_the_request_not_the_batcher() -> None:
    class Broken(SileroVad):
        def infer_batch(self, windows, states):  # type: ignore[no-untyped-def]
            raise RuntimeError("model fault")

    shared = SileroVad.shared()
    batcher = VadBatcher(Broken(shared._session))
    try:
        stream = SileroVadStream(shared)
        with pytest.raises(RuntimeError, match="model fault"):
            await batcher.windows(stream, np.zeros(1024, dtype=np.float32))
        # A chunk that completes no window never reaches the model.
        assert await batcher.windows(stream, np.zeros(100, dtype=np.float32)) == []
    finally:
        batcher.close()


async def test_a_result_that_is_not_finite_starts_the_streams_state_over() -> None:
    """One undefined window must not leave a session deaf: its state would make every later window NaN."""

    class Flaky(SileroVad):
        calls = 0

        def infer_batch(self, windows, states):  # type: ignore[no-untyped-def]
            probabilities, next_states = super().infer_batch(windows, states)
            Flaky.calls += 1
            if Flaky.calls == 3:
                probabilities[:] = np.nan
                next_states[:] = np.nan
            return probabilities, next_states

    shared = SileroVad.shared()
    batcher = VadBatcher(Flaky(shared._session))
    try:
        speech = load_speech().astype(np.float32)
        stream = SileroVadStream(shared)
        got = []
        for offset in range(0, speech.size, 512):
            got.extend(await batcher.windows(stream, speech[offset : offset + 512]))
        assert stream.state_resets == 1
        assert got[2].probability == 0.0
        assert np.isfinite(stream.state).all()
        # The speech after it is heard as speech again.
        assert max(w.probability for w in got[3:]) > 0.9
    finally:
        batcher.close()
