"""The thin asyncio layer around one client's :class:`~duplex_gateway.session.Session`.

One reader (the socket's own task), one writer task draining a bounded send
queue, and one pump task for the engine session's events. Keepalive pings and
the hard frame-size limit are the server's (uvicorn); idle timeout, maximum
session duration, backpressure and the soft message-size limit live here.

Input backpressure: the reader takes the next message from the socket only
after the previous one has gone all the way through the input stage (decoded,
resampled, scanned by the VAD, handed to the engine). Meanwhile the server's
WebSocket layer stops reading the TCP socket, so a client that sends faster
than the session can take its audio is slowed down by TCP itself and no audio
is dropped. The caller audio a session holds on its way in is therefore one
message (at most ``limits.max_message_bytes``; a long one is converted in
slices of ``INPUT_SLICE_MS``) plus what the WebSocket layer buffers: the frame
it is assembling (at most ``limits.hard_max_message_bytes``) and the rest of
one TCP read.

A session outlives a dropped socket for ``limits.resume_grace_s``: it is
*detached* (engine still running, events journaled) until ``session.resume``
attaches a new socket, or the grace runs out. Every way a session ends
releases its engine session and its admission slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from duplex_gateway import events as ev
from duplex_gateway.audio.convert import OutputConverter
from duplex_gateway.commands import SessionResume
from duplex_gateway.config import GatewaySettings
from duplex_gateway.dialects.realtime import parse_client_event, render_server_event
from duplex_gateway.engine import port
from duplex_gateway.errors import CloseCode, ErrorCode, ProtocolError
from duplex_gateway.input_pipeline import InputPipeline
from duplex_gateway.resume import Journal, ResumeRegistry, new_resume_token
from duplex_gateway.session import (
    AckPlayback,
    AddItem,
    AppendAudio,
    BargeInEngine,
    CallerPaused,
    CancelResponse,
    ClearInput,
    CloseSession,
    CommitInput,
    DeleteItem,
    Handshake,
    OpenEngine,
    Output,
    ProcessInput,
    Session,
    StartResponse,
    UpdateEngine,
)
from duplex_gateway.session_config import SessionConfig

__all__ = ["INPUT_SLICE_MS", "Connection", "SessionRegistry", "Socket"]

logger = logging.getLogger(__name__)

#: Caller audio goes through the input stage in pieces of at most this much, so a long
#: append is turn-detected as finely as streamed audio and converted with small buffers.
INPUT_SLICE_MS = 100


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


class _Outcome(enum.Enum):
    """How a socket's time with a session ended."""

    CLOSED = "closed"  # the session is over
    DROPPED = "dropped"  # the client vanished; the session may be resumed
    HANDED_OVER = "handed_over"  # the socket now serves a resumed session


class _Attachment:
    """One socket serving the session: its bounded send queue and writer task."""

    def __init__(self, socket: Socket, queue_size: int, name: str) -> None:
        self.socket = socket
        self.queue: asyncio.Queue[str | _Close] = asyncio.Queue(queue_size)
        self.closing: _Close | None = None
        self.writer = asyncio.create_task(self._write_loop(), name=f"writer:{name}")

    async def _write_loop(self) -> None:
        while True:
            item = await self.queue.get()
            if isinstance(item, _Close):
                with contextlib.suppress(Exception):
                    await self.socket.close(int(item.code), item.reason)
                return
            try:
                await self.socket.send_text(item)
            except Exception:  # noqa: BLE001 - any send failure means the client is gone
                # The reader sees the disconnect.
                return

    async def finish(self, close: _Close | None, timeout_s: float) -> None:
        """Drain what is queued, then close with ``close`` (or just stop, leaving the socket open)."""
        if close is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(close)
        else:
            self.writer.cancel()
        try:
            await asyncio.wait_for(self.writer, timeout_s)
        except asyncio.CancelledError:
            # A writer cancelled earlier (a slow consumer, whose socket is already closed) has
            # nothing left to do; only a cancellation of this task itself goes on.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        except Exception:  # noqa: BLE001 - a writer stuck or failed in any way is stopped the same
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.writer
            if close is not None:
                with contextlib.suppress(Exception):
                    await self.socket.close(int(close.code), close.reason)


class Connection:
    """Serves one caller's session over one or more successive WebSockets."""

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
        resumes: ResumeRegistry[Connection] | None = None,
    ) -> None:
        limits = settings.limits
        self._first_socket = socket
        self._engine = engine
        self._limits = limits
        self._registry = registry
        self._executor = executor
        self._beta = beta
        self._resumes = resumes if limits.resume_grace_s > 0 else None
        self.session = Session(
            session_id=session_id,
            capabilities=engine.capabilities,
            defaults=defaults,
            handshake=handshake,
        )
        self.resume_token = new_resume_token()
        if self._resumes is not None:
            self.session.resume_token = self.resume_token
        self._journal = Journal(max_events=limits.resume_journal_events, max_bytes=limits.resume_journal_bytes)
        self._lock = asyncio.Lock()
        self._engine_session: port.EngineSession | None = None
        self._pump: asyncio.Task[None] | None = None
        self._attachment: _Attachment | None = None
        self._closing: _Close | None = None
        self._ended = asyncio.Event()
        self._resumed = asyncio.Event()
        self._seq = 0
        self._deadline = 0.0
        self._input: InputPipeline | None = None
        self._output: OutputConverter | None = None
        # The session epoch the output converter's state belongs to (see _emit).
        self._output_epoch = 0
        # The session's own clock-driven work (Session.next_timer), e.g. idle_timeout_ms.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._timer_task: asyncio.Task[None] | None = None

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def can_replay_after(self, seq: int) -> bool:
        return self._journal.can_replay_after(seq)

    # -- lifetime -------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve the first socket; returns when it is done (the session may live on, detached)."""
        self._attachment = _Attachment(self._first_socket, self._limits.send_queue_size, self.session_id)
        self._deadline = asyncio.get_running_loop().time() + self._limits.max_session_s
        # The Realtime handshake opens the engine at once, so it is admitted now. The duplex
        # handshake is admitted when its session.update opens the engine: its first message
        # may be a session.resume, which takes over the parked session's slot instead.
        realtime = self.session.handshake is Handshake.REALTIME
        if realtime and not await self._admit():
            await self._end_attachment()
            return
        outcome = _Outcome.CLOSED
        try:
            if realtime and not await self._open_engine(self.session.config):
                outcome = _Outcome.CLOSED
            else:
                await self._apply(self.session.start())
                outcome = await self._read_loop()
        except _SlowConsumer:
            logger.warning("session %s closed: the client did not read its events", self.session_id)
        except Exception:  # a bug must cost this session only, never the server
            logger.exception("session %s failed", self.session_id)
            await self._enqueue_close(CloseCode.INTERNAL_ERROR, "internal error")
        await self._after(outcome)

    async def resume(self, socket: Socket, last_seq: int) -> None:
        """Attach ``socket`` to this detached session, replay what it missed, and serve it."""
        self._resumed.set()
        self.resume_token = new_resume_token()
        self.session.resume_token = self.resume_token
        self._attachment = _Attachment(socket, self._limits.send_queue_size, self.session_id)
        outcome = _Outcome.CLOSED
        try:
            async with self._lock:
                # session.resumed marks where the replay starts: it carries the client's last
                # sequence number and does not take one, so the client's numbering stays gap-free.
                payload = render_server_event(
                    self.session.resumed(), seq=last_seq, event_id=f"event_resumed_{last_seq}",
                    beta=self._beta, session_id=self.session_id,
                )
                await self._send_text(json.dumps(payload, separators=(",", ":")))
                for text in self._journal.after(last_seq):
                    await self._send_text(text)
            logger.info("session %s resumed after event %d", self.session_id, last_seq)
            outcome = await self._read_loop()
        except _SlowConsumer:
            logger.warning("session %s closed: the client did not read its events", self.session_id)
        except Exception:
            logger.exception("session %s failed", self.session_id)
            await self._enqueue_close(CloseCode.INTERNAL_ERROR, "internal error")
        await self._after(outcome)

    async def _after(self, outcome: _Outcome) -> None:
        if outcome is _Outcome.HANDED_OVER:
            # Nothing was opened for this connection; the socket now belongs to another session.
            await self._stop_attachment()
            await self._release()
            return
        if outcome is _Outcome.DROPPED and self._resumable():
            await self._stop_attachment()
            assert self._resumes is not None
            self._resumed.clear()
            self._resumes.park(self)
            asyncio.create_task(self._await_resume(), name=f"grace:{self.session_id}")
            logger.info("session %s detached; resumable for %g s", self.session_id, self._limits.resume_grace_s)
            return
        await self._end_attachment()
        await self._release()

    def _resumable(self) -> bool:
        return (
            self._resumes is not None
            and self.session.configured
            and not self.session.closed
            and self._closing is None
            and self._engine_session is not None
        )

    async def _await_resume(self) -> None:
        grace = min(self._limits.resume_grace_s, max(0.0, self._deadline - asyncio.get_running_loop().time()))
        waits = {asyncio.ensure_future(self._resumed.wait()), asyncio.ensure_future(self._ended.wait())}
        try:
            await asyncio.wait(waits, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        if self._resumed.is_set():
            return
        assert self._resumes is not None
        self._resumes.unpark(self)
        logger.info("session %s was not resumed in time; ending it", self.session_id)
        async with self._lock:
            await self._apply(self.session.expire("resume_timeout", CloseCode.NORMAL, "the client did not come back"))
        await self._release()

    async def shut_down(self) -> None:
        """Close this session because the gateway is stopping (close code 1001)."""
        await self._step(self.session.shut_down)
        if self._attachment is None:  # detached: nobody to tell
            await self._release()

    async def _admit(self) -> bool:
        """Take an admission slot, or refuse the session with ``session_limit``."""
        if self._registry.try_admit(self.session_id):
            return True
        await self._refuse(
            ErrorCode.SESSION_LIMIT,
            f"the gateway is at its limit of {self._registry.max_sessions} sessions; try again later",
        )
        return False

    async def _refuse(self, code: ErrorCode, message: str) -> None:
        await self._emit_raw(ev.ErrorEvent(code=code, message=message))
        await self._enqueue_close(CloseCode.TRY_AGAIN_LATER, code.value)

    async def _read_loop(self) -> _Outcome:
        attachment = self._attachment
        assert attachment is not None
        loop = asyncio.get_running_loop()
        idle = self._limits.idle_timeout_s
        first = True
        while self._closing is None:
            remaining = self._deadline - loop.time()
            try:
                message = await asyncio.wait_for(attachment.socket.receive(), min(idle, max(remaining, 0.0)))
            except TimeoutError:
                if loop.time() >= self._deadline:
                    await self._expire(CloseCode.MAX_DURATION, "the session reached its maximum duration")
                else:
                    await self._expire(CloseCode.IDLE_TIMEOUT, f"no message from the client for {idle:g} s")
                return _Outcome.CLOSED
            if message["type"] == "websocket.disconnect":
                # A client that closes on purpose (1000, 1001) is done; anything else is a dropped
                # connection whose client may come back with session.resume.
                code = message.get("code", 1006)
                return _Outcome.CLOSED if code in (1000, 1001) else _Outcome.DROPPED
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
            if isinstance(command, SessionResume) and first and not self.session.configured:
                if await self._hand_over(command):
                    return _Outcome.HANDED_OVER
                continue
            first = False
            await self._step(functools.partial(self.session.receive, command, now=loop.time()))
        return _Outcome.CLOSED

    async def _hand_over(self, command: SessionResume) -> bool:
        """Give this socket to the detached session ``command`` names; False if refused."""
        if self._resumes is None:
            await self._send_error(
                ProtocolError(ErrorCode.INVALID_RESUME_TOKEN, "session resume is turned off", event_id=command.event_id)
            )
            return False
        try:
            target = self._resumes.claim(
                command.session_id, command.resume_token, command.last_received_server_event_seq
            )
        except ProtocolError as exc:
            await self._send_error(exc.with_event_id(command.event_id))
            return False
        attachment = self._attachment
        assert attachment is not None
        # Stop this connection's writer first so only the resumed session writes to the socket.
        await attachment.finish(None, self._limits.send_timeout_s)
        self._attachment = None
        await target.resume(attachment.socket, command.last_received_server_event_seq)
        return True

    async def _expire(self, code: CloseCode, message: str) -> None:
        await self._step(lambda: self.session.expire(code.name.lower(), code, message))

    async def _stop_attachment(self) -> None:
        """Let go of the socket without closing it (it dropped, or it now serves another session)."""
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            await attachment.finish(None, self._limits.send_timeout_s)

    async def _end_attachment(self) -> None:
        """Flush what is queued and close the socket with the session's close code."""
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            close = self._closing or _Close(CloseCode.NORMAL, "disconnected")
            await attachment.finish(close, self._limits.send_timeout_s)

    async def _release(self) -> None:
        """End the session for good: the engine session, the pump, the admission slot."""
        if self._ended.is_set():
            return
        self._ended.set()
        if self._timer is not None:
            self._timer.cancel()
        engine_session, self._engine_session = self._engine_session, None
        if engine_session is not None:
            reason = self._closing.reason if self._closing else "disconnected"
            try:
                await asyncio.wait_for(engine_session.close(reason), self._limits.engine_timeout_s)
            except Exception:
                logger.exception("closing engine session %s failed", self.session_id)
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self._registry.release(self.session_id)

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
                now = asyncio.get_running_loop().time()
                await self._step(functools.partial(self.session.engine_event, event, now=now))
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
            self._schedule_timer()

    def _schedule_timer(self) -> None:
        """Wake the session when its next timer is due (it keeps no clock of its own)."""
        due = self.session.next_timer
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, due
        if due is not None and not self._ended.is_set():
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(due, self._timer_due)

    def _timer_due(self) -> None:
        self._timer = self._timer_at = None
        if not self._ended.is_set():
            self._timer_task = asyncio.get_running_loop().create_task(
                self._on_timer(), name=f"timer:{self.session_id}"
            )

    async def _on_timer(self) -> None:
        now = asyncio.get_running_loop().time()
        try:
            await self._step(lambda: self.session.tick(now))
        except _SlowConsumer:
            return
        except Exception:  # a bug must cost this session only
            logger.exception("timer of session %s failed", self.session_id)

    async def _apply(self, outputs: Sequence[Output]) -> None:
        for output in outputs:
            if isinstance(output, ev.ServerEvent):
                await self._emit(output)
            elif isinstance(output, ProcessInput):
                await self._process_input(output.audio)
            elif isinstance(output, OpenEngine):
                if await self._admit() and await self._open_engine(output.config):
                    await self._apply(self.session.engine_opened())
            elif isinstance(output, CloseSession):
                await self._enqueue_close(output.code, output.reason)
            else:
                await self._call_engine(output)

    async def _process_input(self, audio: bytes) -> None:
        pipeline = self._input_pipeline()
        loop = asyncio.get_running_loop()
        step = pipeline.wire.byte_count(INPUT_SLICE_MS)
        for offset in range(0, len(audio), step):
            # Decoding, resampling and VAD inference stay off the event loop.
            try:
                processed = await loop.run_in_executor(self._executor, pipeline.process, audio[offset : offset + step])
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
            action = self._commit(engine_session, call)
        elif isinstance(call, ClearInput):
            action = engine_session.clear_input()
        elif isinstance(call, CallerPaused):
            action = self._caller_paused(engine_session)
        elif isinstance(call, AddItem):
            action = engine_session.add_item(
                item_id=call.item_id, role=call.role, text=call.text, previous_item_id=call.previous_item_id
            )
        elif isinstance(call, DeleteItem):
            action = engine_session.delete_item(call.item_id)
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

    async def _flush_input(self, engine_session: port.EngineSession) -> None:
        # The resampler holds back the last few ms the caller said; the engine needs them now.
        tail = self._input.flush() if self._input is not None else b""
        if tail:
            await engine_session.append_audio(tail)

    async def _caller_paused(self, engine_session: port.EngineSession) -> None:
        await self._flush_input(engine_session)
        await engine_session.caller_paused()

    async def _commit(self, engine_session: port.EngineSession, call: CommitInput) -> None:
        await self._flush_input(engine_session)
        await engine_session.commit(item_id=call.item_id, response_id=call.response_id)

    # -- the send side ------------------------------------------------------------------------

    async def _emit(self, event: ev.ServerEvent) -> None:
        # The output resampler holds back the last few ms of the reply it converts. The session
        # advances its epoch whenever it cancels a reply (barge-in, response.cancel,
        # output_audio_buffer.clear, truncate), and it does so before handing out that reply's
        # closing events: a converter filled in an older epoch holds audio of a cancelled reply,
        # which is discarded, never flushed.
        if isinstance(event, ev.AudioDelta):
            converter = self._fenced_output_converter()
            wire = converter.convert(event.audio)
            if not wire:
                return
            event = replace(event, audio=wire, rate=self.session.config.output_format.rate, encoded=True)
        elif isinstance(event, ev.AudioDone):
            tail = self._fenced_output_converter().flush()
            if tail:
                await self._emit_raw(
                    ev.AudioDelta(
                        response_id=event.response_id, item_id=event.item_id, audio=tail,
                        rate=self.session.config.output_format.rate, encoded=True,
                    )
                )
        await self._emit_raw(event)
        if isinstance(event, ev.ResponseDone):
            # vLLM-Omni's server follows every response.done with one; clients sequence on it.
            await self._emit_raw(ev.RateLimitsUpdated())

    def _fenced_output_converter(self) -> OutputConverter:
        converter = self._output_converter()
        if self._output_epoch != self.session.epoch:
            converter.reset()
            self._output_epoch = self.session.epoch
        return converter

    async def _emit_raw(self, event: ev.ServerEvent) -> None:
        """Number, render and journal ``event``, then queue it for the attached socket, if any."""
        self._seq += 1
        payload = render_server_event(
            event, seq=self._seq, event_id=f"event_{self._seq}", beta=self._beta, session_id=self.session_id,
            duplex=self.session.handshake is Handshake.DUPLEX,
        )
        if payload is None:
            self._seq -= 1
            return
        text = json.dumps(payload, separators=(",", ":"))
        if self._resumes is not None:
            self._journal.append(self._seq, text)
        await self._send_text(text)

    async def _send_text(self, text: str) -> None:
        attachment = self._attachment
        if attachment is None:
            return  # detached: the journal holds it for a resume
        if attachment.closing is not None and attachment.queue.full():
            return
        try:
            await asyncio.wait_for(attachment.queue.put(text), self._limits.send_timeout_s)
        except TimeoutError:
            # The client stopped reading: nothing more can reach it, so close at once.
            self._closing = _Close(CloseCode.SLOW_CONSUMER, "slow consumer")
            attachment.writer.cancel()
            with contextlib.suppress(Exception):
                await attachment.socket.close(int(CloseCode.SLOW_CONSUMER), "slow consumer")
            raise _SlowConsumer from None

    async def _send_error(self, exc: ProtocolError) -> None:
        await self._emit(ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param))

    async def _enqueue_close(self, code: CloseCode, reason: str) -> None:
        if self._closing is not None:
            return
        self._closing = _Close(code, reason)
        attachment = self._attachment
        if attachment is None:
            # Detached: the session ended on its own (engine, shutdown); stop waiting for a resume.
            self._ended_detached()
            return
        attachment.closing = self._closing
        with contextlib.suppress(asyncio.QueueFull):
            await asyncio.wait_for(attachment.queue.put(self._closing), self._limits.send_timeout_s)

    def _ended_detached(self) -> None:
        if self._resumes is not None:
            self._resumes.unpark(self)
        if not self._ended.is_set():
            asyncio.create_task(self._release(), name=f"release:{self.session_id}")


class _SlowConsumer(Exception):
    pass
