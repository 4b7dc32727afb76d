"""The session's replies: the one in the conversation, those out of band, the fence and the epoch.

A :class:`Reply` owns its life (LiveKit's ``SpeechHandle``, without futures): it
moves through :data:`REPLY_TRANSITIONS` from the moment it is requested until it
is done, and a move the table lacks raises. The :class:`ReplyBook` keeps the
replies in progress and turns the engine's output into the client's events. Once
a reply is done its id joins the fence, so nothing the engine still sends for it
(a late start, audio already on its way) ever reaches the client.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from duplex_gateway.engine import port
from duplex_gateway.session.conversation import Conversation, Item
from duplex_gateway.session.engine_calls import BargeInEngine, CancelResponse, Output, ReportLatency
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError, openai_message
from duplex_gateway.vocabulary.session_config import Modality

__all__ = [
    "MAX_FENCED_IDS",
    "MAX_SIDE_RESPONSES",
    "REPLY_TRANSITIONS",
    "FunctionCall",
    "Reply",
    "ReplyBook",
    "ReplyHappening",
    "ReplyState",
    "ReplyStateError",
]

#: Ids of finished (and cancelled) responses remembered so a late engine start is fenced.
MAX_FENCED_IDS = 64
#: Out-of-band replies one session may have in progress at once.
MAX_SIDE_RESPONSES = 4


class ReplyState(enum.Enum):
    """Where a reply is in its life; cancel, clear and barge-in reach it in both live states."""

    #: Requested of the engine (``response.created`` sent); the engine has not started it.
    REQUESTED = "requested"
    #: The engine started it, or its first output item opened: output may flow.
    STREAMING = "streaming"
    #: Finished by the engine (completed, incomplete, failed): ``response.done`` sent.
    DONE = "done"
    #: Stopped by the gateway (cancel, clear, barge-in, superseded, closing): ``response.done`` sent.
    CANCELLED = "cancelled"


class ReplyHappening(enum.Enum):
    """What can happen to a reply."""

    #: The engine says it started the reply.
    STARTED = "started"
    #: One of its output items (its message, a function call) opened.
    OUTPUT = "output"
    #: The engine finished it.
    FINISHED = "finished"
    #: The gateway stopped it.
    CANCELLED = "cancelled"


_R, _H = ReplyState, ReplyHappening

#: Every move a reply can make; a done or cancelled reply makes none.
REPLY_TRANSITIONS: Mapping[tuple[ReplyState, ReplyHappening], ReplyState] = {
    (_R.REQUESTED, _H.STARTED): _R.STREAMING,
    (_R.REQUESTED, _H.OUTPUT): _R.STREAMING,
    (_R.REQUESTED, _H.FINISHED): _R.DONE,
    (_R.REQUESTED, _H.CANCELLED): _R.CANCELLED,
    # An engine may announce a reply again, or start it after its first output came.
    (_R.STREAMING, _H.STARTED): _R.STREAMING,
    (_R.STREAMING, _H.OUTPUT): _R.STREAMING,
    (_R.STREAMING, _H.FINISHED): _R.DONE,
    (_R.STREAMING, _H.CANCELLED): _R.CANCELLED,
}


class ReplyStateError(RuntimeError):
    """A reply was asked to make a move :data:`REPLY_TRANSITIONS` does not have (a session bug)."""


@dataclass(slots=True)
class FunctionCall:
    """A function call a reply is making."""

    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: list[str] = field(default_factory=list)
    #: Its final form, once the call is complete (or cut short).
    item: ev.ConversationItem | None = None


@dataclass(slots=True)
class Reply:
    """One reply, from its request to its ``response.done``."""

    id: str
    modalities: tuple[Modality, ...]
    state: ReplyState = ReplyState.REQUESTED
    #: Its spoken or written message item, opened with its first output.
    item_id: str | None = None
    #: Where that item is among the reply's output items.
    message_index: int = 0
    #: The reply's output items (message and function calls), in order.
    outputs: list[str] = field(default_factory=list)
    calls: dict[str, FunctionCall] = field(default_factory=dict)
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
    #: Of which the end-of-turn model took this much (semantic_vad).
    turn_model_ms: float | None = None
    #: The engine's own account of its time (:class:`port.EngineTimings`).
    engine_stages: tuple[tuple[str, float], ...] = ()
    #: Transcript deltas with the reply audio produced when each arrived, so a
    #: truncated reply keeps the words the caller heard.
    transcript: list[tuple[float, str]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def part_type(self) -> str:
        """The kind of its message's content part: ``audio`` or ``text``."""
        return "audio" if Modality.AUDIO in self.modalities else "text"

    def move(self, happening: ReplyHappening) -> None:
        """Take the move ``happening`` makes by :data:`REPLY_TRANSITIONS`."""
        try:
            self.state = REPLY_TRANSITIONS[self.state, happening]
        except KeyError:
            raise ReplyStateError(
                f"reply {self.id} is {self.state.value}: it cannot be {happening.value}"
            ) from None


class ReplyBook:
    """The replies of one session in progress, and the fence behind the finished ones."""

    def __init__(self, conversation: Conversation, new_id: Callable[[str], str], *, output_rate: int) -> None:
        self._conversation = conversation
        self._new_id = new_id
        self._output_rate = output_rate
        #: Advances on every cancel / barge-in of a reply in the conversation; engines may tag output with it.
        self.epoch = 0
        #: The one reply in the conversation in progress, from its request until it is done.
        self._active: Reply | None = None
        #: Out-of-band replies in progress (``conversation: "none"``), by id; they run beside it.
        self._side: dict[str, Reply] = {}
        self._fence: deque[str] = deque(maxlen=MAX_FENCED_IDS)

    # -- which replies there are --------------------------------------------------------------

    @property
    def active(self) -> Reply | None:
        """The reply in the conversation in progress, if any."""
        return self._active

    @property
    def active_id(self) -> str | None:
        """The id of the reply in the conversation in progress, if any."""
        return self._active.id if self._active is not None else None

    @property
    def active_item_id(self) -> str | None:
        """The message item of the reply in the conversation in progress, once it has one."""
        return self._active.item_id if self._active is not None else None

    def out_of_band(self, response_id: str) -> Reply | None:
        """The out-of-band reply in progress with this id, if any."""
        return self._side.get(response_id)

    def live(self, response_id: str) -> Reply | None:
        """The reply in progress with this id (in the conversation or out of band); None if fenced."""
        active = self._active
        if active is not None and active.id == response_id:
            return active
        return self._side.get(response_id)

    def fenced(self, response_id: str) -> bool:
        """Whether ``response_id`` is a reply that is done: the engine's word on it is ignored."""
        return response_id in self._fence

    # -- new replies ----------------------------------------------------------------------------

    def request(
        self,
        modalities: tuple[Modality, ...],
        *,
        requested_at: float | None,
        may_call: bool,
        metadata: Mapping[str, str] | None = None,
    ) -> Reply:
        """A new reply in the conversation, owned from now on.

        Cancel, clear and barge-in reach it before the engine starts it.
        """
        assert self._active is None
        reply = Reply(
            id=self._new_id("resp"),
            modalities=modalities,
            requested_at=requested_at,
            may_call=may_call,
            metadata=metadata,
        )
        self._active = reply
        return reply

    def already_active(self, param: str | None = None) -> ProtocolError:
        """OpenAI's refusal of a second reply in the conversation while one is in progress."""
        return ProtocolError(
            ErrorCode.RESPONSE_ALREADY_ACTIVE,
            openai_message(
                ErrorCode.RESPONSE_ALREADY_ACTIVE,
                f"{self.active_id}. Wait until the response is finished before creating a new one.",
            ),
            param=param,
        )

    def request_out_of_band(
        self,
        modalities: tuple[Modality, ...],
        *,
        requested_at: float | None,
        metadata: Mapping[str, str] | None,
    ) -> Reply:
        """A new reply beside the conversation; refused while :data:`MAX_SIDE_RESPONSES` run."""
        if len(self._side) >= MAX_SIDE_RESPONSES:
            raise ProtocolError(
                ErrorCode.RESPONSE_ALREADY_ACTIVE,
                openai_message(
                    ErrorCode.RESPONSE_ALREADY_ACTIVE,
                    f"{', '.join(self._side)}. At most {MAX_SIDE_RESPONSES} out-of-band responses run "
                    "at once; wait until one is finished before creating another.",
                ),
            )
        reply = Reply(
            id=self._new_id("resp"),
            modalities=modalities,
            requested_at=requested_at,
            out_of_band=True,
            metadata=metadata,
        )
        self._side[reply.id] = reply
        return reply

    # -- the engine's output --------------------------------------------------------------------

    def engine_started(
        self,
        response_id: str,
        *,
        modalities: tuple[Modality, ...],
        requested_at: float | None,
        may_call: bool,
    ) -> list[Output]:
        """The engine says it started ``response_id``: one the session asked for, or one of its own.

        ``modalities`` and ``may_call`` are what a reply of the engine's own takes.
        """
        if response_id in self._fence:
            return []
        live = self.live(response_id)
        if live is not None:
            return self._started(live)
        # The engine moved on to a reply of its own (its own turn detection): stop the one it left behind.
        outputs = self.cancel("superseded")
        reply = Reply(
            id=response_id,
            modalities=modalities,
            requested_at=requested_at,
            turn_item_id=self._conversation.last_caller_item(),
            may_call=may_call,
        )
        self._active = reply
        outputs.append(ev.ResponseCreated(response_id=response_id))
        outputs.extend(self._started(reply))
        return outputs

    def _started(self, reply: Reply) -> list[Output]:
        """A reply that cannot call a function opens its message when the engine starts it."""
        opens = reply.state is ReplyState.REQUESTED and reply.item_id is None and not reply.may_call
        reply.move(ReplyHappening.STARTED)
        return self._open_message(reply) if opens else []

    def speaking(self, event: port.EngineSpeak) -> ev.ResponseSpeak:
        """The engine's turn-taking chose to speak ``event.response_id``: with its item, once it has one."""
        active = self._active
        item_id = active.item_id if active is not None and active.id == event.response_id else None
        return ev.ResponseSpeak(response_id=event.response_id, item_id=item_id)

    def output(
        self,
        event: port.EngineAudio | port.EngineTranscript | port.EngineText,
        now: float | None,
        *,
        latency_event: bool,
    ) -> list[Output]:
        """The reply's audio, transcript or text; ``latency_event``: the client asked for ``turn.latency``."""
        reply = self.live(event.response_id)
        if reply is None:
            return []  # the epoch fence: nothing of a cancelled reply gets through
        if isinstance(event, port.EngineAudio) and (reply.part_type != "audio" or not event.pcm):
            return []  # a text reply's audio is not wanted
        outputs: list[Output] = []
        if reply.item_id is None:  # the reply's first output opens its message
            outputs.extend(self._open_message(reply))
        rid, iid, index = reply.id, reply.item_id, reply.message_index
        assert iid is not None
        if isinstance(event, port.EngineAudio):
            if reply.first_audio_at is None:
                reply.first_audio_at = now
                outputs.extend(self._latency(reply, latency_event))
            ms = len(event.pcm) * 1000.0 / (2 * self._output_rate)
            reply.audio_ms += ms
            record = self._conversation.get(iid)
            if record is not None:
                record.produced_ms = reply.audio_ms
            outputs.append(
                ev.AudioDelta(
                    response_id=rid, item_id=iid, output_index=index, audio=event.pcm, rate=self._output_rate
                )
            )
        elif isinstance(event, port.EngineTranscript) and reply.part_type == "audio":
            reply.transcript.append((reply.audio_ms, event.delta))
            outputs.append(
                ev.TranscriptDelta(response_id=rid, item_id=iid, output_index=index, delta=event.delta)
            )
        else:
            reply.text.append(event.delta)
            outputs.append(ev.TextDelta(response_id=rid, item_id=iid, output_index=index, delta=event.delta))
        return outputs

    def timings(self, event: port.EngineTimings) -> list[Output]:
        """The engine's account of where a reply's time went: kept for the reply's latency report."""
        reply = self.live(event.response_id)
        if reply is not None:
            reply.engine_stages = event.stages
        return []

    def _latency(self, reply: Reply, latency_event: bool) -> list[Output]:
        """The reply's first audio is out: where its time went, for the host and for clients that asked."""
        if reply.requested_at is None or reply.first_audio_at is None:
            return []
        detection = reply.detection_ms
        engine_ms = max(0.0, (reply.first_audio_at - reply.requested_at) * 1000.0)
        stages: list[tuple[str, float]] = []
        if detection is not None:
            model = min(reply.turn_model_ms or 0.0, detection)
            stages.append(("turn_detection", round(detection - model, 1)))
            if reply.turn_model_ms is not None:
                stages.append(("turn_model", round(model, 1)))
        if reply.engine_stages:
            stages.extend((name, round(ms, 1)) for name, ms in reply.engine_stages)
            covered = sum(ms for _, ms in reply.engine_stages)
            stages.append(("other", round(max(0.0, engine_ms - covered), 1)))
        else:
            stages.append(("engine", round(engine_ms, 1)))
        total = round((detection or 0.0) + engine_ms, 1)
        latency = ev.TurnLatency(
            response_id=reply.id, item_id=reply.turn_item_id, total_ms=total, stages=tuple(stages)
        )
        report = ReportLatency(
            latency=latency, first_audio_ms=engine_ms, speech_end_ms=total if detection is not None else None
        )
        return [report, latency] if latency_event else [report]

    def _open_output(self, reply: Reply, item: ev.ConversationItem) -> list[Output]:
        """A new output item of ``reply``: announced, and (unless out of band) in the conversation."""
        reply.move(ReplyHappening.OUTPUT)
        index = len(reply.outputs)
        reply.outputs.append(item.id)
        outputs: list[Output] = [ev.OutputItemAdded(response_id=reply.id, output_index=index, item=item)]
        if not reply.out_of_band:
            previous = self._conversation.append(Item(item=item, response_id=reply.id))
            outputs.append(ev.ConversationItemAdded(item=item, previous_item_id=previous))
        return outputs

    def _open_message(self, reply: Reply) -> list[Output]:
        """The reply's first audio or text: its assistant message item comes into the conversation."""
        item_id = self._new_id("item")
        reply.item_id = item_id
        reply.message_index = len(reply.outputs)
        content_type = "audio" if reply.part_type == "audio" else "text"
        item = ev.ConversationItem(
            id=item_id, role="assistant", status="in_progress", content_type=content_type
        )
        return [
            *self._open_output(reply, item),
            ev.ContentPartAdded(
                response_id=reply.id,
                item_id=item_id,
                output_index=reply.message_index,
                content_index=0,
                part_type=reply.part_type,
            ),
        ]

    def function_call(self, event: port.EngineFunctionCallDelta | port.EngineFunctionCall) -> list[Output]:
        """The reply calls a client function: its item, its arguments as they come, then the whole call."""
        reply = self.live(event.response_id)
        if reply is None:
            return []  # fenced: a cancelled reply calls nothing
        outputs: list[Output] = []
        call = reply.calls.get(event.call_id)
        if call is None:
            call = FunctionCall(
                item_id=self._new_id("item"),
                call_id=event.call_id,
                name=event.name,
                output_index=len(reply.outputs),
            )
            reply.calls[event.call_id] = call
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
            outputs.extend(self._open_output(reply, item))
        if call.item is not None:
            return outputs  # the call is complete; a late fragment changes nothing
        if isinstance(event, port.EngineFunctionCallDelta):
            if event.delta:
                call.arguments.append(event.delta)
                outputs.append(self._arguments_delta(reply, call, event.delta))
            return outputs
        if not call.arguments and event.arguments:
            # Clients that assemble the arguments from deltas get them whole, in one.
            outputs.append(self._arguments_delta(reply, call, event.arguments))
        outputs.extend(self._end_call(reply, call, event.arguments, "completed"))
        return outputs

    @staticmethod
    def _arguments_delta(reply: Reply, call: FunctionCall, delta: str) -> ev.FunctionCallArgumentsDelta:
        return ev.FunctionCallArgumentsDelta(
            response_id=reply.id,
            item_id=call.item_id,
            output_index=call.output_index,
            call_id=call.call_id,
            delta=delta,
        )

    def _end_call(self, reply: Reply, call: FunctionCall, arguments: str, status: str) -> list[Output]:
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
                response_id=reply.id,
                item_id=call.item_id,
                output_index=call.output_index,
                call_id=call.call_id,
                name=call.name,
                arguments=arguments,
            ),
            ev.OutputItemDone(response_id=reply.id, output_index=call.output_index, item=item),
        ]
        record = self._conversation.get(call.item_id)
        if record is not None and not reply.out_of_band:
            record.item = item
            outputs.append(ev.ConversationItemDone(item=item, previous_item_id=record.previous_id))
        return outputs

    # -- ending replies -------------------------------------------------------------------------

    def finish(
        self,
        reply: Reply,
        status: str,
        reason: str | None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> list[Output]:
        """The engine finished ``reply`` with ``status``: its items close and ``response.done`` goes out."""
        reply.move(ReplyHappening.FINISHED)
        return self._close_out(reply, status, reason, input_tokens=input_tokens, output_tokens=output_tokens)

    def cancel(self, reason: str, *, engine_call: bool = True, reply: Reply | None = None) -> list[Output]:
        """Fence and close out ``reply`` (default: the reply in the conversation, if any)."""
        reply = reply or self._active
        if reply is None:
            return []
        reply.move(ReplyHappening.CANCELLED)
        if not reply.out_of_band:
            self.epoch += 1
        outputs: list[Output] = [CancelResponse(response_id=reply.id)] if engine_call else []
        outputs.extend(self._close_out(reply, "cancelled", reason))
        return outputs

    def interrupt(self) -> list[Output]:
        """The caller spoke over the reply: fence it, tell the engine, close it out."""
        outputs: list[Output] = []
        active = self._active
        if active is not None:
            # A reply the engine has not started yet is cancelled by name: a barge-in
            # stops what is playing, not what is still being prepared.
            outputs.extend(self.cancel("turn_detected", engine_call=active.state is ReplyState.REQUESTED))
        outputs.append(BargeInEngine())
        return outputs

    def clear_output(self) -> list[Output]:
        """The client dropped the reply audio it had not played: the reply making it stops."""
        response_id = self.active_id
        outputs = self.cancel("client_cancelled") if response_id else []
        outputs.append(ev.OutputAudioCleared(response_id=response_id))
        return outputs

    def cancel_asked(self, response_id: str | None) -> list[Output]:
        """The client's ``response.cancel``: the out-of-band reply it names, else the conversation's."""
        side = self._side.get(response_id or "")
        if side is not None:
            return self.cancel("client_cancelled", reply=side)
        active = self.active_id
        if active is None or (response_id is not None and response_id != active):
            raise ProtocolError(
                ErrorCode.RESPONSE_NOT_ACTIVE,
                openai_message(ErrorCode.RESPONSE_NOT_ACTIVE)
                if active is None
                else openai_message(
                    ErrorCode.RESPONSE_NOT_ACTIVE,
                    f"with id {response_id} (the active response is {active}).",
                ),
                param="response_id",
            )
        return self.cancel("client_cancelled")

    def cancel_every(self, reason: str) -> list[Output]:
        """The session is closing: every reply in progress is cancelled (the engine is told by its close)."""
        outputs: list[Output] = []
        for side in list(self._side.values()):
            outputs.extend(self.cancel(reason, engine_call=False, reply=side))
        if self._active is not None:
            outputs.extend(self.cancel(reason, engine_call=False))
        return outputs

    def _close_out(
        self,
        reply: Reply,
        status: str,
        reason: str | None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> list[Output]:
        if reply is self._active:
            self._active = None
        self._side.pop(reply.id, None)
        if reply.id not in self._fence:
            # A finished reply stays finished: an engine that announces it again (a late or
            # replayed start) must not open a second reply under the same id.
            self._fence.append(reply.id)
        outputs: list[Output] = []
        items: dict[str, ev.ConversationItem] = {}
        if reply.item_id is not None:
            message, closing = self._close_message(reply, status)
            items[message.id] = message
            outputs.extend(closing)
        for call in reply.calls.values():
            if call.item is None:  # cut short: what the model had written of it
                outputs.extend(self._end_call(reply, call, "".join(call.arguments), "incomplete"))
            assert call.item is not None
            items[call.item_id] = call.item
        turn = self._conversation.get(reply.turn_item_id or "")
        outputs.append(
            ev.ResponseDone(
                response_id=reply.id,
                status=status,
                reason=reason,
                output=tuple(items[item_id] for item_id in reply.outputs if item_id in items),
                audio_ms=int(reply.audio_ms),
                metadata=reply.metadata,
                out_of_band=reply.out_of_band,
                input_audio_ms=int(turn.produced_ms) if turn is not None else 0,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        )
        return outputs

    def _close_message(self, reply: Reply, status: str) -> tuple[ev.ConversationItem, list[Output]]:
        """The reply's message item, complete (or cut short where the caller stopped hearing it)."""
        rid, iid, index = reply.id, reply.item_id, reply.message_index
        assert iid is not None
        record = self._conversation.get(iid)
        if record is not None:
            record.spoken = tuple(reply.transcript)
            transcript = record.heard_words(record.heard_ms)
        else:
            transcript = "".join(delta for _, delta in reply.transcript)
        text = "".join(reply.text)
        audio = reply.part_type == "audio"
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
                part_type=reply.part_type,
                transcript=transcript if audio else text,
            ),
            ev.OutputItemDone(response_id=rid, output_index=index, item=item),
        ]
        if not reply.out_of_band:
            outputs.append(
                ev.ConversationItemDone(item=item, previous_item_id=record.previous_id if record else None)
            )
        return item, outputs
