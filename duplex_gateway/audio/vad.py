"""Voice activity: silero VAD inference.

:class:`SileroVad` wraps the silero VAD ONNX model. The model is loaded once per
process (:meth:`SileroVad.shared`) and every session gets its own
:class:`SileroVadStream`, which holds that session's recurrent state and turns
16 kHz float audio of any chunking into one speech probability per 32 ms window.
The turn-taking state machine reading those windows is
:class:`~duplex_gateway.audio.turn_detector.TurnDetector`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

logger = logging.getLogger(__name__)

__all__ = [
    "CONTEXT_SAMPLES",
    "SAMPLE_RATE",
    "WINDOW_MS",
    "WINDOW_SAMPLES",
    "SileroVad",
    "SileroVadStream",
    "VadWindow",
    "default_model_path",
]

#: The only rate the stream accepts (silero also knows 8 kHz; the gateway never needs it).
SAMPLE_RATE: Final = 16_000
#: Samples per inference window at 16 kHz, as silero requires.
WINDOW_SAMPLES: Final = 512
#: Trailing samples of the previous window prepended to each input, as silero requires.
CONTEXT_SAMPLES: Final = 64
WINDOW_MS: Final = WINDOW_SAMPLES * 1000 // SAMPLE_RATE  # 32

_STATE_SHAPE: Final = (2, 1, 128)
_SR_INPUT: Final = np.array(SAMPLE_RATE, dtype=np.int64)


#: The Silero VAD model shipped inside this package (see models/README.md for its origin and licence).
_PACKAGED_MODEL: Final = Path(__file__).resolve().parents[1] / "models" / "silero_vad.onnx"


def default_model_path() -> Path:
    """The ``silero_vad.onnx`` file shipped inside this package (MIT, from ``silero-vad`` 6.2.3).

    The gateway carries it itself: the ``silero-vad`` wheel declares torch, which the gateway
    never uses, so an ordinary ``pip install`` could not bring the model without PyTorch.
    """
    if not _PACKAGED_MODEL.is_file():
        raise FileNotFoundError(
            f"the voice activity model {_PACKAGED_MODEL} is missing from this install of duplex-gateway: "
            "reinstall the package (pip install --force-reinstall duplex-gateway)"
        )
    return _PACKAGED_MODEL


class SileroVad:
    """A loaded silero VAD model; stateless, safe to share between threads and sessions.

    ``onnxruntime.InferenceSession.run`` is thread-safe, and all per-stream state
    lives in :class:`SileroVadStream`, so one instance serves the whole process.
    """

    _shared: SileroVad | None = None
    _shared_lock: Final = threading.Lock()

    def __init__(self, session: ort.InferenceSession) -> None:
        names = {i.name for i in session.get_inputs()}
        if names != {"input", "state", "sr"}:
            raise ValueError(f"not a silero VAD v5+ model: inputs are {sorted(names)}")
        self._session: Final = session

    @classmethod
    def load(cls, path: Path | str | None = None) -> SileroVad:
        """A new model instance from ``path`` (default: the packaged model).

        One intra-op and one inter-op thread: a 512-sample window is far too small
        to gain from threading, and the gateway runs many streams side by side.
        """
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        model = str(path if path is not None else default_model_path())
        return cls(ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"]))

    @classmethod
    def shared(cls) -> SileroVad:
        """The process-wide model, loaded on first use (thread-safe)."""
        shared = cls._shared
        if shared is None:
            with cls._shared_lock:
                shared = cls._shared
                if shared is None:
                    shared = cls._shared = cls.load()
        return shared

    def stream(self) -> SileroVadStream:
        """A fresh per-session stream on this model."""
        return SileroVadStream(self)

    def infer(
        self, window: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[float, npt.NDArray[np.float32]]:
        """One step: ``window`` is [1, 576] (64 context + 512 new samples), ``state`` [2, 1, 128].

        Returns the speech probability and the next recurrent state.
        """
        probability, next_state = self._session.run(None, {"input": window, "state": state, "sr": _SR_INPUT})
        return float(probability[0, 0]), np.asarray(next_state, dtype=np.float32)

    def infer_batch(
        self, windows: npt.NDArray[np.float32], states: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One step of many streams at once: ``windows`` [B, 576], ``states`` [2, B, 128].

        Returns each stream's probability [B] and next state [2, B, 128].
        """
        probability, next_state = self._session.run(
            None, {"input": windows, "state": states, "sr": _SR_INPUT}
        )
        return np.asarray(probability, dtype=np.float32)[:, 0], np.asarray(next_state, dtype=np.float32)


class VadWindow(NamedTuple):
    """One inference window: where it ends in the stream, and how speech-like it was."""

    end_ms: int
    probability: float


class SileroVadStream:
    """Speech probabilities for one continuous 16 kHz stream.

    Accepts float32 chunks of any size, buffers them into 512-sample windows and
    carries silero's recurrent state and 64-sample context between windows, so
    results do not depend on how the audio was chunked. Not thread-safe.
    """

    def __init__(self, model: SileroVad | None = None) -> None:
        self._model: Final = model if model is not None else SileroVad.shared()
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
        #: Windows whose result was not finite, after which the state started over.
        self.state_resets = 0
        # One reusable [1, 576] input: context in the first 64 slots, new window after.
        self._input = np.zeros((1, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows = 0

    @property
    def processed_ms(self) -> int:
        """Audio covered by the windows inferred so far (a multiple of 32 ms)."""
        return self._windows * WINDOW_MS

    @property
    def buffered_samples(self) -> int:
        """Samples waiting for a full window."""
        return int(self._pending.size)

    def process(self, samples: npt.NDArray[np.floating]) -> list[VadWindow]:
        """Feed 16 kHz mono samples; one :class:`VadWindow` per completed 512-sample window."""
        inputs = self.take_windows(samples)
        probabilities = []
        for row in range(inputs.shape[0]):
            probability, state = self._model.infer(inputs[row : row + 1], self._state)
            probabilities.append(self.advance(probability, state))
        return self.windows_ending(probabilities)

    def advance(self, probability: float, state: npt.NDArray[np.float32]) -> float:
        """Take one window's result: its probability, and the recurrent state it leaves.

        A result that is not finite is not kept: the state it leaves would make every later
        window of the session undefined too (a caller the detector never hears again), so the
        stream starts its state over and the window counts as silence.
        """
        if math.isfinite(probability) and np.isfinite(state).all():
            self._state = state
            return probability
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self.state_resets += 1
        logger.warning("VAD: a window's result was not finite; the stream's state starts over")
        return 0.0

    def take_windows(self, samples: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        """Buffer ``samples``; the model inputs of the windows they complete, [n, 576], in order.

        Each input is the window with its 64-sample context (the previous window's
        tail) in front. Only the recurrent state is left to inference, which must
        run the rows in order and then report them with :meth:`windows_ending`.
        """
        chunk = np.asarray(samples, dtype=np.float32)
        if chunk.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {chunk.shape}")
        audio = np.concatenate((self._pending, chunk)) if self._pending.size else chunk
        full = audio.size // WINDOW_SAMPLES
        inputs = np.empty((full, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32)
        context = self._input[0, :CONTEXT_SAMPLES]
        for index in range(full):
            window = audio[index * WINDOW_SAMPLES : (index + 1) * WINDOW_SAMPLES]
            inputs[index, :CONTEXT_SAMPLES] = context
            inputs[index, CONTEXT_SAMPLES:] = window
            context = window[-CONTEXT_SAMPLES:]
        self._input[0, :CONTEXT_SAMPLES] = context
        # Copy: ``audio`` may be the caller's array, which they are free to reuse.
        self._pending = audio[full * WINDOW_SAMPLES :].copy()
        return inputs

    def windows_ending(self, probabilities: Iterable[float]) -> list[VadWindow]:
        """Number the inferred windows on this stream's clock, in order."""
        results: list[VadWindow] = []
        for probability in probabilities:
            self._windows += 1
            results.append(VadWindow(self._windows * WINDOW_MS, float(probability)))
        return results

    @property
    def state(self) -> npt.NDArray[np.float32]:
        """The recurrent state after the windows inferred so far, [2, 1, 128]."""
        return self._state

    @state.setter
    def state(self, value: npt.NDArray[np.float32]) -> None:
        self._state = value

    def reset(self) -> None:
        """Start over as a new stream at 0 ms."""
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._input.fill(0.0)
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows = 0
