"""What a client can configure about its session, as typed immutable values.

``session.update`` arrives as a :class:`SessionPatch` (only the fields the
client named); :meth:`SessionConfig.apply` folds it into the current
configuration and validates the result.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding

__all__ = [
    "CLOSING_EVENT",
    "EAGERNESS",
    "IGNORED_EVENT",
    "INCLUDABLE",
    "LATENCY_EVENT",
    "OVERLAP_EVENT",
    "UNSET",
    "VLLM_OMNI_FIELDS",
    "FunctionTool",
    "InputTranscription",
    "Modality",
    "SessionConfig",
    "SessionKind",
    "SessionPatch",
    "ToolChoice",
    "ToolChoiceMode",
    "TurnDetection",
    "TurnDetectionMode",
]


class _Unset(enum.Enum):
    UNSET = "unset"


#: Marks a patch field the client did not mention (``None`` means "set to null").
UNSET = _Unset.UNSET


#: The :class:`SessionConfig` fields that are vLLM-Omni session fields of the same name
#: (``max_output_tokens`` and ``noise_reduction`` aside), passed through to its engines.
VLLM_OMNI_FIELDS = (
    "ref_audio",
    "temperature",
    "max_output_tokens",
    "overlap_policy",
    "overlap_short_ack_ms",
    "overlap_barge_in_ms",
    "overlap_silence_rms",
    "playback_commit_policy",
    "idle_timeout_s",
    "noise_reduction",
    "initial_user_text",
    "use_tts_template",
    "extra_body",
)


#: ``session.include`` value that asks for a ``turn.latency`` event per reply (a gateway extension).
LATENCY_EVENT = "turn.latency"
#: ``session.include`` value that asks for a ``session.closing`` warning before a shutdown closes
#: the session (a gateway extension; vLLM-Omni duplex clients get it unasked).
CLOSING_EVENT = "session.closing"
#: ``session.include`` value that asks to be told (once) when the engine does not use pictures the
#: client sent (a gateway extension; vLLM-Omni duplex clients get it unasked).
IGNORED_EVENT = "input.ignored"
#: What ``session.include`` may name: OpenAI's transcription log-probabilities (accepted; the
#: engines report none) and the gateway's extension events.
#: ``session.include`` value that asks for ``overlap.decision`` events (vLLM-Omni's; its duplex
#: clients get them unasked): what happened when the caller spoke over a reply.
OVERLAP_EVENT = "overlap.decision"
INCLUDABLE = (
    "item.input_audio_transcription.logprobs",
    LATENCY_EVENT,
    CLOSING_EVENT,
    IGNORED_EVENT,
    OVERLAP_EVENT,
)


#: ``semantic_vad.eagerness`` values, as OpenAI defines them.
EAGERNESS = ("low", "medium", "high", "auto")


class TurnDetectionMode(enum.StrEnum):
    SERVER_VAD = "server_vad"
    SEMANTIC_VAD = "semantic_vad"


class SessionKind(enum.StrEnum):
    """What the session is for (``session.type``); fixed for the session's life."""

    #: A conversation: the caller's turns are answered.
    REALTIME = "realtime"
    #: Transcription only: turns are found and transcribed, never answered.
    TRANSCRIPTION = "transcription"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscription:
    """The client asked for the caller's words (``audio.input.transcription``); echoed as sent.

    The gateway transcribes with its engine's own recogniser whatever ``model``
    names; ``language`` and ``prompt`` are passed to engines that take them.
    """

    model: str = "whisper-1"
    language: str | None = None
    prompt: str | None = None


class Modality(enum.StrEnum):
    AUDIO = "audio"
    TEXT = "text"


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionTool:
    """A function the client offers the model (``session.tools`` / ``response.tools``).

    ``parameters`` is the function's JSON Schema as the client sent it.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, object] = field(default_factory=dict)


class ToolChoiceMode(enum.StrEnum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolChoice:
    """How the model may use the tools: ``auto``, ``none``, ``required``, or one named function."""

    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    #: A function the reply must call (OpenAI's ``{"type": "function", "name": ...}``); mode is REQUIRED.
    function: str | None = None

    @property
    def forces_call(self) -> bool:
        """The reply must call a tool."""
        return self.mode is ToolChoiceMode.REQUIRED


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnDetection:
    """How the end of a caller's turn is found when the client does not commit."""

    mode: TurnDetectionMode = TurnDetectionMode.SERVER_VAD
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    #: ``semantic_vad``'s ``eagerness``, echoed as the client sent it (the gateway's turn
    #: detector finds the end of a turn the same way whatever it says).
    eagerness: str = "auto"

    def __post_init__(self) -> None:
        if self.eagerness not in EAGERNESS:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"turn_detection.eagerness must be one of {', '.join(EAGERNESS)}",
                param="turn_detection.eagerness",
            )
        if not 0.0 < self.threshold < 1.0:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "turn_detection.threshold must be between 0 and 1",
                param="turn_detection.threshold",
            )
        for name in ("prefix_padding_ms", "silence_duration_ms"):
            value = getattr(self, name)
            if not 0 <= value <= 10_000:
                raise ProtocolError(
                    ErrorCode.INVALID_VALUE,
                    f"turn_detection.{name} must be 0-10000 ms",
                    param=f"turn_detection.{name}",
                )
        if self.idle_timeout_ms is not None and not 1_000 <= self.idle_timeout_ms <= 600_000:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "turn_detection.idle_timeout_ms must be 1000-600000 ms",
                param="turn_detection.idle_timeout_ms",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """The full, validated configuration of one session."""

    kind: SessionKind = SessionKind.REALTIME
    model: str = "duplex-gateway"
    instructions: str = ""
    voice: str = "default"
    output_modalities: tuple[Modality, ...] = (Modality.AUDIO,)
    input_format: AudioFormat = field(
        default_factory=lambda: AudioFormat(encoding=Encoding.PCM16, rate=24_000)
    )
    output_format: AudioFormat = field(
        default_factory=lambda: AudioFormat(encoding=Encoding.PCM16, rate=24_000)
    )
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    input_transcription: InputTranscription | None = None
    speed: float = 1.0
    #: Functions the model may call, and how it may use them.
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    #: Extra server events the client asked for (``session.include``), e.g. ``turn.latency``.
    include: tuple[str, ...] = ()
    #: vLLM-Omni's ``extra_body.auto_response``: a commit that names no ``response_create``
    #: is answered, as vLLM-Omni's server answers it (its ``DuplexClient`` turns it on).
    auto_response: bool = False
    #: vLLM-Omni session fields, handed to engines that take them (None: the engine's default).
    ref_audio: str | None = None
    temperature: float | None = None
    #: ``max_output_tokens`` / ``max_tokens``; None: no limit (``"inf"``).
    max_output_tokens: int | None = None
    overlap_policy: str | None = None
    #: The dialect's own ask, never sent to an engine: caller speech over a reply is judged as a
    #: backchannel or an interruption whatever the turn detection (phone calls: a caller's
    #: "mm-hm" must not cost them the answer).
    hold_for_backchannels: bool = False
    overlap_short_ack_ms: float | None = None
    overlap_barge_in_ms: float | None = None
    overlap_silence_rms: float | None = None
    playback_commit_policy: str | None = None
    idle_timeout_s: float | None = None
    #: ``audio.input.noise_reduction`` / ``input_audio_noise_reduction``, as sent.
    noise_reduction: Mapping[str, object] | None = None
    initial_user_text: str | None = None
    use_tts_template: bool | None = None
    #: ``extra_body`` as the client last sent it: model knobs the engine reads (``auto_response`` too).
    extra_body: Mapping[str, object] = field(default_factory=dict)

    def apply(self, patch: SessionPatch) -> SessionConfig:
        """This configuration with the fields ``patch`` names replaced."""
        changes: dict[str, object] = {}
        for name in SessionPatch.__dataclass_fields__:
            value = getattr(patch, name)
            if value is not UNSET:
                changes[name] = value
        if not changes:
            return self
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPatch:
    """The fields of a ``session.update``; :data:`UNSET` where the client said nothing."""

    kind: SessionKind | _Unset = UNSET
    model: str | _Unset = UNSET
    instructions: str | _Unset = UNSET
    voice: str | _Unset = UNSET
    output_modalities: tuple[Modality, ...] | _Unset = UNSET
    input_format: AudioFormat | _Unset = UNSET
    output_format: AudioFormat | _Unset = UNSET
    turn_detection: TurnDetection | None | _Unset = UNSET
    input_transcription: InputTranscription | None | _Unset = UNSET
    speed: float | _Unset = UNSET
    tools: tuple[FunctionTool, ...] | _Unset = UNSET
    tool_choice: ToolChoice | _Unset = UNSET
    include: tuple[str, ...] | _Unset = UNSET
    auto_response: bool | _Unset = UNSET
    ref_audio: str | None | _Unset = UNSET
    temperature: float | None | _Unset = UNSET
    max_output_tokens: int | None | _Unset = UNSET
    overlap_policy: str | None | _Unset = UNSET
    hold_for_backchannels: bool | _Unset = UNSET
    overlap_short_ack_ms: float | None | _Unset = UNSET
    overlap_barge_in_ms: float | None | _Unset = UNSET
    overlap_silence_rms: float | None | _Unset = UNSET
    playback_commit_policy: str | None | _Unset = UNSET
    idle_timeout_s: float | None | _Unset = UNSET
    noise_reduction: Mapping[str, object] | None | _Unset = UNSET
    initial_user_text: str | None | _Unset = UNSET
    use_tts_template: bool | None | _Unset = UNSET
    extra_body: Mapping[str, object] | _Unset = UNSET
