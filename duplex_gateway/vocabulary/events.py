"""Server events: what the gateway tells a caller's client, as typed immutable values.

The session produces these; a dialect renders them to its wire format. ``type``
is the OpenAI Realtime GA event name (vLLM-Omni duplex names for extensions).
Audio travels as raw bytes here; the realtime dialect base64-encodes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from duplex_gateway.vocabulary.errors import ErrorCode
from duplex_gateway.vocabulary.formats import Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = [
    "AudioDelta",
    "AudioDone",
    "ContentPartAdded",
    "ContentPartDone",
    "ConversationItem",
    "ConversationItemAdded",
    "ConversationItemDeleted",
    "ConversationItemDone",
    "ConversationItemRetrieved",
    "ConversationItemTruncated",
    "DtmfReceived",
    "ErrorEvent",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "HeartbeatAck",
    "InputAudioCleared",
    "InputAudioCommitted",
    "InputAudioTimeoutTriggered",
    "InputIgnored",
    "InputTranscriptionCompleted",
    "InputTranscriptionDelta",
    "InputTranscriptionFailed",
    "OutputAudioCleared",
    "OutputItemAdded",
    "OutputItemDone",
    "OverlapDecision",
    "PlaybackAcknowledged",
    "RateLimitsUpdated",
    "ResponseCreated",
    "ResponseDone",
    "ResponseListen",
    "ResponseSpeak",
    "ServerEvent",
    "SessionClosed",
    "SessionClosing",
    "SessionCreated",
    "SessionReplaced",
    "SessionResumed",
    "SessionResyncRequired",
    "SessionUpdated",
    "SpeechStarted",
    "SpeechStopped",
    "TextDelta",
    "TextDone",
    "TranscriptDelta",
    "TranscriptDone",
    "TurnLatency",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItem:
    """One item of the conversation, as the client sees it: a message, a function call or its output."""

    id: str
    role: str  # "user" | "assistant" | "system"; "assistant" for a function call, "tool" for its output
    status: str = "completed"  # "in_progress" | "completed" | "incomplete"
    content_type: str = "input_audio"  # "input_audio" | "input_text" | "audio" | "text" | "output_text"
    transcript: str | None = None
    text: str | None = None
    kind: str = "message"  # "message" | "function_call" | "function_call_output"
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    #: How many pictures (``input_image`` parts) of a user message the engine holds; the
    #: pictures themselves are the engine's, not kept here.
    images: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerEvent:
    type: ClassVar[str] = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreated(ServerEvent):
    type: ClassVar[str] = "session.created"
    session_id: str
    config: SessionConfig
    capabilities: tuple[tuple[str, object], ...] = ()
    #: The credential for ``session.resume`` after a dropped connection (None: resume is off).
    resume_token: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResumed(SessionCreated):
    """A new connection took over a detached session; events after its last seen one follow."""

    type: ClassVar[str] = "session.resumed"
    #: How many sockets have served the session, this one included (vLLM-Omni's counter).
    attachment_generation: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionReplaced(ServerEvent):
    """Sent to a socket whose session a newer connection resumed: it serves nothing any more."""

    type: ClassVar[str] = "session.replaced"
    session_id: str
    attachment_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResyncRequired(ServerEvent):
    """A resume asked for events the journal no longer holds: the client must start over."""

    type: ClassVar[str] = "session.resync_required"
    session_id: str
    reason: str = "journal_gap"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdated(ServerEvent):
    type: ClassVar[str] = "session.updated"
    session_id: str
    config: SessionConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStarted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStopped(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioCommitted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioTimeoutTriggered(ServerEvent):
    """``turn_detection.idle_timeout_ms`` ran out: the caller's silence became turn ``item_id``."""

    type: ClassVar[str] = "input_audio_buffer.timeout_triggered"
    item_id: str
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DtmfReceived(ServerEvent):
    """A phone caller pressed ``digit`` (OpenAI's SIP event); ``received_at`` in Unix seconds."""

    type: ClassVar[str] = "input_audio_buffer.dtmf_event_received"
    digit: str
    received_at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InputIgnored(ServerEvent):
    """A kind of input the client sent that this engine does not use (a gateway extension).

    Sent once per session and kind, the first time the kind arrives: ``input`` is
    ``video_frames`` (camera frames on ``input_audio_buffer.append``) or ``input_image``
    (pictures in ``conversation.item.create``). The rest of the message (the audio, the
    text) is used as usual; later input of the kind is dropped without a word.
    """

    type: ClassVar[str] = "input.ignored"
    input: str
    engine: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioCleared(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemAdded(ServerEvent):
    type: ClassVar[str] = "conversation.item.added"
    item: ConversationItem
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDone(ServerEvent):
    type: ClassVar[str] = "conversation.item.done"
    item: ConversationItem
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemTruncated(ServerEvent):
    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDeleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemRetrieved(ServerEvent):
    type: ClassVar[str] = "conversation.item.retrieved"
    item: ConversationItem


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionDelta(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    delta: str
    content_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionCompleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    transcript: str
    content_index: int = 0
    #: The length of the transcribed audio: OpenAI reports it as the transcription's usage.
    audio_ms: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionFailed(ServerEvent):
    """The caller's words in ``item_id`` could not be recognised."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.failed"
    item_id: str
    code: str
    message: str
    content_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreated(ServerEvent):
    type: ClassVar[str] = "response.created"
    response_id: str
    #: The client's ``metadata`` for the reply, echoed.
    metadata: Mapping[str, str] | None = None
    #: Out of band (``conversation: "none"``): not part of the conversation.
    out_of_band: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputItemAdded(ServerEvent):
    type: ClassVar[str] = "response.output_item.added"
    response_id: str
    output_index: int
    item: ConversationItem


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentPartAdded(ServerEvent):
    type: ClassVar[str] = "response.content_part.added"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part_type: str  # "audio" | "text"


@dataclass(frozen=True, slots=True, kw_only=True)
class _ResponsePartEvent(ServerEvent):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDelta(_ResponsePartEvent):
    """Reply audio: PCM16 at ``rate`` inside the core, ``encoding`` at ``rate`` once encoded for the wire."""

    type: ClassVar[str] = "response.output_audio.delta"
    audio: bytes
    rate: int
    encoded: bool = False
    encoding: Encoding = Encoding.PCM16


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDone(_ResponsePartEvent):
    type: ClassVar[str] = "response.output_audio.done"


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptDelta(_ResponsePartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.delta"
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptDone(_ResponsePartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.done"
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta(_ResponsePartEvent):
    type: ClassVar[str] = "response.output_text.delta"
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDone(_ResponsePartEvent):
    type: ClassVar[str] = "response.output_text.done"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentPartDone(_ResponsePartEvent):
    type: ClassVar[str] = "response.content_part.done"
    part_type: str
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputItemDone(ServerEvent):
    type: ClassVar[str] = "response.output_item.done"
    response_id: str
    output_index: int
    item: ConversationItem


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone(ServerEvent):
    """The end of a response. ``status`` is ``completed``, ``cancelled`` or ``failed``."""

    type: ClassVar[str] = "response.done"
    response_id: str
    status: str
    reason: str | None = None
    output: tuple[ConversationItem, ...] = ()
    audio_ms: int = 0
    metadata: Mapping[str, str] | None = None
    out_of_band: bool = False
    #: The caller audio the reply answered (ms), and the engine's token counts where it keeps them.
    input_audio_ms: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDelta(ServerEvent):
    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDone(ServerEvent):
    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseListen(ServerEvent):
    """vLLM-Omni extension: the engine's turn-taking chose to keep listening."""

    type: ClassVar[str] = "response.listen"
    #: The reply this ends, when the model stopped one to listen.
    response_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseSpeak(ServerEvent):
    """vLLM-Omni extension: the engine's turn-taking chose to speak: reply ``response_id`` begins."""

    type: ClassVar[str] = "response.speak"
    response_id: str
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapDecision(ServerEvent):
    """vLLM-Omni extension: what an overlap policy did when the caller spoke over a reply.

    The engine's own (vLLM-Omni's models), or the gateway's backchannel policy: ``pause`` (the
    reply is held while the speech is judged), then ``resume`` (a backchannel) or ``barge_in``
    (an interruption); the gateway's name the reply and the caller's speech over it.
    """

    type: ClassVar[str] = "overlap.decision"
    policy: str | None = None
    action: str | None = None
    reason: str | None = None
    response_id: str | None = None
    #: Where the caller's speech over the reply began, and (once decided) where it ended.
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitsUpdated(ServerEvent):
    """Sent after every ``response.done``, as vLLM-Omni does: clients sequence on it.

    The gateway enforces no token or request quota, so the list is empty.
    """

    type: ClassVar[str] = "rate_limits.updated"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioCleared(ServerEvent):
    type: ClassVar[str] = "output_audio_buffer.cleared"
    #: The reply whose audio was cleared; None when none was in progress.
    response_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaybackAcknowledged(ServerEvent):
    type: ClassVar[str] = "playback.acknowledged"
    response_id: str
    played_ms: int
    produced_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnLatency(ServerEvent):
    """Where the time from the end of the caller's speech to the reply's first audio went.

    A gateway extension, sent only to clients that ask for it (``session.include``
    with ``turn.latency``), when a reply's first audio goes out. ``stages`` are
    ``(name, ms)`` in order: ``turn_detection`` (speech end to commit, when the
    gateway found the turn end), then the engine's own stages where it reports them
    (e.g. ``recognition``, ``reply``, ``speech``) or one ``engine`` stage, and
    ``other`` for what the engine's stages do not cover.
    """

    type: ClassVar[str] = "turn.latency"
    response_id: str
    #: The caller's turn the reply answers; None for a reply the client asked for.
    item_id: str | None
    total_ms: float
    stages: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAck(ServerEvent):
    type: ClassVar[str] = "session.heartbeat_ack"
    session_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed(ServerEvent):
    type: ClassVar[str] = "session.closed"
    session_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosing(ServerEvent):
    """The gateway will close the session within ``grace_s`` (it is draining for shutdown).

    A gateway extension, sent only where it cannot trip a strict client: to vLLM-Omni
    duplex clients and to clients that asked (``session.include`` with ``session.closing``).
    The session goes on meanwhile; the current reply may finish.
    """

    type: ClassVar[str] = "session.closing"
    reason: str
    grace_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent(ServerEvent):
    type: ClassVar[str] = "error"
    code: ErrorCode
    message: str
    event_id: str | None = None
    param: str | None = None
