"""Whisper's log-mel features, checked on signals whose spectrum is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_gateway.audio.mel import (
    HOP_LENGTH,
    N_FFT,
    N_MELS,
    SAMPLE_RATE,
    log_mel,
    mel_filterbank,
    normalize,
)

#: Hz between FFT bins.
BIN_HZ = SAMPLE_RATE / N_FFT  # 40


def tone(hz: float, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_eight_seconds_give_whisper_800_frames_of_80_bands() -> None:
    features = log_mel(np.random.default_rng(0).standard_normal(8 * SAMPLE_RATE).astype(np.float32))
    assert features.shape == (N_MELS, 800) and features.dtype == np.float32
    # The STFT's frame centred past the end is dropped: one frame per hop.
    assert log_mel(np.zeros(12_345, dtype=np.float32)).shape == (N_MELS, 12_345 // HOP_LENGTH)


def test_filterbank_is_slaney_triangles_of_equal_area() -> None:
    filters = mel_filterbank()
    assert filters.shape == (N_MELS, N_FFT // 2 + 1)
    assert (filters >= 0).all()
    assert not filters.flags.writeable
    # Every bin feeds at most two neighbouring bands (each triangle overlaps only its neighbours).
    assert ((filters > 0).sum(axis=0) <= 2).all()
    # Slaney normalisation: each triangle has unit area in Hz. Sampled every 40 Hz the
    # sum comes close, and closer once a band spans several bins.
    areas = filters.sum(axis=1) * BIN_HZ
    np.testing.assert_allclose(areas, 1.0, rtol=0.1)
    np.testing.assert_allclose(areas[45:], 1.0, rtol=0.02)
    # Linear spacing below 1 kHz (equal widths), logarithmic above (widths grow).
    peaks = filters.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all()
    # The top band peaks just below 8 kHz (bin 200) and falls to nothing there.
    assert 185 < peaks[-1] < 200 and filters[-1, -1] == 0
    low_widths = (filters[5:25] > 0).sum(axis=1)
    assert low_widths.max() - low_widths.min() <= 1
    assert (filters[-1] > 0).sum() > 4 * low_widths.max()


def test_a_tone_on_a_bin_has_the_level_the_periodic_hann_window_gives() -> None:
    # A sine of amplitude A on bin k: |X[k]| = A * sum(w) / 2 = 100 A. A periodic Hann
    # window is 1/2 - cos/2, three DFT lines (-1/4, 1/2, -1/4): it leaks exactly half
    # that amplitude into bins k +- 1 and nothing further.
    amplitude = 0.5
    k = 25  # 1000 Hz
    features = log_mel(tone(k * BIN_HZ, 2.0, amplitude), normalize_audio=False)
    power = np.zeros(N_FFT // 2 + 1)
    power[k] = (100 * amplitude) ** 2
    power[[k - 1, k + 1]] = (50 * amplitude) ** 2
    expected = (np.log10(np.maximum(mel_filterbank() @ power, 1e-10)) + 4) / 4
    loudest = int(np.argmax(expected))
    # Frames away from the reflected edges see the steady tone.
    steady = features[:, 10:-10]
    np.testing.assert_allclose(steady[loudest], expected[loudest], atol=1e-4)
    assert (steady.argmax(axis=0) == loudest).all()
    # Bands far from the tone sit on the floor, 8 decades (2 after scaling) below the peak.
    np.testing.assert_allclose(features.min(), features.max() - 2.0, atol=1e-6)


def test_level_shifts_features_without_normalisation_and_not_with_it() -> None:
    speechlike = np.random.default_rng(1).standard_normal(SAMPLE_RATE).astype(np.float32) * 0.05
    quiet = log_mel(speechlike, normalize_audio=False)
    loud = log_mel(speechlike * 10, normalize_audio=False)
    # 20 dB more is two decades of power: + 0.5 after (x + 4) / 4.
    np.testing.assert_allclose(loud, quiet + 0.5, atol=1e-4)
    np.testing.assert_allclose(log_mel(speechlike), log_mel(speechlike * 10), atol=1e-4)


def test_frames_are_centred_on_their_hop() -> None:
    # Silence, then a tone from 1 s: frame t spans samples 160 t - 200 .. 160 t + 200.
    audio = np.concatenate([np.zeros(SAMPLE_RATE, dtype=np.float32), tone(1000.0, 1.0)])
    features = log_mel(audio, normalize_audio=False)
    floor = features.max() - 2.0
    last_silent = (SAMPLE_RATE - N_FFT // 2) // HOP_LENGTH  # 98: ends at sample 15880
    np.testing.assert_allclose(features[:, : last_silent + 1], floor, atol=1e-6)
    assert features[:, last_silent + 1].max() > floor + 0.5


def test_silence_is_flat_and_stays_silence_when_normalised() -> None:
    silence = np.zeros(8 * SAMPLE_RATE, dtype=np.float32)
    assert (normalize(silence) == 0).all()
    # log10 of the 1e-10 floor: (-10 + 4) / 4.
    np.testing.assert_array_equal(log_mel(silence), np.full((N_MELS, 800), -1.5, dtype=np.float32))


def test_normalize_gives_zero_mean_unit_variance() -> None:
    audio = np.random.default_rng(2).standard_normal(48_000).astype(np.float32) * 0.2 + 0.3
    scaled = normalize(audio)
    assert abs(scaled.mean()) < 1e-9
    assert scaled.var() == pytest.approx(1.0, rel=1e-5)


def test_rejects_what_it_cannot_frame() -> None:
    with pytest.raises(ValueError, match="mono"):
        log_mel(np.zeros((2, 16_000), dtype=np.float32))
    with pytest.raises(ValueError, match="at least"):
        log_mel(np.zeros(100, dtype=np.float32))
