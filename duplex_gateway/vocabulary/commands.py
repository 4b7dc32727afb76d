"""Client commands: what a caller's client asks the gateway to do.

Every dialect parses its wire messages into these frozen values; the session
consumes nothing else. ``type`` is the OpenAI Realtime (GA) / vLLM-Omni duplex
event name, so the realtime dialect is close to an identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from duplex_gateway.vocabulary.formats import Encoding
from duplex_gateway.vocabulary.session_config import FunctionTool, Modality, SessionPatch, ToolChoice

__all__ = [
    "BargeIn",
    "CallDtmf",
    "Command",
    "ContextAppend",
    "ConversationItemCreate",
    "ConversationItemDelete",
    "ConversationItemRetrieve",
    "ConversationItemTruncate",
    "InputAudioAppend",
    "InputAudioClear",
    "InputAudioCommit",
    "InputAudioMute",
    "InputCancel",
    "InputTextAppend",
    "ItemSpec",
    "OutputAudioClear",
    "PlaybackAck",
    "ResponseCancel",
    "ResponseCreate",
    "SessionClose",
    "SessionEventAck",
    "SessionHeartbeat",
    "SessionResume",
    "SessionUpdate",
    "TurnSignal",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """Base of every client command; ``event_id`` is the client's own id, if any."""

    type: ClassVar[str] = ""
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdate(Command):
    type: ClassVar[str] = "session.update"
    session: SessionPatch


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioAppend(Command):
    """Caller audio (already base64-decoded), with vLLM-Omni's per-chunk hints.

    ``encoding`` / ``rate``: the chunk's own format where the client declared it
    (the session's input format fills in the rest). ``is_speech`` and ``hints``
    (RMS, VAD scores, ...) are the client's view of the chunk, passed on to engines
    that read them.

    ``video_frames``: camera pictures taken during the chunk (base64 JPEG or PNG, at
    most two, vLLM-Omni's duplex extension), for engines that see. ``video_error``:
    why the frames the client sent were refused; the chunk's audio counts all the same.
    """

    type: ClassVar[str] = "input_audio_buffer.append"
    audio: bytes
    encoding: Encoding | None = None
    rate: int | None = None
    is_speech: bool | None = None
    hints: Mapping[str, object] = field(default_factory=dict)
    video_frames: tuple[str, ...] = ()
    video_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioCommit(Command):
    """End the caller's turn, with vLLM-Omni's commit keys.

    ``create_response`` (``response_create``) asks for a reply right away, or for none;
    ``None`` leaves it to the session (``auto_response``, turn detection). ``final: false``
    marks a segment of a turn that goes on, and ``is_speech: false`` input the client
    knows to be silence: neither is answered unless the client asks.
    """

    type: ClassVar[str] = "input_audio_buffer.commit"
    create_response: bool | None = None
    final: bool = True
    is_speech: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioClear(Command):
    type: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioMute(Command):
    """Stop (``muted``) or resume hearing the caller: while muted the engine hears silence in their audio's place.

    The audio stream goes on, so the session's timeline and the engine's clock keep time.
    """

    type: ClassVar[str] = "input_audio.mute"
    muted: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class InputCancel(Command):
    """vLLM-Omni extension: abandon the caller's turn in progress without committing it."""

    type: ClassVar[str] = "input.cancel"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTextAppend(Command):
    """vLLM-Omni extension: text pushed into the caller's live turn (committed with it)."""

    type: ClassVar[str] = "input.text.append"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnSignal(Command):
    """vLLM-Omni extension: a local turn transition (``user_started`` ...) for the engine's turn-taking.

    Signals that name a command of their own (``barge_in``, ``input.cancel``,
    ``response.cancel`` ...) are parsed into that command instead.
    """

    type: ClassVar[str] = "turn.signal"
    event: str
    payload: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemSpec:
    """A conversation item as the client describes it (``conversation.item.create``, ``response.input``).

    ``kind``: ``message`` (``role``, ``text``), ``function_call`` (``call_id``, ``name``,
    ``arguments``), ``function_call_output`` (``call_id``, ``output``), or
    ``item_reference`` (``item_id`` names an item already in the conversation).
    ``images``: a user message's pictures (``input_image`` parts), as JPEG or PNG data URLs.
    """

    kind: str = "message"
    item_id: str | None = None
    role: str = "user"
    text: str = ""
    images: tuple[str, ...] = ()
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreate(Command):
    """Ask for a reply now; every field but ``metadata`` overrides the session's setting for this reply."""

    type: ClassVar[str] = "response.create"
    instructions: str | None = None
    output_modalities: tuple[Modality, ...] | None = None
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: ToolChoice | None = None
    voice: str | None = None
    #: None: the session's limit (also for the wire's ``"inf"``).
    max_output_tokens: int | None = None
    #: ``conversation: "none"``: an out-of-band reply, not added to the conversation.
    out_of_band: bool = False
    #: The reply's own context instead of the conversation (``[]``: none at all).
    input: tuple[ItemSpec, ...] | None = None
    #: Echoed on ``response.created`` and ``response.done``.
    metadata: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCancel(Command):
    type: ClassVar[str] = "response.cancel"
    response_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemCreate(Command):
    """An item the client added to the conversation: a text message, or a function call or its output."""

    type: ClassVar[str] = "conversation.item.create"
    item_id: str | None
    role: str
    text: str
    previous_item_id: str | None = None
    #: ``message``, ``function_call`` or ``function_call_output`` (see :class:`ItemSpec`).
    kind: str = "message"
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    #: A user message's pictures (``input_image`` parts), as JPEG or PNG data URLs.
    images: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextAppend(Command):
    """Context the application adds while the conversation goes on (the Live API's context appends).

    ``channel``: ``instructions`` (guidance), ``thinking`` (silent notes) or ``commentary``
    (something the model should say, in its own words). ``delegation_id``: the delegation (the
    engine's function call) this answers, or None for general context. It asks for no reply:
    when the model speaks is the model's, or the gateway's turn-taking's, to decide.
    """

    type: ClassVar[str] = "context.append"
    channel: str
    content: str
    delegation_id: str | None = None
    #: The conversation item standing for it, where the client named one.
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemTruncate(Command):
    """The caller heard only ``audio_end_ms`` of an assistant item."""

    type: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDelete(Command):
    type: ClassVar[str] = "conversation.item.delete"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemRetrieve(Command):
    type: ClassVar[str] = "conversation.item.retrieve"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioClear(Command):
    """Stop the assistant's audio now (the client flushed its playback)."""

    type: ClassVar[str] = "output_audio_buffer.clear"


@dataclass(frozen=True, slots=True, kw_only=True)
class BargeIn(Command):
    """vLLM-Omni extension: the caller interrupted; cancel and fence the current reply."""

    type: ClassVar[str] = "barge_in"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDtmf(Command):
    """A phone caller pressed a key (``received_at``: Unix seconds, when the gateway got it)."""

    type: ClassVar[str] = "call.dtmf"
    digit: str
    received_at: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaybackAck(Command):
    """vLLM-Omni extension: how much of a response the client has actually played."""

    type: ClassVar[str] = "playback.ack"
    response_id: str | None
    item_id: str | None
    played_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeartbeat(Command):
    type: ClassVar[str] = "session.heartbeat"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClose(Command):
    type: ClassVar[str] = "session.close"
    reason: str = "client_close"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEventAck(Command):
    """vLLM-Omni extension: the client saw every event up to ``server_event_seq``.

    vLLM-Omni's ``DuplexClient`` sends one after every server event; the session
    takes it silently (answering with an ``error`` would start an endless loop).
    """

    type: ClassVar[str] = "session.event_ack"
    server_event_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResume(Command):
    """vLLM-Omni extension: re-attach to a detached session (first message of a connection)."""

    type: ClassVar[str] = "session.resume"
    session_id: str
    resume_token: str
    last_received_server_event_seq: int = 0
