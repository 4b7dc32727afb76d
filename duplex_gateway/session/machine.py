"""The conversation state of one caller, as a sans-I/O state machine.

A :class:`Session` takes client commands, processed caller audio and engine
events, and returns what must happen next: server events for the client and
engine calls for the engine session. It owns every turn-taking rule: the
response lifecycle, the fence that keeps a cancelled reply's audio from ever
reaching the client, the playback cursor (what the caller actually heard), and
gateway-side turn detection for engines that do not find turns themselves.

It never touches a socket, a task or a clock; time arrives as arguments.
"""

from __future__ import annotations

import enum
import itertools
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from duplex_gateway.audio.vad import SpeechPause, SpeechStart, SpeechStop, TurnDetector
from duplex_gateway.engine import port
from duplex_gateway.session.engine_calls import (
    AcknowledgeEvents,
    AckPlayback,
    AddFunctionCall,
    AddFunctionOutput,
    AddItem,
    AppendAudio,
    AppendText,
    BargeInEngine,
    CallerPaused,
    CancelInput,
    CancelResponse,
    ClearInput,
    CloseSession,
    CommitInput,
    DeleteItem,
    EngineCall,
    OpenEngine,
    ProcessInput,
    ReportLatency,
    SignalTurn,
    StartResponse,
    TruncateReply,
    UpdateEngine,
)
from duplex_gateway.session.reply_options import check_session_tools, reply_options
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import (
    OPENAI_MESSAGES,
    CloseCode,
    ErrorCode,
    ProtocolError,
    openai_message,
)
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.session_config import (
    IGNORED_EVENT,
    LATENCY_EVENT,
    FunctionTool,
    Modality,
    SessionConfig,
    SessionKind,
    ToolChoice,
    ToolChoiceMode,
    TurnDetectionMode,
)

__all__ = [
    "AckPlayback",
    "AcknowledgeEvents",
    "AddFunctionCall",
    "AddFunctionOutput",
    "AddItem",
    "AppendAudio",
    "AppendText",
    "BargeInEngine",
    "CallerPaused",
    "CancelInput",
    "CancelResponse",
    "ClearInput",
    "CloseSession",
    "CommitInput",
    "DeleteItem",
    "EngineCall",
    "Handshake",
    "OpenEngine",
    "Output",
    "ProcessInput",
    "ReportLatency",
    "Session",
    "SignalTurn",
    "StartResponse",
    "TruncateReply",
    "UpdateEngine",
]

#: Items remembered for truncate/retrieve/ack; older ones are forgotten.
MAX_ITEMS = 256
#: Ids of finished (and cancelled) responses remembered so a late engine start is fenced.
MAX_FENCED_IDS = 64
#: Out-of-band replies one session may have in progress at once.
MAX_SIDE_RESPONSES = 4
#: Audio kept before speech onset so the turn includes its prefix padding,
#: plus room for the detector's confirmation delay.
_RING_SLACK_MS = 400


class Handshake(enum.Enum):
    """How a connection becomes a session."""

    #: OpenAI Realtime: ``session.created`` right after connect, defaults apply.
    REALTIME = "realtime"
    #: vLLM-Omni duplex: the first message must be ``session.update``.
    DUPLEX = "duplex"


Output = ev.ServerEvent | EngineCall


# -- state ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Item:
    item: ev.ConversationItem
    previous_id: str | None = None
    response_id: str | None = None
    #: The audio the item holds: a reply's produced so far, a caller turn's committed.
    produced_ms: float = 0.0
    heard_ms: float | None = None
    #: A reply's transcript deltas, each with the audio produced before it (ms).
    spoken: tuple[tuple[float, str], ...] = ()


class _Phase(enum.Enum):
    """Where a reply is in its life; cancel, clear and barge-in work in both."""

    #: Requested of the engine (``response.created`` sent); the engine has not started it.
    REQUESTED = "requested"
    #: The engine started it: its assistant item exists and output may flow.
    STREAMING = "streaming"


@dataclass(slots=True)
class _Call:
    """A function call a reply is making."""

    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: list[str] = field(default_factory=list)
    #: Its final form, once the call is complete (or cut short).
    item: ev.ConversationItem | None = None


@dataclass(slots=True)
class _Response:
    id: str
    modalities: tuple[Modality, ...]
    phase: _Phase = _Phase.REQUESTED
    #: Its spoken or written message item, opened with its first output.
    item_id: str | None = None
    #: Where that item is among the reply's output items.
    message_index: int = 0
    #: The reply's output items (message and function calls), in order.
    outputs: list[str] = field(default_factory=list)
    calls: dict[str, _Call] = field(default_factory=dict)
    #: ``conversation: "none"``: nothing of it enters the conversation.
    out_of_band: bool = False
    #: It may call a function: its message opens with its first audio or text, not when
    #: the engine starts it, so a reply that only calls a function has no empty message.
    may_call: bool = False
    metadata: Mapping[str, str] | None = None
    audio_ms: float = 0.0
    #: When its first audio reached the session (the caller starts hearing it then).
    first_audio_at: float | None = None
    #: When the gateway asked for it (the turn's commit, or ``response.create``).
    requested_at: float | None = None
    #: The caller's turn it answers, and how long after the end of that turn's speech
    #: the gateway's turn detection committed it (None: the client or engine ended it).
    turn_item_id: str | None = None
    detection_ms: float | None = None
    #: The engine's own account of its time (:class:`port.EngineTimings`).
    engine_stages: tuple[tuple[str, float], ...] = ()
    #: Transcript deltas with the reply audio produced when each arrived, so a
    #: truncated reply keeps the words the caller heard.
    transcript: list[tuple[float, str]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def part_type(self) -> str:
        return "audio" if Modality.AUDIO in self.modalities else "text"


class _IdFactory:
    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._salt = secrets.token_hex(4)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{self._salt}{next(self._counter):05d}"


class Session:
    """One caller's conversation. Feed it inputs; act on the outputs it returns."""

    def __init__(
        self,
        *,
        session_id: str,
        capabilities: port.EngineCapabilities,
        defaults: SessionConfig,
        handshake: Handshake,
        new_id: Callable[[str], str] | None = None,
    ) -> None:
        self.session_id = session_id
        self.capabilities = capabilities
        self.config = defaults
        self.handshake = handshake
        self.configured = handshake is Handshake.REALTIME
        self.closed = False
        #: Set by the I/O layer when resume is on; announced in ``session.created``.
        self.resume_token: str | None = None
        #: Advances on every cancel / barge-in; engines may tag output with it.
        self.epoch = 0
        self._engine_open = handshake is Handshake.REALTIME
        self._opening = False
        self._new_id = new_id or _IdFactory()
        self._items: OrderedDict[str, _Item] = OrderedDict()
        self._last_item_id: str | None = None
        #: The one reply in progress, from the moment it is requested until it is done.
        self._response: _Response | None = None
        #: Out-of-band replies in progress (``conversation: "none"``), by id; they run beside it.
        self._side: dict[str, _Response] = {}
        # Per caller item: (words already sent as deltas, the engine's last hypothesis).
        self._partials: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._fenced: deque[str] = deque(maxlen=MAX_FENCED_IDS)
        # Caller input since the last commit/clear, in ms of audio.
        self._buffered_ms = 0.0
        self._input_ms = 0.0
        self._speech_item_id: str | None = None
        #: Text pushed into the turn in progress (``input.text.append``): a commit has input.
        self._buffered_text = False
        #: A turn the engine found the end of, waiting for the engine to commit it.
        self._stopped_item_id: str | None = None
        #: The engine's names for caller turns -> the caller's items (engines that find turns).
        self._engine_items: OrderedDict[str, str] = OrderedDict()
        self._ring: deque[tuple[float, float, bytes]] = deque()
        self._detector = self._make_detector()
        # turn_detection.idle_timeout_ms: when the caller's silence after a reply ends
        # their turn for them, and where on the input clock that silence began.
        self._idle_deadline: float | None = None
        self._idle_from_ms = 0.0
        #: The time of the input being handled (the ``now`` the I/O layer passed in).
        self._clock: float | None = None
        #: Camera frames waiting for audio to ride to the engine with (the audio they came with
        #: is still in the resampler or the ring); the newest few only.
        self._held_frames: tuple[str, ...] = ()
        #: Kinds of input the engine does not use that the client was told of (once each).
        self._unused_told: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> list[Output]:
        """The first events of a session (``session.created`` for a realtime handshake)."""
        if self.handshake is not Handshake.REALTIME:
            return []
        try:
            self._checked(self.config)
        except ProtocolError as exc:
            return [self._created(), self._error(exc)]
        return [self._created()]

    @property
    def transcribing_only(self) -> bool:
        """A transcription session: turns are transcribed, never answered."""
        return self.config.kind is SessionKind.TRANSCRIPTION

    def _checked(self, config: SessionConfig) -> SessionConfig:
        if config.kind is SessionKind.TRANSCRIPTION and not self.capabilities.input_transcription:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"the {self.capabilities.name} engine cannot transcribe, so it cannot run a transcription session",
                param="session.type",
            )
        check_session_tools(config, self.capabilities)
        return config

    @staticmethod
    def _never_replies(param: str | None = None) -> ProtocolError:
        return ProtocolError(
            ErrorCode.INVALID_EVENT,
            "a transcription session transcribes the caller and never replies",
            param=param,
        )

    def engine_opened(self) -> list[Output]:
        """The engine session requested by :class:`OpenEngine` is ready."""
        self._engine_open = True
        self._opening = False
        self.configured = True
        return [self._created()]

    def _created(self) -> ev.SessionCreated:
        return ev.SessionCreated(
            session_id=self.session_id,
            config=self.config,
            capabilities=self.capabilities.as_pairs(),
            resume_token=self.resume_token,
        )

    def resumed(self, attachment_generation: int) -> ev.SessionResumed:
        """The event that greets a client re-attaching to this session (socket number ``attachment_generation``)."""
        return ev.SessionResumed(
            session_id=self.session_id,
            config=self.config,
            capabilities=self.capabilities.as_pairs(),
            resume_token=self.resume_token,
            attachment_generation=attachment_generation,
        )

    @property
    def gateway_vad(self) -> bool:
        """Whether the gateway (not the engine) finds the ends of turns."""
        return self.config.turn_detection is not None and not self.capabilities.detects_turns

    @property
    def transcribes_input(self) -> bool:
        """Whether the client gets the caller's words as transcription events.

        A Realtime client asks for them (``audio.input.transcription``); vLLM-Omni's
        duplex server sends whatever its model transcribed, asked or not.
        """
        return (
            self.config.input_transcription is not None
            or self.config.kind is SessionKind.TRANSCRIPTION
            or self.handshake is Handshake.DUPLEX
        )

    @property
    def engine_turns(self) -> bool:
        """The engine's own turn-taking decides which turns get a reply (vLLM-Omni ``auto_response``).

        Asked for by the client with ``extra_body.auto_response``, on an engine that
        has native turn-taking; other engines get the gateway's rendering of it.
        """
        return self.capabilities.native_turns and self.config.auto_response and not self.transcribing_only

    @property
    def response_active(self) -> bool:
        return self._response is not None

    def _make_detector(self) -> TurnDetector | None:
        td = self.config.turn_detection
        if td is None or self.capabilities.detects_turns:
            return None
        return TurnDetector(td)

    # -- client commands ------------------------------------------------------------

    def receive(self, command: cmd.Command, *, now: float) -> list[Output]:
        """Handle one client command received at ``now`` (seconds, any monotonic clock)."""
        if self.closed:
            return []
        self._clock = now
        try:
            return self._dispatch(command, now)
        except ProtocolError as exc:
            return [self._error(exc.with_event_id(command.event_id))]

    def _dispatch(self, command: cmd.Command, now: float) -> list[Output]:
        if isinstance(command, cmd.SessionClose):
            return self._close(command.reason, CloseCode.NORMAL)
        if isinstance(command, cmd.SessionHeartbeat):
            return [ev.HeartbeatAck(session_id=self.session_id)]
        if isinstance(command, cmd.SessionEventAck):
            # Answered by nothing (DuplexClient acks every event, so an answer would loop);
            # what was acknowledged is never replayed, as vLLM-Omni trims its journal.
            return [AcknowledgeEvents(server_event_seq=command.server_event_seq)]
        if isinstance(command, cmd.SessionResume):
            raise ProtocolError(
                ErrorCode.INVALID_EVENT,
                "session.resume must be the first message of a new connection "
                "(on /v1/duplex, or /v1/realtime?resume=1)",
            )
        if not self.configured:
            if isinstance(command, cmd.SessionUpdate):
                return self._open(command)
            raise ProtocolError(
                ErrorCode.SESSION_NOT_CONFIGURED,
                f"{command.type} before the session is configured: send session.update first",
            )
        handler = self._handlers.get(type(command))
        if handler is None:  # every parsed command has a handler; this guards new ones
            raise ProtocolError(ErrorCode.UNKNOWN_EVENT, f"unsupported event {command.type}")
        return handler(self, command, now)

    def _open(self, command: cmd.SessionUpdate) -> list[Output]:
        if self._opening:
            raise ProtocolError(ErrorCode.SESSION_NOT_CONFIGURED, "the session is still opening")
        self.config = self._checked(self.config.apply(command.session))
        self._detector = self._make_detector()
        self._opening = True
        return [OpenEngine(config=self.config)]

    def _on_update(self, command: cmd.SessionUpdate, now: float) -> list[Output]:
        before = self.config
        after = self._checked(before.apply(command.session))
        if after.kind is not before.kind:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"this is a {before.kind.value} session; session.type cannot change "
                "(open a new session, e.g. /v1/realtime?intent=transcription)",
                param="session.type",
            )
        # The gateway's own part (formats, turn detection) applies at once, as the client's next
        # events expect; session.updated waits for the engine, and a refusal takes it back.
        self._set_config(after)
        return [UpdateEngine(config=after, previous=before, event_id=command.event_id)]

    def _set_config(self, config: SessionConfig) -> None:
        before, self.config = self.config, config
        if config.turn_detection != before.turn_detection:
            self._end_speech()
            self._detector = self._make_detector()

    def engine_updated(self, call: UpdateEngine) -> list[Output]:
        """The engine took the configuration of ``call``: the client is told so."""
        if self.closed:
            return []
        return [ev.SessionUpdated(session_id=self.session_id, config=call.config)]

    def engine_update_refused(self, call: UpdateEngine, *, code: str, message: str) -> list[Output]:
        """The engine refused ``call`` and kept its configuration: so does the session."""
        if self.closed:
            return []
        if self.config is call.config:  # no later update is on its way
            self._set_config(call.previous)
        return [
            ev.ErrorEvent(
                code=ErrorCode.INVALID_VALUE,
                message=f"the engine refused the session update ({code}: {message})",
                event_id=call.event_id,
                param="session",
            )
        ]

    def _on_append(self, command: cmd.InputAudioAppend, now: float) -> list[Output]:
        fmt = self._chunk_format(command)
        if not command.audio:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "audio is empty", param="audio")
        fmt.check_length(len(command.audio))
        # The audio is the caller's and always counts; frames sent with it go only where they are seen.
        frames, outputs = command.video_frames, []
        if frames and not self.capabilities.video_input:
            frames, outputs = (), self._unused("video_frames", "camera frames (video_frames)")
        # Audio is never refused for arriving fast: the connection paces the client with backpressure.
        outputs.insert(
            0,
            ProcessInput(
                audio=command.audio,
                format=None if fmt == self.config.input_format else fmt,
                is_speech=command.is_speech,
                hints=command.hints,
                video_frames=frames,
            ),
        )
        if command.video_error is not None:
            outputs.append(
                ev.ErrorEvent(
                    code=ErrorCode.INVALID_VALUE,
                    event_id=command.event_id,
                    param="video_frames",
                    message=f"{command.video_error}; the frames were dropped, the audio was kept",
                )
            )
        return outputs

    def _unused(self, kind: str, what: str) -> list[Output]:
        """Tell the client, the first time only, that the engine does not use ``kind`` of input.

        Duplex-handshake clients are told unasked; a Realtime client only if it asked
        (``session.include``), as strict ones refuse an event type OpenAI does not define.
        """
        if kind in self._unused_told:
            return []
        if self.handshake is not Handshake.DUPLEX and IGNORED_EVENT not in self.config.include:
            return []
        self._unused_told.add(kind)
        name = self.capabilities.name
        return [
            ev.InputIgnored(
                input=kind,
                engine=name,
                message=f"the {name} engine does not use {what}: they are dropped, the rest of the input is used",
            )
        ]

    def _chunk_format(self, command: cmd.InputAudioAppend) -> AudioFormat:
        """The format of one chunk: what the client declared for it, the session's for the rest."""
        session = self.config.input_format
        if command.encoding is None and command.rate is None:
            return session
        encoding = command.encoding or session.encoding
        rate = command.rate
        if rate is None:
            # A telephone codec named without a rate is at its own 8 kHz, as vLLM-Omni reads it.
            rate = 8_000 if encoding.is_g711 and not session.encoding.is_g711 else session.rate
        return AudioFormat(encoding=encoding, rate=rate)

    def _on_dtmf(self, command: cmd.CallDtmf, now: float) -> list[Output]:
        return [ev.DtmfReceived(digit=command.digit, received_at=command.received_at)]

    def _on_input_cancel(self, command: cmd.InputCancel, now: float) -> list[Output]:
        self._drop_input()
        return [CancelInput(), ev.InputAudioCleared()]

    def _on_text_append(self, command: cmd.InputTextAppend, now: float) -> list[Output]:
        self._require_native_turns(command.type)
        self._buffered_text = True
        return [AppendText(text=command.text)]

    def _on_turn_signal(self, command: cmd.TurnSignal, now: float) -> list[Output]:
        self._require_native_turns(command.type)
        return [SignalTurn(event=command.event, payload=command.payload)]

    def _require_native_turns(self, what: str) -> None:
        if not self.capabilities.native_turns:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_BY_ENGINE,
                f"{what} needs an engine with its own turn-taking; the {self.capabilities.name} engine has none",
            )

    def _on_commit(self, command: cmd.InputAudioCommit, now: float) -> list[Output]:
        if command.create_response and self.transcribing_only:
            raise self._never_replies(param="response_create")
        if self._buffered_ms <= 0.0 and not self._buffered_text:
            if command.is_speech is False:
                return []  # vLLM-Omni takes a commit of nothing but declared silence without a word
            raise ProtocolError(
                ErrorCode.INPUT_AUDIO_BUFFER_EMPTY,
                openai_message(
                    ErrorCode.INPUT_AUDIO_BUFFER_EMPTY, "No audio was appended since the last commit."
                ),
            )
        if command.create_response and self.response_active:
            raise self._already_active(param="response_create")
        if command.create_response:
            create = True
        elif self.engine_turns:
            # vLLM-Omni answers an auto_response commit by its own turn-taking (it may choose to
            # listen); the reply, if any, is the engine's, announced when it starts.
            return self._commit_turn(
                create_response=False, final=command.final, engine_decides=True, is_speech=command.is_speech
            )
        elif self.config.auto_response and command.final:
            # vLLM-Omni's server answers every final commit of an auto_response session, even
            # one that says response_create: false. A turn that ends while a reply is in
            # progress asks for no second one.
            create = not self.response_active and not self.transcribing_only
        elif command.create_response is None:
            create = self.gateway_vad and self._turn_detection_creates_response()
        else:
            create = False
        return self._commit_turn(create_response=create)

    def _on_clear(self, command: cmd.InputAudioClear, now: float) -> list[Output]:
        self._drop_input()
        return [ClearInput(), ev.InputAudioCleared()]

    def _drop_input(self) -> None:
        self._buffered_ms = 0.0
        self._buffered_text = False
        self._ring.clear()
        self._held_frames = ()  # the pictures of the input dropped
        self._end_speech()

    def _on_response_create(self, command: cmd.ResponseCreate, now: float) -> list[Output]:
        if self.transcribing_only:
            raise self._never_replies()
        if self.response_active and not command.out_of_band:
            raise self._already_active()
        options = reply_options(command, self.config, self.capabilities, self._find_item)
        if command.out_of_band:
            if len(self._side) >= MAX_SIDE_RESPONSES:
                raise ProtocolError(
                    ErrorCode.RESPONSE_ALREADY_ACTIVE,
                    openai_message(
                        ErrorCode.RESPONSE_ALREADY_ACTIVE,
                        f"{', '.join(self._side)}. At most {MAX_SIDE_RESPONSES} out-of-band responses run "
                        "at once; wait until one is finished before creating another.",
                    ),
                )
            response = _Response(
                id=self._new_id("resp"),
                modalities=options.modalities,
                requested_at=self._clock,
                out_of_band=True,
                metadata=command.metadata,
            )
            self._side[response.id] = response
        else:
            response = self._request_response(options.modalities)
            response.metadata = command.metadata
        response.may_call = self._may_call(options.tools, options.tool_choice)
        return [
            StartResponse(response_id=response.id, instructions=command.instructions, options=options),
            ev.ResponseCreated(
                response_id=response.id, metadata=command.metadata, out_of_band=command.out_of_band
            ),
        ]

    def _already_active(self, param: str | None = None) -> ProtocolError:
        return ProtocolError(
            ErrorCode.RESPONSE_ALREADY_ACTIVE,
            openai_message(
                ErrorCode.RESPONSE_ALREADY_ACTIVE,
                f"{self._active_id()}. Wait until the response is finished before creating a new one.",
            ),
            param=param,
        )

    def _find_item(self, item_id: str) -> ev.ConversationItem | None:
        record = self._items.get(item_id)
        return record.item if record is not None else None

    def _on_response_cancel(self, command: cmd.ResponseCancel, now: float) -> list[Output]:
        side = self._side.get(command.response_id or "")
        if side is not None:
            return self._cancel("client_cancelled", response=side)
        active = self._active_id()
        if active is None or (command.response_id is not None and command.response_id != active):
            raise ProtocolError(
                ErrorCode.RESPONSE_NOT_ACTIVE,
                openai_message(ErrorCode.RESPONSE_NOT_ACTIVE)
                if active is None
                else openai_message(
                    ErrorCode.RESPONSE_NOT_ACTIVE,
                    f"with id {command.response_id} (the active response is {active}).",
                ),
                param="response_id",
            )
        return self._cancel("client_cancelled")

    def _on_output_clear(self, command: cmd.OutputAudioClear, now: float) -> list[Output]:
        response_id = self._active_id()
        outputs = self._cancel("client_cancelled") if response_id else []
        outputs.append(ev.OutputAudioCleared(response_id=response_id))
        return outputs

    def _on_barge_in(self, command: cmd.BargeIn, now: float) -> list[Output]:
        return self._interrupt()

    def _on_item_create(self, command: cmd.ConversationItemCreate, now: float) -> list[Output]:
        if command.kind != "message":
            return self._on_function_item(command)
        if command.role not in ("user", "assistant", "system"):
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"unknown role {command.role!r}", param="item.role")
        item_id, after = self._created_item_place(command)
        images, told = command.images, []
        if images and not self.capabilities.image_input:
            images, told = (), self._unused("input_image", "pictures (input_image)")
        content_type = "input_text" if command.role != "assistant" else "output_text"
        item = ev.ConversationItem(
            id=item_id, role=command.role, content_type=content_type, text=command.text, images=len(images)
        )
        previous = self._enter(_Item(item=item), after)
        return [
            *told,
            AddItem(
                item_id=item_id, role=command.role, text=command.text, previous_item_id=after, images=images
            ),
            ev.ConversationItemAdded(item=item, previous_item_id=previous),
            ev.ConversationItemDone(item=item, previous_item_id=previous),
        ]

    def _on_function_item(self, command: cmd.ConversationItemCreate) -> list[Output]:
        """A function call (history) or a function's output enters the conversation."""
        item_id, after = self._created_item_place(command)
        call_id = command.call_id or self._new_id("call")
        item = ev.ConversationItem(
            id=item_id,
            role=command.role,
            content_type="",
            kind=command.kind,
            call_id=call_id,
            name=command.name,
            arguments=command.arguments,
            output=command.output,
        )
        previous = self._enter(_Item(item=item), after)
        call: EngineCall
        if command.kind == "function_call":
            call = AddFunctionCall(
                item_id=item_id,
                call_id=call_id,
                name=command.name or "",
                arguments=command.arguments or "",
                previous_item_id=after,
            )
        else:
            call = AddFunctionOutput(
                item_id=item_id, call_id=call_id, output=command.output or "", previous_item_id=after
            )
        return [
            call,
            ev.ConversationItemAdded(item=item, previous_item_id=previous),
            ev.ConversationItemDone(item=item, previous_item_id=previous),
        ]

    def _created_item_place(self, command: cmd.ConversationItemCreate) -> tuple[str, str | None]:
        """The id a created item takes and the item it goes after; refused when either is wrong."""
        item_id = command.item_id or self._new_id("item")
        if item_id in self._items:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"item {item_id} already exists", param="item.id")
        after = command.previous_item_id
        if after is not None and after != "root" and after not in self._items:
            raise ProtocolError(
                ErrorCode.ITEM_NOT_FOUND, f"no item {after} to insert after", param="previous_item_id"
            )
        return item_id, after

    def _enter(self, record: _Item, after: str | None) -> str | None:
        """Put a created item in the conversation: last (None), first ("root") or after ``after``.

        Returns the id of the item it now follows.
        """
        if after is None:
            return self._remember(record)
        return self._insert(record, None if after == "root" else after)

    def _on_truncate(self, command: cmd.ConversationItemTruncate, now: float) -> list[Output]:
        if command.item_id not in self._items:
            raise _no_such_item(ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID, command.item_id)
        record = self._assistant_item(command.item_id)
        if command.content_index != 0:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "assistant items have one content part (index 0)",
                param="content_index",
            )
        if command.audio_end_ms < 0:
            raise ProtocolError(
                ErrorCode.AUDIO_END_OUT_OF_RANGE, "audio_end_ms must not be negative", param="audio_end_ms"
            )
        # As OpenAI does: a point past the audio produced means all of it was heard.
        heard = min(float(command.audio_end_ms), record.produced_ms)
        record.heard_ms = heard
        outputs: list[Output] = []
        if self._response is not None and self._response.item_id == command.item_id:
            outputs.extend(self._cancel("client_cancelled"))
        else:
            record.item = replace(record.item, transcript=_heard_words(record, heard))
        assert record.response_id is not None
        outputs.append(TruncateReply(response_id=record.response_id, audio_end_ms=int(heard)))
        outputs.append(
            ev.ConversationItemTruncated(item_id=command.item_id, content_index=0, audio_end_ms=int(heard))
        )
        return outputs

    def _on_item_delete(self, command: cmd.ConversationItemDelete, now: float) -> list[Output]:
        item_id = command.item_id
        if item_id not in self._items:
            raise _no_such_item(ErrorCode.ITEM_DELETE_INVALID_ITEM_ID, item_id)
        outputs: list[Output] = []
        if self._response is not None and self._response.item_id == item_id:
            # The reply being spoken loses its item: it cannot go on.
            outputs.extend(self._cancel("client_cancelled"))
        record = self._items.pop(item_id)
        # The conversation closes over the gap.
        for other in self._items.values():
            if other.previous_id == item_id:
                other.previous_id = record.previous_id
        if self._last_item_id == item_id:
            self._last_item_id = next(reversed(self._items), None)
        made_by = record.response_id
        call_id = record.item.call_id if made_by is not None and record.item.kind == "function_call" else None
        outputs += [
            DeleteItem(item_id=item_id, response_id=made_by, call_id=call_id),
            ev.ConversationItemDeleted(item_id=item_id),
        ]
        return outputs

    def _on_item_retrieve(self, command: cmd.ConversationItemRetrieve, now: float) -> list[Output]:
        record = self._items.get(command.item_id)
        if record is None:
            raise _no_such_item(ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, command.item_id)
        return [ev.ConversationItemRetrieved(item=record.item)]

    def _on_playback_ack(self, command: cmd.PlaybackAck, now: float) -> list[Output]:
        if command.played_ms < 0:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "played_ms must not be negative", param="played_ms")
        record = self._find_played(command.response_id, command.item_id)
        played = min(float(command.played_ms), record.produced_ms)
        record.heard_ms = played
        assert record.response_id is not None
        return [
            AckPlayback(response_id=record.response_id, played_ms=int(played)),
            ev.PlaybackAcknowledged(
                response_id=record.response_id, played_ms=int(played), produced_ms=int(record.produced_ms)
            ),
        ]

    _handlers: ClassVar[dict[type[cmd.Command], Callable[[Session, Any, float], list[Output]]]] = {}

    # -- caller audio -------------------------------------------------------------------

    def input_processed(
        self,
        pcm: bytes,
        duration_ms: float,
        windows: Sequence[tuple[int, float]] = (),
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        now: float | None = None,
        video_frames: Sequence[str] = (),
    ) -> list[Output]:
        """Caller audio converted to the engine's format, with VAD windows ``(end_ms, probability)``.

        ``end_ms`` counts from the start of the session's input stream; ``is_speech``
        and ``hints`` are the client's, for the engine; ``now`` is when it was processed
        (the clock of :meth:`receive`; it times the replies turn detection starts).
        ``video_frames``: camera frames taken while this audio was spoken; they go to
        the engine with the next audio it gets (this, or the audio after it).
        """
        # An empty chunk (the resampler is still filling) still moves the input
        # clock and may carry VAD windows: only its audio is absent.
        if self.closed:
            return []
        if now is not None:
            self._clock = now
        start_ms = self._input_ms
        self._input_ms += duration_ms
        if video_frames:
            # The newest frames only: vLLM-Omni's models take at most two with one append.
            self._held_frames = (*self._held_frames, *video_frames)[-2:]
        if self._detector is None:
            self._buffered_ms += duration_ms
            return [self._append(pcm, is_speech=is_speech, hints=hints)] if pcm else []
        outputs: list[Output] = []
        if self._speech_item_id is None:
            if pcm:
                self._ring.append((start_ms, self._input_ms, pcm))
            horizon = self._input_ms - self._ring_capacity_ms()
            while self._ring and self._ring[0][1] < horizon:
                self._ring.popleft()
        else:
            self._buffered_ms += duration_ms
            if pcm:
                outputs.append(self._append(pcm, is_speech=is_speech, hints=hints))
        for decision in self._detector.feed_many(windows):
            if isinstance(decision, SpeechStart) and self._speech_item_id is None:
                outputs.extend(self._speech_started(decision.audio_start_ms))
            elif isinstance(decision, SpeechPause) and self._speech_item_id is not None:
                outputs.append(CallerPaused())
            elif isinstance(decision, SpeechStop) and self._speech_item_id is not None:
                outputs.extend(self._speech_stopped(decision.audio_end_ms))
        return outputs

    def _append(
        self, pcm: bytes, *, is_speech: bool | None = None, hints: Mapping[str, object] | None = None
    ) -> AppendAudio:
        """Audio for the engine, with the camera frames that waited for it."""
        frames, self._held_frames = self._held_frames, ()
        return AppendAudio(pcm=pcm, is_speech=is_speech, hints=hints or {}, video_frames=frames)

    def _ring_capacity_ms(self) -> float:
        td = self.config.turn_detection
        return (td.prefix_padding_ms if td else 0) + _RING_SLACK_MS

    def _speech_started(self, audio_start_ms: int) -> list[Output]:
        self._idle_deadline = None
        item_id = self._new_id("item")
        self._speech_item_id = item_id
        outputs: list[Output] = [ev.SpeechStarted(audio_start_ms=audio_start_ms, item_id=item_id)]
        td = self.config.turn_detection
        if td is not None and td.interrupt_response and self.response_active:
            outputs.extend(self._interrupt())
        # The turn starts at its prefix padding: hand the engine what the ring
        # holds from there on, then stream live.
        for chunk_start, chunk_end, pcm in self._ring:
            if chunk_end > audio_start_ms:
                self._buffered_ms += chunk_end - chunk_start
                outputs.append(self._append(pcm))
        self._ring.clear()
        return outputs

    def _speech_stopped(self, audio_end_ms: int) -> list[Output]:
        item_id = self._speech_item_id
        assert item_id is not None
        outputs: list[Output] = [ev.SpeechStopped(audio_end_ms=audio_end_ms, item_id=item_id)]
        if self.engine_turns:
            td = self.config.turn_detection
            decides = td is not None and td.create_response
            outputs.extend(self._commit_turn(create_response=False, engine_decides=decides))
        else:
            # The detector commits a silence after the speech ended: that wait is part of the reply's
            # latency. ``audio_end_ms`` already counts the silence (as OpenAI's does), so the speech
            # itself ended ``silence_duration_ms`` before it.
            td = self.config.turn_detection
            silence = td.silence_duration_ms if td is not None else 0
            outputs.extend(
                self._commit_turn(
                    create_response=self._turn_detection_creates_response(),
                    detection_ms=max(0.0, self._input_ms - (audio_end_ms - silence)),
                )
            )
        return outputs

    def _turn_detection_creates_response(self) -> bool:
        td = self.config.turn_detection
        return (
            td is not None and td.create_response and not self.response_active and not self.transcribing_only
        )

    def _end_speech(self) -> None:
        self._speech_item_id = None
        if self._detector is not None:
            self._detector.reset()

    def _commit_turn(
        self,
        *,
        create_response: bool,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
        detection_ms: float | None = None,
    ) -> list[Output]:
        item_id = self._speech_item_id or self._new_id("item")
        self._speech_item_id = None
        response = self._request_response(self.config.output_modalities) if create_response else None
        if response is not None:
            response.turn_item_id = item_id
            response.detection_ms = detection_ms
        call = CommitInput(
            item_id=item_id,
            response_id=response.id if response else None,
            final=final,
            engine_decides=engine_decides,
            is_speech=is_speech,
        )
        outputs: list[Output] = [call, *self._turn_committed(item_id)]
        if response is not None:
            outputs.append(ev.ResponseCreated(response_id=response.id))
        return outputs

    def _turn_committed(self, item_id: str) -> list[Output]:
        """The caller's turn is ``item_id`` in the conversation from now on."""
        turn_ms, self._buffered_ms = self._buffered_ms, 0.0
        self._buffered_text = False
        item = ev.ConversationItem(id=item_id, role="user", content_type="input_audio")
        previous = self._remember(_Item(item=item, produced_ms=turn_ms))
        return [
            ev.InputAudioCommitted(item_id=item_id, previous_item_id=previous),
            ev.ConversationItemAdded(item=item, previous_item_id=previous),
            ev.ConversationItemDone(item=item, previous_item_id=previous),
        ]

    def _engine_turn_committed(self, engine_item_id: str) -> list[Output]:
        """The engine committed a caller turn; one it ended by itself is announced now."""
        if not engine_item_id or engine_item_id in self._items:
            return []  # the gateway committed it, under this very id
        mapped = self._engine_items.get(engine_item_id)
        if mapped is not None and mapped in self._items:
            return []
        item_id = mapped or self._stopped_item_id or self._speech_item_id or self._new_id("item")
        if item_id == self._speech_item_id:
            self._end_speech()
        self._stopped_item_id = None
        self._map_engine_item(engine_item_id, item_id)
        return self._turn_committed(item_id)

    def _map_engine_item(self, engine_item_id: str, item_id: str) -> None:
        if not engine_item_id or engine_item_id == item_id:
            return
        self._engine_items[engine_item_id] = item_id
        while len(self._engine_items) > MAX_ITEMS:
            self._engine_items.popitem(last=False)

    def _caller_item(self, engine_item_id: str) -> str:
        """The caller's item an engine's item id names ("" for none known)."""
        if engine_item_id in self._items:
            return engine_item_id
        return self._engine_items.get(engine_item_id, "")

    def _request_response(self, modalities: tuple[Modality, ...]) -> _Response:
        """A new reply, owned from now on: cancel, clear and barge-in reach it before the engine starts it."""
        assert self._response is None
        self._idle_deadline = None
        response = _Response(
            id=self._new_id("resp"),
            modalities=modalities,
            requested_at=self._clock,
            may_call=self._may_call(self.config.tools, self.config.tool_choice),
        )
        self._response = response
        return response

    # -- the clock ------------------------------------------------------------------------

    @property
    def next_timer(self) -> float | None:
        """When :meth:`tick` next has work to do (the clock of :meth:`receive`), or None."""
        return None if self.closed else self._idle_deadline

    def tick(self, now: float) -> list[Output]:
        """Time has passed: fire what :attr:`next_timer` announced, if it is due."""
        self._clock = now
        deadline = self._idle_deadline
        if self.closed or deadline is None or now < deadline:
            return []
        self._idle_deadline = None
        if self._response is not None or self._speech_item_id is not None:
            return []  # the conversation moved on by itself
        # turn_detection.idle_timeout_ms ran out: the caller's silence ends their turn
        # (it is committed, as OpenAI does) and the assistant speaks up.
        item_id = self._new_id("item")
        self._speech_item_id = item_id
        triggered = ev.InputAudioTimeoutTriggered(
            item_id=item_id, audio_start_ms=int(self._idle_from_ms), audio_end_ms=int(self._input_ms)
        )
        return [triggered, *self._commit_turn(create_response=True)]

    def _arm_idle_timer(self, response: _Response, now: float) -> None:
        td = self.config.turn_detection
        if td is None or td.idle_timeout_ms is None or td.mode is not TurnDetectionMode.SERVER_VAD:
            return
        # The timeout counts from when the reply has finished playing, not from when
        # the engine finished making it: a reply made faster than real time is still playing.
        started = response.first_audio_at if response.first_audio_at is not None else now
        played_until = max(now, started + response.audio_ms / 1000.0)
        self._idle_deadline = played_until + td.idle_timeout_ms / 1000.0
        self._idle_from_ms = self._input_ms + (played_until - now) * 1000.0

    # -- engine events -----------------------------------------------------------------

    def engine_event(self, event: port.EngineEvent, *, now: float | None = None) -> list[Output]:
        """Handle one event from the engine session, received at ``now`` (the clock of :meth:`receive`).

        Without ``now`` the session cannot tell when a reply finishes playing, so
        ``turn_detection.idle_timeout_ms`` is not armed by it.
        """
        if self.closed:
            return []
        if now is not None:
            self._clock = now
        if isinstance(event, port.EngineResponseStarted):
            return self._response_started(event.response_id)
        if isinstance(event, port.EngineTimings):
            live = self._live(event.response_id)
            if live is not None:
                live.engine_stages = event.stages
            return []
        if isinstance(event, port.EngineFunctionCallDelta | port.EngineFunctionCall):
            return self._function_call(event)
        if isinstance(event, port.EngineAudio | port.EngineTranscript | port.EngineText):
            return self._response_output(event, now)
        if isinstance(event, port.EngineResponseDone):
            response = self._live(event.response_id)
            if response is None:
                return []  # already finished on our side (cancelled): fenced
            if event.status in ("completed", "incomplete") and now is not None and not response.out_of_band:
                self._arm_idle_timer(response, now)
            return self._finish(
                response,
                event.status,
                event.reason,
                input_tokens=event.input_tokens,
                output_tokens=event.output_tokens,
            )
        if isinstance(event, port.EngineSpeechStarted):
            if self._speech_item_id is not None:
                return []
            started = self._speech_started(event.audio_start_ms)
            assert self._speech_item_id is not None
            self._map_engine_item(event.item_id, self._speech_item_id)
            return started
        if isinstance(event, port.EngineSpeechStopped):
            item_id = self._speech_item_id
            if item_id is None:
                return []
            self._speech_item_id = None
            self._stopped_item_id = item_id  # committed when the engine says it committed the turn
            self._map_engine_item(event.item_id, item_id)
            return [ev.SpeechStopped(audio_end_ms=event.audio_end_ms, item_id=item_id)]
        if isinstance(event, port.EngineTurnCommitted):
            return self._engine_turn_committed(event.item_id)
        if isinstance(event, port.EngineListen):
            return [ev.ResponseListen(response_id=event.response_id, reason=event.reason)]
        if isinstance(event, port.EngineSpeak):
            response = self._response
            item_id = response.item_id if response is not None and response.id == event.response_id else None
            return [ev.ResponseSpeak(response_id=event.response_id, item_id=item_id)]
        if isinstance(event, port.EngineOverlapDecision):
            return [ev.OverlapDecision(policy=event.policy, action=event.action, reason=event.reason)]
        if isinstance(event, port.EngineInputTranscript):
            item_id = (
                self._caller_item(event.item_id)
                or event.item_id
                or self._speech_item_id
                or self._stopped_item_id
                or self._last_caller_item()
                or ""
            )
            if event.final:
                record = self._items.get(item_id)
                if record is not None:
                    record.item = replace(record.item, transcript=event.text)
                if not self.transcribes_input:
                    return []
                audio_ms = record.produced_ms if record is not None else 0.0
                return [
                    ev.InputTranscriptionCompleted(item_id=item_id, transcript=event.text, audio_ms=audio_ms)
                ]
            return self._partial_transcript(item_id, event.text) if self.transcribes_input else []
        if isinstance(event, port.EngineInputTranscriptFailed):
            if not self.transcribes_input:
                return []
            item_id = self._caller_item(event.item_id) or event.item_id
            return [ev.InputTranscriptionFailed(item_id=item_id, code=event.code, message=event.message)]
        if isinstance(event, port.EngineError):
            outputs: list[Output] = [
                ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message=f"{event.code}: {event.message}")
            ]
            if event.fatal:
                outputs.extend(self._close("engine_error", CloseCode.ENGINE_FAILED))
            return outputs
        if isinstance(event, port.EngineClosed):
            return self._close(event.reason, CloseCode.ENGINE_FAILED, engine_gone=True)
        return []

    def _partial_transcript(self, item_id: str, hypothesis: str) -> list[Output]:
        """Turn an engine's running hypothesis into append-only deltas, as clients expect.

        A recognizer revises its latest words as it hears more, but a delta cannot be
        taken back: only words two hypotheses in a row agree on are sent, once each.
        The final transcript (``...completed``) is the authority on what was said.
        """
        emitted, previous = self._partials.get(item_id, ((), ()))
        words = tuple(hypothesis.split())
        stable = tuple(
            a for a, _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(previous, words))
        )
        new: tuple[str, ...] = ()
        if len(stable) > len(emitted) and stable[: len(emitted)] == emitted:
            new = stable[len(emitted) :]
            emitted = stable
        self._partials[item_id] = (emitted, words)
        while len(self._partials) > 4:  # only the turn being spoken matters
            self._partials.pop(next(iter(self._partials)))
        if not new:
            return []
        delta = " ".join(new)
        return [
            ev.InputTranscriptionDelta(
                item_id=item_id, delta=f" {delta}" if len(emitted) > len(new) else delta
            )
        ]

    def _live(self, response_id: str) -> _Response | None:
        """The reply in progress with this id (in the conversation or out of band); None if fenced."""
        response = self._response
        if response is not None and response.id == response_id:
            return response
        return self._side.get(response_id)

    def _response_started(self, response_id: str) -> list[Output]:
        if response_id in self._fenced:
            return []
        live = self._live(response_id)
        if live is not None:
            if live.phase is _Phase.REQUESTED and live.item_id is None and not live.may_call:
                return self._open_reply_item(live)
            live.phase = _Phase.STREAMING
            return []
        outputs: list[Output] = []
        if self._response is not None:
            # The engine moved on to a reply of its own: stop the one it left behind.
            outputs.extend(self._cancel("superseded"))
        # A reply the engine started by itself (its own turn detection).
        response = _Response(
            id=response_id,
            modalities=self.config.output_modalities,
            requested_at=self._clock,
            turn_item_id=self._last_caller_item(),
            may_call=self._may_call(self.config.tools, self.config.tool_choice),
        )
        self._response = response
        outputs.append(ev.ResponseCreated(response_id=response_id))
        outputs.extend(self._response_started(response_id))
        return outputs

    def _may_call(self, tools: tuple[FunctionTool, ...], choice: ToolChoice) -> bool:
        return bool(tools) and choice.mode is not ToolChoiceMode.NONE and self.capabilities.tools

    def _open_output(self, response: _Response, item: ev.ConversationItem) -> list[Output]:
        """A new output item of ``response``: announced, and (unless out of band) in the conversation."""
        response.phase = _Phase.STREAMING
        index = len(response.outputs)
        response.outputs.append(item.id)
        outputs: list[Output] = [ev.OutputItemAdded(response_id=response.id, output_index=index, item=item)]
        if not response.out_of_band:
            previous = self._remember(_Item(item=item, response_id=response.id))
            outputs.append(ev.ConversationItemAdded(item=item, previous_item_id=previous))
        return outputs

    def _open_reply_item(self, response: _Response) -> list[Output]:
        """The reply's first audio or text: its assistant message item comes into the conversation."""
        item_id = self._new_id("item")
        response.item_id = item_id
        response.message_index = len(response.outputs)
        content_type = "audio" if response.part_type == "audio" else "text"
        item = ev.ConversationItem(
            id=item_id, role="assistant", status="in_progress", content_type=content_type
        )
        return [
            *self._open_output(response, item),
            ev.ContentPartAdded(
                response_id=response.id,
                item_id=item_id,
                output_index=response.message_index,
                content_index=0,
                part_type=response.part_type,
            ),
        ]

    def _function_call(self, event: port.EngineFunctionCallDelta | port.EngineFunctionCall) -> list[Output]:
        """The reply calls a client function: its item, its arguments as they come, then the whole call."""
        response = self._live(event.response_id)
        if response is None:
            return []  # fenced: a cancelled reply calls nothing
        outputs: list[Output] = []
        call = response.calls.get(event.call_id)
        if call is None:
            call = _Call(
                item_id=self._new_id("item"),
                call_id=event.call_id,
                name=event.name,
                output_index=len(response.outputs),
            )
            response.calls[event.call_id] = call
            item = ev.ConversationItem(
                id=call.item_id,
                role="assistant",
                status="in_progress",
                content_type="",
                kind="function_call",
                call_id=call.call_id,
                name=call.name,
                arguments="",
            )
            outputs.extend(self._open_output(response, item))
        if call.item is not None:
            return outputs  # the call is complete; a late fragment changes nothing
        if isinstance(event, port.EngineFunctionCallDelta):
            if event.delta:
                call.arguments.append(event.delta)
                outputs.append(
                    ev.FunctionCallArgumentsDelta(
                        response_id=response.id,
                        item_id=call.item_id,
                        output_index=call.output_index,
                        call_id=call.call_id,
                        delta=event.delta,
                    )
                )
            return outputs
        if not call.arguments and event.arguments:
            # Clients that assemble the arguments from deltas get them whole, in one.
            outputs.append(
                ev.FunctionCallArgumentsDelta(
                    response_id=response.id,
                    item_id=call.item_id,
                    output_index=call.output_index,
                    call_id=call.call_id,
                    delta=event.arguments,
                )
            )
        outputs.extend(self._end_call(response, call, event.arguments, "completed"))
        return outputs

    def _end_call(self, response: _Response, call: _Call, arguments: str, status: str) -> list[Output]:
        item = ev.ConversationItem(
            id=call.item_id,
            role="assistant",
            status=status,
            content_type="",
            kind="function_call",
            call_id=call.call_id,
            name=call.name,
            arguments=arguments,
        )
        call.item = item
        outputs: list[Output] = [
            ev.FunctionCallArgumentsDone(
                response_id=response.id,
                item_id=call.item_id,
                output_index=call.output_index,
                call_id=call.call_id,
                name=call.name,
                arguments=arguments,
            ),
            ev.OutputItemDone(response_id=response.id, output_index=call.output_index, item=item),
        ]
        record = self._items.get(call.item_id)
        if record is not None and not response.out_of_band:
            record.item = item
            outputs.append(ev.ConversationItemDone(item=item, previous_item_id=record.previous_id))
        return outputs

    def _response_output(
        self, event: port.EngineAudio | port.EngineTranscript | port.EngineText, now: float | None = None
    ) -> list[Output]:
        response = self._live(event.response_id)
        if response is None:
            return []  # the epoch fence: nothing of a cancelled reply gets through
        if isinstance(event, port.EngineAudio) and (response.part_type != "audio" or not event.pcm):
            return []  # a text reply's audio is not wanted
        outputs: list[Output] = []
        if response.item_id is None:  # the reply's first output opens its message
            outputs.extend(self._open_reply_item(response))
        rid, iid, index = response.id, response.item_id, response.message_index
        assert iid is not None
        if isinstance(event, port.EngineAudio):
            if response.first_audio_at is None:
                response.first_audio_at = now
                outputs.extend(self._latency(response))
            ms = len(event.pcm) * 1000.0 / (2 * self.capabilities.output_rate)
            response.audio_ms += ms
            record = self._items.get(iid)
            if record is not None:
                record.produced_ms = response.audio_ms
            outputs.append(
                ev.AudioDelta(
                    response_id=rid,
                    item_id=iid,
                    output_index=index,
                    audio=event.pcm,
                    rate=self.capabilities.output_rate,
                )
            )
        elif isinstance(event, port.EngineTranscript) and response.part_type == "audio":
            response.transcript.append((response.audio_ms, event.delta))
            outputs.append(
                ev.TranscriptDelta(response_id=rid, item_id=iid, output_index=index, delta=event.delta)
            )
        else:
            response.text.append(event.delta)
            outputs.append(ev.TextDelta(response_id=rid, item_id=iid, output_index=index, delta=event.delta))
        return outputs

    def _latency(self, response: _Response) -> list[Output]:
        """The reply's first audio is out: where its time went, for the host and for clients that asked."""
        if response.requested_at is None or response.first_audio_at is None:
            return []
        detection = response.detection_ms
        engine_ms = max(0.0, (response.first_audio_at - response.requested_at) * 1000.0)
        stages: list[tuple[str, float]] = []
        if detection is not None:
            stages.append(("turn_detection", round(detection, 1)))
        if response.engine_stages:
            stages.extend((name, round(ms, 1)) for name, ms in response.engine_stages)
            covered = sum(ms for _, ms in response.engine_stages)
            stages.append(("other", round(max(0.0, engine_ms - covered), 1)))
        else:
            stages.append(("engine", round(engine_ms, 1)))
        total = round((detection or 0.0) + engine_ms, 1)
        latency = ev.TurnLatency(
            response_id=response.id, item_id=response.turn_item_id, total_ms=total, stages=tuple(stages)
        )
        report = ReportLatency(
            latency=latency, first_audio_ms=engine_ms, speech_end_ms=total if detection is not None else None
        )
        return [report, latency] if LATENCY_EVENT in self.config.include else [report]

    # -- ending responses ---------------------------------------------------------------

    def _active_id(self) -> str | None:
        return self._response.id if self._response is not None else None

    def _interrupt(self) -> list[Output]:
        """The caller spoke over the reply: fence it, tell the engine, close it out."""
        outputs: list[Output] = []
        response = self._response
        if response is not None:
            # A reply the engine has not started yet is cancelled by name: a barge-in
            # stops what is playing, not what is still being prepared.
            outputs.extend(self._cancel("turn_detected", engine_call=response.phase is _Phase.REQUESTED))
        outputs.append(BargeInEngine())
        return outputs

    def _cancel(
        self, reason: str, *, engine_call: bool = True, response: _Response | None = None
    ) -> list[Output]:
        """Fence and close out ``response`` (default: the reply in the conversation)."""
        response = response or self._response
        if response is None:
            return []
        if not response.out_of_band:
            self.epoch += 1
        self._fenced.append(response.id)
        outputs: list[Output] = []
        if engine_call:
            outputs.append(CancelResponse(response_id=response.id))
        outputs.extend(self._finish(response, "cancelled", reason))
        return outputs

    def _finish(
        self,
        response: _Response,
        status: str,
        reason: str | None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> list[Output]:
        if response is self._response:
            self._response = None
        self._side.pop(response.id, None)
        if response.id not in self._fenced:
            # A finished reply stays finished: an engine that announces it again (a late or
            # replayed start) must not open a second reply under the same id.
            self._fenced.append(response.id)
        outputs: list[Output] = []
        items: dict[str, ev.ConversationItem] = {}
        if response.item_id is not None:
            message, closing = self._close_message(response, status)
            items[message.id] = message
            outputs.extend(closing)
        for call in response.calls.values():
            if call.item is None:  # cut short: what the model had written of it
                outputs.extend(self._end_call(response, call, "".join(call.arguments), "incomplete"))
            assert call.item is not None
            items[call.item_id] = call.item
        turn = self._items.get(response.turn_item_id or "")
        outputs.append(
            ev.ResponseDone(
                response_id=response.id,
                status=status,
                reason=reason,
                output=tuple(items[item_id] for item_id in response.outputs if item_id in items),
                audio_ms=int(response.audio_ms),
                metadata=response.metadata,
                out_of_band=response.out_of_band,
                input_audio_ms=int(turn.produced_ms) if turn is not None else 0,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        )
        return outputs

    def _close_message(self, response: _Response, status: str) -> tuple[ev.ConversationItem, list[Output]]:
        """The reply's message item, complete (or cut short where the caller stopped hearing it)."""
        rid, iid, index = response.id, response.item_id, response.message_index
        assert iid is not None
        record = self._items.get(iid)
        if record is not None:
            record.spoken = tuple(response.transcript)
            transcript = _heard_words(record, record.heard_ms)
        else:
            transcript = "".join(delta for _, delta in response.transcript)
        text = "".join(response.text)
        audio = response.part_type == "audio"
        item = ev.ConversationItem(
            id=iid,
            role="assistant",
            status="completed" if status == "completed" else "incomplete",
            content_type="audio" if audio else "text",
            transcript=transcript if audio else None,
            text=None if audio else text,
        )
        if record is not None:
            record.item = item
        outputs: list[Output] = []
        if audio:
            outputs.append(ev.AudioDone(response_id=rid, item_id=iid, output_index=index))
            outputs.append(
                ev.TranscriptDone(response_id=rid, item_id=iid, output_index=index, transcript=transcript)
            )
        else:
            outputs.append(ev.TextDone(response_id=rid, item_id=iid, output_index=index, text=text))
        outputs += [
            ev.ContentPartDone(
                response_id=rid,
                item_id=iid,
                output_index=index,
                part_type=response.part_type,
                transcript=transcript if audio else text,
            ),
            ev.OutputItemDone(response_id=rid, output_index=index, item=item),
        ]
        if not response.out_of_band:
            outputs.append(
                ev.ConversationItemDone(item=item, previous_item_id=record.previous_id if record else None)
            )
        return item, outputs

    def _close(self, reason: str, code: CloseCode, *, engine_gone: bool = False) -> list[Output]:
        outputs: list[Output] = []
        if not engine_gone:
            for side in list(self._side.values()):
                outputs.extend(self._cancel("client_cancelled", engine_call=False, response=side))
            if self.response_active:
                outputs.extend(self._cancel("client_cancelled", engine_call=False))
        self.closed = True
        outputs.append(ev.SessionClosed(session_id=self.session_id, reason=reason))
        outputs.append(CloseSession(reason=reason, code=code))
        return outputs

    def shut_down(self) -> list[Output]:
        """The gateway is stopping: close out any reply, say so, close with 1001."""
        if self.closed:
            return []
        return self._close("server_shutdown", CloseCode.GOING_AWAY)

    def expire(self, reason: str, code: CloseCode, message: str) -> list[Output]:
        """The transport ended the session (idle, too long, slow reader): say why, then close."""
        if self.closed:
            return []
        error_code = {
            CloseCode.IDLE_TIMEOUT: ErrorCode.IDLE_TIMEOUT,
            CloseCode.MAX_DURATION: ErrorCode.SESSION_EXPIRED,
            CloseCode.SLOW_CONSUMER: ErrorCode.SLOW_CONSUMER,
        }.get(code, ErrorCode.INTERNAL_ERROR)
        if error_code in OPENAI_MESSAGES:  # OpenAI's words first, ``message`` after them
            message = openai_message(error_code, message)
        return [ev.ErrorEvent(code=error_code, message=message), *self._close(reason, code)]

    # -- conversation items ----------------------------------------------------------------

    def _last_caller_item(self) -> str | None:
        """The caller's latest spoken turn (a transcript never belongs to an assistant item)."""
        for record in reversed(self._items.values()):
            if record.item.role == "user" and record.item.content_type == "input_audio":
                return record.item.id
        return None

    def _remember(self, record: _Item) -> str | None:
        """Add ``record`` at the end of the conversation; returns the item before it."""
        previous = self._last_item_id
        record.previous_id = previous
        self._items[record.item.id] = record
        self._last_item_id = record.item.id
        while len(self._items) > MAX_ITEMS:
            self._items.popitem(last=False)
        return previous

    def _insert(self, record: _Item, after: str | None) -> str | None:
        """Add ``record`` right after item ``after`` (None: at the start); returns ``after``."""
        ordered = list(self._items.items())
        position = 0 if after is None else next(i for i, (key, _) in enumerate(ordered) if key == after) + 1
        record.previous_id = after
        ordered.insert(position, (record.item.id, record))
        if position < len(ordered) - 1:
            ordered[position + 1][1].previous_id = record.item.id
        self._items = OrderedDict(ordered)
        self._last_item_id = ordered[-1][0]
        while len(self._items) > MAX_ITEMS:
            self._items.popitem(last=False)
        return after

    def _assistant_item(self, item_id: str) -> _Item:
        record = self._items.get(item_id)
        if record is None or record.response_id is None or record.item.kind != "message":
            raise ProtocolError(
                ErrorCode.ITEM_NOT_FOUND, f"no assistant audio item {item_id}", param="item_id"
            )
        return record

    def _find_played(self, response_id: str | None, item_id: str | None) -> _Item:
        if item_id is not None and item_id not in self._items and item_id.startswith("item_"):
            # vLLM-Omni names a reply's item ``item_<response_id>``, and its clients send that
            # name back: it means the item of that reply.
            named = item_id.removeprefix("item_")
            if response_id in (None, named):
                item_id, response_id = None, named
        if item_id is not None:
            return self._assistant_item(item_id)
        for record in reversed(self._items.values()):
            if (
                record.response_id is not None
                and record.item.kind == "message"
                and response_id in (None, record.response_id)
            ):
                return record
        raise ProtocolError(
            ErrorCode.ITEM_NOT_FOUND,
            f"no response {response_id}" if response_id else "no response has been produced yet",
            param="response_id",
        )

    @staticmethod
    def _error(exc: ProtocolError) -> ev.ErrorEvent:
        return ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param)


def _no_such_item(code: ErrorCode, item_id: str) -> ProtocolError:
    """OpenAI's error for a retrieve, delete or truncate naming an item the conversation lacks."""
    return ProtocolError(
        code, openai_message(code, f"the item with id '{item_id[:64]}' does not exist."), param="item_id"
    )


def _heard_words(record: _Item, heard_ms: float | None) -> str:
    """The reply's transcript up to what the caller heard: the words whose audio had begun."""
    if heard_ms is None:
        return "".join(delta for _, delta in record.spoken)
    return "".join(delta for at_ms, delta in record.spoken if at_ms < heard_ms)


Session._handlers = {
    cmd.SessionUpdate: Session._on_update,
    cmd.InputAudioAppend: Session._on_append,
    cmd.InputAudioCommit: Session._on_commit,
    cmd.InputAudioClear: Session._on_clear,
    cmd.InputCancel: Session._on_input_cancel,
    cmd.CallDtmf: Session._on_dtmf,
    cmd.InputTextAppend: Session._on_text_append,
    cmd.TurnSignal: Session._on_turn_signal,
    cmd.ResponseCreate: Session._on_response_create,
    cmd.ResponseCancel: Session._on_response_cancel,
    cmd.OutputAudioClear: Session._on_output_clear,
    cmd.BargeIn: Session._on_barge_in,
    cmd.ConversationItemCreate: Session._on_item_create,
    cmd.ConversationItemTruncate: Session._on_truncate,
    cmd.ConversationItemDelete: Session._on_item_delete,
    cmd.ConversationItemRetrieve: Session._on_item_retrieve,
    cmd.PlaybackAck: Session._on_playback_ack,
}
