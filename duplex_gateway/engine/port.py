"""The engine port: the one interface every speech engine implements.

Nothing above this module knows which engine runs. Audio crosses the port as
mono PCM16 little-endian at the engine's own rates (``EngineCapabilities``);
the gateway's audio layer converts to and from each client's wire format.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

from duplex_gateway.vocabulary.session_config import FunctionTool, Modality, SessionConfig, ToolChoice

__all__ = [
    "REPLY_OUTPUT_EVENTS",
    "ContextItem",
    "Engine",
    "EngineAudio",
    "EngineCapabilities",
    "EngineClosed",
    "EngineError",
    "EngineEvent",
    "EngineFunctionCall",
    "EngineFunctionCallDelta",
    "EngineInputTranscript",
    "EngineInputTranscriptFailed",
    "EngineListen",
    "EngineOverlapDecision",
    "EngineRefused",
    "EngineResponseDone",
    "EngineResponseStarted",
    "EngineSession",
    "EngineSessionLimit",
    "EngineSpeak",
    "EngineSpeechStarted",
    "EngineSpeechStopped",
    "EngineText",
    "EngineTimings",
    "EngineTranscript",
    "EngineTurnCommitted",
    "EngineUnavailable",
    "ResponseOptions",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCapabilities:
    """What an engine offers; surfaced to clients in ``session.created``."""

    name: str
    input_rate: int
    output_rate: int
    #: The engine finds turn ends itself; otherwise the gateway runs its VAD.
    detects_turns: bool = False
    barge_in: bool = True
    input_transcription: bool = False
    voices: tuple[str, ...] = ("default",)
    max_sessions: int | None = None
    #: The engine can take turns by itself (vLLM-Omni's ``auto_response``): it decides
    #: whether a committed turn gets a reply, reports listen / speak / overlap decisions,
    #: and takes text into a live turn (``input.text.append``) and ``turn.signal``\s.
    native_turns: bool = False
    #: The engine's replies can call the client's functions (``session.tools``).
    tools: bool = False
    #: The engine can make a reply outside the conversation (``conversation: "none"``)
    #: while another is in progress.
    out_of_band: bool = False
    #: The per-reply options of ``response.create`` the engine honours, beyond
    #: ``instructions`` and ``output_modalities``: ``tools`` (a reply's own tools and tool
    #: choice), ``voice``, ``max_output_tokens``, ``input`` (a context of its own instead of
    #: the conversation).
    response_options: frozenset[str] = frozenset()
    #: The engine sees camera frames sent with caller audio (vLLM-Omni's ``video_frames``,
    #: which MiniCPM-o 4.5 takes); other engines get the audio alone.
    video_input: bool = False
    #: The engine takes pictures in user messages (Realtime ``input_image`` parts).
    image_input: bool = False
    #: After ``caller_paused`` the engine sends the caller's words up to the pause, as a partial
    #: transcript marked ``at_pause`` (its text may be empty): ``semantic_vad`` waits for them
    #: before it ends a turn on the audio model's word alone.
    words_at_pause: bool = False

    def as_pairs(self) -> tuple[tuple[str, object], ...]:
        return (
            ("engine", self.name),
            ("input_sample_rate_hz", self.input_rate),
            ("output_sample_rate_hz", self.output_rate),
            ("engine_turn_detection", self.detects_turns),
            ("barge_in", self.barge_in),
            ("input_transcription", self.input_transcription),
            ("voices", list(self.voices)),
            ("native_turn_taking", self.native_turns),
            ("function_calling", self.tools),
            ("out_of_band_responses", self.out_of_band),
            ("response_options", sorted(self.response_options)),
            ("video_input", self.video_input),
            ("image_input", self.image_input),
        )


class EngineSessionLimit(Exception):
    """The engine has no room for another session (becomes ``session_limit``)."""


class EngineUnavailable(Exception):
    """The engine cannot open sessions right now (not started, or dead)."""


class EngineRefused(Exception):
    """The engine refused a call (e.g. a configuration it cannot take); the session goes on."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


# -- what a reply is asked to do ------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextItem:
    """A conversation item, as the context a reply is given (``response.create`` ``input``).

    ``kind`` is ``message`` (``role`` and ``text``), ``function_call`` (``call_id``,
    ``name``, ``arguments`` as JSON text) or ``function_call_output`` (``call_id``, ``output``).
    """

    id: str
    kind: str = "message"
    role: str = "user"
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOptions:
    """How one reply is to be made: the session's settings with the reply's own overrides applied."""

    modalities: tuple[Modality, ...] = (Modality.AUDIO,)
    #: The functions the reply may call, and how.
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    #: None: the session's voice.
    voice: str | None = None
    #: None: no limit.
    max_output_tokens: int | None = None
    #: ``conversation: "none"``: the reply is not part of the conversation (and may run
    #: alongside another); engines that keep history leave it out.
    out_of_band: bool = False
    #: The reply's own context instead of the conversation (None: the conversation).
    input: tuple[ContextItem, ...] | None = None


# -- events an engine session produces ---------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineEvent:
    type: ClassVar[str] = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineResponseStarted(EngineEvent):
    type: ClassVar[str] = "response.created"
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineAudio(EngineEvent):
    """A chunk of reply audio: PCM16 mono at ``EngineCapabilities.output_rate``."""

    type: ClassVar[str] = "response.output_audio.delta"
    response_id: str
    pcm: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineTranscript(EngineEvent):
    """Text of what the reply audio says, as it is produced."""

    type: ClassVar[str] = "response.output_audio_transcript.delta"
    response_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineText(EngineEvent):
    """Text-only reply output."""

    type: ClassVar[str] = "response.output_text.delta"
    response_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineResponseDone(EngineEvent):
    type: ClassVar[str] = "response.done"
    response_id: str
    #: completed | cancelled | failed | incomplete (cut short by ``max_output_tokens``)
    status: str = "completed"
    reason: str | None = None
    #: Tokens the reply consumed and produced, for engines that count them.
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFunctionCallDelta(EngineEvent):
    """Part of the arguments of a function call the reply makes, as the model writes them."""

    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    call_id: str
    name: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFunctionCall(EngineEvent):
    r"""The reply calls the client's function ``name`` with ``arguments`` (JSON text, whole).

    Ends the call: engines that stream arguments send :class:`EngineFunctionCallDelta`\ s
    first, others only this. The client runs the function and adds its output
    (:meth:`EngineSession.add_function_output`), then asks for the next reply.
    """

    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineTimings(EngineEvent):
    """Where a reply's time went inside the engine, up to its first audio.

    ``stages`` are ``(name, ms)`` in order, e.g. ``recognition``, ``reply``,
    ``speech``; sent before the reply's first :class:`EngineAudio`. Optional:
    engines that cannot tell their stages apart send none.
    """

    type: ClassVar[str] = "response.timings"
    response_id: str
    stages: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpeechStarted(EngineEvent):
    """Engines that detect turns themselves report the caller's speech.

    ``item_id`` is the engine's own name for the turn ("" when it has none); the
    gateway session maps it to the caller's item.
    """

    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpeechStopped(EngineEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineTurnCommitted(EngineEvent):
    """The engine's record of a caller turn: ``item_id`` (the engine's name for it).

    Sent for every committed turn by engines that keep a record of turns of their own
    (vLLM-Omni's duplex sessions: ``vllm-omni`` and ``remote``); the others (echo,
    embedded, vllm-omni-stream) send none, and the gateway's commit is the record
    (the engine contract suite holds them to this). For a turn the gateway committed, ``item_id`` is
    the id the gateway gave it (or "" when the engine cannot carry it); for a turn
    the engine ended itself (its own VAD or turn-taking) it is the engine's id,
    and the gateway session announces the turn to the client.
    """

    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineListen(EngineEvent):
    """Native turn-taking: the model chose to keep listening (no reply for now)."""

    type: ClassVar[str] = "response.listen"
    #: The reply this ends, when the model stopped one to listen.
    response_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpeak(EngineEvent):
    """Native turn-taking: the model chose to speak; ``response_id`` is the reply it starts."""

    type: ClassVar[str] = "response.speak"
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOverlapDecision(EngineEvent):
    """What the engine's overlap policy did when the caller spoke over a reply."""

    type: ClassVar[str] = "overlap.decision"
    policy: str | None = None
    action: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInputTranscript(EngineEvent):
    """What the caller said: partial (``final=False``) or the turn's final text."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    text: str
    final: bool = False
    #: How sure the recognizer is of the last word of a partial (0-1), where it says: an unsure
    #: last word is a cue, for ``semantic_vad``, that the caller may not be done.
    last_word_confidence: float | None = None
    #: A partial with the words up to the caller's pause (``EngineCapabilities.words_at_pause``).
    at_pause: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInputTranscriptFailed(EngineEvent):
    """The caller's turn ``item_id`` could not be transcribed (the session goes on)."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.failed"
    item_id: str
    code: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineError(EngineEvent):
    """A failure inside the engine; ``fatal`` ends the session."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    fatal: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineClosed(EngineEvent):
    """The engine session is over; the last event its stream yields."""

    type: ClassVar[str] = "session.closed"
    reason: str


#: What a reply says (its audio, words and tool calls), as opposed to its start and end: what a
#: stopped reply may not emit any more, so an engine takes back what its reader has not read yet.
REPLY_OUTPUT_EVENTS: Final = (
    EngineAudio,
    EngineTranscript,
    EngineText,
    EngineFunctionCallDelta,
    EngineFunctionCall,
)


# -- the port -----------------------------------------------------------------


class EngineSession(abc.ABC):
    """One caller's conversation inside an engine."""

    #: ``append_audio`` returns without ever waiting (it only keeps the audio, or hands it to a
    #: worker of its own). The gateway then makes an append at once, in the task that read it,
    #: when no other call of the session is queued or running: no task switch per frame.
    appends_without_waiting: ClassVar[bool] = False

    @abc.abstractmethod
    async def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> None:
        """Caller audio, PCM16 mono at the engine's input rate.

        ``is_speech`` and ``hints`` are what the client said about the chunk
        (vLLM-Omni's per-chunk hints: its own speech flag, RMS, VAD scores ...);
        engines that have no use for them ignore them. ``video_frames``: camera
        frames (base64 JPEG or PNG) taken while this audio was spoken; only engines
        with ``video_input`` get any.
        """

    @abc.abstractmethod
    async def commit(
        self,
        *,
        item_id: str,
        response_id: str | None,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
    ) -> None:
        """The caller's turn ``item_id`` is complete; reply to it as ``response_id`` if one is given.

        The gateway names the reply before the engine starts it, so the reply can be
        cancelled (:meth:`cancel_response`) at any instant of its life, even before
        the engine's first event for it. ``engine_decides`` (only for engines with
        ``native_turns``): no reply was asked for, the engine's own turn-taking
        decides whether to start one. ``final=False``: a segment of a turn that goes on;
        ``is_speech=False``: the client says the turn is silence (the engine may listen on).
        """

    @abc.abstractmethod
    async def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        """A text message the client added to the conversation.

        ``previous_item_id`` places it: after that item, first for ``"root"``, last for None.
        ``images``: a user message's pictures (JPEG or PNG data URLs); only engines with
        ``image_input`` get any.
        """

    async def add_function_call(
        self, *, item_id: str, call_id: str, name: str, arguments: str, previous_item_id: str | None = None
    ) -> None:
        """A function call the client put into the conversation (history it replays).

        Engines that keep no conversation, or call no tools, ignore it.
        """
        return

    async def add_function_output(
        self, *, item_id: str, call_id: str, output: str, previous_item_id: str | None = None
    ) -> None:
        """What the client's function ``call_id`` returned; the next reply can use it.

        Engines that call no tools ignore it.
        """
        return

    async def delete_item(
        self, item_id: str, *, response_id: str | None = None, call_id: str | None = None
    ) -> None:
        """The client removed ``item_id`` from the conversation.

        Engines that keep conversation state forget it; the default, for engines
        that keep none, does nothing. An item one of this engine's replies made (its
        message, or a function call) also names that reply, ``response_id``, and for a
        call its ``call_id``: an engine that never learns the ids the gateway gives its
        replies' items finds the item by these.
        """
        return

    async def caller_paused(self) -> None:
        """Hint: the caller went quiet mid-turn and a commit may follow.

        Engines may start work early here (e.g. transcribe the turn so far); the
        default does nothing. Only sent when the gateway detects turns.
        """
        return

    @abc.abstractmethod
    async def clear_input(self) -> None:
        """Drop caller audio appended since the last commit."""

    async def cancel_input(self) -> None:
        """The caller abandoned the turn in progress (vLLM-Omni's ``input.cancel``).

        Engines with turn state of their own drop it too; the default drops the audio.
        """
        await self.clear_input()

    async def append_text(self, text: str) -> None:
        """Text pushed into the caller's live turn (``input.text.append``; ``native_turns`` engines)."""
        raise EngineRefused("unsupported_by_engine", "this engine takes no text into a live turn")

    async def signal_turn(self, event: str, payload: Mapping[str, object]) -> None:
        """A client's turn signal (``turn.signal``, e.g. ``user_started``; ``native_turns`` engines)."""
        raise EngineRefused("unsupported_by_engine", "this engine takes no turn signals")

    @abc.abstractmethod
    async def create_response(
        self, *, response_id: str, instructions: str | None, options: ResponseOptions | None = None
    ) -> None:
        """Start a reply now, with this id.

        ``options`` (None: the session's settings) say what the reply may do; the
        gateway only passes options the engine's capabilities claim.
        """

    @abc.abstractmethod
    async def cancel_response(self, response_id: str) -> None:
        """Stop the reply; emit nothing more for it but, at most, its ``response.done`` (``cancelled``).

        Engines differ in that last event (echo, embedded and vllm-omni send it; remote
        drops all its backend still says of the reply): the gateway takes either.
        """

    @abc.abstractmethod
    async def barge_in(self) -> None:
        """The caller spoke over the reply: stop it and listen."""

    @abc.abstractmethod
    async def ack_playback(self, *, response_id: str, played_ms: int) -> None:
        """The caller has heard ``played_ms`` of the reply."""

    async def truncate_reply(self, *, response_id: str, audio_end_ms: int) -> None:
        """The caller heard only ``audio_end_ms`` of the reply (``conversation.item.truncate``).

        Engines that keep the conversation cut the reply there; the default reports it
        as playback, for engines that keep none.
        """
        await self.ack_playback(response_id=response_id, played_ms=audio_end_ms)

    @abc.abstractmethod
    async def update(self, config: SessionConfig) -> None:
        """The client changed its session configuration.

        Returns once the engine has taken it; raises :class:`EngineRefused` if it refused it
        (the engine keeps its previous configuration).
        """

    @abc.abstractmethod
    async def close(self, reason: str) -> None:
        """End the session and release what it holds; idempotent."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[EngineEvent]:
        """The session's events in order; ends after :class:`EngineClosed`. One consumer."""


class Engine(abc.ABC):
    """A speech engine that many sessions share."""

    @property
    @abc.abstractmethod
    def capabilities(self) -> EngineCapabilities: ...

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """Can open sessions now (``/readyz``)."""

    @property
    @abc.abstractmethod
    def active_sessions(self) -> int: ...

    @abc.abstractmethod
    async def start(self) -> None:
        """Load models / connect; called once before the server accepts clients."""

    @abc.abstractmethod
    async def open_session(self, session_id: str, config: SessionConfig) -> EngineSession:
        """A new session; raises :class:`EngineSessionLimit` or :class:`EngineUnavailable`."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Close every session and release the engine."""
