"""StreamResampler: chunking must not change the result, and flush/reset must isolate streams."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from duplex_gateway.audio.resample import StreamResampler
from tests.fixtures import load_speech

RATE_PAIRS = [(8000, 24000), (48000, 16000), (24000, 16000), (16000, 24000), (44100, 16000), (8000, 16000)]


def _chunked(resampler: StreamResampler, x: npt.NDArray[np.float32], seed: int) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    parts = []
    i = 0
    while i < x.size:
        n = int(rng.integers(1, 1500))
        parts.append(resampler.process(x[i : i + n]))
        i += n
    parts.append(resampler.flush())
    return np.concatenate(parts)


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_chunked_equals_one_shot(in_rate: int, out_rate: int) -> None:
    x = load_speech(in_rate)
    one_shot = soxr.resample(x, in_rate, out_rate, quality="HQ")
    chunked = _chunked(StreamResampler(in_rate, out_rate), x, seed=in_rate + out_rate)
    assert chunked.dtype == np.float32
    assert chunked.size == one_shot.size
    assert np.max(np.abs(chunked - one_shot)) < 1e-6


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_output_length_prediction(in_rate: int, out_rate: int) -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 159, 160, 161, 4799, 48_000):
        r = StreamResampler(in_rate, out_rate)
        x = (rng.standard_normal(n) * 0.1).astype(np.float32)
        assert np.concatenate([r.process(x), r.flush()]).size == r.output_length(n)


def test_sine_survives_without_clicks_at_chunk_edges() -> None:
    # A 440 Hz tone fed in 10 ms chunks comes out as a clean 440 Hz tone: a discontinuity
    # at chunk edges would show up as a large sample-to-sample jump.
    r = StreamResampler(8000, 24000)
    t = np.arange(8000 * 2) / 8000
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    y = np.concatenate([r.process(x[i : i + 80]) for i in range(0, x.size, 80)] + [r.flush()])
    steady = y[2400:-2400]
    max_step = 0.5 * 2 * np.pi * 440 / 24000  # the tone's own steepest slope per sample
    assert np.max(np.abs(np.diff(steady))) < max_step * 1.01
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(y.size) / 24000)
    assert np.max(np.abs(y[2400:-2400] - expected[2400:-2400])) < 1e-3


def test_identity_is_a_passthrough() -> None:
    r = StreamResampler(16000, 16000)
    assert r.is_identity
    x = np.linspace(-1, 1, 321, dtype=np.float32)
    assert np.array_equal(r.process(x), x)
    assert r.flush().size == 0
    assert r.process(x.astype(np.float64)).dtype == np.float32


def test_flush_resets_for_an_independent_next_stream() -> None:
    x = load_speech(24000)[:12000]
    r = StreamResampler(24000, 16000)
    first = np.concatenate([r.process(x), r.flush()])
    second = np.concatenate([r.process(x), r.flush()])
    assert np.array_equal(first, second)


def test_reset_drops_buffered_audio() -> None:
    x = load_speech(24000)
    r = StreamResampler(24000, 16000)
    r.process(x[:5000])
    r.reset()
    fresh = StreamResampler(24000, 16000)
    a = np.concatenate([r.process(x[5000:9000]), r.flush()])
    b = np.concatenate([fresh.process(x[5000:9000]), fresh.flush()])
    assert np.array_equal(a, b)


def test_flush_without_input_and_empty_chunks() -> None:
    r = StreamResampler(8000, 24000)
    assert r.flush().size == 0
    assert r.process(np.zeros(0, dtype=np.float32)).size == 0
    assert r.flush().size == 0


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        StreamResampler(0, 16000)
    with pytest.raises(ValueError):
        StreamResampler(16000, 24000).process(np.zeros((2, 10), dtype=np.float32))
