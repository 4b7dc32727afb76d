"""Whisper's log-mel spectrogram in numpy, as the Smart Turn end-of-turn model reads it.

The steps are Whisper's: 16 kHz audio, a 25 ms periodic Hann window every 10 ms
(``n_fft`` 400, hop 160) on a centred, reflect-padded STFT, the power spectrum
projected onto 80 Slaney mel bands (0 to 8 kHz, each band scaled to unit area),
``log10`` floored at 1e-10, then everything more than 8 decades below the
loudest value raised to that level and the result mapped by ``(x + 4) / 4`` to
roughly -1..1. The STFT's last frame (centred past the end of the audio) is
dropped, so 8 s give exactly 800 frames.

Smart Turn's feature extractor also scales the waveform to zero mean and unit
variance first (:func:`normalize`); :func:`log_mel` does so unless told not to.
"""

from __future__ import annotations

import functools
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["HOP_LENGTH", "N_FFT", "N_MELS", "SAMPLE_RATE", "log_mel", "mel_filterbank", "normalize"]

SAMPLE_RATE: Final = 16_000
#: FFT size and window length: 25 ms.
N_FFT: Final = 400
#: Samples between frames: 10 ms.
HOP_LENGTH: Final = 160
N_MELS: Final = 80

_LOG_FLOOR: Final = 1e-10
#: Dynamic range kept below the loudest band, in decades of power (80 dB).
_DYNAMIC_RANGE: Final = 8.0
_VARIANCE_EPSILON: Final = 1e-7

# Slaney's mel scale: linear (3 mels per 200 Hz) up to 1 kHz, logarithmic above,
# with 27 mels spanning a factor of 6.4 in frequency.
_BREAK_HZ: Final = 1000.0
_HZ_PER_MEL: Final = 200.0 / 3.0
_BREAK_MEL: Final = _BREAK_HZ / _HZ_PER_MEL  # 15
_LOG_STEP: Final = np.log(6.4) / 27.0


def _hz_to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    linear = hz / _HZ_PER_MEL
    # The maximum keeps log() away from 0 Hz; those bins take the linear branch anyway.
    logarithmic = _BREAK_MEL + np.log(np.maximum(hz, _BREAK_HZ) / _BREAK_HZ) / _LOG_STEP
    return np.where(hz >= _BREAK_HZ, logarithmic, linear)


def _mel_to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    linear = mel * _HZ_PER_MEL
    logarithmic = _BREAK_HZ * np.exp(_LOG_STEP * (np.maximum(mel, _BREAK_MEL) - _BREAK_MEL))
    return np.where(mel >= _BREAK_MEL, logarithmic, linear)


@functools.cache
def mel_filterbank() -> npt.NDArray[np.float64]:
    """The 80 triangular Slaney mel filters over the 201 FFT bins, shape (80, 201); read-only.

    Band ``i`` rises from edge ``i`` to edge ``i + 1`` and falls to edge ``i + 2``,
    the 82 edges evenly spaced in mels from 0 Hz to 8 kHz, and is scaled by
    ``2 / (width in Hz)`` so that every band has the same area.
    """
    bins = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(
        np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(SAMPLE_RATE / 2)), N_MELS + 2)
    )
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - low) / (centre - low)
    falling = (high - bins[None, :]) / (high - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (high - low))
    filters.setflags(write=False)
    return filters


@functools.cache
def _sparse_filterbank() -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.intp]]:
    """The filterbank as (bins, weights, first entry of each band), band after band.

    Each FFT bin feeds at most two bands, so summing the few weighted bins per band
    is cheaper than a dense product, and keeps BLAS (whose worker threads would
    contend with the rest of the process) out of the feature path.
    """
    filters = mel_filterbank()
    bins: list[npt.NDArray[np.intp]] = []
    for band in filters:
        nonzero = np.flatnonzero(band)
        # A band always gets one entry: reduceat needs strictly increasing offsets.
        bins.append(nonzero if nonzero.size else np.array([int(np.argmax(band))]))
    starts = np.cumsum([0] + [b.size for b in bins[:-1]])
    flat = np.concatenate(bins)
    weights = np.concatenate([filters[band, b] for band, b in enumerate(bins)])
    return flat, weights, starts.astype(np.intp)


@functools.cache
def _hann() -> npt.NDArray[np.float64]:
    # Periodic (the window of an N-point DFT), not the symmetric one np.hanning gives.
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)
    window.setflags(write=False)
    return window


def normalize(samples: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """``samples`` shifted to zero mean and scaled to unit variance (silence stays silence)."""
    audio = np.asarray(samples, dtype=np.float64)
    scaled: npt.NDArray[np.float64] = (audio - audio.mean()) / np.sqrt(audio.var() + _VARIANCE_EPSILON)
    return scaled


def log_mel(samples: npt.NDArray[np.floating], *, normalize_audio: bool = True) -> npt.NDArray[np.float32]:
    """Whisper's log-mel features of 16 kHz mono ``samples``: float32, (80, ``len(samples) // 160``).

    ``normalize_audio`` scales the waveform first (:func:`normalize`), as Smart
    Turn's extractor does; Whisper's own does not. The clamp to 8 decades below
    the peak is taken over these samples, so the caller decides the window
    (Smart Turn: exactly the last 8 s).
    """
    audio = np.asarray(samples)
    if audio.ndim != 1:
        raise ValueError(f"expected mono 1-D samples, got shape {audio.shape}")
    if audio.size < N_FFT // 2 + 1:
        # Reflect padding needs more samples than it mirrors.
        raise ValueError(f"need at least {N_FFT // 2 + 1} samples, got {audio.size}")
    signal = normalize(audio) if normalize_audio else audio.astype(np.float64)
    padded = np.pad(signal, N_FFT // 2, mode="reflect")
    # Frame t covers padded[t * hop : t * hop + n_fft], i.e. is centred on sample t * hop;
    # the one centred on the very end is left out, as Whisper leaves it out.
    frames = audio.size // HOP_LENGTH
    stride = padded.strides[0]
    windows = np.lib.stride_tricks.as_strided(
        padded, shape=(frames, N_FFT), strides=(HOP_LENGTH * stride, stride), writeable=False
    )
    spectrum = np.fft.rfft(windows * _hann(), axis=1)
    power = spectrum.real**2 + spectrum.imag**2  # (frames, 201)
    bins, weights, starts = _sparse_filterbank()
    mel = np.add.reduceat(power[:, bins] * weights, starts, axis=1).T  # (80, frames)
    log_spec = np.log10(np.maximum(mel, _LOG_FLOOR))
    log_spec = np.maximum(log_spec, log_spec.max() - _DYNAMIC_RANGE)
    features: npt.NDArray[np.float32] = ((log_spec + 4.0) / 4.0).astype(np.float32)
    return features
