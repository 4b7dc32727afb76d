"""What the simulated callers say: real speech or a tone, cut into 20 ms frames.

Every frame is rendered once, as the finished ``input_audio_buffer.append``
message, and shared by all callers: the bench must spend its CPU on timing, not
on base64, or it becomes the bottleneck it is meant to detect.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["FRAME_MS", "CallerAudio", "default_speech_path", "load_caller_audio"]

FRAME_MS = 20
#: Below this amplitude a sample counts as silence when finding where speech ends.
_SPEECH_LEVEL = 0.01


def default_speech_path() -> Path:
    """The speech recording committed with the tests, when the bench runs from a checkout."""
    return Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "speech_16k.wav"


@dataclass(frozen=True)
class CallerAudio:
    """One caller turn as ready-to-send append messages at ``rate`` Hz (PCM16).

    ``frames`` is the whole recording (leading silence, speech, trailing
    silence); ``speech_start`` / ``speech_end`` are the indices of the frames
    holding the first and last speech sample; ``silence`` is one silent frame.
    """

    rate: int
    kind: str
    frames: tuple[str, ...]
    silence: str
    speech_start: int
    speech_end: int
    #: The same frames as PCM16 (a WebRTC caller's microphone track plays these).
    pcm: tuple[bytes, ...] = ()

    @property
    def frame_bytes(self) -> int:
        """PCM16 bytes in one frame."""
        return self.rate * FRAME_MS // 1000 * 2


def _append(pcm: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode("ascii")})


def _tone(rate: int) -> npt.NDArray[np.float32]:
    # A 2 s voiced-like tone (220 Hz with a slow tremolo) between 500 ms of silence each side.
    t = np.arange(int(rate * 2.0)) / rate
    body = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    gap = np.zeros(rate // 2)
    return np.concatenate([gap, body, gap]).astype(np.float32)


def _speech(path: Path, rate: int) -> npt.NDArray[np.float32]:
    import soundfile as sf
    import soxr

    samples, native = sf.read(path, dtype="float32", always_2d=False)
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    if native != rate:
        samples = soxr.resample(samples, native, rate, quality="HQ")
    return np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)


def load_caller_audio(rate: int, *, kind: str = "speech", path: Path | None = None) -> CallerAudio:
    """The caller's recording at ``rate``: ``kind`` ``speech`` (a WAV file) or ``tone``."""
    samples = _speech(path or default_speech_path(), rate) if kind == "speech" else _tone(rate)
    step = rate * FRAME_MS // 1000
    pcm = (samples * 32767).astype("<i2")
    pad = (-len(pcm)) % step
    pcm = np.concatenate([pcm, np.zeros(pad, dtype="<i2")])
    loud = np.flatnonzero(np.abs(samples) > _SPEECH_LEVEL)
    if loud.size == 0:
        raise ValueError(f"no sound above {_SPEECH_LEVEL} in the caller audio")
    raw = tuple(pcm[i : i + step].tobytes() for i in range(0, len(pcm), step))
    return CallerAudio(
        rate=rate,
        kind=kind,
        frames=tuple(_append(frame) for frame in raw),
        pcm=raw,
        silence=_append(bytes(step * 2)),
        speech_start=int(loud[0]) // step,
        speech_end=int(loud[-1]) // step,
    )
