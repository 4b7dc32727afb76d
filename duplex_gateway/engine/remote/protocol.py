"""The wire between the ``remote`` engine and one backend session, as pure translation.

A backend is a vLLM-Omni server (``WS /v1/realtime?duplex=1``, served by
``OmniDuplexSessionHandler``) or another duplex-gateway (same endpoint, same
handshake). :class:`BackendWire` turns port calls into the client events that
backend expects and the backend's server events into port events; it owns the
bookkeeping in between: which backend reply is which gateway response, which
backend item is which gateway turn, per-reply resampling of reply audio to the
engine's output rate, and the playback ledger vLLM-Omni insists on.

Pure: no asyncio, no socket, no clock. :mod:`duplex_gateway.engine.remote.session`
does the I/O.

The two kinds of backend differ in three places (found from the
``session.created`` they send, see :func:`detect_kind`):

* a vLLM-Omni turn is committed with ``input_audio_buffer.commit
  {response_create}``; a duplex-gateway with ``turn_detection: null`` answers a
  commit only after an explicit ``response.create``;
* vLLM-Omni's ``ACK_ONLY`` playback policy treats the next caller turn as talking
  over the last reply unless that reply was acknowledged, so a reply the client
  never reported on is acknowledged in full at the caller's next commit or
  ``response.create``;
* a truncated reply is cut in a vLLM-Omni backend's history with
  ``conversation.item.truncate`` (its assistant items are ``item_<response id>``);
  a gateway backend hears of it as a ``playback.ack``;
* a reply's own tools go to a gateway backend with its ``response.create``; vLLM-Omni
  refuses them there, so against it such a reply fails here (:func:`reply_refusal`);
* vLLM-Omni takes input that arrives during a reply, or before the reply is reported
  played, for talking over it, and in turn mode drops appends it finds quiet: where the
  gateway decides the turns, caller input waits until the backend is free
  (:mod:`~duplex_gateway.engine.remote.input_gate`) and its appends say ``is_speech``.

Function calls come back as the Realtime function-call events; vLLM-Omni wraps each
call in a response of its own, which :class:`~duplex_gateway.engine.omni.tools.FunctionCalls`
puts back on the reply in progress.
"""

from __future__ import annotations

import base64
import enum
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from duplex_gateway.engine import port
from duplex_gateway.engine.omni.audio import ReplyAudio
from duplex_gateway.engine.omni.events import (
    OmniReply,
    error_fields,
    late_report,
    reply_done,
    response_id_of,
    translate,
)
from duplex_gateway.engine.omni.fields import changed_fields
from duplex_gateway.engine.omni.items import message_item
from duplex_gateway.engine.omni.session import session_object
from duplex_gateway.engine.omni.tools import (
    FunctionCalls,
    function_call_item,
    function_output_item,
    own_tools,
    reply_tools_refusal,
    tool_choice_object,
    tool_object,
)
from duplex_gateway.engine.remote.input_gate import InputGate
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = [
    "FULL_CODES",
    "RESUME_REFUSED_CODES",
    "BackendKind",
    "BackendWire",
    "JsonObject",
    "detect_kind",
    "error_fields",
    "response_id_of",
    "session_object",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

#: ``error.code``s a backend answers an open with when it has no room (gateway / vLLM-Omni).
FULL_CODES = frozenset({"session_limit", "resource_exhausted", "too_many_sessions", "max_sessions_reached"})
#: Codes that end a ``session.resume`` attempt for good.
RESUME_REFUSED_CODES = frozenset(
    {
        "invalid_resume_token",
        "resume_gap",
        "session_resume_expired",
        "unsupported_session_resume",
        "invalid_session_resume",
        "runtime_resume_failed",
        "session_resume_conflict",
    }
)
#: Replies remembered after they finish, for late playback reports and cancels.
_FINISHED_REMEMBERED = 32
#: Sent control events remembered so a backend error about one can be recognized.
_SENT_REMEMBERED = 64
#: vLLM-Omni refuses a ``response.create`` with these without naming its event: they are
#: about the oldest reply asked for and not announced.
_UNNAMED_CREATE_REFUSALS = frozenset({"response_create_without_input", "text_only_turn_unsupported"})


class BackendKind(enum.StrEnum):
    VLLM_OMNI = "vllm-omni"
    GATEWAY = "duplex-gateway"


def detect_kind(created: Mapping[str, Any]) -> BackendKind:
    """Which server sent this ``session.created``.

    A duplex-gateway announces its engine under ``session.capabilities.engine``
    (with ``input_sample_rate_hz``); vLLM-Omni's session object has no such key
    (its capabilities are ``supports_*`` flags).
    """
    session = created.get("session")
    caps = session.get("capabilities") if isinstance(session, Mapping) else None
    if isinstance(caps, Mapping) and "engine" in caps and "input_sample_rate_hz" in caps:
        return BackendKind.GATEWAY
    return BackendKind.VLLM_OMNI


# ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Requested:
    """A reply asked of the backend that it has not announced yet."""

    gateway_id: str | None  # None: the backend names it
    event_id: str
    cancelled: bool = False


class BackendWire:
    """Port calls -> backend client events, backend server events -> port events, for one session.

    Every ``*`` method returns the client events to send, in order;
    :meth:`receive` returns the port events for one server event, and may leave
    client events to send in :meth:`take_outgoing` (a late cancel).
    """

    def __init__(self, *, kind: BackendKind, input_rate: int, output_rate: int) -> None:
        self.kind = kind
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._ids = itertools.count(1)
        self._requested: deque[_Requested] = deque()
        #: Backend response id -> the reply it is on the gateway side (in progress).
        self._replies: dict[str, OmniReply] = {}
        #: Finished replies by backend id.
        self._finished: OrderedDict[str, OmniReply] = OrderedDict()
        #: Commits the backend has not confirmed yet (event id, gateway turn id), and the mapping once it has.
        self._commits: deque[tuple[str, str]] = deque(maxlen=_FINISHED_REMEMBERED)
        #: Text items sent under the gateway's ids: the ones a delete can name to the backend.
        self._added_items: set[str] = set()
        self._items: OrderedDict[str, str] = OrderedDict()
        #: Control events sent (event_id -> type), so errors about them can be told apart.
        self._sent: OrderedDict[str, str] = OrderedDict()
        #: vLLM-Omni: finished replies with audio that nobody reported playback for (backend ids).
        self._unreported: list[str] = []
        self._outgoing: list[JsonObject] = []
        #: The session object last sent (an update sends what differs from it).
        self._session: JsonObject = {}
        #: Updates sent and not answered yet (event ids, oldest first), and the answers to take.
        self._updates: deque[tuple[str, JsonObject]] = deque()  # (event id, the session before it)
        self._update_answers: list[tuple[str, port.EngineRefused | None]] = []
        #: vLLM-Omni answers the opening session.update with session.updated right after
        #: session.created: that one answers none of the updates sent since.
        self._open_echo = True
        self._calls = FunctionCalls()
        #: The session configuration last sent (what a reply's own tools are compared with).
        self._config = SessionConfig()
        #: vLLM-Omni: function outputs sent and not announced yet (event id -> item id).
        self._outputs: OrderedDict[str, str] = OrderedDict()
        #: The backend's own turn-taking answers commits (``auto_response``), as last sent.
        self._backend_turns = False
        #: vLLM-Omni, turns decided here: caller input waiting for the backend to be free.
        self._gate: InputGate[_Requested] = InputGate()

    @property
    def input_waiting(self) -> bool:
        """Caller input is held until the backend's reply is over (see :mod:`.input_gate`)."""
        return self._gate.waiting

    def release_input(self) -> list[JsonObject]:
        """Send the held input now, busy backend or not (it has gone quiet for too long).

        A finished reply nobody reported on is acknowledged first, so that its ledger
        at least takes the input as a turn.
        """
        return self._ack_unreported() + self._gate.release(
            self._backend_busy, self._requested.append, force=True
        )

    # -- port calls -> client events ----------------------------------------------------------

    def _gates_input(self) -> bool:
        """vLLM-Omni, with turns decided by the gateway (or the client) rather than by the backend."""
        return self.kind is BackendKind.VLLM_OMNI and not self._backend_turns

    def _backend_busy(self) -> bool:
        """vLLM-Omni holds the turn: a reply asked for, in progress, or not reported played."""
        return bool(self._requested or self._replies or self._unreported)

    def _input(self, events: list[JsonObject], request: _Requested | None = None) -> list[JsonObject]:
        """Caller input (``request``: the reply its last event asks for): what to send now, in order.

        While the backend is busy it waits in the gate, and so does everything after it.
        """
        if not self._gates_input():
            if request is not None:
                self._requested.append(request)
            return events
        for index, event in enumerate(events):
            self._gate.hold(event, request if index == len(events) - 1 else None)
        return self._released()

    def _in_order(self, events: list[JsonObject]) -> list[JsonObject]:
        """Events that must not overtake caller input held before them."""
        return self._input(events) if self._gate.waiting else events

    def _released(self) -> list[JsonObject]:
        """Held input the backend may have now; behind events released earlier and not yet taken."""
        out = self._gate.release(self._backend_busy, self._requested.append)
        if out and self._outgoing:
            self._outgoing.extend(out)
            return []
        return out

    def _event(self, kind: str, remember: bool = False, **fields: Any) -> JsonObject:
        event_id = f"evt_gw_{next(self._ids)}"
        if remember:
            self._sent[event_id] = kind
            while len(self._sent) > _SENT_REMEMBERED:
                self._sent.popitem(last=False)
        return {"type": kind, "event_id": event_id, **fields}

    def session_update(self, config: SessionConfig, *, initial: bool) -> JsonObject | None:
        """The ``session.update`` for ``config``: whole when opening, else only what changed
        (None: nothing did). An update's answer is taken by :meth:`take_update_answers`."""
        session = session_object(
            config, input_rate=self.input_rate, output_rate=self.output_rate, initial=False
        )
        self._config = config
        self._backend_turns = bool(session["extra_body"]["auto_response"])
        if initial:
            self._session = session
            return self._event(
                "session.update",
                session=session_object(
                    config, input_rate=self.input_rate, output_rate=self.output_rate, initial=True
                ),
            )
        changes = changed_fields(self._session, session)
        if not changes:
            return None
        event = self._event("session.update", remember=True, session=changes)
        self._updates.append((str(event["event_id"]), self._session))
        self._session = session
        return event

    def take_update_answers(self) -> list[tuple[str, port.EngineRefused | None]]:
        """Updates the backend answered since the last call: (event id, None if taken, else its refusal)."""
        out, self._update_answers = self._update_answers, []
        return out

    def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> list[JsonObject]:
        # A reply nobody reported on is acknowledged at the commit, not here: the caller may
        # still report (or truncate) it while speaking. Its audio waits for that meanwhile.
        if is_speech is None and self._gates_input():
            # In turn mode vLLM-Omni drops an append it finds quiet (a pause between two
            # words) unless it is told it is speech; here the gateway decides what a turn holds.
            is_speech = True
        extra: JsonObject = {}
        if is_speech is not None:
            extra["is_speech"] = is_speech
        if hints:
            extra["hints"] = dict(hints)
        if video_frames:
            # Camera frames ride the audio they were taken with, as vLLM-Omni's clients send them.
            extra["video_frames"] = list(video_frames)
        return self._input(
            [
                self._event(
                    "input_audio_buffer.append",
                    audio=base64.b64encode(pcm).decode("ascii"),
                    format="pcm16",
                    sample_rate_hz=self.input_rate,
                    **extra,
                )
            ]
        )

    def commit(
        self,
        *,
        item_id: str,
        response_id: str | None,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
    ) -> list[JsonObject]:
        """``engine_decides``: the backend's own turn-taking (``auto_response``) answers, or not."""
        out = self._ack_unreported()
        if self.kind is BackendKind.VLLM_OMNI:
            keys: JsonObject = {"final": final}
            if is_speech is not None:
                keys["is_speech"] = is_speech
            if response_id is not None or not engine_decides:
                keys["response_create"] = response_id is not None
            commit = self._event("input_audio_buffer.commit", **keys)
            self._commits.append((str(commit["event_id"]), item_id))
            request = None
            if response_id is not None:
                request = _Requested(gateway_id=response_id, event_id=str(commit["event_id"]))
            return out + self._input([commit], request)
        keys = {} if final else {"final": False}
        if is_speech is not None:
            keys["is_speech"] = is_speech
        commit = self._event("input_audio_buffer.commit", **keys)
        self._commits.append((str(commit["event_id"]), item_id))
        out.append(commit)
        if response_id is not None:
            create = self._event("response.create", remember=True)
            self._requested.append(_Requested(gateway_id=response_id, event_id=str(create["event_id"])))
            out.append(create)
        return out

    def clear_input(self) -> list[JsonObject]:
        return self._input([self._event("input_audio_buffer.clear")])

    def cancel_input(self) -> list[JsonObject]:
        return self._input([self._event("input.cancel")])

    def append_text(self, text: str) -> list[JsonObject]:
        return self._input([self._event("input.text.append", text=text)])

    def signal_turn(self, event: str, payload: Mapping[str, object]) -> list[JsonObject]:
        return self._in_order([self._event("turn.signal", event=event, payload=dict(payload))])

    def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> list[JsonObject]:
        item = message_item(item_id=item_id, role=role, text=text, images=images)
        self._added_items.add(item_id)
        placement: JsonObject = {"previous_item_id": previous_item_id} if previous_item_id is not None else {}
        return self._in_order([self._event("conversation.item.create", item=item, **placement)])

    def add_function_call(
        self, *, item_id: str, call_id: str, name: str, arguments: str, previous_item_id: str | None = None
    ) -> list[JsonObject]:
        """A call the client replays (vLLM-Omni takes a function's output only for a call it knows)."""
        item = function_call_item(item_id=item_id, call_id=call_id, name=name, arguments=arguments)
        return self._in_order(self._create_item(item, previous_item_id))

    def add_function_output(
        self, *, item_id: str, call_id: str, output: str, previous_item_id: str | None = None
    ) -> list[JsonObject]:
        """A function's output; until vLLM-Omni announces it, :attr:`outputs_pending` holds."""
        out = self._create_item(
            function_output_item(item_id=item_id, call_id=call_id, output=output), previous_item_id
        )
        if self.kind is BackendKind.VLLM_OMNI and len(self._outputs) < _SENT_REMEMBERED:
            self._outputs[str(out[0]["event_id"])] = item_id
        return self._in_order(out)

    @property
    def outputs_pending(self) -> bool:
        """vLLM-Omni has not announced every function output sent yet.

        Taking one, it spawns the continuation of the reply in progress, which for a
        turn-commit model ends whatever reply is in progress when it runs; it runs once the
        item is announced, so a reply asked for before that would be the one it ends.
        """
        return bool(self._outputs)

    def forget_outputs(self) -> None:
        """Stop waiting for announcements (they did not come in time)."""
        self._outputs.clear()

    def _create_item(self, item: JsonObject, previous_item_id: str | None) -> list[JsonObject]:
        self._added_items.add(str(item["id"]))
        placement: JsonObject = {"previous_item_id": previous_item_id} if previous_item_id is not None else {}
        return [self._event("conversation.item.create", item=item, **placement)]

    def delete_item(self, item_id: str) -> list[JsonObject]:
        """Forget an item the backend holds under our id (the items we added)."""
        if item_id not in self._added_items:
            return []
        self._added_items.discard(item_id)
        return self._in_order([self._event("conversation.item.delete", item_id=item_id)])

    def reply_refusal(self, options: port.ResponseOptions | None) -> str | None:
        """Why the backend cannot make a reply with ``options`` (None: it can).

        vLLM-Omni's ``response.create`` takes no tools; a gateway backend's does.
        """
        if self.kind is not BackendKind.VLLM_OMNI:
            return None
        return reply_tools_refusal(options, self._config)

    def create_response(
        self, *, response_id: str, instructions: str | None, options: port.ResponseOptions | None = None
    ) -> list[JsonObject]:
        out = self._ack_unreported()
        request: JsonObject = {}
        if instructions:
            request["instructions"] = instructions
        if self.kind is BackendKind.GATEWAY and own_tools(options, self._config):
            # Tools of its own (a gateway backend checks them against its engine).
            assert options is not None
            request["tools"] = [tool_object(tool) for tool in options.tools]
            request["tool_choice"] = tool_choice_object(options.tool_choice)
        create = self._event("response.create", remember=True, **({"response": request} if request else {}))
        return out + self._input(
            [create], _Requested(gateway_id=response_id, event_id=str(create["event_id"]))
        )

    def cancel_response(self, response_id: str) -> list[JsonObject]:
        backend_id = self._backend_id(response_id)
        if backend_id is not None:
            reply = self._replies.get(backend_id)
            if reply is None:
                return []  # finished already: nothing to stop
            reply.dropped = True
            return [self._event("response.cancel", remember=True, response_id=backend_id)]
        if self._gate.withdraw(lambda requested: requested.gateway_id == response_id):
            return []  # still held here: the backend never hears of it
        for requested in self._requested:
            if requested.gateway_id == response_id and not requested.cancelled:
                # Not announced yet: the backend cancels the reply it is preparing, and
                # whatever it still announces for it is dropped here.
                requested.cancelled = True
                return [self._event("response.cancel", remember=True)]
        return []

    def barge_in(self) -> list[JsonObject]:
        for reply in self._replies.values():
            reply.dropped = True
        for requested in self._requested:
            requested.cancelled = True
        self._gate.withdraw(lambda requested: True)
        return [self._event("barge_in", remember=True)]

    def ack_playback(self, *, response_id: str, played_ms: int) -> list[JsonObject]:
        backend_id, _, played = self._reported(response_id, played_ms)
        ack = self._event("playback.ack", remember=True, response_id=backend_id, played_ms=played)
        return [ack, *self._released()]  # the reply played: what the caller said since may go

    def _reported(self, response_id: str, heard_ms: int) -> tuple[str, OmniReply | None, int]:
        """The client reported on a reply: its backend id, its record, and ``heard_ms`` on the backend's clock."""
        backend_id = self._backend_id(response_id) or response_id
        reply = self._replies.get(backend_id) or self._finished.get(backend_id)
        heard = int(heard_ms)
        if reply is not None:
            reply.acked = True
            heard = reply.audio.ledger_played(heard)
        if backend_id in self._unreported:
            self._unreported.remove(backend_id)
        return backend_id, reply, heard

    def truncate_reply(self, *, response_id: str, audio_end_ms: int) -> list[JsonObject]:
        """The caller heard only ``audio_end_ms`` of the reply: vLLM-Omni cuts it there in its history."""
        if self.kind is not BackendKind.VLLM_OMNI:
            # A gateway backend learns of it as playback (its item ids are its own).
            return self.ack_playback(response_id=response_id, played_ms=audio_end_ms)
        backend_id, reply, end = self._reported(response_id, audio_end_ms)
        out = [
            self._event(
                "conversation.item.truncate",
                remember=True,
                item_id=f"item_{backend_id}",
                content_index=0,
                audio_end_ms=end,
            )
        ]
        if reply is not None and reply.audio.samples:
            # The caller's playback of it is over: under vLLM-Omni's ACK_ONLY ledger a reply
            # acknowledged only in part keeps the turn busy, so the rest is acknowledged too
            # (the history stays cut at the truncation, a hard cap).
            played = reply.audio.ledger_total()
            out.append(self._event("playback.ack", remember=True, response_id=backend_id, played_ms=played))
        return out + self._released()

    def close(self, reason: str) -> JsonObject:
        return self._event("session.close", reason=reason)

    def take_outgoing(self) -> list[JsonObject]:
        out, self._outgoing = self._outgoing, []
        return out

    def _ack_unreported(self) -> list[JsonObject]:
        """vLLM-Omni: acknowledge finished replies the client never reported playback for."""
        if not self._unreported:
            return []
        out: list[JsonObject] = []
        for backend_id in self._unreported:
            reply = self._finished.get(backend_id)
            if reply is not None and not reply.acked:
                reply.acked = True
                out.append(
                    self._event(
                        "playback.ack",
                        remember=True,
                        response_id=backend_id,
                        played_ms=reply.audio.ledger_total(),
                    )
                )
        self._unreported.clear()
        return out

    def _backend_id(self, gateway_id: str) -> str | None:
        for replies in (self._replies, self._finished):
            for backend_id, reply in replies.items():
                if reply.gateway_id == gateway_id:
                    return backend_id
        return None

    # -- server events -> port events ------------------------------------------------------------

    def receive(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        out = self._receive(event)
        if self._gate.waiting:
            # The backend may be free now (a reply ended): held input goes out behind the rest.
            self._outgoing.extend(self._gate.release(self._backend_busy, self._requested.append))
        return out

    def _receive(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        kind = event.get("type")
        if kind == "response.created":
            return self._response_created(response_id_of(event), hold=True)
        if kind in ("conversation.item.added", "conversation.item.created") and self._outputs:
            item = event.get("item")
            announced = item.get("id") if isinstance(item, Mapping) else None
            for event_id in [e for e, item_id in self._outputs.items() if item_id == announced]:
                del self._outputs[event_id]
            return []
        response_id = response_id_of(event)
        calls = self._calls.translate(event, self._gateway_of)
        if calls is not None:
            return calls
        if response_id is not None and self._calls.held(response_id):
            # What the backend started beside the reply in progress carries more than a
            # call: a reply of its own after all.
            self._calls.release(response_id)
            return [*self._response_created(response_id), *self._receive(event)]
        if kind == "response.done":
            return self._response_done(event)
        if kind == "input_audio_buffer.committed":
            item = self._committed(event.get("item_id"))
            return [port.EngineTurnCommitted(item_id=item)] if item else []
        if kind == "session.updated":
            if self._open_echo and self.kind is BackendKind.VLLM_OMNI:
                self._open_echo = False
            elif self._updates:
                self._update_answers.append((self._updates.popleft()[0], None))
            return []
        if kind == "error":
            return self._error(event)
        # Sessions are opened with turn_detection null: the gateway finds the turns, so
        # vLLM-Omni's speech events are no news (the table leaves them out).
        out = translate(event, self._replies, caller_item=self._item)
        return out if out is not None else []

    def _response_created(self, backend_id: str | None, *, hold: bool = False) -> list[port.EngineEvent]:
        if not backend_id or backend_id in self._replies or backend_id in self._finished:
            return []
        if hold and self._calls.created(backend_id, next(reversed(self._replies), None)):
            return []  # maybe the wrapper of a function call of the reply in progress
        requested = self._requested.popleft() if self._requested else None
        gateway_id = requested.gateway_id if requested is not None and requested.gateway_id else backend_id
        reply = OmniReply(gateway_id=gateway_id, audio=ReplyAudio(self.output_rate))
        self._replies[backend_id] = reply
        if requested is not None and requested.cancelled:
            reply.dropped = True
            self._outgoing.append(self._event("response.cancel", remember=True, response_id=backend_id))
            return []
        return [port.EngineResponseStarted(response_id=gateway_id)]

    def _response_done(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        backend_id = response_id_of(event) or ""
        reply = self._replies.pop(backend_id, None)
        if reply is None:
            # A reply cancelled before the backend announced it ends without response.created.
            if self._requested and self._requested[0].cancelled and backend_id not in self._finished:
                self._requested.popleft()
            return []
        self._finished[backend_id] = reply
        while len(self._finished) > _FINISHED_REMEMBERED:
            self._finished.popitem(last=False)
        if reply.dropped:
            reply.acked = True  # nothing of it was played on purpose; vLLM-Omni was told to stop
            return []
        if self.kind is BackendKind.VLLM_OMNI and reply.audio.samples and not reply.acked:
            self._unreported.append(backend_id)
        return reply_done(reply, event)

    def _gateway_of(self, backend_id: str) -> str | None:
        """The gateway's id of the reply in progress ``backend_id`` (None: gone or dropped)."""
        reply = self._replies.get(backend_id)
        return reply.gateway_id if reply is not None and not reply.dropped else None

    def _committed(self, backend_item: object) -> str:
        """The caller's item a backend commit is: the gateway's for its commits, else the backend's id."""
        name = backend_item if isinstance(backend_item, str) else ""
        if not self._commits:
            return name  # the backend ended a turn by itself
        _, gateway_item = self._commits.popleft()
        if name:
            self._items[name] = gateway_item
            while len(self._items) > _FINISHED_REMEMBERED:
                self._items.popitem(last=False)
        return gateway_item

    def _item(self, backend_item: object) -> str:
        # The backend's own id for a turn it ended itself: the gateway session maps it.
        if not isinstance(backend_item, str):
            return ""
        return self._items.get(backend_item, backend_item)

    def _error(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        code, message, related = error_fields(event)
        refused: list[port.EngineEvent] = []
        if related is None and code in _UNNAMED_CREATE_REFUSALS and self._requested:
            oldest = self._requested[0].event_id
            if self._sent.get(oldest) == "response.create":
                related = oldest
        if related is not None:
            self._outputs.pop(related, None)  # a refused output: nothing to wait for
            for requested in list(self._requested):
                if requested.event_id == related:
                    # The backend refused this reply: it will never be announced, so the
                    # gateway's reply of that name ends here.
                    self._requested.remove(requested)
                    if requested.gateway_id is not None and not requested.cancelled:
                        refused.append(
                            port.EngineResponseDone(
                                response_id=requested.gateway_id, status="failed", reason=code
                            )
                        )
            for commit in list(self._commits):
                if commit[0] == related:
                    self._commits.remove(commit)  # refused: no input_audio_buffer.committed will follow
            for index, (event_id, before) in enumerate(self._updates):
                if event_id == related:
                    # The backend refused this update and keeps its previous configuration.
                    del self._updates[index]
                    if index == len(self._updates):  # the latest: what the backend holds is before it
                        self._session = before
                    self._update_answers.append((related, port.EngineRefused(code, message or code)))
                    return []
            about = self._sent.get(related)
            if about in ("response.cancel", "playback.ack", "barge_in", "conversation.item.truncate"):
                # About a reply that already ended on the backend (a race the gateway has fenced).
                logger.info("backend refused %s: %s: %s", about, code, message)
                return []
        if late_report(code):
            logger.info("backend refused a report on a finished reply: %s: %s", code, message)
            return []
        return [port.EngineError(code=code, message=message or code), *refused]
