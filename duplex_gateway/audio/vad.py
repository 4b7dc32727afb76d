"""Voice activity: silero VAD inference and the turn-taking state machine on top.

:class:`SileroVad` wraps the silero VAD ONNX model. The model is loaded once per
process (:meth:`SileroVad.shared`) and every session gets its own
:class:`SileroVadStream`, which holds that session's recurrent state and turns
16 kHz float audio of any chunking into one speech probability per 32 ms window.

:class:`TurnDetector` is a pure state machine (no clock, no I/O): it reads those
``(end_ms, probability)`` windows and says when a caller started and stopped
speaking, in audio milliseconds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from duplex_gateway.vocabulary.session_config import TurnDetection

__all__ = [
    "CONTEXT_SAMPLES",
    "MIN_SPEECH_MS",
    "SAMPLE_RATE",
    "WINDOW_MS",
    "WINDOW_SAMPLES",
    "SileroVad",
    "SileroVadStream",
    "SpeechPause",
    "SpeechStart",
    "SpeechStop",
    "TurnDetector",
    "TurnEvent",
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
#: Default shortest run above threshold that counts as speech (filters clicks).
MIN_SPEECH_MS: Final = 64

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
            probability, self._state = self._model.infer(inputs[row : row + 1], self._state)
            probabilities.append(probability)
        return self.windows_ending(probabilities)

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


# --- turn detection -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeechStart:
    """The caller started speaking; ``audio_start_ms`` already includes the prefix padding."""

    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStop:
    """The caller stopped; ``audio_end_ms`` is where the trailing silence ran out.

    As in the OpenAI Realtime API, this includes ``silence_duration_ms`` of silence.
    """

    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class SpeechPause:
    """The caller went quiet at ``at_ms``; a :class:`SpeechStop` follows unless speech resumes.

    A hint for engines that can start work early (e.g. transcribing the turn so far).
    """

    at_ms: int


TurnEvent = SpeechStart | SpeechPause | SpeechStop


class TurnDetector:
    """Speech start/stop from a sequence of VAD windows; pure, no clock.

    * Start: ``probability >= threshold`` for at least ``min_speech_ms`` of
      consecutive windows. The event reports the onset (start of the first such
      window) minus ``prefix_padding_ms``, never before 0 nor before the previous
      turn's end (that audio already belongs to the committed turn).
    * Stop: once in speech, a window below ``threshold - 0.15`` (silero's own
      hysteresis) starts a silence timer; a window at or above ``threshold``
      cancels it; windows in between neither start nor cancel it. When the timer
      reaches ``silence_duration_ms`` the turn ends at that window's end.

    Windows are assumed contiguous, each ``window_ms`` long.
    """

    def __init__(
        self,
        config: TurnDetection,
        *,
        min_speech_ms: int = MIN_SPEECH_MS,
        window_ms: int = WINDOW_MS,
    ) -> None:
        if window_ms <= 0:
            raise ValueError("window_ms must be positive")
        if min_speech_ms < 0:
            raise ValueError("min_speech_ms must not be negative")
        self.threshold: Final = config.threshold
        self.neg_threshold: Final = max(config.threshold - 0.15, 0.01)
        self.prefix_padding_ms: Final = config.prefix_padding_ms
        self.silence_duration_ms: Final = config.silence_duration_ms
        self.min_speech_ms: Final = min_speech_ms
        self.window_ms: Final = window_ms
        self._in_speech = False
        self._run_start_ms: int | None = None  # onset of a run not yet long enough
        self._silence_start_ms: int | None = None
        self._floor_ms = 0  # no turn may start before this (the last stop)

    @property
    def in_speech(self) -> bool:
        """True between a :class:`SpeechStart` and the matching :class:`SpeechStop`."""
        return self._in_speech

    def feed(self, end_ms: int, probability: float) -> TurnEvent | None:
        """Advance by one window ending at ``end_ms``; at most one event results."""
        if math.isnan(probability):
            probability = 0.0  # an undefined score is not evidence of speech
        start_ms = max(end_ms - self.window_ms, 0)
        if self._in_speech:
            return self._feed_speaking(start_ms, end_ms, probability)
        if probability < self.threshold:
            self._run_start_ms = None
            return None
        if self._run_start_ms is None:
            self._run_start_ms = start_ms
        if end_ms - self._run_start_ms < self.min_speech_ms:
            return None
        onset = self._run_start_ms
        self._run_start_ms = None
        self._in_speech = True
        self._silence_start_ms = None
        return SpeechStart(max(onset - self.prefix_padding_ms, self._floor_ms, 0))

    def feed_many(self, windows: Iterable[tuple[int, float]]) -> list[TurnEvent]:
        """:meth:`feed` each ``(end_ms, probability)`` in order; the events, in order."""
        events: list[TurnEvent] = []
        for end_ms, probability in windows:
            event = self.feed(end_ms, probability)
            if event is not None:
                events.append(event)
        return events

    def reset(self) -> None:
        """Back to silence with no history (new stream, or turn detection reconfigured)."""
        self._in_speech = False
        self._run_start_ms = None
        self._silence_start_ms = None
        self._floor_ms = 0

    def _feed_speaking(
        self, start_ms: int, end_ms: int, probability: float
    ) -> SpeechStop | SpeechPause | None:
        if probability >= self.threshold:
            self._silence_start_ms = None
            return None
        paused = False
        if probability < self.neg_threshold and self._silence_start_ms is None:
            self._silence_start_ms = start_ms
            paused = True
        if self._silence_start_ms is None or end_ms - self._silence_start_ms < self.silence_duration_ms:
            return SpeechPause(start_ms) if paused else None
        self._in_speech = False
        self._silence_start_ms = None
        self._floor_ms = end_ms
        return SpeechStop(end_ms)
