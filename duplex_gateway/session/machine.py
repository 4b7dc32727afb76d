"""The conversation state of one caller, as a sans-I/O state machine.

A :class:`Session` takes client commands, processed caller audio and engine
events, and returns what must happen next: server events for the client and
engine calls for the engine session. It owns every turn-taking rule: the
response lifecycle, the fence that keeps a cancelled reply's audio from ever
reaching the client, the playback cursor (what the caller actually heard), and
gateway-side turn detection for engines that do not find turns themselves.

The session's own life is :data:`PHASE_TRANSITIONS`; its parts live beside it:
the replies in :mod:`~duplex_gateway.session.replies`, the caller's turn in
:mod:`~duplex_gateway.session.turns`, the items in
:mod:`~duplex_gateway.session.conversation`, what the configuration implies in
:mod:`~duplex_gateway.session.settings`. The session is where they meet: commands
and engine events each reach their handler through a table, and the handlers
decide what one part's news means for the others (a caller who starts speaking
stops the reply; a turn the detector ends may ask for one).

It never touches a socket, a task or a clock; time arrives as arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from duplex_gateway.audio.turn_detector import (
    SpeechCandidate,
    SpeechPause,
    SpeechStart,
    SpeechStop,
    TurnEvent,
)
from duplex_gateway.engine import port
from duplex_gateway.session.backchannels import Backchannels
from duplex_gateway.session.context import AppContext, on_context, speak_owed
from duplex_gateway.session.conversation import MAX_ITEMS, Conversation, Item
from duplex_gateway.session.engine_calls import (
    AcknowledgeEvents,
    AckPlayback,
    AddFunctionCall,
    AddFunctionOutput,
    AddItem,
    AppendAudio,
    AppendText,
    AssessTurn,
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
    Output,
    ProcessInput,
    ReportLatency,
    SignalTurn,
    StartResponse,
    TruncateReply,
    UpdateEngine,
)
from duplex_gateway.session.ids import IdFactory
from duplex_gateway.session.overlap import BackchannelRule, OverlapVerdict
from duplex_gateway.session.phases import PHASE_TRANSITIONS, Happening, Lifecycle, Phase, PhaseError
from duplex_gateway.session.replies import MAX_SIDE_RESPONSES, Reply, ReplyBook
from duplex_gateway.session.reply_options import reply_options
from duplex_gateway.session.settings import Handshake, Settings
from duplex_gateway.session.turns import TurnTracker, process_input
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import (
    OPENAI_MESSAGES,
    CloseCode,
    ErrorCode,
    ProtocolError,
    openai_message,
)
from duplex_gateway.vocabulary.session_config import (
    LATENCY_EVENT,
    Modality,
    SessionConfig,
)

__all__ = [
    "MAX_ITEMS",
    "MAX_SIDE_RESPONSES",
    "PHASE_TRANSITIONS",
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
    "Happening",
    "Lifecycle",
    "Modality",
    "OpenEngine",
    "Output",
    "Phase",
    "PhaseError",
    "ProcessInput",
    "ReportLatency",
    "Session",
    "SignalTurn",
    "StartResponse",
    "TruncateReply",
    "UpdateEngine",
]


#: The gateway's backchannel rule when the host names none.
DEFAULT_BACKCHANNELS = BackchannelRule()


# -- the session ---------------------------------------------------------------------------------


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
        backchannels: BackchannelRule = DEFAULT_BACKCHANNELS,
    ) -> None:
        """``backchannels``: how caller speech over a reply is judged, unless the session says otherwise."""
        self.session_id = session_id
        self.capabilities = capabilities
        self.handshake = handshake
        self._settings = Settings(defaults, capabilities, handshake)
        self._life = Lifecycle(Phase.OPEN if handshake is Handshake.REALTIME else Phase.AWAITING_CONFIG)
        #: Set by the I/O layer when resume is on; announced in ``session.created``.
        self.resume_token: str | None = None
        self._new_id = new_id or IdFactory()
        self._conversation = Conversation(self._new_id)
        self._replies = ReplyBook(self._conversation, self._new_id, output_rate=capabilities.output_rate)
        self._turns = TurnTracker(
            self._conversation, self._new_id, defaults.turn_detection, engine=capabilities
        )
        #: The time of the input being handled (the ``now`` the I/O layer passed in).
        self._clock: float | None = None
        self._app = AppContext(self._conversation)
        self._backchannels = Backchannels(
            backchannels,
            self._turns,
            self._replies,
            start_turn=self._speech_started,
            replay=lambda event: self._engine_dispatch(event, self._clock),
            tell=lambda: self._settings.tells_overlaps,
        )

    # -- lifecycle ----------------------------------------------------------------

    @property
    def config(self) -> SessionConfig:
        """The configuration in force: the client's, as far as the engine took it."""
        return self._settings.config

    @property
    def phase(self) -> Phase:
        """Where the session is in its life."""
        return self._life.phase

    @property
    def closed(self) -> bool:
        """The session is over: it handles nothing more."""
        return self._life.phase is Phase.CLOSED

    @property
    def configured(self) -> bool:
        """The client's configuration is in force (at once for a Realtime handshake), or was at the close."""
        return Phase.OPEN in (self._life.phase, self._life.closed_from)

    @property
    def epoch(self) -> int:
        """Advances on every cancel / barge-in; engines may tag output with it."""
        return self._replies.epoch

    @property
    def _items(self) -> Mapping[str, Item]:
        # The conversation's records, for tests that look inside the session.
        return self._conversation.items

    def start(self) -> list[Output]:
        """The first events of a session (``session.created`` for a realtime handshake)."""
        if self.handshake is not Handshake.REALTIME:
            return []
        try:
            self._settings.checked(self.config)
        except ProtocolError as exc:
            return [self._settings.created(self.session_id, self.resume_token), self._error(exc)]
        return [self._settings.created(self.session_id, self.resume_token)]

    @property
    def transcribing_only(self) -> bool:
        """A transcription session: turns are transcribed, never answered."""
        return self._settings.transcribing_only

    def carried_on(self) -> None:
        """Taken over from another gateway, where it was configured and announced: open, quietly."""
        self._life.move(Happening.CARRIED_ON)

    def engine_opened(self) -> list[Output]:
        """The engine session requested by :class:`OpenEngine` is ready."""
        self._life.move(Happening.ENGINE_OPENED)
        return [self._settings.created(self.session_id, self.resume_token)]

    def resumed(self, attachment_generation: int) -> ev.SessionResumed:
        """The event that greets a client re-attaching to this session (socket number ``attachment_generation``)."""
        return self._settings.resumed(self.session_id, self.resume_token, attachment_generation)

    @property
    def gateway_vad(self) -> bool:
        """Whether the gateway (not the engine) finds the ends of turns."""
        return self._settings.gateway_vad

    @property
    def transcribes_input(self) -> bool:
        """Whether the client gets the caller's words as transcription events."""
        return self._settings.transcribes_input

    @property
    def engine_turns(self) -> bool:
        """The engine's own turn-taking decides which turns get a reply (vLLM-Omni ``auto_response``)."""
        return self._settings.engine_turns

    @property
    def response_active(self) -> bool:
        return self._replies.active is not None

    # -- client commands ------------------------------------------------------------

    def receive(self, command: cmd.Command, *, now: float) -> list[Output]:
        """Handle one client command received at ``now`` (seconds, any monotonic clock)."""
        if self.closed:
            return []
        self._clock = now
        try:
            outputs = self._dispatch(command, now)
        except ProtocolError as exc:
            outputs = [self._error(exc.with_event_id(command.event_id))]
        if self._backchannels.holding:
            outputs.extend(self._backchannels.lapsed())
        return outputs

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
        if self.phase is not Phase.OPEN:
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
        if self.phase is Phase.OPENING:
            raise ProtocolError(ErrorCode.SESSION_NOT_CONFIGURED, "the session is still opening")
        self._settings.config = self._settings.checked(self.config.apply(command.session))
        self._turns.detect_with(self.config.turn_detection)
        self._life.move(Happening.CONFIGURED)
        return [OpenEngine(config=self.config)]

    def _on_update(self, command: cmd.SessionUpdate, now: float) -> list[Output]:
        before, after = self.config, self._settings.updated(command.session)
        # The gateway's own part (formats, turn detection) applies at once, as the client's next
        # events expect; session.updated waits for the engine, and a refusal takes it back.
        self._set_config(after)
        return [UpdateEngine(config=after, previous=before, event_id=command.event_id)]

    def _set_config(self, config: SessionConfig) -> None:
        before, self._settings.config = self.config, config
        if config.turn_detection != before.turn_detection:
            self._turns.end_speech()
            self._turns.detect_with(config.turn_detection)

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
        # Audio is never refused for arriving fast: the connection paces the client with backpressure.
        process = process_input(self._app.heard(command, self.config.input_format), self.config.input_format)
        outputs: list[Output] = [process]
        # The audio is the caller's and always counts; frames sent with it go only where they are seen.
        if process.video_frames and not self.capabilities.video_input:
            told = self._settings.unused("video_frames", "camera frames (video_frames)")
            outputs = [replace(process, video_frames=()), *told]
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

    def _on_dtmf(self, command: cmd.CallDtmf, now: float) -> list[Output]:
        return [ev.DtmfReceived(digit=command.digit, received_at=command.received_at)]

    def _on_input_cancel(self, command: cmd.InputCancel, now: float) -> list[Output]:
        self._turns.drop_input()
        return [CancelInput(), ev.InputAudioCleared()]

    def _on_text_append(self, command: cmd.InputTextAppend, now: float) -> list[Output]:
        self._settings.require_native_turns(command.type)
        self._turns.text_appended()
        return [AppendText(text=command.text)]

    def _on_turn_signal(self, command: cmd.TurnSignal, now: float) -> list[Output]:
        self._settings.require_native_turns(command.type)
        return [SignalTurn(event=command.event, payload=command.payload)]

    def _on_commit(self, command: cmd.InputAudioCommit, now: float) -> list[Output]:
        if command.create_response and self.transcribing_only:
            raise self._settings.never_replies(param="response_create")
        if not self._turns.has_input:
            if command.is_speech is False:
                return []  # vLLM-Omni takes a commit of nothing but declared silence without a word
            raise ProtocolError(
                ErrorCode.INPUT_AUDIO_BUFFER_EMPTY,
                openai_message(
                    ErrorCode.INPUT_AUDIO_BUFFER_EMPTY, "No audio was appended since the last commit."
                ),
            )
        if command.create_response and self.response_active:
            raise self._replies.already_active(param="response_create")
        create = self._settings.commit_asks_reply(command, replying=self.response_active)
        if create is None:  # the engine's turn-taking answers the turn, if it does
            return self._commit_turn(
                create_response=False, final=command.final, engine_decides=True, is_speech=command.is_speech
            )
        return self._commit_turn(create_response=create)

    def _on_clear(self, command: cmd.InputAudioClear, now: float) -> list[Output]:
        self._turns.drop_input()
        return [ClearInput(), ev.InputAudioCleared()]

    def _on_response_create(self, command: cmd.ResponseCreate, now: float) -> list[Output]:
        if self.transcribing_only:
            raise self._settings.never_replies()
        if self.response_active and not command.out_of_band:
            raise self._replies.already_active()
        options = reply_options(command, self.config, self.capabilities, self._conversation.find)
        if command.out_of_band:
            reply = self._replies.request_out_of_band(
                options.modalities, requested_at=self._clock, metadata=command.metadata
            )
        else:
            reply = self._request_reply(options.modalities)
            reply.metadata = command.metadata
        reply.may_call = self._settings.may_call(options.tools, options.tool_choice)
        return [
            StartResponse(response_id=reply.id, instructions=command.instructions, options=options),
            ev.ResponseCreated(
                response_id=reply.id, metadata=command.metadata, out_of_band=command.out_of_band
            ),
        ]

    def _on_response_cancel(self, command: cmd.ResponseCancel, now: float) -> list[Output]:
        return self._replies.cancel_asked(command.response_id)

    def _on_output_clear(self, command: cmd.OutputAudioClear, now: float) -> list[Output]:
        return self._replies.clear_output()

    def _on_barge_in(self, command: cmd.BargeIn, now: float) -> list[Output]:
        return self._replies.interrupt()

    def _on_item_create(self, command: cmd.ConversationItemCreate, now: float) -> list[Output]:
        if command.kind != "message":
            return self._conversation.add_function_item(command)
        if command.role not in ("user", "assistant", "system"):
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"unknown role {command.role!r}", param="item.role")
        item_id, after = self._conversation.place(command)
        images, told = command.images, []
        if images and not self.capabilities.image_input:
            images, told = (), self._settings.unused("input_image", "pictures (input_image)")
        return [*told, *self._conversation.add_message(command, item_id, after, images)]

    def _on_truncate(self, command: cmd.ConversationItemTruncate, now: float) -> list[Output]:
        # A reply still speaking the item stops where the caller stopped hearing it.
        speaking = self._replies.active_item_id == command.item_id
        truncated = self._conversation.truncate(command, reply_closes_it=speaking)
        return [*(self._replies.cancel("client_cancelled") if speaking else []), *truncated]

    def _on_item_delete(self, command: cmd.ConversationItemDelete, now: float) -> list[Output]:
        self._conversation.require(command.item_id, ErrorCode.ITEM_DELETE_INVALID_ITEM_ID)
        # The reply being spoken loses its item: it cannot go on.
        speaking = self._replies.active_item_id == command.item_id
        return [
            *(self._replies.cancel("client_cancelled") if speaking else []),
            *self._conversation.delete(command.item_id),
        ]

    def _on_item_retrieve(self, command: cmd.ConversationItemRetrieve, now: float) -> list[Output]:
        record = self._conversation.require(command.item_id, ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID)
        return [ev.ConversationItemRetrieved(item=record.item)]

    def _on_playback_ack(self, command: cmd.PlaybackAck, now: float) -> list[Output]:
        return self._conversation.acknowledge_playback(command)

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

        ``end_ms`` counts from the start of the session's input stream; ``is_speech`` and ``hints`` are
        the client's, for the engine; ``now`` is when it was processed (the clock of :meth:`receive`;
        it times the replies turn detection starts). ``video_frames``: camera frames taken while this
        audio was spoken; they go to the engine with the next audio it gets (this, or the one after).
        """
        # An empty chunk (the resampler is still filling) still moves the input clock and may carry
        # VAD windows: only its audio is absent.
        if self.closed:
            return []
        if now is not None:
            self._clock = now
        turns = self._turns
        outputs: list[Output] = []
        outputs.extend(
            turns.take_audio(pcm, duration_ms, is_speech=is_speech, hints=hints, video_frames=video_frames)
        )
        held = self._backchannels
        if held.holding:
            outputs.extend(held.lapsed())
        for window in windows:
            # One window at a time: a hold started by one window judges the next.
            for decision in turns.decisions((window,)):
                outputs.extend(self._turn_event(decision))
            if held.holding:
                outputs.extend(held.feed(*window))
        return outputs

    def _turn_event(self, decision: TurnEvent) -> list[Output]:
        turns = self._turns
        held = self._backchannels
        if isinstance(decision, SpeechStart) and not turns.speaking and not held.holding:
            # Over a reply the speech may be a backchannel: the reply is held while it is judged.
            hold = held.caller_started(decision, self.config, now=self._clock) if self.gateway_vad else None
            if hold is not None:
                return hold
            return self._speech_started(decision.audio_start_ms)
        if isinstance(decision, SpeechPause) and turns.speaking:
            return turns.caller_paused()
        if isinstance(decision, SpeechCandidate) and (assess := turns.assess(decision)) is not None:
            return [assess]
        if isinstance(decision, SpeechStop) and turns.speaking:
            return self._speech_stopped(decision.audio_end_ms)
        if isinstance(decision, SpeechStop) and held.holding:
            return held.decide(OverlapVerdict.BACKCHANNEL)  # the silence ran out first
        return []

    def turn_assessed(
        self, call: AssessTurn, probability: float | None, model_ms: float = 0.0
    ) -> list[Output]:
        """The end-of-turn model's judgement of ``call`` (None: it failed, and the silence ends the turn).

        ``model_ms``: how long the judgement took (a stage of the reply's latency report).
        """
        stop = None if self.closed else self._turns.assessed(call, probability, self._clock, model_ms)
        return self._speech_stopped(stop.audio_end_ms, model_ms) if stop is not None else []

    def _speech_started(self, audio_start_ms: int, engine_item_id: str = "") -> list[Output]:
        """The caller started speaking, found by the gateway's detector or the engine's (``engine_item_id``)."""
        item_id = self._new_id("item")
        self._turns.start_speech(item_id)
        self._conversation.name_for_engine(engine_item_id, item_id)
        outputs: list[Output] = [ev.SpeechStarted(audio_start_ms=audio_start_ms, item_id=item_id)]
        td = self.config.turn_detection
        if td is not None and td.interrupt_response and self.response_active:
            outputs.extend(self._replies.interrupt())
        # The turn starts at its prefix padding: hand the engine what the ring
        # holds from there on, then stream live.
        outputs.extend(self._turns.release_ring(audio_start_ms))
        return outputs

    def _speech_stopped(self, audio_end_ms: int, model_ms: float | None = None) -> list[Output]:
        item_id = self._turns.speech_item_id
        assert item_id is not None
        outputs: list[Output] = [ev.SpeechStopped(audio_end_ms=audio_end_ms, item_id=item_id)]
        if self.engine_turns:
            # The engine's turn-taking answers the turn if turn detection would have.
            decides = self._settings.turn_end_asks_reply(replying=False)
            outputs.extend(self._commit_turn(create_response=False, engine_decides=decides))
        else:
            # The detector commits a silence after the speech ended: that wait is part of the reply's latency.
            outputs.extend(
                self._commit_turn(
                    create_response=self._settings.turn_end_asks_reply(replying=self.response_active),
                    detection_ms=self._turns.detection_ms(audio_end_ms),
                    model_ms=model_ms,
                )
            )
        return outputs

    def _commit_turn(
        self,
        *,
        create_response: bool,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
        detection_ms: float | None = None,
        model_ms: float | None = None,
    ) -> list[Output]:
        item_id = self._turns.take_speech_item() or self._new_id("item")
        reply = self._request_reply(self.config.output_modalities) if create_response else None
        if reply is not None:
            reply.turn_item_id = item_id
            reply.detection_ms, reply.turn_model_ms = detection_ms, model_ms
        call = CommitInput(
            item_id=item_id,
            response_id=reply.id if reply else None,
            final=final,
            engine_decides=engine_decides,
            is_speech=is_speech,
        )
        outputs: list[Output] = [call, *self._turns.commit(item_id)]
        if reply is not None:
            outputs.append(ev.ResponseCreated(response_id=reply.id))
        return outputs

    def _request_reply(self, modalities: tuple[Modality, ...]) -> Reply:
        """A new reply in the conversation: the caller's silence no longer ends a turn for them."""
        self._turns.cancel_idle()
        self._app.owes_reply = False
        return self._replies.request(
            modalities, requested_at=self._clock, may_call=self._settings.replies_may_call
        )

    # -- the clock ------------------------------------------------------------------------

    @property
    def next_timer(self) -> float | None:
        """When :meth:`tick` next has work to do (the clock of :meth:`receive`), or None."""
        timers = (self._turns.idle_deadline, self._turns.judged_end_at, self._backchannels.deadline)
        due = [t for t in timers if t is not None]
        return None if self.closed or not due else min(due)

    def tick(self, now: float) -> list[Output]:
        """Time has passed: fire what :attr:`next_timer` announced, if it is due."""
        self._clock = now
        turns = self._turns
        if not self.closed and (decided := self._backchannels.expire(now)):
            return decided
        if not self.closed and (stop := turns.judged_end_due(now)) is not None:
            return self._speech_stopped(stop.audio_end_ms)
        deadline = turns.idle_deadline
        if self.closed or deadline is None or now < deadline:
            return []
        turns.cancel_idle()
        if self.response_active or turns.speaking:
            return []  # the conversation moved on by itself
        # turn_detection.idle_timeout_ms ran out: the caller's silence ends their turn
        # (it is committed, as OpenAI does) and the assistant speaks up.
        item_id = self._new_id("item")
        turns.start_speech(item_id)
        triggered = ev.InputAudioTimeoutTriggered(
            item_id=item_id, audio_start_ms=int(turns.idle_from_ms), audio_end_ms=int(turns.input_ms)
        )
        return [triggered, *self._commit_turn(create_response=True)]

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
        held = self._backchannels.keep(event)  # a held reply's output waits for the verdict
        return held if held is not None else self._engine_dispatch(event, now)

    def _engine_dispatch(self, event: port.EngineEvent, now: float | None) -> list[Output]:
        handler = self._engine_handlers.get(type(event))
        return handler(self, event, now) if handler is not None else []

    def _on_response_started(self, event: port.EngineResponseStarted, now: float | None) -> list[Output]:
        self._app.owes_reply = False  # the engine's reply has the context too
        return self._replies.engine_started(
            event.response_id,
            modalities=self.config.output_modalities,
            requested_at=self._clock,
            may_call=self._settings.replies_may_call,
        )

    def _on_reply_output(
        self, event: port.EngineAudio | port.EngineTranscript | port.EngineText, now: float | None
    ) -> list[Output]:
        return self._replies.output(event, now, latency_event=LATENCY_EVENT in self.config.include)

    def _on_response_done(self, event: port.EngineResponseDone, now: float | None) -> list[Output]:
        reply = self._replies.live(event.response_id)
        if reply is None:
            return []  # already finished on our side (cancelled): fenced
        if event.status in ("completed", "incomplete") and now is not None and not reply.out_of_band:
            self._turns.arm_idle(first_audio_at=reply.first_audio_at, audio_ms=reply.audio_ms, now=now)
        done = self._replies.finish(
            reply,
            event.status,
            event.reason,
            input_tokens=event.input_tokens,
            output_tokens=event.output_tokens,
        )
        return done + speak_owed(self, now)

    def _on_speech_started(self, event: port.EngineSpeechStarted, now: float | None) -> list[Output]:
        return [] if self._turns.speaking else self._speech_started(event.audio_start_ms, event.item_id)

    def _on_input_transcript(self, event: port.EngineInputTranscript, now: float | None) -> list[Output]:
        outputs = self._turns.caller_words(event, tell_client=self.transcribes_input)
        if not event.final and not self.closed and (finished := self._turns.words_finished()) is not None:
            stop, model_ms = finished
            outputs.extend(self._speech_stopped(stop.audio_end_ms, model_ms))
        return outputs

    def _on_input_transcript_failed(
        self, event: port.EngineInputTranscriptFailed, now: float | None
    ) -> list[Output]:
        return self._turns.caller_words_failed(event) if self.transcribes_input else []

    def _on_engine_error(self, event: port.EngineError, now: float | None) -> list[Output]:
        outputs: list[Output] = [
            ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message=f"{event.code}: {event.message}")
        ]
        if event.fatal:
            outputs.extend(self._close("engine_error", CloseCode.ENGINE_FAILED))
        return outputs

    _engine_handlers: ClassVar[
        dict[type[port.EngineEvent], Callable[[Session, Any, float | None], list[Output]]]
    ] = {}

    # -- ending replies and the session ---------------------------------------------------------

    def _close(self, reason: str, code: CloseCode, *, engine_gone: bool = False) -> list[Output]:
        outputs: list[Output] = [] if engine_gone else self._replies.cancel_every("client_cancelled")
        self._life.move(Happening.CLOSED)
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
        error_code = _EXPIRY_ERRORS.get(code, ErrorCode.INTERNAL_ERROR)
        if error_code in OPENAI_MESSAGES:  # OpenAI's words first, ``message`` after them
            message = openai_message(error_code, message)
        return [ev.ErrorEvent(code=error_code, message=message), *self._close(reason, code)]

    @staticmethod
    def _error(exc: ProtocolError) -> ev.ErrorEvent:
        return ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param)


#: The error a client is told when the transport ends its session for a reason of its own.
_EXPIRY_ERRORS = {
    CloseCode.IDLE_TIMEOUT: ErrorCode.IDLE_TIMEOUT,
    CloseCode.MAX_DURATION: ErrorCode.SESSION_EXPIRED,
    CloseCode.SLOW_CONSUMER: ErrorCode.SLOW_CONSUMER,
}


Session._handlers = {
    cmd.SessionUpdate: Session._on_update,
    cmd.InputAudioAppend: Session._on_append,
    cmd.InputAudioCommit: Session._on_commit,
    cmd.InputAudioClear: Session._on_clear,
    **dict.fromkeys((cmd.ContextAppend, cmd.InputAudioMute), on_context),
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

Session._engine_handlers = {
    port.EngineResponseStarted: Session._on_response_started,
    # Events one part of the session answers alone:
    port.EngineTimings: lambda s, e, now: s._replies.timings(e),
    port.EngineFunctionCallDelta: lambda s, e, now: s._replies.function_call(e),
    port.EngineFunctionCall: lambda s, e, now: s._replies.function_call(e),
    port.EngineSpeechStopped: lambda s, e, now: s._turns.stopped_by_engine(e),
    port.EngineTurnCommitted: lambda s, e, now: s._turns.committed_by_engine(e),
    port.EngineSpeak: lambda s, e, now: [s._replies.speaking(e)],
    port.EngineListen: lambda s, e, now: [ev.ResponseListen(response_id=e.response_id, reason=e.reason)],
    port.EngineOverlapDecision: lambda s, e, now: (
        [ev.OverlapDecision(policy=e.policy, action=e.action, reason=e.reason)]
        if s._settings.tells_overlaps
        else []
    ),
    port.EngineClosed: lambda s, e, now: s._close(e.reason, CloseCode.ENGINE_FAILED, engine_gone=True),
    # Events the session decides on:
    port.EngineAudio: Session._on_reply_output,
    port.EngineTranscript: Session._on_reply_output,
    port.EngineText: Session._on_reply_output,
    port.EngineResponseDone: Session._on_response_done,
    port.EngineSpeechStarted: Session._on_speech_started,
    port.EngineInputTranscript: Session._on_input_transcript,
    port.EngineInputTranscriptFailed: Session._on_input_transcript_failed,
    port.EngineError: Session._on_engine_error,
}
