"""One session's running numbers, for the metrics and for its summary log line.

The session host feeds a :class:`SessionStats` what it already sees: the events
it sends, the latency breakdown the session reports for each reply, the frames
that come in and go out, and the moments the writer actually wrote a reply's
audio. From those come the per-reply histograms (first audio, barge-in cut-off,
gaps between audio chunks) and, when the session ends, one summary.

It holds no clock: every time arrives as an argument, on the event loop's clock.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from duplex_gateway.ops.metrics import GatewayMetrics, SessionLabels, close_reason
from duplex_gateway.session.machine import ReportLatency
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.frames import Frame, frame_size

__all__ = ["SessionStats", "describe"]

#: Replies whose audio is tracked at once; older ones (their audio long out) are forgotten.
_TRACKED_REPLIES = 4
#: First-audio times kept for the summary; a very long session keeps its first ones.
_MAX_SAMPLES = 1000


@dataclass(slots=True)
class _ReplyAudio:
    """One reply's audio on its way to the client: chunks queued, chunks written."""

    queued: int = 0
    written: int = 0
    last_written_at: float | None = None
    #: Set when the caller barged in: when their speech started. Observed once the
    #: last queued chunk is written.
    barge_in_at: float | None = None


class SessionStats:
    """Counts for one session; reports to ``metrics`` as it goes."""

    def __init__(self, metrics: GatewayMetrics, *, started_at: float) -> None:
        self._metrics = metrics
        self.started_at = started_at
        self.labels: SessionLabels | None = None
        self.turns = 0
        self.replies = 0
        self.barge_ins = 0
        self.resumes = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.first_audio_ms: list[float] = []
        self.speech_end_ms: list[float] = []
        #: The caller is in a turn the gateway has not committed yet (speech started).
        self.caller_speaking = False
        self._speech_started_at: float | None = None
        self._audio: OrderedDict[str, _ReplyAudio] = OrderedDict()
        self._add_in, self._add_out = metrics.byte_counters()

    # -- admission -------------------------------------------------------------------

    def admitted(self, labels: SessionLabels) -> None:
        if self.labels is None:
            self.labels = labels
            self._metrics.session_admitted(labels)

    def released(self) -> None:
        if self.labels is not None:
            self._metrics.session_released(self.labels)

    # -- traffic ---------------------------------------------------------------------

    def frame_in(self, frame: Frame) -> None:
        size = frame_size(frame)
        self.bytes_in += size
        self._add_in(size)

    def written(self, size: int) -> None:
        """The writer put ``size`` bytes on the socket."""
        self.bytes_out += size
        self._add_out(size)

    def queued(self, depth: int) -> None:
        self._metrics.send_queue_depth(depth)

    def input_wait(self, seconds: float) -> None:
        self._metrics.input_wait(seconds)

    # -- what the session said ---------------------------------------------------------

    def latency(self, report: ReportLatency) -> None:
        """A reply's first audio went out (the numbers of ``turn.latency``)."""
        self._metrics.first_audio(report.first_audio_ms / 1000.0)
        if len(self.first_audio_ms) < _MAX_SAMPLES:
            self.first_audio_ms.append(report.first_audio_ms)
        if report.speech_end_ms is not None:
            self._metrics.speech_end_to_first_audio(report.speech_end_ms / 1000.0)
            if len(self.speech_end_ms) < _MAX_SAMPLES:
                self.speech_end_ms.append(report.speech_end_ms)

    def event(self, event: ev.ServerEvent, now: float) -> None:
        """``event`` is on its way to the client."""
        if isinstance(event, ev.SpeechStarted):
            self.caller_speaking = True
            self._speech_started_at = now
        elif isinstance(event, ev.SpeechStopped | ev.InputAudioCommitted | ev.InputAudioCleared):
            self.caller_speaking = False
            if isinstance(event, ev.InputAudioCommitted):
                self.turns += 1
        elif isinstance(event, ev.ResponseDone):
            self.replies += 1
            self._metrics.reply_done(event.status)
            if event.status == "cancelled" and event.reason == "turn_detected":
                self.barge_ins += 1
                self._metrics.barge_in()
                # A barge-in the gateway or engine heard starts with the caller's speech; one the
                # client declared (vLLM-Omni's barge_in) starts now.
                began = self._speech_started_at if self.caller_speaking and self._speech_started_at else now
                self._barged_in(event.response_id, began)

    # -- a reply's audio on the socket ---------------------------------------------------

    def audio_queued(self, response_id: str) -> Callable[[float], None]:
        """A chunk of ``response_id`` was queued; the returned callback is for when it is written."""
        track = self._audio.get(response_id)
        if track is None:
            track = self._audio[response_id] = _ReplyAudio()
            while len(self._audio) > _TRACKED_REPLIES:
                self._audio.popitem(last=False)
        track.queued += 1
        return lambda now: self._audio_written(response_id, now)

    def _audio_written(self, response_id: str, now: float) -> None:
        track = self._audio.get(response_id)
        if track is None:
            return
        if track.last_written_at is not None:
            self._metrics.output_gap(now - track.last_written_at)
        track.last_written_at = now
        track.written += 1
        if track.barge_in_at is not None and track.written >= track.queued:
            self._metrics.barge_in_cutoff(now - track.barge_in_at)
            del self._audio[response_id]

    def _barged_in(self, response_id: str, speech_at: float) -> None:
        track = self._audio.get(response_id)
        if track is None:
            return  # none of its audio went this way (not started, or a paced phone call)
        if track.written >= track.queued:
            # All of it was out before the caller spoke, or by the time they were heard.
            last = track.last_written_at if track.last_written_at is not None else speech_at
            self._metrics.barge_in_cutoff(last - speech_at)
            del self._audio[response_id]
        else:
            track.barge_in_at = speech_at

    # -- the end -----------------------------------------------------------------------

    def ended(self, reason: str | None, code: int | None, dialect: str) -> str:
        """Count the session's end (a refused one's too); returns its reason label."""
        label = close_reason(reason, code)
        self._metrics.session_ended(self.labels or self._metrics.labels(dialect), label)
        return label

    def summary(
        self,
        *,
        now: float,
        session_id: str,
        reason: str,
        code: int | None,
        dialect: str,
        engine: str,
        call_id: str | None = None,
    ) -> dict[str, Any]:
        """The fields of the session's summary log line (``call_id``: a phone call's, when it is one)."""
        summary = {
            "event": "session_summary",
            "session_id": session_id,
            "duration_s": round(now - self.started_at, 3),
            "turns": self.turns,
            "replies": self.replies,
            "first_audio_ms": _spread(self.first_audio_ms),
            "speech_end_to_first_audio_ms": _spread(self.speech_end_ms),
            "barge_ins": self.barge_ins,
            "resumes": self.resumes,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "close_reason": reason,
            "close_code": code,
            "dialect": dialect,
            "engine": engine,
        }
        if call_id is not None:
            summary["call_id"] = call_id
        return summary


def _spread(samples: list[float]) -> dict[str, float | int] | None:
    if not samples:
        return None
    return {
        "count": len(samples),
        "min": round(min(samples), 1),
        "median": round(statistics.median(samples), 1),
        "max": round(max(samples), 1),
    }


def describe(summary: dict[str, Any]) -> str:
    """The summary as one readable sentence (the log line's message)."""
    first = summary["first_audio_ms"]
    audio = (
        f"first audio {first['min']:g}/{first['median']:g}/{first['max']:g} ms (min/median/max)"
        if first
        else "no audio"
    )
    s = summary
    return (
        f"session {s['session_id']} ended after {s['duration_s']:.1f} s: {s['turns']} turns, {s['replies']} replies, "
        f"{audio}, {s['barge_ins']} barge-ins, {s['bytes_in']} B in, {s['bytes_out']} B out, "
        f"{s['close_reason']} ({s['close_code']}), {s['dialect']} on {s['engine']}"
    )
