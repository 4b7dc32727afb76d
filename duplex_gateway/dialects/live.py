"""The OpenAI Live API (GPT-Live, full duplex) as a :class:`~duplex_gateway.dialects.base.Dialect`.

Client frames are parsed by :mod:`duplex_gateway.dialects.live_commands` into the gateway's commands:
``session.start`` becomes the session's configuration (a ``session.update`` of the duplex handshake)
and its startup history; audio appends, context appends, function-call outputs, ``response.create``,
``session.update`` (delegation only) and ``session.close`` follow. The gateway's server events are
rendered here as Live server events; those the Live API has no form for render as nothing.

What the Live API names differently:

- A **delegation** is one of the engine's function calls. Under client delegation the engine has
  one function, :data:`~duplex_gateway.dialects.live_session.DELEGATE_TOOL`; its call becomes
  ``session.delegation.created`` and the client's commentary or thinking with that
  ``delegation_id`` goes back as the call's output. Under Responses delegation the engine calls the
  client's function tools; each reply that calls one is a delegation whose calls the client sees in
  ``response.event`` envelopes, and answers with ``response.item.create`` and ``response.create``.
- A **context append** is a :class:`~duplex_gateway.vocabulary.commands.ContextAppend` (under a
  conversation item id the dialect names); the session's ``ContextAppended`` is its
  acknowledgement, ``session.<channel>.appended``. Mute and unmute are ``InputAudioMute``.
- The **session timeline** (``start_ms``, ``end_ms``, ``offset_ms``) is the caller's audio received
  so far, which a Live client streams without pause; the dialect keeps no clock.
- **What the caller heard**: a Live client plays the audio it gets as it gets it and sends no
  playback acks, so the gateway is the one who knows.
  :class:`~duplex_gateway.dialects.live_pacing.PacedLiveDialect`, the dialect the gateway serves, sends reply audio no faster than it plays (:class:`LivePlayout`: a small lead
  ahead, so a late packet leaves no gap), tells the session what its clock says was played, and
  drops what is queued when a reply is cut short: the caller hears at most the lead after a
  barge-in, and the conversation keeps what they heard. Time arrives as arguments.

Pure: no asyncio, no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from duplex_gateway.dialects import wire_codec
from duplex_gateway.dialects.live_backend import (
    BackendDelegations,
    BackendMessage,
    BackendRequest,
    BackendResult,
)
from duplex_gateway.dialects.live_commands import PARSERS, LiveState, Parser
from duplex_gateway.dialects.live_errors import (
    INVALID_VALUE,
    LiveProtocolError,
    live_code,
    missing,
    quote_list,
    refuse,
    wrong_type,
)
from duplex_gateway.dialects.live_session import DELEGATE_TOOL, session_resource
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError, error_type_for
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "CLIENT_EVENT_TYPES",
    "CLOSE_REASONS",
    "LiveDialect",
]

JsonObject = dict[str, object]

#: Every client event type the dialect knows (some refused for now, saying why).
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(PARSERS)

_MAX_REFUSALS = 8

#: The Live API's ``session.closed`` reason for the gateway's close reasons; any other is a lost connection.
CLOSE_REASONS: Mapping[str, str] = {
    "close_requested": "close_requested",
    "client_close": "close_requested",
    "client_closed": "close_requested",
    "session_expired": "expired",
    "max_duration": "expired",
    "server_shutdown": "remote_hangup",
    "remote_hangup": "remote_hangup",
    # POST /v1/live/sessions/{session_id}/hangup: the application hung the call up.
    "hangup_requested": "remote_hangup",
}


@dataclass(slots=True)
class _Reply:
    """What the client has been shown of one of the engine's replies."""

    #: Where its first audio sits on the session timeline, and how much audio it has sent (ms).
    start_ms: int | None = None
    audio_ms: float = 0.0
    transcript_end_ms: int = 0
    #: Responses delegation: the delegation it belongs to, and whether ``response.created`` went out.
    delegation: str | None = None
    announced: bool = False
    #: Its words, for the conversation a backend reads.
    words: str = ""


@dataclass(slots=True)
class _Heard:
    """The caller's turn ``item_id``: its span on the timeline and the words shown so far."""

    start_ms: int
    end_ms: int | None = None
    text: str = ""
    cursor_ms: int = 0


@dataclass(slots=True)
class _View:
    replies: dict[str, _Reply] = field(default_factory=dict)
    heard: dict[str, _Heard] = field(default_factory=dict)
    output_end_ms: int = 0


class LiveDialect:
    """One Live connection's translator: Live client frames in, Live server frames out.

    ``session_id`` is the id the client sees; ``expires_at`` (Unix seconds) when the gateway ends the
    session, which the host knows from its own limits. ``backend`` names the gateway's backend model
    that Responses delegation goes to (see :mod:`~duplex_gateway.dialects.live_backend`); None: the
    voice engine does the delegated work itself.
    """

    #: The client events this dialect takes, each with its parser (a transport may take some differently).
    parsers: ClassVar[Mapping[str, Parser]] = PARSERS

    def __init__(
        self, *, session_id: str, expires_at: int, max_message_bytes: int, backend: str | None = None
    ) -> None:
        self.session_id = session_id
        self.expires_at = expires_at
        self._max_bytes = max_message_bytes
        self.backend = backend
        self.state = LiveState(backend=BackendDelegations() if backend is not None else None)
        self._own_frames = 0
        self._view = _View()
        #: The Live codes of refusals raised and not yet rendered (the host renders each at once).
        self._refusals: dict[tuple[object, ...], str] = {}

    # -- client -> commands --------------------------------------------------------------------

    def parse(self, frame: Frame) -> tuple[Command, ...]:
        event_id: str | None = None
        try:
            data = self._load(frame)
            raw_id = data.get("event_id")
            if raw_id is not None and not isinstance(raw_id, str):
                raise wrong_type("event_id", "a string", raw_id)
            event_id = raw_id
            kind = data.get("type")
            if kind is None:
                raise missing("type")
            if not isinstance(kind, str):
                raise wrong_type("type", "a string", kind)
            parser = self.parsers.get(kind)
            if parser is None:
                raise refuse(
                    INVALID_VALUE,
                    f"Invalid value: '{kind[:100]}'. Supported values are: {quote_list(sorted(self.parsers))}.",
                    param="type",
                )
            return parser(data, event_id, self.state)
        except ProtocolError as exc:
            error = exc.with_event_id(event_id)
            if isinstance(error, LiveProtocolError):
                if len(self._refusals) >= _MAX_REFUSALS:
                    self._refusals.pop(next(iter(self._refusals)))
                self._refusals[_error_key(error.code, error.message, error.param, error.event_id)] = (
                    error.live
                )
            raise error from None

    def _load(self, frame: Frame) -> Mapping[str, object]:
        if not isinstance(frame, str):
            raise LiveProtocolError(
                "binary_not_supported",
                ErrorCode.BINARY_NOT_SUPPORTED,
                "This endpoint takes JSON text messages only.",
            )
        # Only a non-ASCII text needs encoding to know its size in bytes.
        too_long = len(frame) > self._max_bytes or (
            not frame.isascii() and len(frame.encode("utf-8", "surrogatepass")) > self._max_bytes
        )
        if too_long:
            raise LiveProtocolError(
                "message_too_large",
                ErrorCode.MESSAGE_TOO_LARGE,
                f"The message exceeds the {self._max_bytes}-byte limit.",
            )
        try:
            data = wire_codec.loads(frame)
        except (ValueError, RecursionError):
            raise LiveProtocolError(
                "invalid_json", ErrorCode.INVALID_JSON, "The message is not valid JSON."
            ) from None
        if not isinstance(data, dict):
            raise wrong_type("", "an object", data)
        return data

    # -- events -> server frames ---------------------------------------------------------------

    def render(self, event: ev.ServerEvent, *, seq: int) -> str | None:
        return self._render(event, f"event_{seq}")

    def render_unsequenced(self, event: ev.ServerEvent) -> str:
        raise NotImplementedError("Live sessions are not resumed")

    def _render(self, event: ev.ServerEvent, event_id: str) -> str | None:
        renderer = _RENDERERS.get(type(event))
        if renderer is None:
            return None  # the Live API has no form for it (turn events, playback, rate limits' detail...)
        body = renderer(self, event)
        if body is None:
            return None
        wire: JsonObject = {"type": body.pop("type"), "event_id": event_id, **body}
        return wire_codec.dumps(wire)

    # session

    def _resource(self, config: Any) -> JsonObject:
        setup = self.state.setup
        assert setup is not None
        return session_resource(
            config, setup, self.state.delegation, session_id=self.session_id, expires_at=self.expires_at
        )

    def _session_started(self, event: ev.SessionCreated) -> JsonObject | None:
        if self.state.setup is None:
            return None
        self.state.started = True
        return _with_client_id(
            {"type": "session.started", "session": self._resource(event.config)}, self.state.start_event_id
        )

    def _session_updated(self, event: ev.SessionUpdated) -> JsonObject | None:
        if not self.state.updates:
            return None  # a change of the gateway's own (the startup history) is no update of the client's
        return _with_client_id(
            {"type": "session.updated", "session": self._resource(event.config)}, self.state.updates.pop(0)
        )

    def _session_closed(self, event: ev.SessionClosed) -> JsonObject | None:
        if self.state.setup is None:
            return None
        seconds = self._usage_seconds()
        body: JsonObject = {
            "type": "session.closed",
            "reason": CLOSE_REASONS.get(event.reason, "connection_lost"),
            "session": {
                "id": self.session_id,
                "expires_at": self.expires_at,
                "model": self.state.setup.model,
                "status": "active",
                "delegation": self.state.delegation.wire(),
            },
            "usage": {"seconds": seconds},
        }
        return _with_client_id(body, self.state.close_event_id)

    def _usage(self, event: ev.RateLimitsUpdated) -> JsonObject | None:
        # The gateway reports usage after every reply; the Live API's is cumulative audio time.
        if not self.state.started:
            return None
        return {"type": "session.usage.updated", "usage": {"seconds": self._usage_seconds()}}

    def _usage_seconds(self) -> int:
        return int(max(self.state.timeline_ms, self._view.output_end_ms) // 1000)

    # audio and words

    def _audio(self, event: ev.AudioDelta) -> JsonObject:
        reply = self._reply(event.response_id)
        if reply.start_ms is None:
            reply.start_ms = max(self.state.now_ms(), self._view.output_end_ms)
            reply.transcript_end_ms = reply.start_ms
        fmt = self.state.setup.audio_format if self.state.setup is not None else None
        if fmt is not None:
            reply.audio_ms += fmt.duration_ms(len(event.audio))
        self._view.output_end_ms = max(self._view.output_end_ms, reply.start_ms + int(reply.audio_ms))
        return {"type": "session.output_audio.delta", "delta": wire_codec.b64encode(event.audio)}

    def _output_words(self, event: ev.TranscriptDelta) -> JsonObject | None:
        if not event.delta:
            return None
        reply = self._reply(event.response_id)
        if reply.start_ms is None:  # words ahead of the reply's audio sit where its audio will begin
            reply.start_ms = max(self.state.now_ms(), self._view.output_end_ms)
            reply.transcript_end_ms = reply.start_ms
        start = reply.transcript_end_ms
        end = max(start, reply.start_ms + int(reply.audio_ms))
        reply.transcript_end_ms = end
        reply.words += event.delta
        return {
            "type": "session.output_transcript.delta",
            "delta": event.delta,
            "start_ms": start,
            "end_ms": end,
        }

    def _speech_started(self, event: ev.SpeechStarted) -> None:
        self._view.heard[event.item_id] = _Heard(
            start_ms=event.audio_start_ms, cursor_ms=event.audio_start_ms
        )

    def _speech_stopped(self, event: ev.SpeechStopped) -> None:
        heard = self._view.heard.setdefault(event.item_id, _Heard(start_ms=event.audio_end_ms))
        heard.end_ms = event.audio_end_ms

    def _input_words(self, item_id: str, text: str, *, final: bool) -> JsonObject | None:
        heard = self._view.heard.get(item_id)
        if heard is None:
            heard = self._view.heard[item_id] = _Heard(
                start_ms=self.state.now_ms(), cursor_ms=self.state.now_ms()
            )
        delta = text
        backend = self._backend_on()
        if final and backend is not None:
            backend.transcript.add("user", text)
        if final:
            # No "completed" in the Live API: only the words the deltas have not shown yet.
            self._view.heard.pop(item_id, None)
            delta = text[len(heard.text) :] if text.startswith(heard.text) else _revision(heard.text, text)
        else:
            heard.text += text
        if not delta:
            return None
        start = heard.cursor_ms
        end = max(start, heard.end_ms if heard.end_ms is not None else self.state.now_ms())
        heard.cursor_ms = end
        return {"type": "session.input_transcript.delta", "delta": delta, "start_ms": start, "end_ms": end}

    # delegation

    def _reply(self, response_id: str) -> _Reply:
        reply = self._view.replies.get(response_id)
        if reply is None:
            reply = self._view.replies[response_id] = _Reply()
        return reply

    def _backend_on(self) -> BackendDelegations | None:
        """The backend doing this session's delegated work, if it has one (Responses delegation)."""
        return self.state.backend if self.state.delegation.target == "responses" else None

    def _call_started(self, event: ev.OutputItemAdded) -> JsonObject | None:
        if event.item.kind != "function_call" or self.state.delegation.target != "responses":
            return None
        if self._backend_on() is not None:
            return None  # the engine's call is the backend's delegation, opened when the call is complete
        reply = self._reply(event.response_id)
        if reply.delegation is not None:
            return None
        continuing, self.state.continuing = self.state.continuing, None
        if continuing is not None:
            reply.delegation, reply.announced = continuing, True
            return self._envelope(
                continuing,
                {"type": "response.created", "response": _snapshot(event.response_id, "in_progress")},
            )
        reply.delegation = self.state.last_delegation = f"deleg_{event.response_id}"
        return self._delegation_created(reply.delegation, "responses", response_id=event.response_id)

    def _arguments_done(self, event: ev.FunctionCallArgumentsDone) -> JsonObject | None:
        reply = self._view.replies.get(event.response_id)
        if reply is None or reply.delegation is None or reply.announced:
            return None
        reply.announced = True
        return self._envelope(
            reply.delegation,
            {"type": "response.created", "response": _snapshot(event.response_id, "in_progress")},
        )

    def _call_done(self, event: ev.OutputItemDone) -> JsonObject | None:
        item = event.item
        if item.kind != "function_call" or item.call_id is None:
            return None
        if self.state.delegation.target == "client":
            if item.name != DELEGATE_TOOL.name:
                return None
            self.state.open_delegations.add(item.call_id)
            return self._delegation_created(item.call_id, "client")
        backend = self._backend_on()
        if backend is not None:
            if not backend.is_delegation(item.name):
                return None
            setup = self.state.setup
            system = (setup.instructions,) if setup is not None and setup.instructions else ()
            # What the transcript has not got yet: words still being recognized, the reply delegating.
            reply = self._view.replies.get(event.response_id)
            pending = (
                *(BackendMessage(role="user", content=heard.text) for heard in self._view.heard.values()),
                BackendMessage(role="assistant", content=reply.words if reply is not None else None),
            )
            bodies = backend.delegate(item.call_id, self.state.now_ms(), system, pending)
            self.state.outbox.extend(bodies[1:])
            return bodies[0] if bodies else None
        reply = self._view.replies.get(event.response_id)
        if reply is None or reply.delegation is None:
            return None
        self.state.open_calls.add(item.call_id)
        nested: JsonObject = {
            "type": "response.output_item.done",
            "output_index": event.output_index,
            "item": {
                "id": item.id,
                "type": "function_call",
                "status": item.status,
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.arguments or "",
            },
        }
        return self._envelope(reply.delegation, nested)

    def _response_done(self, event: ev.ResponseDone) -> JsonObject | None:
        reply = self._view.replies.pop(event.response_id, None)
        backend = self._backend_on()
        if reply is not None and backend is not None:
            backend.transcript.add("assistant", reply.words)
        if reply is None or reply.delegation is None:
            return None
        status = {"completed": "completed", "failed": "failed"}.get(event.status, "incomplete")
        snapshot = _snapshot(event.response_id, status)
        if status == "incomplete":
            snapshot["incomplete_details"] = {"reason": event.reason or event.status}
            self.state.open_calls.clear()  # the calls of a reply cut short are not answered
        if status == "failed":
            snapshot["error"] = {
                "code": event.reason or "engine_error",
                "message": "The delegated reply failed.",
            }
            self.state.open_calls.clear()
        return self._envelope(reply.delegation, {"type": f"response.{status}", "response": snapshot})

    def _delegation_created(
        self, delegation_id: str, target: str, *, response_id: str | None = None
    ) -> JsonObject:
        delegation: JsonObject = {"id": delegation_id, "type": "delegation", "target": target}
        if response_id is not None:
            delegation["response_id"] = response_id
        return {
            "type": "session.delegation.created",
            "offset_ms": self.state.now_ms(),
            "delegation": delegation,
        }

    @staticmethod
    def _envelope(delegation_id: str, nested: JsonObject) -> JsonObject:
        return {"type": "response.event", "delegation_id": delegation_id, "event": nested}

    # the backend's work (the host runs each request and hands back what the backend streams)

    def take_backend_requests(self) -> list[BackendRequest]:
        """Backend rounds to run: each delegation the engine opened, each round the client resumed."""
        return self.state.backend.take_requests() if self.state.backend is not None else []

    def backend_result(self, result: BackendResult) -> None:
        """What a backend round streamed; its frames go out with :meth:`own_frames`."""
        if self.state.backend is not None:
            self.state.outbox.extend(self.state.backend.result(result))

    def take_backend_commands(self) -> list[cmd.Command]:
        """What the backend's work has for the session: its answers, for the engine to say."""
        return self.state.backend.take_commands() if self.state.backend is not None else []

    def own_frames(self) -> list[Frame]:
        """The dialect's own server events waiting to go out (the backend's), as frames, in order."""
        bodies, self.state.outbox = self.state.outbox, []
        frames: list[Frame] = []
        for body in bodies:
            self._own_frames += 1
            wire = {"type": body.pop("type"), "event_id": f"event_own_{self._own_frames}", **body}
            frames.append(wire_codec.dumps(wire))
        return frames

    # acknowledgements and errors

    def _context_appended(self, event: ctx.ContextAppended) -> JsonObject | None:
        if BackendDelegations.is_answer_item(event.item_id):
            return None  # the gateway's own append: the backend's answer handed to the engine
        now = self.state.now_ms()
        body: JsonObject = {"type": f"session.{event.channel}.appended", "start_ms": now, "end_ms": now}
        return _with_client_id(body, event.event_id)

    def _error(self, event: ev.ErrorEvent) -> JsonObject:
        if event.event_id is not None and event.event_id in self.state.updates:
            self.state.updates.remove(event.event_id)  # a refused update gets no session.updated
        key = _error_key(event.code, event.message, event.param, event.event_id)
        code = self._refusals.pop(key, None) or live_code(event.code)
        error: JsonObject = {"type": error_type_for(event.code), "code": code, "message": event.message}
        if event.param is not None:
            error["param"] = event.param
        if event.event_id is not None:
            error["client_event_id"] = event.event_id
        return _with_client_id({"type": "error", "error": error}, event.event_id)


def _error_key(code: ErrorCode, message: str, param: str | None, event_id: str | None) -> tuple[object, ...]:
    return (code, message, param, event_id)


def _with_client_id(body: JsonObject, client_event_id: str | None) -> JsonObject:
    if client_event_id is not None:
        body["client_event_id"] = client_event_id
    return body


def _snapshot(response_id: str, status: str) -> JsonObject:
    # Reduced, as the Live API's are: output is always empty; calls come in their own events.
    return {"id": response_id, "object": "response", "status": status, "output": []}


def _silent(handler: Callable[[LiveDialect, Any], None]) -> Callable[[LiveDialect, Any], JsonObject | None]:
    def render(dialect: LiveDialect, event: Any) -> JsonObject | None:
        handler(dialect, event)
        return None

    return render


_RENDERERS: Mapping[type[ev.ServerEvent], Callable[[LiveDialect, Any], JsonObject | None]] = {
    ev.SessionCreated: LiveDialect._session_started,
    ev.SessionUpdated: LiveDialect._session_updated,
    ev.SessionClosed: LiveDialect._session_closed,
    ev.RateLimitsUpdated: LiveDialect._usage,
    ev.AudioDelta: LiveDialect._audio,
    ev.TranscriptDelta: LiveDialect._output_words,
    ev.SpeechStarted: _silent(LiveDialect._speech_started),
    ev.SpeechStopped: _silent(LiveDialect._speech_stopped),
    ev.InputTranscriptionDelta: lambda d, e: d._input_words(e.item_id, e.delta, final=False),
    ev.InputTranscriptionCompleted: lambda d, e: d._input_words(e.item_id, e.transcript, final=True),
    ev.OutputItemAdded: LiveDialect._call_started,
    ev.FunctionCallArgumentsDone: LiveDialect._arguments_done,
    ev.OutputItemDone: LiveDialect._call_done,
    ev.ResponseDone: LiveDialect._response_done,
    ev.ErrorEvent: LiveDialect._error,
    ctx.ContextAppended: LiveDialect._context_appended,
    ctx.InputAudioMuted: lambda d, e: {
        "type": "session.input_audio.muted" if e.muted else "session.input_audio.unmuted"
    },
    ctx.Notice: lambda d, e: {"type": "info", "code": e.code, "message": e.message},
}


def _revision(shown: str, final: str) -> str:
    """The final transcript's words past those the deltas already showed right.

    A recognizer's final words may revise its partial ones, and the Live API has no event that
    replaces words: the client gets the final words from the first one that differs, so what the
    caller said reaches it even where the partial words were wrong.
    """
    common = next(
        (i for i, (a, b) in enumerate(zip(shown, final, strict=False)) if a != b), min(len(shown), len(final))
    )
    start = final.rfind(" ", 0, common) + 1 if common < len(final) else common
    rest = final[start:]
    return f" {rest}" if rest and shown and not shown.endswith(" ") else rest
