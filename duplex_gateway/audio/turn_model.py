"""Semantic end of turn: the Smart Turn v3.2 model says whether a caller has finished.

Voice activity only hears that a caller went quiet; Smart Turn, a Whisper-tiny
encoder with a classifier trained on complete and cut-off utterances, hears from
the words and intonation of the last 8 s whether the turn is over ("I'd like to
book a table for" is not). :class:`SmartTurn` loads the model once per process
(:meth:`SmartTurn.shared`); :meth:`SmartTurn.prepare` turns a turn's audio into
the model's input and :meth:`SmartTurn.predict` gives, per input, the
probability that the turn is complete.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from duplex_gateway.audio.mel import HOP_LENGTH, N_MELS, SAMPLE_RATE, log_mel

__all__ = ["FRAMES", "WINDOW_SAMPLES", "SmartTurn", "default_model_path"]

#: The model hears the last 8 s of a turn (shorter turns are padded with silence in front).
WINDOW_SAMPLES: Final = 8 * SAMPLE_RATE
#: Feature frames in that window.
FRAMES: Final = WINDOW_SAMPLES // HOP_LENGTH  # 800

_INPUT: Final = "input_features"

#: The Smart Turn model shipped inside this package (see models/README.md for its origin and licence).
_PACKAGED_MODEL: Final = Path(__file__).resolve().parents[1] / "models" / "smart_turn_v3.2.onnx"


def default_model_path() -> Path:
    """The ``smart_turn_v3.2.onnx`` file shipped inside this package (BSD-2-Clause, by Daily).

    The gateway carries it itself: the package it comes in (``pipecat-ai``) pins
    versions of the gateway's own dependencies that clash with the gateway's.
    """
    if not _PACKAGED_MODEL.is_file():
        raise FileNotFoundError(
            f"the end-of-turn model {_PACKAGED_MODEL} is missing from this install of duplex-gateway: "
            "reinstall the package (pip install --force-reinstall duplex-gateway)"
        )
    return _PACKAGED_MODEL


class SmartTurn:
    """A loaded Smart Turn model; stateless, safe to share between threads and sessions."""

    _shared: SmartTurn | None = None
    _shared_lock: Final = threading.Lock()

    def __init__(self, session: ort.InferenceSession) -> None:
        inputs = session.get_inputs()
        if [i.name for i in inputs] != [_INPUT] or list(inputs[0].shape[1:]) != [N_MELS, FRAMES]:
            raise ValueError(
                "not a Smart Turn v3 model: inputs are "
                f"{[(i.name, i.shape) for i in inputs]}, expected {_INPUT} [batch, {N_MELS}, {FRAMES}]"
            )
        self._session: Final = session

    @classmethod
    def load(cls, path: Path | str | None = None, *, threads: int = 1) -> SmartTurn:
        """A new model instance from ``path`` (default: the packaged model).

        One intra-op thread by default: the gateway runs the model beside every
        session's audio work, and one call must not take all the cores from them.
        """
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        model = str(path if path is not None else default_model_path())
        return cls(ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"]))

    @classmethod
    def shared(cls) -> SmartTurn:
        """The process-wide model, loaded on first use (thread-safe)."""
        shared = cls._shared
        if shared is None:
            with cls._shared_lock:
                shared = cls._shared
                if shared is None:
                    shared = cls._shared = cls.load()
        return shared

    @staticmethod
    def prepare(samples_16k: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        """The model's input for a turn heard so far: (80, 800) float32.

        Only the last 8 s of ``samples_16k`` (mono, 16 kHz, -1..1) count; a
        shorter turn is padded with silence at the start, so its end is always
        where the model was trained to look for it.
        """
        audio = np.asarray(samples_16k, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {audio.shape}")
        if audio.size >= WINDOW_SAMPLES:
            window = audio[-WINDOW_SAMPLES:]
        else:
            window = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
            window[WINDOW_SAMPLES - audio.size :] = audio
        return log_mel(window)

    def predict(self, features: npt.NDArray[np.float32] | Sequence[npt.NDArray[np.float32]]) -> list[float]:
        """The probability that each turn is complete, for a batch of :meth:`prepare` outputs.

        ``features`` is [batch, 80, 800] (or a sequence of (80, 800) arrays);
        the model's output is already a probability (a sigmoid), 0..1.
        """
        batch = np.ascontiguousarray(
            features if isinstance(features, np.ndarray) else np.stack(list(features)), dtype=np.float32
        )
        if batch.ndim != 3 or batch.shape[1:] != (N_MELS, FRAMES):
            raise ValueError(f"expected features [batch, {N_MELS}, {FRAMES}], got shape {batch.shape}")
        if batch.shape[0] == 0:
            return []
        (probabilities,) = self._session.run(None, {_INPUT: batch})
        return [float(p) for p in np.asarray(probabilities, dtype=np.float32).reshape(-1)]

    def completion(self, samples_16k: npt.NDArray[np.floating]) -> float:
        """The probability that the turn ending with ``samples_16k`` is complete (blocking)."""
        return self.predict(self.prepare(samples_16k)[None])[0]
