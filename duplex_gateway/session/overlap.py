"""Caller speech over a reply: a backchannel the reply survives, or an interruption that ends it.

With the backchannel policy, caller speech that starts while a reply is active does not cut the
reply at once. The session *holds* the reply (nothing more of it reaches the client) and an
:class:`OverlapHold` watches the caller's voice activity, window by window, on the audio clock:

* speech that goes on for :attr:`BackchannelRule.barge_in_ms` is an interruption: the session
  announces the turn (``input_audio_buffer.speech_started``, late but with the true start) and
  cuts the reply at the point it was held;
* speech that stops for :attr:`BackchannelRule.settle_ms` before that is a backchannel ("yeah",
  "mm-hm") or noise: the reply resumes where it was held, nothing lost and nothing repeated, and
  the short speech never becomes a turn.

Clients that stop their own playback at ``speech_started`` (most Realtime clients do) therefore
never hear a backchannel as a barge-in. The rule is pure: the session feeds it VAD windows and
acts on its :class:`OverlapVerdict`; a wall-clock cap (:attr:`BackchannelRule.max_hold_ms`) is
the session's timer, for a client that stops sending audio in the middle of a hold.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetectionMode

__all__ = [
    "BackchannelRule",
    "OverlapHold",
    "OverlapPolicy",
    "OverlapVerdict",
    "backchannel_rule",
]


class OverlapPolicy(enum.StrEnum):
    """What caller speech over a reply does (``overlap_policy``, vLLM-Omni's session field)."""

    #: ``backchannel`` with ``semantic_vad``, ``barge_in_on_speech`` with ``server_vad``.
    AUTO = "auto"
    #: Hold the reply, then resume it (a backchannel) or cut it (an interruption).
    BACKCHANNEL = "backchannel"
    #: Every speech start interrupts the reply: OpenAI's Realtime behaviour.
    BARGE_IN_ON_SPEECH = "barge_in_on_speech"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackchannelRule:
    """How long caller speech over a reply must last to interrupt it, and how long quiet resumes it."""

    policy: OverlapPolicy = OverlapPolicy.AUTO
    #: Voiced speech over a held reply, from its onset, at which it is an interruption: longer
    #: than the VAD hears in "mm hmm", "sure thing" or "got it" (up to ~0.5 s of voice). A
    #: client that pauses its playback at ``overlap.decision`` ``pause`` hears an interruption
    #: stop at once; one that stops at ``speech_started`` hears it stop this much later.
    barge_in_ms: int = 550
    #: Quiet after shorter speech at which it was a backchannel (the reply resumes): longer than
    #: the pause after a first word ("Wait, ...", "Stop, ..."), so an interruption is not resumed.
    settle_ms: int = 400
    #: The longest a reply is held by the session's clock, should the caller's audio stop coming.
    max_hold_ms: int = 2_000

    def __post_init__(self) -> None:
        if self.barge_in_ms <= 0 or self.settle_ms <= 0 or self.max_hold_ms <= 0:
            raise ValueError("barge_in_ms, settle_ms and max_hold_ms must be positive")


def backchannel_rule(config: SessionConfig, default: BackchannelRule) -> BackchannelRule | None:
    """The rule a session holds replies by, or None when every speech start interrupts.

    The session's own ``overlap_policy`` / ``overlap_barge_in_ms`` (vLLM-Omni's fields) win over
    the gateway's default; ``auto`` means ``backchannel`` under ``semantic_vad``, or where the
    dialect asks for it (:attr:`SessionConfig.hold_for_backchannels`: phone calls).
    """
    td = config.turn_detection
    if td is None or not td.interrupt_response:
        return None  # speech never interrupts: there is nothing to decide
    try:
        policy = OverlapPolicy(config.overlap_policy) if config.overlap_policy else default.policy
    except ValueError:
        policy = default.policy  # a vLLM-Omni policy the gateway does not run (listen_only, ...)
    if policy is OverlapPolicy.AUTO:
        semantic = td.mode is TurnDetectionMode.SEMANTIC_VAD
        backchannels = semantic or config.hold_for_backchannels
        policy = OverlapPolicy.BACKCHANNEL if backchannels else OverlapPolicy.BARGE_IN_ON_SPEECH
    if policy is OverlapPolicy.BARGE_IN_ON_SPEECH:
        return None
    barge_in_ms = config.overlap_barge_in_ms
    if barge_in_ms is None or barge_in_ms <= 0:
        barge_in_ms = default.barge_in_ms
    # The policy decided (never ``auto``): it is what overlap.decision tells the client.
    return replace(default, policy=OverlapPolicy.BACKCHANNEL, barge_in_ms=int(barge_in_ms))


class OverlapVerdict(enum.Enum):
    """What caller speech over a held reply turned out to be."""

    #: A backchannel or noise: the reply resumes.
    BACKCHANNEL = "backchannel"
    #: An interruption: the caller's turn starts and the reply is cut where it was held.
    INTERRUPTION = "interruption"


@dataclass(slots=True, kw_only=True)
class OverlapHold:
    """One reply held while the caller's speech over it is judged (audio clock, ms of caller input)."""

    rule: BackchannelRule
    #: The reply held.
    response_id: str
    #: Where the caller's speech began (the detector's onset) and where the turn would start
    #: (less its prefix padding): an interruption's ``speech_started`` carries the latter.
    onset_ms: int
    audio_start_ms: int
    #: Probability at or above which a window is speech, and below which it is quiet (the
    #: detector's own thresholds and hysteresis).
    threshold: float
    neg_threshold: float
    #: When the session's clock ends the hold whatever the audio says (None: no clock was given).
    deadline: float | None
    voiced_ms: int = field(init=False, default=0)
    #: Where the current quiet began (None while the caller is voiced).
    quiet_from_ms: int | None = field(init=False, default=None)
    #: Where the last window fed ended.
    heard_to_ms: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.heard_to_ms = self.onset_ms

    def start(self, detected_at_ms: int) -> OverlapVerdict | None:
        """The detector confirmed speech at ``detected_at_ms``: what it heard from the onset is voiced."""
        self.voiced_ms = max(detected_at_ms - self.onset_ms, 0)
        self.heard_to_ms = max(detected_at_ms, self.onset_ms)
        return OverlapVerdict.INTERRUPTION if self.voiced_ms >= self.rule.barge_in_ms else None

    def feed(self, end_ms: int, probability: float) -> OverlapVerdict | None:
        """One VAD window ending at ``end_ms``: the verdict once there is one."""
        step = max(end_ms - self.heard_to_ms, 0)
        self.heard_to_ms = max(end_ms, self.heard_to_ms)
        if probability >= self.threshold:
            self.voiced_ms += step
            self.quiet_from_ms = None
            if self.voiced_ms >= self.rule.barge_in_ms:
                return OverlapVerdict.INTERRUPTION
            return None
        if probability < self.neg_threshold and self.quiet_from_ms is None:
            self.quiet_from_ms = end_ms - step
        if self.quiet_from_ms is not None and end_ms - self.quiet_from_ms >= self.rule.settle_ms:
            return OverlapVerdict.BACKCHANNEL
        return None

    def expire(self) -> OverlapVerdict:
        """The session's clock ran out on the hold: quiet resumes the reply, speech cuts it."""
        return OverlapVerdict.BACKCHANNEL if self.quiet_from_ms is not None else OverlapVerdict.INTERRUPTION

    @property
    def speech_end_ms(self) -> int:
        """Where the caller's speech over the reply ended (so far)."""
        return self.quiet_from_ms if self.quiet_from_ms is not None else self.heard_to_ms
