"""The ``vllm-omni`` engine: native duplex sessions of an in-process vLLM-Omni ``DuplexOmni``.

One ``DuplexOmni`` serves the whole gateway; each gateway session owns one
``DuplexSessionHandle`` for its lifetime. Port calls map one to one onto handle
calls, and the handle's typed events, in their wire shape (``to_realtime()``), go
through the vLLM-Omni translator the ``remote`` engine shares
(:mod:`duplex_gateway.engine.omni`) onto port events:

==================================  ==========================================
handle event                        port event
==================================  ==========================================
``response.created``                :class:`~port.EngineResponseStarted`
``response.output_audio.delta``     :class:`~port.EngineAudio` (PCM16 at the
                                    engine's output rate, whatever the event's
                                    format and rate)
``response.output_audio_transcript  :class:`~port.EngineTranscript`
.delta``
``response.output_text.delta``      :class:`~port.EngineText`
``response.done``                   :class:`~port.EngineResponseDone` (with
                                    token usage, where reported)
``response.function_call_arguments  :class:`~port.EngineFunctionCallDelta` /
.delta`` / ``.done``                ``EngineFunctionCall``, on the reply the
                                    call belongs to (see :mod:`.omni.tools`)
``input_audio_buffer.speech_*``     :class:`~port.EngineSpeechStarted` /
                                    ``Stopped`` (engine VAD only)
``input_audio_buffer.committed``    :class:`~port.EngineTurnCommitted`
``...input_audio_transcription      :class:`~port.EngineInputTranscript` (on the
.completed``                        caller's item: commits carry its id)
``response.listen`` / ``.speak``    :class:`~port.EngineListen` / ``EngineSpeak``
``overlap.decision``                :class:`~port.EngineOverlapDecision`
``error``                           :class:`~port.EngineError`
``session.closed`` / ``expired``    :class:`~port.EngineClosed`
==================================  ==========================================

The session's tools go to vLLM-Omni with its configuration; the client's function
outputs (and replayed calls) as conversation items (:mod:`.omni.tools`).

A session whose client set ``extra_body.auto_response`` runs on vLLM-Omni's own
turn-taking: the engine session is opened with it, commits leave the reply to the
model (it may listen instead), and the model's listen / speak / overlap decisions
reach the client.

vLLM-Omni keeps a playback ledger: until the client says how much of a reply it
played, the next user turn counts as talking over it and gets no answer. The
gateway passes on what clients report: ``playback.ack`` as an ack, and
``conversation.item.truncate`` as vLLM-Omni's truncate (``truncate_item``), which
cuts the reply in the model's history to what the caller heard. A reply nobody
reported on is acknowledged in full at the caller's next commit or
``response.create``.

vLLM, vLLM-Omni and torch are imported only when this engine starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from duplex_gateway.engine import port
from duplex_gateway.engine.event_queue import EngineEventQueue
from duplex_gateway.engine.omni.audio import ReplyAudio, decode_audio
from duplex_gateway.engine.omni.events import (
    OmniReply,
    error_fields,
    item_of,
    late_report,
    reply_done,
    response_id_of,
    translate,
)
from duplex_gateway.engine.omni.fields import changed_fields
from duplex_gateway.engine.omni.items import message_item
from duplex_gateway.engine.omni.loading import (
    DEFAULT_INPUT_RATE,
    DEFAULT_OUTPUT_RATE,
    OmniFactoryError,
    keep_root_logging,
    load_factory,
    omni_builder,
)
from duplex_gateway.engine.omni.session import engine_session, output_modalities
from duplex_gateway.engine.omni.tools import (
    FunctionCalls,
    function_call_item,
    function_output_item,
    reply_tools_refusal,
)
from duplex_gateway.engine.updates import PendingUpdates
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = [
    "DEFAULT_INPUT_RATE",
    "DEFAULT_OUTPUT_RATE",
    "OmniFactoryError",
    "ReplyAudio",
    "VllmOmniEngine",
    "VllmOmniSession",
    "decode_audio",
    "keep_root_logging",
    "load_factory",
    "omni_builder",
]

logger = logging.getLogger(__name__)

_EVENT_QUEUE_SIZE = 1024
#: How long a reply waits for vLLM-Omni to announce a function's output (see ``_outputs_taken``).
_OUTPUT_TAKEN_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------------
# The session


#: Finished replies remembered for late playback reports.
_LEDGER_SIZE = 16


class VllmOmniSession(port.EngineSession):
    """One gateway session on one ``DuplexSessionHandle``."""

    def __init__(self, engine: VllmOmniEngine, session_id: str, handle: Any, config: SessionConfig) -> None:
        self._engine = engine
        self._session_id = session_id
        self._handle = handle
        self._config = config
        caps = engine.capabilities
        self._input_rate = caps.input_rate
        self._output_rate = caps.output_rate
        self._engine_vad = caps.detects_turns
        self._events = EngineEventQueue(_EVENT_QUEUE_SIZE)
        #: Engine response id -> the reply it is on the gateway side.
        self._replies: dict[str, OmniReply] = {}
        #: Ids the gateway gave ``response.create`` calls the engine has not answered yet.
        self._pending_ids: deque[str] = deque()
        #: Text items added under the gateway's ids (the ones a delete can name).
        self._added_items: set[str] = set()
        self._cancelled_pending: set[str] = set()
        #: Gateway ids of replies the gateway stopped (cancel, barge-in) and the engine has not
        #: ended yet: what vLLM-Omni still says of them is not passed on.
        self._stopped: set[str] = set()
        #: Finished replies by engine id, for playback reports that come after them.
        self._finished: dict[str, OmniReply] = {}
        #: The last finished reply nobody reported playback for: (engine id, engine ms).
        self._unacked: tuple[str, int] | None = None
        self._updates = PendingUpdates()
        self._update_ids = 0
        #: The last event was ``session.created``: vLLM-Omni follows it with a ``session.updated``
        #: of its own (the open's), which answers none of the gateway's updates.
        self._just_created = False
        #: response.create commands sent, by event id: the gateway's id of the reply each asks for.
        self._creates: dict[str, str] = {}
        self._create_ids = 0
        self._calls = FunctionCalls()
        #: Function outputs sent and not announced by vLLM-Omni yet: item id -> taken, and
        #: the event ids they were sent under (an error about one names its event).
        self._outputs: dict[str, asyncio.Future[None]] = {}
        self._output_events: dict[str, str] = {}
        self._item_ids = 0
        self._closed = False
        self._closed_event = asyncio.Event()
        self._pump = asyncio.create_task(self._run(), name=f"vllm-omni-events:{session_id}")

    @property
    def engine_session_id(self) -> str:
        return str(self._handle.session_id)

    # -- port calls -----------------------------------------------------------------------

    async def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> None:
        # A reply nobody reported on is acknowledged at the commit, not here: the caller may
        # still report (or truncate) it while speaking.
        if is_speech is None and not (self._engine_vad or self._config.auto_response):
            # Gateway VAD (or the client's commits) decides turns: all audio handed over is the turn's.
            is_speech = True
        await self._handle.append_audio(
            pcm,
            format="pcm16",
            sample_rate_hz=self._input_rate,
            is_speech=is_speech,
            hints=hints,
            video_frames=tuple(video_frames),
        )

    async def commit(
        self,
        *,
        item_id: str,
        response_id: str | None,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
    ) -> None:
        await self._outputs_taken()
        await self._ack_unreported()
        if response_id is not None:
            # vLLM-Omni names the reply it starts for this commit; it is mapped to ours when announced.
            self._pending_ids.append(response_id)
        create: bool | None = True if response_id is not None else (None if engine_decides else False)
        # The turn carries the caller's item id, so the engine's events about it (committed,
        # transcript) name the caller's item.
        await self._handle.submit(
            self._engine.commit_command(
                final=final, create_response=create, item_id=item_id, is_speech=is_speech
            )
        )

    async def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        item = message_item(item_id=item_id, role=role, text=text, images=images)
        await self._handle.create_item(item, previous_item_id=previous_item_id)
        self._added_items.add(item_id)

    async def add_function_call(
        self, *, item_id: str, call_id: str, name: str, arguments: str, previous_item_id: str | None = None
    ) -> None:
        # vLLM-Omni takes a function's output only for a call it knows: a replayed call goes in first.
        item = function_call_item(item_id=item_id, call_id=call_id, name=name, arguments=arguments)
        await self._handle.create_item(item, previous_item_id=previous_item_id)
        self._added_items.add(item_id)

    async def add_function_output(
        self, *, item_id: str, call_id: str, output: str, previous_item_id: str | None = None
    ) -> None:
        item = function_output_item(item_id=item_id, call_id=call_id, output=output)
        self._item_ids += 1
        event_id = f"gw_item_{self._item_ids}"
        if len(self._outputs) < _LEDGER_SIZE:  # bounded: beyond it a reply just does not wait
            self._outputs[item_id] = asyncio.get_running_loop().create_future()
            self._output_events[event_id] = item_id
        await self._handle.submit(self._engine.item_command(item, previous_item_id, event_id))
        self._added_items.add(item_id)

    async def delete_item(
        self, item_id: str, *, response_id: str | None = None, call_id: str | None = None
    ) -> None:
        # Only items given to the engine under our id can be named to it.
        if item_id in self._added_items:
            self._added_items.discard(item_id)
            await self._handle.delete_item(item_id)

    async def clear_input(self) -> None:
        await self._handle.clear_input()

    async def cancel_input(self) -> None:
        await self._handle.cancel_input()

    async def append_text(self, text: str) -> None:
        await self._handle.append_text(text)

    async def signal_turn(self, event: str, payload: Mapping[str, object]) -> None:
        await self._handle.signal_turn(event, payload)

    async def create_response(
        self, *, response_id: str, instructions: str | None, options: port.ResponseOptions | None = None
    ) -> None:
        refusal = reply_tools_refusal(options, self._config)
        if refusal is not None:
            if self._closed:
                return  # the session is over: nobody reads its events any more
            # Nothing goes to the engine: the reply ends here, failed, and the client is told why.
            for event in (
                port.EngineError(code="unsupported_by_engine", message=refusal),
                port.EngineResponseDone(
                    response_id=response_id, status="failed", reason="unsupported_by_engine"
                ),
            ):
                await self._events.put(event)
            return
        await self._outputs_taken()
        await self._ack_unreported()
        self._pending_ids.append(response_id)
        request: dict[str, object] = {"modalities": output_modalities(self._config)}
        if instructions:
            request["instructions"] = instructions
        # Named, so that vLLM-Omni's refusal of it (e.g. per-reply instructions, which its
        # duplex sessions refuse) ends this reply instead of leaving it waiting in line.
        self._create_ids += 1
        event_id = f"gw_create_{self._create_ids}"
        self._creates[event_id] = response_id
        while len(self._creates) > _LEDGER_SIZE:
            del self._creates[next(iter(self._creates))]
        await self._handle.submit(self._engine.create_command(request, event_id))

    async def cancel_response(self, response_id: str) -> None:
        engine_id = self._engine_id(response_id)
        if engine_id is None and response_id in self._pending_ids:
            # Not announced yet. vLLM-Omni takes commands in order, so a cancel naming no reply
            # stops the reply it is preparing now, before the caller's next turn. The reply keeps
            # its place in line: announced later, it must not be taken for the next turn's.
            self._cancelled_pending.add(response_id)
        self._take_back({response_id})
        await self._handle.cancel_response(engine_id)

    async def barge_in(self) -> None:
        self._take_back({reply.gateway_id for reply in self._replies.values()})  # it stops every reply
        await self._handle.barge_in()

    def _take_back(self, stopped: set[str]) -> None:
        """Stop passing on what ``stopped`` replies say, and take back what is queued of it.

        vLLM-Omni may have produced more of a reply before it takes the stop; that output, queued
        here or still to come, would reach the gateway after the stop.
        """
        self._stopped |= stopped
        self._events.discard(
            lambda event: isinstance(event, port.REPLY_OUTPUT_EVENTS) and event.response_id in stopped
        )

    async def ack_playback(self, *, response_id: str, played_ms: int) -> None:
        engine_id = self._engine_id(response_id) or response_id
        reply = self._replies.get(engine_id) or self._finished.get(engine_id)
        if self._unacked is not None and self._unacked[0] == engine_id:
            self._unacked = None
        played = reply.audio.ledger_played(int(played_ms)) if reply is not None else int(played_ms)
        await self._handle.ack_playback(played, response_id=engine_id)

    async def truncate_reply(self, *, response_id: str, audio_end_ms: int) -> None:
        engine_id = self._engine_id(response_id) or response_id
        reply = self._replies.get(engine_id) or self._finished.get(engine_id)
        if self._unacked is not None and self._unacked[0] == engine_id:
            self._unacked = None
        end = reply.audio.ledger_played(int(audio_end_ms)) if reply is not None else int(audio_end_ms)
        # vLLM-Omni's truncate: its history keeps only the words spoken before ``end`` (a hard cap).
        await self._handle.truncate_item(f"item_{engine_id}", audio_end_ms=end)
        if reply is not None and reply.audio.samples:
            # The caller's playback of it is over: under vLLM-Omni's ACK_ONLY ledger a reply
            # acknowledged only in part keeps the turn busy, so the rest is acknowledged too
            # (the history stays cut at the truncation).
            await self._handle.ack_playback(reply.audio.ledger_total(), response_id=engine_id)

    async def update(self, config: SessionConfig) -> None:
        # Only what changed: vLLM-Omni refuses an update naming ``voice`` once audio was made.
        patch = changed_fields(
            self._engine.session_patch(self._config, initial=False),
            self._engine.session_patch(config, initial=False),
        )
        if patch:
            self._update_ids += 1
            event_id = f"gw_update_{self._update_ids}"
            await self._updates.send(
                event_id, self._handle.submit(self._engine.update_command(patch, event_id))
            )
        self._config = config

    async def close(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self._handle.closed:
                await self._handle.close(reason=reason, timeout=self._engine.control_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the engine refused or lost the close; the session ends anyway
            logger.warning("closing vLLM-Omni session %s failed: %s", self.engine_session_id, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pump), self._engine.control_timeout_s)
        if not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        self._finish(reason)

    def events(self) -> AsyncIterator[port.EngineEvent]:
        return self._events.stream()

    # -- helpers ---------------------------------------------------------------------------

    def _engine_id(self, gateway_id: str) -> str | None:
        for replies in (self._replies, self._finished):
            for engine_id, reply in replies.items():
                if reply.gateway_id == gateway_id:
                    return engine_id
        return None

    async def _outputs_taken(self) -> None:
        """Wait until vLLM-Omni has announced the function outputs sent to it.

        Taking an output, vLLM-Omni spawns the continuation of the reply in progress, and
        for a turn-commit model that ends whatever reply is in progress when it runs: a
        reply asked for before it ran would be the one ended. It runs once vLLM-Omni has
        announced the item and gone idle, so a reply asked for after the announcement is safe.
        """
        pending = [future for future in self._outputs.values() if not future.done()]
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*pending), _OUTPUT_TAKEN_TIMEOUT_S)
        self._outputs.clear()
        self._output_events.clear()

    def _output_taken(self, item_id: str | None) -> None:
        future = self._outputs.get(item_id or "")
        if future is not None and not future.done():
            future.set_result(None)

    async def _ack_unreported(self) -> None:
        """Tell the engine a finished reply was heard, when the client never said."""
        unacked, self._unacked = self._unacked, None
        if unacked is not None:
            engine_id, produced_ms = unacked
            await self._handle.ack_playback(produced_ms, response_id=engine_id)

    def _finish(self, reason: str) -> None:
        if self._closed_event.is_set():
            return
        self._closed = True
        self._closed_event.set()
        self._updates.refuse_all("session_closed", "the engine session ended")
        for future in self._outputs.values():
            if not future.done():
                future.set_result(None)  # nothing more will be announced
        self._engine._release(self._session_id)
        self._events.put_urgent(port.EngineClosed(reason=reason))

    # -- engine events ---------------------------------------------------------------------

    async def _run(self) -> None:
        reason = "engine_closed"
        try:
            async for event in self._handle.events():
                kind = getattr(event, "type", "")
                if kind in ("session.closed", "session.expired"):
                    reason = str(getattr(event, "reason", None) or kind)
                    break
                for out in self._translate(event.to_realtime()):
                    if isinstance(out, port.REPLY_OUTPUT_EVENTS) and out.response_id in self._stopped:
                        continue
                    if isinstance(out, port.EngineResponseDone):
                        self._stopped.discard(out.response_id)
                    await self._events.put(out)
            else:
                reason = str(getattr(self._handle, "close_reason", None) or reason)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("event stream of vLLM-Omni session %s failed", self.engine_session_id)
            self._events.put_urgent(
                port.EngineError(code="engine_error", message="the engine event stream failed")
            )
            reason = "engine_error"
        self._finish(reason)

    def _translate(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        """Port events for one engine event, in its wire shape (what vLLM-Omni's server would send)."""
        kind = event.get("type")
        just_created, self._just_created = self._just_created, kind == "session.created"
        if kind == "response.created":
            return self._on_response_created(response_id_of(event), hold=True)
        if kind in ("conversation.item.added", "conversation.item.created"):
            item = event.get("item")
            self._output_taken(item.get("id") if isinstance(item, Mapping) else None)
            return []
        response_id = response_id_of(event)
        calls = self._calls.translate(event, self._gateway_of)
        if calls is not None:
            return calls
        if response_id is not None and self._calls.held(response_id):
            # What vLLM-Omni started beside the reply in progress carries more than a call:
            # a reply of its own after all.
            self._calls.release(response_id)
            return [*self._on_response_created(response_id), *self._translate(event)]
        if kind == "response.done":
            return self._on_response_done(event)
        if kind == "input_audio_buffer.committed":
            return [port.EngineTurnCommitted(item_id=item_of(event))]
        if kind == "session.updated":
            if just_created:
                # The open's own, right behind session.created. Taken for the answer to an
                # update sent meanwhile (a client's first session.update, while the pump had not
                # yet read the open's events), it let the update return before vLLM-Omni had
                # applied it: the client heard session.updated with the engine still on the old
                # tools and instructions.
                return []
            self._updates.settle(None)  # vLLM-Omni answers updates in order
            return []
        if kind == "error":
            return self._on_error(event)
        # The turn's items carry the gateway's ids (commits name them), so vLLM-Omni's are the caller's.
        out = translate(event, self._replies, caller_item=_same_item, engine_vad=self._engine_vad)
        return out if out is not None else []

    def _on_error(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        code, message, related = error_fields(event, "engine_error")
        if related in self._updates:
            self._updates.settle(str(related), port.EngineRefused(code, message))
            return []
        if related is not None and related in self._output_events:
            self._output_taken(self._output_events[related])  # refused: nothing to wait for
        refused = self._creates.pop(related, None) if related is not None else None
        if refused is not None and refused in self._pending_ids:
            # vLLM-Omni refused this response.create: the reply will never be announced.
            self._pending_ids.remove(refused)
            if refused in self._cancelled_pending:
                self._cancelled_pending.discard(refused)
                return []
            return [
                port.EngineError(code=code, message=message),
                port.EngineResponseDone(response_id=refused, status="failed", reason=code),
            ]
        if late_report(code):
            logger.info("vLLM-Omni session %s: %s: %s", self.engine_session_id, code, message)
            return []
        return [port.EngineError(code=code, message=message)]

    def _on_response_created(self, engine_id: str | None, *, hold: bool = False) -> list[port.EngineEvent]:
        if not engine_id or engine_id in self._replies:
            return []
        if hold and self._calls.created(engine_id, next(reversed(self._replies), None)):
            return []  # maybe the wrapper of a function call of the reply in progress
        gateway_id = self._pending_ids.popleft() if self._pending_ids else engine_id
        reply = OmniReply(gateway_id=gateway_id, audio=ReplyAudio(self._output_rate))
        self._replies[engine_id] = reply
        if gateway_id in self._cancelled_pending:
            self._cancelled_pending.discard(gateway_id)
            reply.dropped = True
            asyncio.get_running_loop().create_task(self._cancel_late(engine_id))
            return []
        return [port.EngineResponseStarted(response_id=gateway_id)]

    def _gateway_of(self, engine_id: str) -> str | None:
        """The gateway's id of the reply in progress ``engine_id`` (None: gone or dropped)."""
        reply = self._replies.get(engine_id)
        return reply.gateway_id if reply is not None and not reply.dropped else None

    async def _cancel_late(self, engine_id: str) -> None:
        try:
            await self._handle.cancel_response(engine_id)
        except Exception as exc:  # noqa: BLE001 - best effort: the reply is fenced either way
            logger.info("cancelling reply %s late failed: %s", engine_id, exc)

    def _on_response_done(self, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        engine_id = response_id_of(event)
        reply = self._replies.pop(engine_id, None) if engine_id else None
        if reply is None or reply.dropped:
            return []
        out = reply_done(reply, event)
        if engine_id:
            self._finished[engine_id] = reply
            while len(self._finished) > _LEDGER_SIZE:
                del self._finished[next(iter(self._finished))]
            if reply.audio.samples:
                self._unacked = (engine_id, reply.audio.ledger_total())
        return out


def _same_item(item_id: object) -> str:
    return item_id if isinstance(item_id, str) else ""


# ---------------------------------------------------------------------------------------
# The engine


class VllmOmniEngine(port.Engine):
    """Native duplex sessions of an in-process vLLM-Omni ``DuplexOmni``.

    ``factory``: builds the ``DuplexOmni`` (a ``module:callable`` spec or a
    callable); without one, ``DuplexOmni(model=..., deploy_config=...,
    trust_remote_code=...)``. ``engine_vad``: open sessions with vLLM-Omni's server
    VAD, so the engine finds turns (otherwise the gateway does and commits).
    """

    name = "vllm-omni"

    def __init__(
        self,
        *,
        factory: str | Callable[[], Any] | None = None,
        model: str | None = None,
        deploy_config: str | None = None,
        trust_remote_code: bool = False,
        startup_timeout_s: float = 600.0,
        control_timeout_s: float = 10.0,
        input_rate: int | None = None,
        output_rate: int | None = None,
        engine_vad: bool = False,
        max_sessions: int | None = None,
    ) -> None:
        if factory is None and not model:
            raise ValueError("the vllm-omni engine needs a model or an omni factory")
        self._factory = factory
        self._model = model
        self._deploy_config = deploy_config
        self._trust_remote_code = trust_remote_code
        self.startup_timeout_s = startup_timeout_s
        self.control_timeout_s = control_timeout_s
        self._caps = port.EngineCapabilities(
            name=self.name,
            input_rate=input_rate or DEFAULT_INPUT_RATE,
            output_rate=output_rate or DEFAULT_OUTPUT_RATE,
            detects_turns=engine_vad,
            max_sessions=max_sessions,
            native_turns=True,
            # Session tools reach the model; response.create takes no per-reply options in
            # vLLM-Omni 0.30 (voice, token limits, tools), so none is claimed.
            tools=True,
        )
        self._gateway_max_sessions = max_sessions
        self._omni: Any = None
        self._sessions: dict[str, VllmOmniSession] = {}
        self._error_cls: type[BaseException] = RuntimeError

    @property
    def capabilities(self) -> port.EngineCapabilities:
        return self._caps

    @property
    def ready(self) -> bool:
        omni = self._omni
        return omni is not None and not bool(getattr(omni, "errored", False))

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def omni(self) -> Any:
        """The ``DuplexOmni`` (``None`` before :meth:`start`)."""
        return self._omni

    async def start(self) -> None:
        with keep_root_logging():
            messages = importlib.import_module("vllm_omni.engine.duplex.messages")
            self._error_cls = messages.DuplexSessionError
            build = self._builder()
            self._omni = await asyncio.wait_for(asyncio.to_thread(build), self.startup_timeout_s)
            await self._warm_audio_encoder()
        self._caps = self._capabilities_from(self._omni)
        logger.info("vLLM-Omni duplex engine ready: %s", dict(self._caps.as_pairs()))

    def _builder(self) -> Callable[[], Any]:
        return omni_builder(
            self._factory,
            "vllm_omni.entrypoints.duplex_omni:DuplexOmni",
            model=self._model,
            deploy_config=self._deploy_config,
            trust_remote_code=self._trust_remote_code,
        )

    async def _warm_audio_encoder(self) -> None:
        # The first encode pays about a second of lazy imports; pay it before the first caller.
        encoding = importlib.import_module("vllm_omni.entrypoints.duplex.audio_encoding")
        silence = np.zeros(self._caps.output_rate // 10, dtype=np.float32)
        try:
            await asyncio.to_thread(encoding.encode_audio, silence, self._caps.output_rate, "pcm", None)
        except Exception as exc:  # noqa: BLE001 - warming is an optimisation only
            logger.warning("warming the vLLM-Omni audio encoder failed: %s", exc)

    def _capabilities_from(self, omni: Any) -> port.EngineCapabilities:
        caps = self._caps
        try:
            duplex_caps = omni.duplex_capabilities
            engine_max = int(omni.duplex_session_config.max_sessions)
        except Exception as exc:  # noqa: BLE001 - a factory may hand over a partial object
            logger.warning("vLLM-Omni did not report its duplex capabilities: %s", exc)
            return caps
        limit = (
            engine_max if self._gateway_max_sessions is None else min(engine_max, self._gateway_max_sessions)
        )
        accepts = getattr(duplex_caps, "accepts_input_modality", None)
        return replace(
            caps,
            barge_in=bool(getattr(duplex_caps, "supports_barge_in", caps.barge_in)),
            max_sessions=limit,
            # What the model sees, as it declares it: MiniCPM-o takes camera frames with its audio.
            video_input=bool(accepts("video")) if callable(accepts) else False,
            image_input=bool(getattr(duplex_caps, "supports_image_input", False)),
        )

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        omni = self._omni
        if omni is None or not self.ready:
            raise port.EngineUnavailable("the vLLM-Omni engine is not running")
        try:
            handle = await omni.open_session(self._open_config(config), timeout=self.control_timeout_s)
        except self._error_cls as exc:
            code = getattr(exc, "code", "")
            if code == "resource_exhausted":
                raise port.EngineSessionLimit(
                    f"the vLLM-Omni engine has no room for another session ({exc})"
                ) from exc
            raise port.EngineUnavailable(f"the vLLM-Omni engine refused the session: {code or exc}") from exc
        except (RuntimeError, OSError, ValueError) as exc:
            raise port.EngineUnavailable(f"the vLLM-Omni engine cannot open a session: {exc}") from exc
        session = VllmOmniSession(self, session_id, handle, config)
        self._sessions[session_id] = session
        return session

    def _open_config(self, config: SessionConfig) -> Any:
        """What the engine session is opened with: the Realtime session object, or, for the
        fields vLLM-Omni's Realtime parser does not read (``use_tts_template``), its typed config."""
        patch = self.session_patch(config, initial=True)
        if config.use_tts_template is None:
            return patch
        config_module = importlib.import_module("vllm_omni.engine.duplex.config")
        typed = config_module.DuplexSessionConfig.from_realtime(
            patch, model=getattr(self._omni, "model", None)
        )
        typed.use_tts_template = config.use_tts_template
        return typed

    def commit_command(
        self, *, final: bool, create_response: bool | None, item_id: str, is_speech: bool | None
    ) -> Any:
        """vLLM-Omni's ``Commit`` for a caller turn the gateway names ``item_id``."""
        commands = importlib.import_module("vllm_omni.engine.duplex.commands")
        return commands.Commit(
            final=final, create_response=create_response, is_speech=is_speech, realtime_item_id=item_id
        )

    def create_command(self, options: dict[str, object], event_id: str) -> Any:
        """vLLM-Omni's ``CreateResponse`` command; an error about it names ``event_id``."""
        commands = importlib.import_module("vllm_omni.engine.duplex.commands")
        return commands.CreateResponse(options=options, event_id=event_id)

    def item_command(self, item: dict[str, object], previous_item_id: str | None, event_id: str) -> Any:
        """vLLM-Omni's ``CreateItem`` command; an error about it names ``event_id``."""
        commands = importlib.import_module("vllm_omni.engine.duplex.commands")
        return commands.CreateItem(item=item, previous_item_id=previous_item_id, event_id=event_id)

    def update_command(self, patch: dict[str, object], event_id: str) -> Any:
        """vLLM-Omni's ``UpdateSession`` command for ``patch``; its answer names ``event_id``."""
        commands = importlib.import_module("vllm_omni.engine.duplex.commands")
        return commands.UpdateSession(patch=patch, event_id=event_id)

    def session_patch(self, config: SessionConfig, *, initial: bool) -> dict[str, object]:
        """The Realtime ``session`` object the engine session is opened / updated with."""
        return engine_session(config, initial=initial, detects_turns=self._caps.detects_turns)

    def _release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def shutdown(self) -> None:
        for session in list(self._sessions.values()):
            with contextlib.suppress(Exception):
                await session.close("shutdown")
        omni, self._omni = self._omni, None
        if omni is None:
            return
        # The output pump is a task on this loop: stop it here, then join the engine off the loop.
        task = getattr(omni, "final_output_task", None)
        if task is not None:
            task.cancel()
            omni.final_output_task = None
        try:
            await asyncio.wait_for(asyncio.to_thread(omni.shutdown), self.control_timeout_s)
        except TimeoutError:
            logger.warning("vLLM-Omni did not shut down within %.0f s", self.control_timeout_s)
