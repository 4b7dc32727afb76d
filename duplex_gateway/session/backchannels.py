"""The session's part that holds a reply while the caller's speech over it is judged.

:class:`Backchannels` applies :mod:`~duplex_gateway.session.overlap`'s rule inside a session:
when the detector hears the caller start over an active reply it holds the reply (the engine's
events for it wait here, in order, so nothing more of it reaches the client) and keeps the
caller's audio out of any turn; the verdict either replays the held events (a backchannel: the
reply resumes where it was held) or starts the caller's turn, which cuts the reply, and replays
them into the reply's fence. Every step says what it did in an ``overlap.decision`` event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from duplex_gateway.audio.turn_detector import SpeechStart
from duplex_gateway.engine import port
from duplex_gateway.session.engine_calls import Output
from duplex_gateway.session.overlap import BackchannelRule, OverlapHold, OverlapVerdict, backchannel_rule
from duplex_gateway.session.replies import ReplyBook
from duplex_gateway.session.turns import TurnTracker
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = ["MAX_HELD_EVENTS", "Backchannels"]

#: Engine events a held reply keeps at most (minutes of audio at any engine's pace): a hold that
#: fills up ends as an interruption.
MAX_HELD_EVENTS: Final = 4_096


class Backchannels:
    """Holds a reply while caller speech over it is judged; resumes it or starts the caller's turn."""

    def __init__(
        self,
        default: BackchannelRule,
        turns: TurnTracker,
        replies: ReplyBook,
        *,
        start_turn: Callable[[int], list[Output]],
        replay: Callable[[port.EngineEvent], list[Output]],
        tell: Callable[[], bool],
    ) -> None:
        """``start_turn(audio_start_ms)`` starts the caller's turn (and cuts an active reply);
        ``replay`` hands a held engine event to the session as if it came now; ``tell()`` says
        whether the client gets ``overlap.decision`` events."""
        self.default = default
        self._turns = turns
        self._replies = replies
        self._start_turn = start_turn
        self._replay = replay
        self._tell = tell
        self._hold: OverlapHold | None = None
        self._held: list[port.EngineEvent] = []

    @property
    def deadline(self) -> float | None:
        """When the session's clock ends the hold in progress (None: no hold, or no clock)."""
        return None if self._hold is None else self._hold.deadline

    @property
    def holding(self) -> bool:
        return self._hold is not None

    def caller_started(
        self, start: SpeechStart, config: SessionConfig, *, now: float | None
    ) -> list[Output] | None:
        """The detector heard the caller start: the hold's first outputs, or None (no reply to hold)."""
        rule = backchannel_rule(config, self.default)
        response_id = self._replies.active_id
        thresholds = self._turns.vad_thresholds
        if rule is None or response_id is None or thresholds is None or self._hold is not None:
            return None
        onset = start.audio_start_ms if start.onset_ms is None else start.onset_ms
        self._hold = hold = OverlapHold(
            rule=rule,
            response_id=response_id,
            onset_ms=onset,
            audio_start_ms=start.audio_start_ms,
            threshold=thresholds[0],
            neg_threshold=thresholds[1],
            deadline=None if now is None else now + rule.max_hold_ms / 1000.0,
        )
        self._turns.hold_speech(start.audio_start_ms)
        pause = ev.OverlapDecision(
            policy=rule.policy.value,
            action="pause",
            reason="overlap_speech",
            response_id=response_id,
            audio_start_ms=onset,
        )
        outputs: list[Output] = [pause] if self._tell() else []
        verdict = hold.start(onset if start.detected_ms is None else start.detected_ms)
        if verdict is not None:
            outputs.extend(self.decide(verdict))
        return outputs

    def feed(self, end_ms: int, probability: float) -> list[Output]:
        """One VAD window of the caller's audio: the verdict's outputs once there is one."""
        if self._hold is None:
            return []
        verdict = self._hold.feed(end_ms, probability)
        return [] if verdict is None else self.decide(verdict)

    def keep(self, event: port.EngineEvent) -> list[Output] | None:
        """An engine event: None unless it belongs to the held reply (then it waits, and [] is returned)."""
        hold = self._hold
        if hold is None or getattr(event, "response_id", None) != hold.response_id:
            return None
        if len(self._held) < MAX_HELD_EVENTS:
            self._held.append(event)
            return []
        return [*self.decide(OverlapVerdict.INTERRUPTION, "hold_full"), *self._replay(event)]

    def lapsed(self) -> list[Output]:
        """The held reply, or the speech over it, went away by other means (a cancel, a clear)."""
        hold = self._hold
        if hold is None:
            return []
        if not self._turns.holding:
            return self.decide(OverlapVerdict.BACKCHANNEL, "input_cleared")
        if self._replies.active_id != hold.response_id:
            return self.decide(OverlapVerdict.INTERRUPTION, "response_ended")
        return []

    def expire(self, now: float) -> list[Output]:
        """The session's clock: a hold past its deadline is decided by what the audio last said."""
        hold = self._hold
        if hold is None or hold.deadline is None or now < hold.deadline:
            return []
        return self.decide(hold.expire(), "hold_expired")

    def decide(self, verdict: OverlapVerdict, reason: str | None = None) -> list[Output]:
        """End the hold: a backchannel resumes the reply; an interruption starts the caller's turn."""
        hold, self._hold = self._hold, None
        held, self._held = self._held, []
        if hold is None:
            return []
        interrupted = verdict is OverlapVerdict.INTERRUPTION
        decision = ev.OverlapDecision(
            policy=hold.rule.policy.value,
            action="barge_in" if interrupted else "resume",
            reason=reason or ("long_overlap_speech" if interrupted else "short_ack"),
            response_id=hold.response_id,
            audio_start_ms=hold.onset_ms,
            audio_end_ms=hold.speech_end_ms,
        )
        outputs: list[Output] = [decision] if self._tell() else []
        if interrupted:
            # The turn starts where the speech began; the reply is cut where it was held.
            outputs.extend(self._start_turn(hold.audio_start_ms))
        else:
            self._turns.dismiss_speech(hold.heard_to_ms)
        for event in held:  # in order; a cut reply's output meets its fence
            outputs.extend(self._replay(event))
        return outputs
