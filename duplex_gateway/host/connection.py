"""The lifetime of one caller's session, and the thin asyncio around its :class:`~duplex_gateway.session.machine.Session`.

Three parts, each in its own module, do the work; this one wires them and owns
the session's life (admission, timers, resume, the ways it ends):

* the socket attachment (:mod:`duplex_gateway.host.transport`): one writer task drains
  an outbox the session fills without waiting;
* the engine link (:mod:`duplex_gateway.host.engine_link`): calls go one way, in
  order, from one task; the engine's events come back through one pump task;
* the audio stage (:mod:`duplex_gateway.audio.stage`): decode, resample and VAD
  on the way in, encode on the way out, with the epoch fence.

The session decides synchronously and nothing holds it across an await: a
frame is read, parsed by the connection's dialect, decided on, and its outputs
queued, all in one go. Keepalive pings and the hard frame-size limit are the
server's (uvicorn); idle timeout, maximum session duration and the soft
message-size limit live here.

The client's events are answered in the order it sent them, as OpenAI's server
answers them: after a ``session.update`` the reader takes the next message only
once the engine has answered the update (bounded; see ``_settle_updates``).

Input backpressure: the reader takes the next message from the socket only
after the previous one has gone through the input stage, and, while more caller
audio is waiting for the engine than the link's high water mark, only once the
engine has caught up. Meanwhile the server's WebSocket layer stops reading the
TCP socket, so a client that sends faster than the session can take its audio
is slowed down by TCP itself and no audio is dropped. The caller audio a session
holds on its way in is therefore one message (at most
``limits.max_message_bytes``; a long one is converted in slices of
``INPUT_SLICE_MS``), what the link holds (at most its high water mark plus one
message), and what the WebSocket layer buffers: the frame it is assembling (at
most ``limits.hard_max_message_bytes``) and the rest of one TCP read.

A session outlives a dropped socket for ``limits.resume_grace_s``: it is
*detached* (engine still running, events journaled) until ``session.resume``
attaches a new socket, or the grace runs out. Every way a session ends
releases its engine session and its admission slot, and logs one summary line.

When the gateway drains for shutdown (:meth:`Connection.drain`), a session is told
``session.closing`` where its client can take it, finishes the reply in progress
(and the caller's turn in progress, with its reply), and closes with 1001; the
gateway closes whatever is left when the grace runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Sequence

from duplex_gateway.audio.stage import InputStage, OutputStage
from duplex_gateway.audio.vad_batch import VadBatcher
from duplex_gateway.config import GatewaySettings
from duplex_gateway.dialects.base import Dialect, PacedDialect
from duplex_gateway.engine import port
from duplex_gateway.host.admission import SessionRegistry
from duplex_gateway.host.engine_link import EngineLink
from duplex_gateway.host.observers import Observers
from duplex_gateway.host.resumption import Journal, ResumeRegistry, new_resume_token
from duplex_gateway.host.transport import Attachment, Close
from duplex_gateway.ops.logs import bind_session
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.ops.recording import NO_RECORDER, Recorder
from duplex_gateway.ops.session_stats import SessionStats, describe
from duplex_gateway.session.machine import (
    AcknowledgeEvents,
    AppendAudio,
    CloseSession,
    CommitInput,
    EngineCall,
    Handshake,
    OpenEngine,
    Output,
    ProcessInput,
    ReportLatency,
    Session,
    UpdateEngine,
)
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import Command, SessionClose, SessionResume
from duplex_gateway.vocabulary.errors import CloseCode, ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame, Socket
from duplex_gateway.vocabulary.session_config import CLOSING_EVENT, SessionConfig

__all__ = ["INPUT_SLICE_MS", "Connection", "SessionRegistry", "Socket"]

logger = logging.getLogger(__name__)

#: Caller audio goes through the input stage in pieces of at most this much, so a long
#: append is turn-detected as finely as streamed audio and converted with small buffers.
INPUT_SLICE_MS = 100
#: Caller audio (engine-rate PCM) the engine link may hold before the reader waits for it.
ENGINE_BACKLOG_MS = 2_000


def _duration(seconds: float) -> str:
    """``seconds`` in OpenAI's words for a session's maximum duration (``60 minutes``)."""
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} seconds"


class _Outcome(enum.Enum):
    """How a socket's time with a session ended."""

    CLOSED = "closed"  # the session is over
    DROPPED = "dropped"  # the client vanished; the session may be resumed
    HANDED_OVER = "handed_over"  # the socket now serves a resumed session
    REPLACED = "replaced"  # a resume took the session over from this socket


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
        handshake: Handshake,
        dialect: Dialect,
        resumes: ResumeRegistry[Connection] | None = None,
        vad: VadBatcher | None = None,
        metrics: GatewayMetrics | None = None,
        dialect_name: str = "realtime",
        recorder: Recorder = NO_RECORDER,
    ) -> None:
        limits = settings.limits
        self._first_socket = socket
        self._engine = engine
        self._limits = limits
        self._registry = registry
        self._dialect = dialect
        #: A dialect that paces some of its frames (a phone call's reply audio), and its next wake-up.
        self._paced = dialect if isinstance(dialect, PacedDialect) else None
        self._pace_timer: asyncio.Handle | None = None
        self._pace_at: float | None = None
        self._vad = vad
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
        self._journal = Journal(
            max_events=limits.resume_journal_events, max_bytes=limits.resume_journal_bytes
        )
        self._link: EngineLink | None = None
        self._pump: asyncio.Task[None] | None = None
        self._attachment: Attachment | None = None
        self._closing: Close | None = None
        self._ended = asyncio.Event()
        self._resumed = asyncio.Event()
        #: Sockets that have served this session, the current one included.
        self._generation = 0
        #: Readers of sockets a resume took the session from, with their attachments.
        self._superseded: dict[asyncio.Task[object], Attachment] = {}
        self._seq = 0
        self._deadline = 0.0
        self._input: InputStage | None = None
        self._output = OutputStage(engine.capabilities.output_rate)
        # Work the last step left for the reader: audio to convert, an engine to open.
        self._pending_input: list[ProcessInput] = []
        self._pending_open: SessionConfig | None = None
        # session.update calls the engine has not answered yet; the reader holds the client's
        # next event until they are settled (see _settle_updates).
        self._updates_pending = 0
        self._updates_settled = asyncio.Event()
        self._updates_settled.set()
        # The session's own clock-driven work (Session.next_timer), e.g. idle_timeout_ms.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        # The task reading the socket, and whether it was told to stop (a stalled client).
        self._reader: asyncio.Task[object] | None = None
        self._stop_reading = False
        #: The close (4002) of a client that stopped reading, waiting for its socket to take it.
        self._stalled_close: asyncio.Task[None] | None = None
        #: Read-only Realtime clients watching this session (made on the first one).
        self._observers: Observers | None = None
        # Metrics and the summary line: the dialect's name for labels (a call's carrier refines it).
        self._metrics = metrics if metrics is not None else GatewayMetrics(engine.capabilities.name)
        self._dialect_name = dialect_name
        #: Hears every frame, event and piece of audio of the session (recording: off by default).
        self._recorder = recorder
        self._stats = SessionStats(self._metrics, started_at=0.0)
        #: How the client ended it, when it did (its close code, and whether it meant to).
        self._client_close: tuple[str, int] | None = None
        self._reported = False
        #: The gateway is draining: close once the reply and turn in progress are done.
        self._draining = False

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def call_id(self) -> str | None:
        """The carrier's id of the phone call this session serves (None: not a call, or not started)."""
        start = getattr(self._dialect, "start", None)
        call_id = getattr(start, "call_id", None)
        return call_id if isinstance(call_id, str) else None

    @property
    def dialect_label(self) -> str:
        """The dialect's name in metrics and logs: a call's carrier, else the handshake's dialect."""
        start = getattr(self._dialect, "start", None)
        carrier = getattr(start, "carrier", None)
        return str(carrier) if carrier else self._dialect_name

    @property
    def closed_by_server(self) -> bool:
        """The gateway ended the session (its client did not just go away)."""
        return self._closing is not None

    def end(self, reason: str) -> None:
        """End the session from outside (a call hung up through the API): as if its client closed it."""
        if not self.session.closed:
            self._apply(
                self.session.receive(SessionClose(reason=reason), now=asyncio.get_running_loop().time())
            )

    async def observe(self, socket: Socket) -> None:
        """Serve ``socket`` as a read-only observer of this session until either ends."""
        if self._observers is None:
            limits = self._limits
            self._observers = Observers(
                self.session_id,
                max_message_bytes=limits.max_message_bytes,
                send_queue_size=limits.send_queue_size,
                send_timeout_s=limits.send_timeout_s,
            )
        observers = self._observers
        greeting = ev.SessionCreated(
            session_id=self.session_id,
            config=self.session.config,
            capabilities=self._engine.capabilities.as_pairs(),
        )
        attachment = observers.attach(socket, greeting)
        if attachment is None:
            with contextlib.suppress(Exception):
                await socket.close(int(CloseCode.TRY_AGAIN_LATER), "too many observers")
            return
        try:
            while not self._ended.is_set():
                message = await socket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                observers.refuse(attachment, str(message.get("text") or "a binary frame"))
        finally:
            await observers.finish(attachment, "observer_left" if not self._ended.is_set() else "call_ended")

    def can_replay_after(self, seq: int) -> bool:
        return self._journal.can_replay_after(seq)

    # -- lifetime -------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve the first socket; returns when it is done (the session may live on, detached)."""
        bind_session(self.session_id)
        self._stats.started_at = asyncio.get_running_loop().time()
        self._attachment = self._attach(self._first_socket)
        self._generation = 1
        self._deadline = asyncio.get_running_loop().time() + self._limits.max_session_s
        # The Realtime handshake opens the engine at once, so it is admitted now. The duplex
        # handshake is admitted when its session.update opens the engine: its first message
        # may be a session.resume, which takes over the parked session's slot instead.
        realtime = self.session.handshake is Handshake.REALTIME
        if realtime and not self._admit():
            await self._end_attachment()
            self._report_end()
            return
        outcome = _Outcome.CLOSED
        try:
            if realtime and not await self._open_engine(self.session.config):
                outcome = _Outcome.CLOSED
            else:
                self._apply(self.session.start())
                outcome = await self._read_loop()
        except Exception:  # a bug must cost this session only, never the server
            logger.exception("session %s failed", self.session_id)
            self._close_socket(CloseCode.INTERNAL_ERROR, "internal error")
        await self._after(outcome)

    async def resume(self, socket: Socket, last_seq: int) -> None:
        """Attach ``socket`` to this session, replay what it missed, and serve it.

        The session may still be attached: its client lost a connection this gateway has
        not noticed yet. That socket is told ``session.replaced`` and let go.
        """
        replaced, reader = self._attachment, self._reader
        if replaced is not None:
            replaced.send(
                self._dialect.render_unsequenced(
                    ev.SessionReplaced(session_id=self.session_id, attachment_generation=self._generation)
                )
            )
            replaced.close_after(Close(CloseCode.NORMAL, "session_replaced"))
            if reader is not None:
                # It may wait on a socket that will never say another word.
                self._superseded[reader] = replaced
                reader.cancel()
            logger.info("session %s taken over by a new connection", self.session_id)
        bind_session(self.session_id)
        self._metrics.resume("resumed")
        self._stats.resumes += 1
        self._resumed.set()
        self._generation += 1
        self.resume_token = new_resume_token()
        self.session.resume_token = self.resume_token
        attachment = self._attachment = self._attach(socket)
        if self._resumes is not None:
            self._resumes.attach(self)
        outcome = _Outcome.CLOSED
        try:
            # session.resumed carries no sequence number, as vLLM-Omni sends it: DuplexClient
            # drops an event numbered at or below its last seen one as a replayed duplicate,
            # and with it the new resume_token, so its next resume would fail.
            attachment.send(self._dialect.render_unsequenced(self.session.resumed(self._generation)))
            for frame in self._journal.after(last_seq):
                attachment.send(frame)
            logger.info("session %s resumed after event %d", self.session_id, last_seq)
            outcome = await self._read_loop()
        except Exception:
            logger.exception("session %s failed", self.session_id)
            self._close_socket(CloseCode.INTERNAL_ERROR, "internal error")
        await self._after(outcome)

    async def _after(self, outcome: _Outcome) -> None:
        if outcome is _Outcome.REPLACED:
            # The session is another socket's now; this one only says goodbye.
            task = asyncio.current_task()
            replaced = self._superseded.pop(task) if task is not None else None
            if replaced is not None:
                await replaced.finish(
                    Close(CloseCode.NORMAL, "session_replaced"), self._limits.send_timeout_s
                )
            return
        if outcome is _Outcome.HANDED_OVER:
            # Nothing was opened for this connection; the socket now belongs to another session.
            self._reported = True  # it never was a session of its own
            self._recorder.closed("handed_over", None, self.session.config)
            await self._stop_attachment()
            await self._release()
            return
        if outcome is _Outcome.DROPPED and self._resumable():
            await self._stop_attachment()
            if self._attachment is not None:
                return  # the client came back while the old socket was being let go
            assert self._resumes is not None
            self._resumed.clear()
            self._resumes.park(self)
            asyncio.create_task(self._await_resume(), name=f"grace:{self.session_id}")
            logger.info(
                "session %s detached; resumable for %g s", self.session_id, self._limits.resume_grace_s
            )
            return
        await self._end_attachment()
        await self._release()
        await self._await_stalled_close()

    async def _await_stalled_close(self) -> None:
        """Give a stalled client's 4002 ``send_timeout_s`` to go out, then let the socket go.

        The close waits behind what the client has not read: returning before it is written
        would have the server drop the connection without it (the client saw 1006). A client
        that never reads again is not waited for longer, and no task is left behind.
        """
        task, self._stalled_close = self._stalled_close, None
        if task is None:
            return
        try:
            async with asyncio.timeout(self._limits.send_timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _resumable(self) -> bool:
        return (
            self._resumes is not None
            and self.session.configured
            and not self.session.closed
            and self._closing is None
            and self._link is not None
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
        if not self._ended.is_set():
            self._metrics.resume("expired")
        logger.info("session %s was not resumed in time; ending it", self.session_id)
        self._apply(self.session.expire("resume_timeout", CloseCode.NORMAL, "the client did not come back"))
        await self._release()

    async def shut_down(self) -> None:
        """Close this session because the gateway is stopping (close code 1001)."""
        self._apply(self.session.shut_down())
        if self._attachment is None:  # detached: nobody to tell
            await self._release()

    def drain(self, grace_s: float) -> None:
        """The gateway is draining: warn the client, let the reply and turn in progress finish, close (1001).

        ``session.closing`` goes only to clients that cannot trip on an unknown event:
        vLLM-Omni duplex clients (and phone calls, whose dialect drops it) and clients
        that asked for it (``session.include``). The gateway enforces ``grace_s``.
        """
        if self._draining or self.session.closed or self._closing is not None:
            return
        self._draining = True
        if self._attachment is None:
            return  # detached: the gateway closes it at once
        if self.session.handshake is Handshake.DUPLEX or CLOSING_EVENT in self.session.config.include:
            self._emit_raw(ev.SessionClosing(reason="server_shutdown", grace_s=grace_s), observed=False)
        self._drain_step()

    def _drain_step(self) -> None:
        """Draining: close as soon as no reply is in progress and the caller is not mid-turn."""
        session = self.session
        if (
            session.closed
            or self._closing is not None
            or session.response_active
            or self._stats.caller_speaking
        ):
            return
        self._apply(session.shut_down())

    def _admit(self) -> bool:
        """Take an admission slot, or refuse the session with ``session_limit`` (``server_shutting_down``)."""
        if self._registry.try_admit(self.session_id, self):
            self._stats.admitted(self._metrics.labels(self.dialect_label))
            return True
        if self._registry.draining:
            self._refuse(ErrorCode.SERVER_SHUTTING_DOWN, "the gateway is shutting down; connect again")
            return False
        self._refuse(
            ErrorCode.SESSION_LIMIT,
            f"the gateway is at its limit of {self._registry.max_sessions} sessions; try again later",
        )
        return False

    def _refuse(self, code: ErrorCode, message: str) -> None:
        self._emit(ev.ErrorEvent(code=code, message=message))
        self._close_socket(CloseCode.TRY_AGAIN_LATER, code.value)

    # -- reading -----------------------------------------------------------------------

    async def _read_loop(self) -> _Outcome:
        reader = asyncio.current_task()
        self._reader = reader
        try:
            return await self._read_messages()
        except asyncio.CancelledError:
            if reader is not None and reader in self._superseded and reader.cancelling() == 1:
                # Stopped by a resume that took the session over: the session goes on.
                reader.uncancel()
                return _Outcome.REPLACED
            # Stopped by _client_stalled, not by anyone above: the session is over.
            if reader is not None and self._stop_reading and reader.cancelling() == 1:
                reader.uncancel()
                return _Outcome.CLOSED
            raise
        finally:
            if self._reader is reader:
                self._reader = None

    async def _read_messages(self) -> _Outcome:
        attachment = self._attachment
        assert attachment is not None
        loop = asyncio.get_running_loop()
        idle = self._limits.idle_timeout_s
        first = True
        while self._closing is None:
            remaining = self._deadline - loop.time()
            try:
                async with asyncio.timeout(min(idle, max(remaining, 0.0))):
                    message = await attachment.socket.receive()
            except TimeoutError:
                if loop.time() >= self._deadline:
                    self._expire(CloseCode.MAX_DURATION, f"of {_duration(self._limits.max_session_s)}.")
                else:
                    self._expire(CloseCode.IDLE_TIMEOUT, f"no message from the client for {idle:g} s")
                return _Outcome.CLOSED
            if message["type"] == "websocket.disconnect":
                # A client that closes on purpose (1000, 1001) is done; anything else is a dropped
                # connection whose client may come back with session.resume.
                code = message.get("code", 1006)
                purposeful = code in (1000, 1001)
                self._client_close = ("client_closed" if purposeful else "client_dropped", code)
                return _Outcome.CLOSED if purposeful else _Outcome.DROPPED
            frame: Frame | None = message.get("text")
            if frame is None:
                frame = message.get("bytes", b"")
            self._stats.frame_in(frame)
            if self._paced is not None:
                self._paced.tick(loop.time())
            try:
                commands: Sequence[Command] = self._dialect.parse(frame)
            except ProtocolError as exc:
                self._recorder.client_command(frame, (), self.session.config.input_format)
                self._send_error(exc)
                continue
            self._recorder.client_command(frame, commands, self.session.config.input_format)
            if self._paced is not None and self._paced.wants_pump:
                self._pace(None)  # e.g. the carrier takes audio again after a pause
            waited = 0.0
            for command in commands:
                if isinstance(command, SessionResume) and first and not self.session.configured:
                    if await self._hand_over(command):
                        return _Outcome.HANDED_OVER
                    continue
                first = False
                self._apply(self.session.receive(command, now=loop.time()))
                began = loop.time()
                await self._finish_step()
                waited += loop.time() - began
            self._stats.input_wait(waited)
        return _Outcome.CLOSED

    async def _finish_step(self) -> None:
        """Do what the last step left for the reader, which waits for it: the input stage, an engine to open."""
        if self._pending_open is not None:
            config, self._pending_open = self._pending_open, None
            if self._admit() and await self._open_engine(config):
                self._apply(self.session.engine_opened())
        while self._pending_input:
            await self._process_input(self._pending_input.pop(0))
        if self._updates_pending:
            await self._settle_updates()
        link = self._link
        if link is not None and link.backlogged:
            await link.drained()

    async def _settle_updates(self) -> None:
        """Hold the client's next event until the engine has answered its ``session.update``.

        OpenAI's server handles a connection's events in order: the update's answer
        (``session.updated``, which waits for the engine, or its error) comes before the
        answer to anything sent after it, and a ``response.create`` right behind it (as
        Pipecat sends one) is made with the updated session. The engine link times the
        update out after ``engine_timeout_s`` once it is made; this wait also covers the
        calls queued ahead of it, and when even that runs out the client is told, and the
        events after the update are handled while it is still on its way.
        """
        bound = 2 * self._limits.engine_timeout_s
        try:
            async with asyncio.timeout(bound):
                await self._updates_settled.wait()
        except TimeoutError:
            self._emit(
                ev.ErrorEvent(
                    code=ErrorCode.ENGINE_ERROR,
                    message=f"the engine has not answered the session update in {bound:g} s; "
                    "the events sent after it are handled before it",
                    param="session",
                )
            )

    def _update_settled(self) -> None:
        self._updates_pending = max(0, self._updates_pending - 1)
        if not self._updates_pending:
            self._updates_settled.set()

    async def _process_input(self, chunk: ProcessInput) -> None:
        stage = self._input_stage(chunk.format)
        audio = chunk.audio
        step = stage.wire.byte_count(INPUT_SLICE_MS)
        for offset in range(0, len(audio), step):
            try:
                processed = await stage.process(audio[offset : offset + step])
            except ProtocolError as exc:
                self._send_error(exc)
                return
            self._recorder.caller_audio(processed.pcm)
            # The chunk's camera frames were taken while it was spoken: they ride its last slice.
            last = offset + step >= len(audio)
            self._apply(
                self.session.input_processed(
                    processed.pcm,
                    processed.duration_ms,
                    processed.windows,
                    is_speech=chunk.is_speech,
                    hints=chunk.hints,
                    now=asyncio.get_running_loop().time(),
                    video_frames=chunk.video_frames if last else (),
                )
            )
            if self._closing is not None:
                return

    async def _hand_over(self, command: SessionResume) -> bool:
        """Give this socket to the detached session ``command`` names; False if refused."""
        if self._resumes is None:
            self._metrics.resume("disabled")
            self._send_error(
                ProtocolError(
                    ErrorCode.INVALID_RESUME_TOKEN, "session resume is turned off", event_id=command.event_id
                )
            )
            return False
        try:
            target = self._resumes.claim(
                command.session_id, command.resume_token, command.last_received_server_event_seq
            )
        except ProtocolError as exc:
            self._metrics.resume("gap" if exc.code is ErrorCode.RESUME_GAP else "refused")
            attachment = self._attachment
            if exc.code is ErrorCode.RESUME_GAP and attachment is not None:
                # vLLM-Omni's answer: the client must start over (its DuplexClient gives up
                # at once instead of retrying a resume that cannot succeed).
                attachment.send(
                    self._dialect.render_unsequenced(
                        ev.SessionResyncRequired(session_id=command.session_id, reason="journal_gap")
                    )
                )
            else:
                self._send_error(exc.with_event_id(command.event_id))
            return False
        attachment = self._attachment
        assert attachment is not None
        # Stop this connection's writer first so only the resumed session writes to the socket.
        await attachment.finish(None, self._limits.send_timeout_s)
        self._attachment = None
        await target.resume(attachment.socket, command.last_received_server_event_seq)
        return True

    def _expire(self, code: CloseCode, message: str) -> None:
        self._apply(self.session.expire(code.name.lower(), code, message))

    # -- the socket --------------------------------------------------------------------

    def _attach(self, socket: Socket) -> Attachment:
        return Attachment(
            socket,
            high_water=self._limits.send_queue_size,
            stall_timeout_s=self._limits.send_timeout_s,
            on_stalled=self._client_stalled,
            name=self.session_id,
            on_queued=self._stats.queued,
            on_written=self._stats.written,
        )

    def _client_stalled(self) -> None:
        attachment = self._attachment
        if attachment is None or not attachment.stalled:
            return  # a socket the session was taken from: nobody reads it, and nobody needs to
        # The client stopped reading: nothing more can reach it, so close at once.
        logger.warning("session %s closed: the client did not read its events", self.session_id)
        self._closing = Close(CloseCode.SLOW_CONSUMER, "slow consumer")
        attachment = self._attachment
        if attachment is not None:
            socket = attachment.socket
            self._stalled_close = asyncio.get_running_loop().create_task(
                self._close_stalled(socket), name=f"stalled:{self.session_id}"
            )
        reader = self._reader
        if reader is not None and reader is not asyncio.current_task() and not self._stop_reading:
            # It may be waiting for a message from a client that only sends; it waits no more.
            self._stop_reading = True
            reader.cancel()

    async def _close_stalled(self, socket: Socket) -> None:
        with contextlib.suppress(Exception):
            await socket.close(int(CloseCode.SLOW_CONSUMER), "slow consumer")

    async def _stop_attachment(self) -> None:
        """Let go of the socket without closing it (it dropped, or it now serves another session)."""
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            await attachment.finish(None, self._limits.send_timeout_s)

    async def _end_attachment(self) -> None:
        """Flush what is queued and close the socket with the session's close code."""
        attachment, self._attachment = self._attachment, None
        if attachment is not None and not attachment.stalled:
            close = self._closing or Close(CloseCode.NORMAL, "disconnected")
            await attachment.finish(close, self._limits.send_timeout_s)

    def _close_socket(self, code: CloseCode, reason: str) -> None:
        if self._closing is not None:
            return
        self._closing = Close(code, reason)
        if self._resumes is not None:
            # A session on its way out is not taken over, attached or not.
            self._resumes.unpark(self)
        attachment = self._attachment
        if attachment is None:
            # Detached: the session ended on its own (engine, shutdown); stop waiting for a resume.
            if not self._ended.is_set():
                asyncio.get_running_loop().create_task(self._release(), name=f"release:{self.session_id}")
            return
        attachment.close_after(self._closing)

    async def _release(self) -> None:
        """End the session for good: the engine session, the pump, the admission slot."""
        if self._ended.is_set():
            return
        self._ended.set()
        if self._resumes is not None:
            self._resumes.unpark(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._pace_timer is not None:
            self._pace_timer.cancel()
        if self._observers is not None:
            self._observers.close_all("call_ended")
        link, self._link = self._link, None
        if link is not None:
            await link.close()
            # The calls still queued are dropped with the link: nothing waits for their answers.
            self._updates_pending = 0
            self._updates_settled.set()
            reason = self._closing.reason if self._closing else "disconnected"
            try:
                with self._metrics.timed_call("close_session"):
                    async with asyncio.timeout(self._limits.engine_timeout_s):
                        await link.engine_session.close(reason)
            except Exception:
                logger.exception("closing engine session %s failed", self.session_id)
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self._registry.release(self.session_id)
        self._stats.released()
        self._report_end()

    def _report_end(self) -> None:
        """Count the session's end and log its summary line, once."""
        if self._reported:
            return
        self._reported = True
        closing = self._closing
        client = self._client_close or ("client_closed", None)
        reason, code = (closing.reason, int(closing.code)) if closing else client
        summary = self._stats.summary(
            now=asyncio.get_running_loop().time(),
            session_id=self.session_id,
            reason=self._stats.ended(reason, code, self.dialect_label),
            code=code,
            dialect=self.dialect_label,
            engine=self._engine.capabilities.name,
            call_id=self.call_id,
        )
        logger.info(describe(summary), extra=summary)
        self._recorder.closed(str(summary["close_reason"]), code, self.session.config)

    # -- the engine ---------------------------------------------------------------------

    async def _open_engine(self, config: SessionConfig) -> bool:
        try:
            with self._metrics.timed_call("open_session"):
                async with asyncio.timeout(self._limits.engine_timeout_s):
                    engine_session = await self._engine.open_session(self.session_id, config)
        except port.EngineSessionLimit as exc:
            self._refuse(ErrorCode.SESSION_LIMIT, str(exc) or "the engine has no room for another session")
            return False
        except (port.EngineUnavailable, TimeoutError) as exc:
            self._refuse(ErrorCode.ENGINE_UNAVAILABLE, str(exc) or "the engine is not available")
            return False
        rate = self._engine.capabilities.input_rate
        self._link = EngineLink(
            engine_session,
            timeout_s=self._limits.engine_timeout_s,
            on_error=self._engine_call_failed,
            on_done=self._engine_call_done,
            high_water_bytes=rate * 2 * ENGINE_BACKLOG_MS // 1000,
            name=self.session_id,
            metrics=self._metrics,
        )
        self._pump = asyncio.create_task(self._pump_engine(engine_session), name=f"pump:{self.session_id}")
        if self._resumes is not None:
            # Resumable from now on, even before this socket is seen to drop.
            self._resumes.attach(self)
        return True

    def _engine_call_done(self, call: EngineCall) -> None:
        if isinstance(call, UpdateEngine):
            self._apply(self.session.engine_updated(call))
            self._update_settled()

    def _engine_call_failed(self, call: EngineCall, exc: BaseException) -> None:
        if isinstance(call, UpdateEngine):
            if isinstance(exc, port.EngineRefused):
                code, message = exc.code, exc.message
            elif isinstance(exc, TimeoutError):
                code, message = "engine_error", f"no answer in {self._limits.engine_timeout_s:g} s"
            else:
                code, message = "engine_error", f"the engine failed: {type(exc).__name__}"
            self._apply(self.session.engine_update_refused(call, code=code, message=message))
            self._update_settled()
            return
        if isinstance(exc, port.EngineRefused):
            # The engine turned this one call down (e.g. a kind of input it does not take).
            self._emit(ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message=f"the engine refused it: {exc}"))
            return
        self._emit(
            ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message=f"the engine failed: {type(exc).__name__}")
        )

    async def _pump_engine(self, engine_session: port.EngineSession) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for event in engine_session.events():
                self._apply(self.session.engine_event(event, now=loop.time()))
                if isinstance(event, port.EngineClosed):
                    return
        except Exception:
            logger.exception("engine event stream of session %s failed", self.session_id)
            self._apply(
                self.session.engine_event(
                    port.EngineError(
                        code="engine_error", message="the engine event stream failed", fatal=True
                    )
                )
            )

    # -- executing what the session decided ------------------------------------------------

    def _apply(self, outputs: Sequence[Output]) -> None:
        """Carry out one step's outputs, in order, without waiting for any of them."""
        for output in outputs:
            if isinstance(output, ev.ServerEvent):
                self._emit(output)
            elif isinstance(output, ProcessInput):
                self._pending_input.append(output)
            elif isinstance(output, OpenEngine):
                self._pending_open = output.config
            elif isinstance(output, CloseSession):
                self._close_socket(output.code, output.reason)
            elif isinstance(output, AcknowledgeEvents):
                self._acknowledge(output.server_event_seq)
            elif isinstance(output, ReportLatency):
                self._stats.latency(output)
            else:
                self._call_engine(output)
        if self._paced is not None:
            loop = asyncio.get_running_loop()
            for command in self._paced.take_commands():
                self._apply(self.session.receive(command, now=loop.time()))
        self._schedule_timer()
        if self._draining:
            self._drain_step()

    def _call_engine(self, call: EngineCall) -> None:
        link = self._link
        if link is None:
            if isinstance(call, UpdateEngine):  # no engine session to refuse it
                self._apply(self.session.engine_updated(call))
            return
        if isinstance(call, CommitInput) and self._input is not None:
            # The resampler holds back the last few ms of the turn; the engine needs them now. Not at
            # a pause: the caller goes on, and a flush there would end the filter's stream mid-turn,
            # leaving a step in the audio of every turn the caller paused in (the early
            # transcription a pause starts can do without the few ms of quiet still held back).
            tail = self._input.flush()
            if tail:
                self._recorder.caller_audio(tail)
                link.submit(AppendAudio(pcm=tail))
        if isinstance(call, UpdateEngine):
            self._updates_pending += 1
            self._updates_settled.clear()
        link.submit(call)

    def _input_stage(self, chunk_format: AudioFormat | None = None) -> InputStage:
        """The stage for audio in ``chunk_format`` (the session's input format when None).

        A chunk in a format of its own (vLLM-Omni's per-chunk ``format``) gets a stage
        of its own, placed on the same input clock.
        """
        wire, vad = chunk_format or self.session.config.input_format, self.session.gateway_vad
        current = self._input
        if current is None or current.wire != wire or current.vad != vad:
            current = self._input = InputStage(
                wire,
                self._engine.capabilities.input_rate,
                vad=(self._vad or VadBatcher.shared()) if vad else None,
                start_ms=current.position_ms if current is not None else 0.0,
            )
        return current

    def _schedule_timer(self) -> None:
        """Wake the session when its next timer is due (it keeps no clock of its own)."""
        due = self.session.next_timer
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, due
        if due is not None and not self._ended.is_set():
            self._timer = asyncio.get_running_loop().call_at(due, self._timer_due)

    def _timer_due(self) -> None:
        self._timer = self._timer_at = None
        if self._ended.is_set():
            return
        try:
            self._apply(self.session.tick(asyncio.get_running_loop().time()))
        except Exception:  # a bug must cost this session only
            logger.exception("timer of session %s failed", self.session_id)
            self._close_socket(CloseCode.INTERNAL_ERROR, "internal error")

    # -- the send side ------------------------------------------------------------------------

    def _emit(self, event: ev.ServerEvent) -> None:
        self._stats.event(event, asyncio.get_running_loop().time())
        if isinstance(event, ev.AudioDelta):
            self._recorder.assistant_audio(event.audio)  # the engine's PCM16, before client encoding
        for out in self._output.encode(event, self.session.config.output_format, self.session.epoch):
            self._emit_raw(out)
        if isinstance(event, ev.ResponseDone):
            # vLLM-Omni's server follows every response.done with one; clients sequence on it.
            self._emit_raw(ev.RateLimitsUpdated())

    def _emit_raw(self, event: ev.ServerEvent, *, observed: bool = True) -> None:
        """Number, render and journal ``event``, then queue it for the attached socket, if any.

        ``observed``: observers (strict Realtime clients) get it too.
        """
        if self._observers is not None and observed:
            self._observers.send(event)
        if self._paced is not None:
            self._paced.tick(asyncio.get_running_loop().time())
            self._pace(None)  # it may have queued paced frames
        frame = self._dialect.render(event, seq=self._seq + 1)
        self._recorder.server_event(event, frame is not None)
        if frame is None:
            return
        self._seq += 1
        if self._resumes is not None:
            self._journal.append(self._seq, frame)
        attachment = self._attachment
        if attachment is None:
            return  # detached: the journal holds it for a resume
        if isinstance(event, ev.AudioDelta):
            # Its write time feeds the chunk-gap and barge-in cut-off histograms.
            attachment.send(frame, on_sent=self._stats.audio_queued(event.response_id))
        else:
            attachment.send(frame)

    def _pace(self, at: float | None) -> None:
        """Have the paced dialect's due frames sent at ``at`` (None: as soon as this step is done)."""
        loop = asyncio.get_running_loop()
        if at is None:
            if self._pace_timer is not None and self._pace_at is None:
                return  # already due
            if self._pace_timer is not None:
                self._pace_timer.cancel()
            self._pace_timer, self._pace_at = loop.call_soon(self._send_paced), None
            return
        if self._pace_timer is not None and (self._pace_at is None or self._pace_at <= at):
            return  # an earlier wake-up is set
        if self._pace_timer is not None:
            self._pace_timer.cancel()
        self._pace_timer, self._pace_at = loop.call_at(at, self._send_paced), at

    def _send_paced(self) -> None:
        self._pace_timer = self._pace_at = None
        paced = self._paced
        if paced is None or self._closing is not None:
            return
        try:
            frames, wake = paced.pump(asyncio.get_running_loop().time())
        except Exception:  # a bug must cost this session only
            logger.exception("pacing the output of session %s failed", self.session_id)
            self._close_socket(CloseCode.INTERNAL_ERROR, "internal error")
            return
        attachment = self._attachment
        if attachment is not None:
            for frame in frames:
                attachment.send(frame)
        if wake is not None:
            self._pace(wake)

    def _acknowledge(self, seq: int) -> None:
        if self._resumes is None:
            return  # nothing is kept for a resume, so there is nothing to trim
        try:
            self._journal.acknowledge(seq)
        except ProtocolError as exc:
            self._send_error(exc)

    def _send_error(self, exc: ProtocolError) -> None:
        self._emit(ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param))
        if exc.code is ErrorCode.UNAUTHORIZED:
            self._close_socket(CloseCode.POLICY_VIOLATION, "unauthorized")  # nothing more is heard from it
