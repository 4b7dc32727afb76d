"""The thin asyncio layer around one client's :class:`~duplex_gateway.session.Session`.

One reader (this connection's own task), one writer task draining a bounded
send queue, and one pump task for the engine session's events. Keepalive pings
and the hard frame-size limit are the server's (uvicorn); idle timeout, maximum
session duration, backpressure and the soft message-size limit live here. Every
way out of :meth:`Connection.serve` releases the engine session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from duplex_gateway import events as ev
from duplex_gateway.audio.convert import OutputConverter
from duplex_gateway.config import GatewaySettings
from duplex_gateway.dialects.realtime import parse_client_event, render_server_event
from duplex_gateway.engine import port
from duplex_gateway.errors import CloseCode, ErrorCode, ProtocolError
from duplex_gateway.input_pipeline import InputPipeline
from duplex_gateway.ratelimit import AudioRateLimiter
from duplex_gateway.session import (
    AckPlayback,
    AddItem,
    AppendAudio,
    BargeInEngine,
    CancelResponse,
    ClearInput,
    CloseSession,
    CommitInput,
    Handshake,
    OpenEngine,
    Output,
    ProcessInput,
    Session,
    StartResponse,
    UpdateEngine,
)
from duplex_gateway.session_config import SessionConfig

__all__ = ["Connection", "SessionRegistry", "Socket"]

logger = logging.getLogger(__name__)


class Socket(Protocol):
    """The part of a WebSocket the connection uses (Starlette's fits)."""

    async def receive(self) -> MutableMapping[str, Any]: ...
    async def send_text(self, data: str) -> None: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class SessionRegistry:
    """Counts live sessions against ``max_sessions`` (admission control)."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._live: set[str] = set()

    def try_admit(self, session_id: str) -> bool:
        if len(self._live) >= self.max_sessions:
            return False
        self._live.add(session_id)
        return True

    def release(self, session_id: str) -> None:
        self._live.discard(session_id)

    @property
    def count(self) -> int:
        return len(self._live)


@dataclass(frozen=True, slots=True)
class _Close:
    code: CloseCode
    reason: str


class Connection:
    """Serves one WebSocket client for the life of its session."""

    def __init__(
        self,
        socket: Socket,
        *,
        session_id: str,
        engine: port.Engine,
        settings: GatewaySettings,
        defaults: SessionConfig,
        registry: SessionRegistry,
        executor: Executor,
        handshake: Handshake,
        beta: bool,
    ) -> None:
        limits = settings.limits
        self._socket = socket
        self._engine = engine
        self._limits = limits
        self._registry = registry
        self._executor = executor
        self._beta = beta
        self.session = Session(
            session_id=session_id,
            capabilities=engine.capabilities,
            defaults=defaults,
            handshake=handshake,
            rate_limiter=AudioRateLimiter(factor=limits.input_rate_factor, burst_ms=limits.input_burst_ms),
        )
        self._queue: asyncio.Queue[ev.ServerEvent | _Close] = asyncio.Queue(limits.send_queue_size)
        self._lock = asyncio.Lock()
        self._engine_session: port.EngineSession | None = None
        self._pump: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closing: _Close | None = None
        self._seq = 0
        self._input: InputPipeline | None = None
        self._output: OutputConverter | None = None

    @property
    def session_id(self) -> str:
        return self.session.session_id

    # -- lifetime -------------------------------------------------------------------

    async def serve(self) -> None:
        """Run until the client leaves, the session closes or a limit ends it."""
        self._writer = asyncio.create_task(self._write_loop(), name=f"writer:{self.session_id}")
        admitted = self._registry.try_admit(self.session_id)
        try:
            if not admitted:
                await self._refuse(
                    ErrorCode.SESSION_LIMIT,
                    f"the gateway is at its limit of {self._registry.max_sessions} sessions; try again later",
                )
                return
            if self.session.handshake is Handshake.REALTIME and not await self._open_engine(self.session.config):
                return
            await self._apply(self.session.start())
            await self._read_loop()
        except _SlowConsumer:
            logger.warning("session %s closed: the client did not read its events", self.session_id)
        except Exception:  # a bug must cost this session only, never the server
            logger.exception("session %s failed", self.session_id)
            await self._enqueue_close(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            await self._teardown()
            if admitted:
                self._registry.release(self.session_id)

    async def shut_down(self) -> None:
        """Close this session because the gateway is stopping (close code 1001)."""
        await self._step(self.session.shut_down)

    async def _refuse(self, code: ErrorCode, message: str) -> None:
        await self._emit_raw(ev.ErrorEvent(code=code, message=message))
        await self._enqueue_close(CloseCode.TRY_AGAIN_LATER, code.value)

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.max_session_s
        idle = self._limits.idle_timeout_s
        while self._closing is None:
            remaining = deadline - loop.time()
            try:
                message = await asyncio.wait_for(self._socket.receive(), min(idle, max(remaining, 0.0)))
            except TimeoutError:
                if loop.time() >= deadline:
                    await self._expire(CloseCode.MAX_DURATION, "the session reached its maximum duration")
                else:
                    await self._expire(CloseCode.IDLE_TIMEOUT, f"no message from the client for {idle:g} s")
                return
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await self._send_error(
                    ProtocolError(ErrorCode.BINARY_NOT_SUPPORTED, "this endpoint takes JSON text messages only")
                )
                continue
            try:
                command = parse_client_event(text, max_bytes=self._limits.max_message_bytes)
            except ProtocolError as exc:
                await self._send_error(exc)
                continue
            await self._step(functools.partial(self.session.receive, command, now=loop.time()))

    async def _expire(self, code: CloseCode, message: str) -> None:
        await self._step(lambda: self.session.expire(code.name.lower(), code, message))

    async def _teardown(self) -> None:
        engine_session, self._engine_session = self._engine_session, None
        if engine_session is not None:
            try:
                await asyncio.wait_for(engine_session.close(self._closing.reason if self._closing else "disconnected"),
                                       self._limits.engine_timeout_s)
            except Exception:
                logger.exception("closing engine session %s failed", self.session_id)
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        if self._closing is None:
            self._closing = _Close(CloseCode.NORMAL, "disconnected")
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(self._closing)
        if self._writer is not None:
            try:
                await asyncio.wait_for(self._writer, self._limits.send_timeout_s)
            except Exception:  # noqa: BLE001 - a writer stuck or failed in any way is torn down the same
                self._writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._writer
                with contextlib.suppress(Exception):
                    await self._socket.close(int(self._closing.code), self._closing.reason)

    # -- engine session -----------------------------------------------------------------

    async def _open_engine(self, config: SessionConfig) -> bool:
        try:
            self._engine_session = await asyncio.wait_for(
                self._engine.open_session(self.session_id, config), self._limits.engine_timeout_s
            )
        except port.EngineSessionLimit as exc:
            await self._refuse(ErrorCode.SESSION_LIMIT, str(exc) or "the engine has no room for another session")
            return False
        except (port.EngineUnavailable, TimeoutError) as exc:
            await self._refuse(ErrorCode.ENGINE_UNAVAILABLE, str(exc) or "the engine is not available")
            return False
        self._pump = asyncio.create_task(self._pump_engine(self._engine_session), name=f"pump:{self.session_id}")
        return True

    async def _pump_engine(self, engine_session: port.EngineSession) -> None:
        try:
            async for event in engine_session.events():
                await self._step(functools.partial(self.session.engine_event, event))
                if isinstance(event, port.EngineClosed):
                    return
        except _SlowConsumer:
            return
        except Exception:
            logger.exception("engine event stream of session %s failed", self.session_id)
            await self._step(lambda: self.session.engine_event(
                port.EngineError(code="engine_error", message="the engine event stream failed", fatal=True)))

    # -- executing what the session decided ------------------------------------------------

    async def _step(self, decide: Callable[[], list[Output]]) -> None:
        async with self._lock:
            await self._apply(decide())

    async def _apply(self, outputs: Sequence[Output]) -> None:
        for output in outputs:
            if isinstance(output, ev.ServerEvent):
                await self._emit(output)
            elif isinstance(output, ProcessInput):
                await self._process_input(output.audio)
            elif isinstance(output, OpenEngine):
                if await self._open_engine(output.config):
                    await self._apply(self.session.engine_opened())
            elif isinstance(output, CloseSession):
                await self._enqueue_close(output.code, output.reason)
            else:
                await self._call_engine(output)

    async def _process_input(self, audio: bytes) -> None:
        pipeline = self._input_pipeline()
        loop = asyncio.get_running_loop()
        # Decoding, resampling and VAD inference stay off the event loop.
        try:
            processed = await loop.run_in_executor(self._executor, pipeline.process, audio)
        except ProtocolError as exc:
            await self._send_error(exc)
            return
        await self._apply(self.session.input_processed(processed.pcm, processed.duration_ms, processed.windows))

    def _input_pipeline(self) -> InputPipeline:
        wire, vad = self.session.config.input_format, self.session.gateway_vad
        current = self._input
        if current is None or current.wire != wire or current.vad != vad:
            current = self._input = InputPipeline(
                wire, self._engine.capabilities.input_rate, vad=vad,
                start_ms=current.position_ms if current is not None else 0.0,
            )
        return current

    def _output_converter(self) -> OutputConverter:
        wire = self.session.config.output_format
        if self._output is None or self._output.wire != wire:
            self._output = OutputConverter(self._engine.capabilities.output_rate, wire)
        return self._output

    async def _call_engine(self, call: Output) -> None:
        engine_session = self._engine_session
        if engine_session is None:
            return
        action: Awaitable[None]
        if isinstance(call, AppendAudio):
            action = engine_session.append_audio(call.pcm)
        elif isinstance(call, CommitInput):
            action = engine_session.commit(item_id=call.item_id, create_response=call.create_response)
        elif isinstance(call, ClearInput):
            action = engine_session.clear_input()
        elif isinstance(call, AddItem):
            action = engine_session.add_item(item_id=call.item_id, role=call.role, text=call.text)
        elif isinstance(call, StartResponse):
            action = engine_session.create_response(response_id=call.response_id, instructions=call.instructions)
        elif isinstance(call, CancelResponse):
            action = engine_session.cancel_response(call.response_id)
        elif isinstance(call, BargeInEngine):
            action = engine_session.barge_in()
        elif isinstance(call, AckPlayback):
            action = engine_session.ack_playback(response_id=call.response_id, played_ms=call.played_ms)
        elif isinstance(call, UpdateEngine):
            action = engine_session.update(call.config)
        else:
            raise TypeError(f"unhandled session output {call!r}")
        try:
            await asyncio.wait_for(action, self._limits.engine_timeout_s)
        except Exception as exc:
            logger.exception("engine call %s failed in session %s", type(call).__name__, self.session_id)
            await self._emit(ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message=f"the engine failed: {type(exc).__name__}"))

    # -- the send side ------------------------------------------------------------------------

    async def _emit(self, event: ev.ServerEvent) -> None:
        if isinstance(event, ev.AudioDelta):
            wire = self._output_converter().convert(event.audio)
            if not wire:
                return
            event = replace(event, audio=wire, rate=self.session.config.output_format.rate, encoded=True)
        elif isinstance(event, ev.AudioDone):
            tail = self._output_converter().flush()
            if tail:
                await self._emit_raw(
                    ev.AudioDelta(
                        response_id=event.response_id, item_id=event.item_id, audio=tail,
                        rate=self.session.config.output_format.rate, encoded=True,
                    )
                )
        elif isinstance(event, ev.ResponseDone) and event.status != "completed":
            self._output_converter().reset()
        await self._emit_raw(event)

    async def _emit_raw(self, event: ev.ServerEvent | _Close) -> None:
        if self._closing is not None and not isinstance(event, _Close) and self._queue.full():
            return
        try:
            await asyncio.wait_for(self._queue.put(event), self._limits.send_timeout_s)
        except TimeoutError:
            # The client stopped reading: nothing more can reach it, so close at once.
            self._closing = _Close(CloseCode.SLOW_CONSUMER, "slow consumer")
            if self._writer is not None:
                self._writer.cancel()
            with contextlib.suppress(Exception):
                await self._socket.close(int(CloseCode.SLOW_CONSUMER), "slow consumer")
            raise _SlowConsumer from None

    async def _send_error(self, exc: ProtocolError) -> None:
        await self._emit(ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param))

    async def _enqueue_close(self, code: CloseCode, reason: str) -> None:
        if self._closing is not None:
            return
        self._closing = _Close(code, reason)
        with contextlib.suppress(_SlowConsumer):
            await self._emit_raw(self._closing)

    async def _write_loop(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, _Close):
                with contextlib.suppress(Exception):
                    await self._socket.close(int(item.code), item.reason)
                return
            self._seq += 1
            payload = render_server_event(
                item, seq=self._seq, event_id=f"event_{self._seq}", beta=self._beta, session_id=self.session_id
            )
            if payload is None:
                self._seq -= 1
                continue
            try:
                await self._socket.send_text(json.dumps(payload, separators=(",", ":")))
            except Exception:  # noqa: BLE001 - any send failure means the client is gone
                # The reader sees the disconnect and tears down.
                return


class _SlowConsumer(Exception):
    pass
