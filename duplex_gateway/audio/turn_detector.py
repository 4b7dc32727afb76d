"""The caller's turns from voice activity: a pure state machine (no clock, no I/O).

:class:`TurnDetector` reads the VAD's ``(end_ms, probability)`` windows and says when a caller
started and stopped speaking, in audio milliseconds. With ``server_vad`` a turn ends after
``silence_duration_ms`` of silence. With ``semantic_vad`` a short silence is a
:class:`SpeechCandidate`: an end-of-turn model judges the turn so far, and the session ends it
(:meth:`TurnDetector.end_turn`) when the model says the caller is done; otherwise the turn goes on
until speech resumes or the longest wait the ``eagerness`` allows (:data:`SEMANTIC_EAGERNESS`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from duplex_gateway.audio.vad import WINDOW_MS
from duplex_gateway.vocabulary.session_config import TurnDetection, TurnDetectionMode

__all__ = [
    "MIN_SPEECH_MS",
    "SEMANTIC_CANDIDATE_MS",
    "SEMANTIC_EAGERNESS",
    "SEMANTIC_REASSESS_MS",
    "Eagerness",
    "SpeechCandidate",
    "SpeechPause",
    "SpeechStart",
    "SpeechStop",
    "TurnDetector",
    "TurnEvent",
]

#: Default shortest run above threshold that counts as speech (filters clicks).
MIN_SPEECH_MS: Final = 64


@dataclass(frozen=True, slots=True)
class Eagerness:
    """How ``semantic_vad`` ends a turn at one ``eagerness``."""

    #: The end-of-turn model's probability at or above which the caller is done.
    threshold: float
    #: The longest silence after speech before the turn ends whatever the model says (OpenAI's
    #: longest waits: 8 s for low, 4 s for medium, 2 s for high).
    max_wait_ms: int


#: ``semantic_vad``'s ``eagerness``: ``auto`` is ``medium``, as in OpenAI's Realtime API.
SEMANTIC_EAGERNESS: Final = {
    "low": Eagerness(threshold=0.7, max_wait_ms=8_000),
    "medium": Eagerness(threshold=0.5, max_wait_ms=4_000),
    "high": Eagerness(threshold=0.3, max_wait_ms=2_000),
    "auto": Eagerness(threshold=0.5, max_wait_ms=4_000),
}
#: Silence after speech at which the end-of-turn model first judges the turn.
SEMANTIC_CANDIDATE_MS: Final = 200
#: Further silence after which it judges again (its window then holds more of the quiet), and again.
SEMANTIC_REASSESS_MS: Final = 1_000


@dataclass(frozen=True, slots=True)
class SpeechStart:
    """The caller started speaking; ``audio_start_ms`` already includes the prefix padding.

    ``onset_ms`` is where the speech itself began and ``detected_ms`` where it was confirmed
    (None: both at ``audio_start_ms``, for a start not found by this detector); they tell the
    session how much speech it has heard, not the client where the turn starts, so two starts
    at the same place are equal.
    """

    audio_start_ms: int
    onset_ms: int | None = field(default=None, compare=False)
    detected_ms: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class SpeechStop:
    """The caller stopped; ``audio_end_ms`` is where the trailing silence ran out.

    As in the OpenAI Realtime API, this includes ``silence_duration_ms`` of silence.
    """

    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class SpeechCandidate:
    """``semantic_vad``: the caller has been quiet long enough for the end-of-turn model to judge.

    ``audio_end_ms`` is where the silence has run to: the turn's end if the model says it is one,
    and the mark :meth:`TurnDetector.end_turn` takes; ``speech_end_ms`` where the speech stopped.
    """

    audio_end_ms: int
    speech_end_ms: int


@dataclass(frozen=True, slots=True)
class SpeechPause:
    """The caller went quiet at ``at_ms``; a :class:`SpeechStop` follows unless speech resumes.

    A hint for engines that can start work early (e.g. transcribing the turn so far).
    """

    at_ms: int


TurnEvent = SpeechStart | SpeechPause | SpeechCandidate | SpeechStop


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
    * ``semantic_vad``: the silence timer runs to the eagerness's longest wait instead, and at
      :data:`SEMANTIC_CANDIDATE_MS` of it (then every :data:`SEMANTIC_REASSESS_MS`) a
      :class:`SpeechCandidate` asks for the end-of-turn model's judgement; the session ends the
      turn with :meth:`end_turn` when the model says the caller is done.

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
        self.semantic: Final = config.mode is TurnDetectionMode.SEMANTIC_VAD
        self.eagerness: Final = SEMANTIC_EAGERNESS[config.eagerness]
        #: The silence that ends a turn by itself.
        self.silence_duration_ms: Final = (
            self.eagerness.max_wait_ms if self.semantic else config.silence_duration_ms
        )
        self.min_speech_ms: Final = min_speech_ms
        self.window_ms: Final = window_ms
        self._in_speech = False
        self._run_start_ms: int | None = None  # onset of a run not yet long enough
        self._silence_start_ms: int | None = None
        self._floor_ms = 0  # no turn may start before this (the last stop)
        #: semantic_vad: the silence at which the next candidate goes to the end-of-turn model.
        self._candidate_at_ms = SEMANTIC_CANDIDATE_MS
        #: Where the speech of the last turn ended (its stop less its silence).
        self.last_speech_end_ms = 0

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
        return SpeechStart(
            max(onset - self.prefix_padding_ms, self._floor_ms, 0), onset_ms=onset, detected_ms=end_ms
        )

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
        self._candidate_at_ms = SEMANTIC_CANDIDATE_MS

    def dismiss(self, end_ms: int) -> None:
        """The speech since the last start was not a turn (a backchannel): back to silence at ``end_ms``.

        No later turn starts before ``end_ms``: its prefix padding must not reach back into it.
        """
        self._in_speech = False
        self._run_start_ms = None
        self._silence_start_ms = None
        self._floor_ms = max(self._floor_ms, end_ms)
        self._candidate_at_ms = SEMANTIC_CANDIDATE_MS

    def awaiting(self, candidate: SpeechCandidate) -> bool:
        """The caller has stayed quiet since ``candidate``: the model's judgement of it still counts."""
        return self._in_speech and self._silence_start_ms == candidate.speech_end_ms

    def end_turn(self, candidate: SpeechCandidate) -> SpeechStop | None:
        """The end-of-turn model says the caller is done at ``candidate``: the turn ends there.

        None when the caller has spoken again since (the judgement came too late to count).
        """
        if not self.awaiting(candidate):
            return None
        self._stop(candidate.audio_end_ms)
        return SpeechStop(candidate.audio_end_ms)

    def _stop(self, end_ms: int) -> None:
        self.last_speech_end_ms = self._silence_start_ms if self._silence_start_ms is not None else end_ms
        self._in_speech = False
        self._silence_start_ms = None
        self._floor_ms = end_ms
        self._candidate_at_ms = SEMANTIC_CANDIDATE_MS

    def _feed_speaking(
        self, start_ms: int, end_ms: int, probability: float
    ) -> SpeechStop | SpeechPause | SpeechCandidate | None:
        if probability >= self.threshold:
            self._silence_start_ms = None
            self._candidate_at_ms = SEMANTIC_CANDIDATE_MS
            return None
        paused = False
        if probability < self.neg_threshold and self._silence_start_ms is None:
            self._silence_start_ms = start_ms
            paused = True
        silence = self._silence_start_ms
        if silence is None or end_ms - silence < self.silence_duration_ms:
            if paused:
                return SpeechPause(start_ms)
            if self.semantic and silence is not None and end_ms - silence >= self._candidate_at_ms:
                self._candidate_at_ms += SEMANTIC_REASSESS_MS
                return SpeechCandidate(audio_end_ms=end_ms, speech_end_ms=silence)
            return None
        self._stop(end_ms)
        return SpeechStop(end_ms)
