"""The lifetime of one caller's session, and the thin asyncio around its :class:`~duplex_gateway.session.machine.Session`.

This module wires the host's parts (see :mod:`duplex_gateway.host`) and owns the
session's life: admission, the engine session and its event pump, the session's
timers, and every way it ends. The session decides synchronously and nothing
holds it across an await; every failure is answered as the one table in
:mod:`duplex_gateway.host.closing` says.

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
import logging
from collections.abc import Sequence

from duplex_gateway.audio.stage import OutputStage
from duplex_gateway.audio.vad_batch import VadBatcher
from duplex_gateway.config import GatewaySettings
from duplex_gateway.dialects.base import Dialect, PacedDialect
from duplex_gateway.engine import port
from duplex_gateway.engine.event_queue import EngineEventStream
from duplex_gateway.host.admission import SessionRegistry
from duplex_gateway.host.closing import (
    FAILURES,
    Close,
    Failure,
    close_for,
    engine_call_failure,
    engine_open_failure,
    protocol_failure,
)
from duplex_gateway.host.delegation import DelegatingDialect, Delegator, ResponsesBackend
from duplex_gateway.host.engine_link import EngineLink
from duplex_gateway.host.observers import Control, Observers
from duplex_gateway.host.outbox import Outbox
from duplex_gateway.host.pacing import Pacer
from duplex_gateway.host.reader import INPUT_SLICE_MS, Outcome, Reader
from duplex_gateway.host.resumption import Journal, ResumeRegistry, new_resume_token
from duplex_gateway.host.takeover import Takeover
from duplex_gateway.host.transport import Attachment
from duplex_gateway.host.turn_judge import TurnJudge
from duplex_gateway.ops.logs import bind_session
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.ops.recording import NO_RECORDER, Recorder
from duplex_gateway.ops.session_stats import SessionStats, describe
from duplex_gateway.session.engine_calls import AssessTurn
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
from duplex_gateway.session.overlap import BackchannelRule, OverlapPolicy
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import SessionClose, SessionResume
from duplex_gateway.vocabulary.errors import ProtocolError
from duplex_gateway.vocabulary.frames import Socket
from duplex_gateway.vocabulary.session_config import CLOSING_EVENT, SessionConfig

__all__ = ["INPUT_SLICE_MS", "Connection", "SessionRegistry", "Socket"]

logger = logging.getLogger(__name__)

#: Caller audio (engine-rate PCM) the engine link may hold before the reader waits for it.
ENGINE_BACKLOG_MS = 2_000


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
        backend: ResponsesBackend | None = None,
    ) -> None:
        limits = settings.limits
        self._first_socket = socket
        self._engine = engine
        self._limits = limits
        self._registry = registry
        self._dialect = dialect
        self._resumes = resumes if limits.resume_grace_s > 0 else None
        self.session = Session(
            session_id=session_id,
            capabilities=engine.capabilities,
            defaults=defaults,
            handshake=handshake,
            backchannels=_backchannel_rule(settings),
        )
        self.resume_token = new_resume_token()
        if self._resumes is not None:
            self.session.resume_token = self.resume_token
        self._journal = Journal(
            max_events=limits.resume_journal_events, max_bytes=limits.resume_journal_bytes
        )
        self._link: EngineLink | None = None
        self._pump: asyncio.Task[None] | None = None
        #: The engine's event stream, while its events are taken where the engine puts them.
        self._at_once: EngineEventStream | None = None
        #: Carrying out a step's outputs (an engine event taken at once must wait for the pump).
        self._stepping = False
        self._closing: Close | None = None
        self._ended = asyncio.Event()
        #: The wait for a detached session's client to come back, and a detached session's end.
        self._grace: asyncio.Task[None] | None = None
        self._releasing: asyncio.Task[None] | None = None
        self._deadline = 0.0
        # The session's own clock-driven work (Session.next_timer), e.g. idle_timeout_ms.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        #: The socket of a client that stopped reading, whose close (4002) is on its way.
        self._stalled: Attachment | None = None
        # Metrics and the summary line: the dialect's name for labels (a call's carrier refines it).
        self._metrics = metrics if metrics is not None else GatewayMetrics(engine.capabilities.name)
        self._dialect_name = dialect_name
        #: Hears every frame, event and piece of audio of the session (recording: off by default).
        self._recorder = recorder
        self._stats = SessionStats(self._metrics, started_at=0.0)
        self._reported = False
        #: The gateway is draining: close once the reply and turn in progress are done.
        self._draining = False
        #: Draining with a fleet: the session's hand-off to it.
        self._moving: asyncio.Task[None] | None = None
        #: A dialect that paces some of its frames (a phone call's reply audio) gets a clock.
        self._pacer = (
            Pacer(
                dialect,
                send=lambda frame: self._outbox.send_frame(frame),
                stopped=lambda: self._closing is not None,
                failed=lambda: self.fail(Failure.INTERNAL),
                name=session_id,
            )
            if isinstance(dialect, PacedDialect)
            else None
        )
        #: Responses delegation's backend rounds, for a dialect that hands work to the backend model.
        self._delegator = (
            Delegator(backend, dialect, delivered=self._delegated, name=session_id)
            if backend is not None and isinstance(dialect, DelegatingDialect)
            else None
        )
        self._outbox = Outbox(
            self.session,
            dialect,
            output=OutputStage(engine.capabilities.output_rate),
            journal=self._journal if self._resumes is not None else None,
            stats=self._stats,
            recorder=recorder,
            pacer=self._pacer,
        )
        self._reader = Reader(
            self,
            self.session,
            dialect,
            limits=limits,
            input_rate=engine.capabilities.input_rate,
            vad=vad,
            stats=self._stats,
            recorder=recorder,
            pacer=self._pacer,
        )
        #: semantic_vad's end-of-turn judgements.
        self._judge = TurnJudge(recent=self._reader.recent_audio, verdict=self._turn_judged, name=session_id)
        self._takeover = Takeover(
            self,
            self.session,
            dialect,
            resumes=self._resumes,
            outbox=self._outbox,
            reader=self._reader,
            metrics=self._metrics,
            stats=self._stats,
            send_timeout_s=limits.send_timeout_s,
            send_error=self.send_error,
        )

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def call_id(self) -> str | None:
        """The id of the call this session serves: a carrier's phone call, a WebRTC call (None: neither)."""
        call_id = getattr(self._dialect, "call_id", None)
        if call_id is None:
            call_id = getattr(getattr(self._dialect, "start", None), "call_id", None)
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

    @property
    def deadline(self) -> float:
        """The loop time the session reaches ``limits.max_session_s``."""
        return self._deadline

    def end(self, reason: str) -> None:
        """End the session from outside (a call hung up through the API): as if its client closed it."""
        if not self.session.closed:
            self.apply(
                self.session.receive(SessionClose(reason=reason), now=asyncio.get_running_loop().time())
            )

    async def observe(self, socket: Socket, control: Control | None = None) -> None:
        """Serve ``socket`` as an observer of this session until either ends (``control``: one that steers it)."""
        observers = self._outbox.observers
        if observers is None:
            limits = self._limits
            observers = self._outbox.observers = Observers(
                self.session_id,
                max_message_bytes=limits.max_message_bytes,
                send_queue_size=limits.send_queue_size,
                send_timeout_s=limits.send_timeout_s,
            )
        greeting = ev.SessionCreated(
            session_id=self.session_id,
            config=self.session.config,
            capabilities=self._engine.capabilities.as_pairs(),
        )
        await observers.serve(socket, greeting, self._ended, control)

    def can_replay_after(self, seq: int) -> bool:
        return self._journal.can_replay_after(seq)

    # -- lifetime -------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve the first socket; returns when it is done (the session may live on, detached)."""
        bind_session(self.session_id)
        self._stats.started_at = asyncio.get_running_loop().time()
        self._outbox.attachment = self._attach(self._first_socket)
        self._takeover.generation = 1
        self._deadline = asyncio.get_running_loop().time() + self._limits.max_session_s
        # The Realtime handshake opens the engine at once, so it is admitted now. The duplex
        # handshake is admitted when its session.update opens the engine: its first message
        # may be a session.resume, which takes over the parked session's slot instead.
        realtime = self.session.handshake is Handshake.REALTIME
        if realtime and not self._admit():
            await self._end_attachment()
            self._report_end()
            return
        await self._serve_socket(self._outbox.attachment, realtime=realtime)

    async def resume(self, socket: Socket, last_seq: int) -> None:
        """Attach ``socket`` to this session, replay what it missed, and serve it (see :class:`Takeover`)."""
        attachment = self._attach(socket)
        self.resume_token = self._takeover.take(attachment)
        await self._serve_socket(attachment, resumed_after=last_seq)

    async def carry_on(self, entries: Sequence[tuple[int, str | bytes]], head: int, config: str) -> bool:
        """Open this session as the one another gateway served until now, for :meth:`resume` to attach.

        Its journal goes on from ``head`` (``entries``: the events its client may still ask for), its engine
        session opens with its configuration, and this gateway writes its copy in the state store from now
        on (``config``: the frame that last told its client its configuration). False: no room, or no engine.
        """
        # The session's clock starts again here: its start on the other gateway is not kept.
        self._stats.started_at = now = asyncio.get_running_loop().time()
        self._deadline = now + self._limits.max_session_s
        self.session.carried_on()
        self._journal.carry_on(entries, head)
        self._outbox.carry_on(head)
        if not self._registry.try_admit(self.session_id, self):
            return False
        self._stats.admitted(self._metrics.labels(self.dialect_label))
        if not await self._open_engine(self.session.config):
            return False
        if self._outbox.mirror is not None:
            self._outbox.mirror.configured(config)
        return True

    async def _serve_socket(
        self, attachment: Attachment, *, realtime: bool = False, resumed_after: int | None = None
    ) -> None:
        """Read ``attachment`` until its time with the session ends (opening the engine first, or greeting a resumed client)."""
        outcome = Outcome.CLOSED
        try:
            if resumed_after is not None:
                self._takeover.greet(attachment, resumed_after)
                outcome = await self._reader.run(attachment)
            elif not realtime or await self._open_engine(self.session.config):
                self.apply(self.session.start())
                outcome = await self._reader.run(attachment)
        except Exception:  # a bug must cost this session only, never the server
            logger.exception("session %s failed", self.session_id)
            self.fail(Failure.INTERNAL)
        await self._after(outcome)

    async def _after(self, outcome: Outcome) -> None:
        if outcome is Outcome.REPLACED:
            await self._takeover.farewell()  # the session is another socket's now
            return
        if outcome is Outcome.HANDED_OVER:
            # Nothing was opened for this connection; the socket now belongs to another session.
            self._reported = True  # it never was a session of its own
            self._recorder.closed("handed_over", None, self.session.config)
            await self._stop_attachment()
            await self._release()
            return
        if outcome is Outcome.DROPPED and self._resumable():
            await self._stop_attachment()
            if self._outbox.attachment is not None:
                return  # the client came back while the old socket was being let go
            self._takeover.park(self._limits.resume_grace_s)
            self._grace = asyncio.create_task(self._await_resume(), name=f"grace:{self.session_id}")
            return
        await self._end_attachment()
        await self._release()
        await self._await_stalled_close()

    async def _await_stalled_close(self) -> None:
        stalled, self._stalled = self._stalled, None
        if stalled is not None:
            await stalled.await_stalled_close(self._limits.send_timeout_s)

    def _resumable(self) -> bool:
        return (
            self._resumes is not None
            and self.session.configured
            and not self.session.closed
            and self._closing is None
            and self._link is not None
        )

    async def _await_resume(self) -> None:
        if not await self._takeover.await_return(self._limits.resume_grace_s, self._deadline, self._ended):
            self.expire(Failure.RESUME_TIMEOUT, "the client did not come back")
            await self._release()

    async def hand_over(self, command: SessionResume) -> bool:
        """Give this socket to the detached session ``command`` names; False if refused."""
        return await self._takeover.hand_over(command)

    async def shut_down(self) -> None:
        """Close this session because the gateway is stopping (1001); a detached one goes to the fleet if it can."""
        if self._outbox.attachment is None and await self._takeover.let_go():
            await self._release()  # its client resumes it on another gateway
            return
        self.apply(self.session.shut_down())
        if self._outbox.attachment is None:  # detached: nobody to tell
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
        if self._outbox.attachment is None:
            return  # detached: the gateway closes it at once
        if self.session.handshake is Handshake.DUPLEX or CLOSING_EVENT in self.session.config.include:
            self._outbox.emit_raw(
                ev.SessionClosing(reason="server_shutdown", grace_s=grace_s), observed=False
            )
        self._drain_step()

    def _drain_step(self) -> None:
        """Draining: close as soon as no reply is in progress and the caller is not mid-turn."""
        session = self.session
        if (
            session.closed
            or self._closing is not None
            or session.response_active
            or self._stats.caller_speaking
            or self._moving is not None
        ):
            return
        if self._takeover.movable:
            self._moving = asyncio.create_task(self._move(), name=f"move:{self.session_id}")
            return
        self.apply(session.shut_down())

    async def _move(self) -> None:
        """Hand the session to the fleet, then tell its client to resume it there (1012)."""
        if await self._takeover.let_go():
            self._close_socket(close_for(Failure.MOVED))
        elif not self.session.closed:
            self.apply(self.session.shut_down())

    def _admit(self) -> bool:
        """Take an admission slot, or refuse the session with ``session_limit`` (``server_shutting_down``)."""
        if self._registry.try_admit(self.session_id, self):
            self._stats.admitted(self._metrics.labels(self.dialect_label))
            return True
        if self._registry.draining:
            self.fail(Failure.GATEWAY_DRAINING, "the gateway is shutting down; connect again")
            return False
        self.fail(
            Failure.GATEWAY_FULL,
            f"the gateway is at its limit of {self._registry.max_sessions} sessions; try again later",
        )
        return False

    # -- failures -------------------------------------------------------------------------

    def fail(self, failure: Failure, message: str = "", *, param: str | None = None) -> None:
        """Tell the client ``failure`` and close, as the failure table says."""
        verdict = FAILURES[failure]
        if verdict.error is not None:
            self._outbox.emit(ev.ErrorEvent(code=verdict.error, message=message, param=param))
        if verdict.close is not None:
            self._close_socket(close_for(failure))

    def send_error(self, exc: ProtocolError) -> None:
        """Answer a ProtocolError with its error event (and close, where the failure table says so)."""
        self._outbox.emit(
            ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param)
        )
        failure = protocol_failure(exc)
        if FAILURES[failure].close is not None:
            self._close_socket(close_for(failure))  # nothing more is heard from it

    def expire(self, failure: Failure, message: str) -> None:
        """The host ends the session for ``failure`` (idle, too long, not resumed); the session says why."""
        close = close_for(failure)
        self.apply(self.session.expire(close.reason, close.code, message))

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
        attachment = self._outbox.attachment
        if attachment is None or not attachment.stalled:
            return  # a socket the session was taken from: nobody reads it, and nobody needs to
        # The client stopped reading: nothing more can reach it, so close at once.
        logger.warning("session %s closed: the client did not read its events", self.session_id)
        self._closing = close_for(Failure.SLOW_CONSUMER)
        attachment.close_stalled(self._closing)
        self._stalled = attachment
        self._reader.stop()

    async def _stop_attachment(self) -> None:
        """Let go of the socket without closing it (it dropped, or it now serves another session)."""
        attachment, self._outbox.attachment = self._outbox.attachment, None
        if attachment is not None:
            await attachment.finish(None, self._limits.send_timeout_s)

    async def _end_attachment(self) -> None:
        """Flush what is queued and close the socket with the session's close code."""
        attachment, self._outbox.attachment = self._outbox.attachment, None
        if attachment is not None and not attachment.stalled:
            close = self._closing or close_for(Failure.DISCONNECTED)
            await attachment.finish(close, self._limits.send_timeout_s)

    def _close_socket(self, close: Close) -> None:
        if self._closing is not None:
            return
        self._closing = close
        if self._resumes is not None:
            # A session on its way out is not taken over, attached or not.
            self._resumes.unpark(self)
        attachment = self._outbox.attachment
        if attachment is None:
            # Detached: the session ended on its own (engine, shutdown); stop waiting for a resume.
            if not self._ended.is_set():
                self._releasing = asyncio.get_running_loop().create_task(
                    self._release(), name=f"release:{self.session_id}"
                )
            return
        attachment.close_after(close)

    async def _release(self) -> None:
        """End the session for good: the engine session, the pump, the admission slot."""
        if self._ended.is_set():
            return
        self._ended.set()
        if self._resumes is not None:
            self._resumes.unpark(self)
            self._takeover.unmirror()
        if self._timer is not None:
            self._timer.cancel()
        if self._pacer is not None:
            self._pacer.cancel()
        if self._delegator is not None:
            await self._delegator.close()
        await self._judge.close()
        if self._outbox.observers is not None:
            self._outbox.observers.close_all("call_ended")
        link, self._link = self._link, None
        if link is not None:
            await link.close()
            self._reader.forget_updates()
            reason = self._closing.reason if self._closing else "disconnected"
            try:
                with self._metrics.timed_call("close_session"):
                    async with asyncio.timeout(self._limits.engine_timeout_s):
                        await link.engine_session.close(reason)
            except Exception:
                logger.exception("closing engine session %s failed", self.session_id)
        self._stop_taking_at_once()
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
        client = self._reader.client_close or ("client_closed", None)
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

    async def open_engine(self, config: SessionConfig) -> None:
        """Admit the session and open its engine session with ``config`` (the duplex handshake's first update)."""
        if self._admit() and await self._open_engine(config):
            self.apply(self.session.engine_opened())

    async def _open_engine(self, config: SessionConfig) -> bool:
        try:
            with self._metrics.timed_call("open_session"):
                async with asyncio.timeout(self._limits.engine_timeout_s):
                    engine_session = await self._engine.open_session(self.session_id, config)
        except Exception as exc:
            refused = engine_open_failure(exc)
            if refused is None:
                raise
            self.fail(*refused)
            return False
        rate = self._engine.capabilities.input_rate
        self._link = EngineLink(
            engine_session,
            timeout_s=self._limits.engine_timeout_s,
            on_error=self._engine_call_failed,
            on_done=self._reader.update_answered,
            high_water_bytes=rate * 2 * ENGINE_BACKLOG_MS // 1000,
            name=self.session_id,
            metrics=self._metrics,
        )
        self._pump = asyncio.create_task(self._pump_engine(engine_session), name=f"pump:{self.session_id}")
        if self._resumes is not None:
            # Resumable from now on, even before this socket is seen to drop.
            self._resumes.attach(self)
            self._takeover.mirror()
        return True

    async def engine_caught_up(self) -> None:
        """Return once the engine link holds no more caller audio than its high water mark."""
        link = self._link
        if link is not None and link.backlogged:
            await link.drained()

    def _engine_call_failed(self, call: EngineCall, exc: BaseException) -> None:
        if isinstance(call, UpdateEngine):
            self._reader.update_refused(call, exc)
        else:
            self.fail(*engine_call_failure(exc))

    async def _pump_engine(self, engine_session: port.EngineSession) -> None:
        loop = asyncio.get_running_loop()
        events = engine_session.events()
        if isinstance(events, EngineEventStream):
            # Most events then reach the session in the engine's own task, as they are made:
            # no wake-up of this task per reply chunk.
            self._at_once = events
            events.take_at_once(self._take_engine_event)
        try:
            async for event in events:
                self.apply(self.session.engine_event(event, now=loop.time()))
                if isinstance(event, port.EngineClosed):
                    return
        except Exception:
            logger.exception("engine event stream of session %s failed", self.session_id)
            self._engine_events_failed()
        finally:
            self._stop_taking_at_once()

    def _take_engine_event(self, event: port.EngineEvent) -> bool:
        """Take an engine event where the engine puts it, unless that would interleave with a step.

        An engine may make events inside a call the session is making (an append made at once,
        within a step's outputs; any call on the link's task, whose answer comes after it):
        those wait for the pump, behind the step, as every event used to.
        """
        link = self._link
        if self._stepping or (link is not None and link.calling):
            return False
        try:
            self.apply(self.session.engine_event(event, now=asyncio.get_running_loop().time()))
        except Exception:
            logger.exception("engine event of session %s failed", self.session_id)
            self._stop_taking_at_once()
            self._engine_events_failed()
        return True

    def _stop_taking_at_once(self) -> None:
        stream, self._at_once = self._at_once, None
        if stream is not None:
            stream.take_at_once(None)

    def _engine_events_failed(self) -> None:
        # A fatal engine error: the session closes (4003), as for an engine that ended it.
        self.apply(
            self.session.engine_event(
                port.EngineError(code="engine_error", message="the engine event stream failed", fatal=True)
            )
        )

    # -- executing what the session decided ------------------------------------------------

    def apply(self, outputs: Sequence[Output]) -> None:
        """Carry out one step's outputs, in order, without waiting for any of them."""
        outer, self._stepping = self._stepping, True
        try:
            self._apply(outputs)
        finally:
            self._stepping = outer

    def _apply(self, outputs: Sequence[Output]) -> None:
        for output in outputs:
            if isinstance(output, ev.ServerEvent):
                self._outbox.emit(output)
            elif isinstance(output, ProcessInput):
                self._reader.pending_input.append(output)
            elif isinstance(output, OpenEngine):
                self._reader.pending_open = output.config
            elif isinstance(output, CloseSession):
                self._close_socket(Close(output.code, output.reason))
            elif isinstance(output, AcknowledgeEvents):
                self._acknowledge(output.server_event_seq)
            elif isinstance(output, ReportLatency):
                self._stats.latency(output)
            elif isinstance(output, AssessTurn):
                self._judge.assess(output)
            else:
                self._call_engine(output)
        if self._pacer is not None:
            loop = asyncio.get_running_loop()
            for command in self._pacer.take_commands():
                self.apply(self.session.receive(command, now=loop.time()))
        self._schedule_timer()
        if self._delegator is not None:
            self._delegator.poll()
        if self._draining:
            self._drain_step()

    def _turn_judged(self, call: AssessTurn, probability: float | None, model_ms: float) -> None:
        """The end-of-turn model's verdict on the caller's silence."""
        if self._closing is not None or self._ended.is_set():
            return
        silence = call.candidate.audio_end_ms - call.candidate.speech_end_ms
        logger.debug(
            "session %s: end-of-turn model after %d ms of silence: %s in %.0f ms",
            self.session_id,
            silence,
            "failed" if probability is None else f"{probability:.2f}",
            model_ms,
        )
        try:
            self.apply(self.session.turn_assessed(call, probability, model_ms))
        except Exception:  # a bug must cost this session only
            logger.exception("end-of-turn verdict of session %s failed", self.session_id)
            self.fail(Failure.INTERNAL)

    def delegate(self) -> None:
        """Start the backend rounds a client frame asked for (a delegation resumed)."""
        if self._delegator is not None:
            self._delegator.poll()

    def _delegated(self) -> None:
        """The backend streamed something: the dialect's frames go out, its commands to the session."""
        if self._closing is not None or self._ended.is_set():
            return
        if self._pacer is not None:
            self._pacer.pump_soon()
        try:
            self.apply(())
        except Exception:  # a bug must cost this session only
            logger.exception("delegated work of session %s failed", self.session_id)
            self.fail(Failure.INTERNAL)

    def _acknowledge(self, seq: int) -> None:
        try:
            self._outbox.acknowledge(seq)
        except ProtocolError as exc:
            self.send_error(exc)

    def _call_engine(self, call: EngineCall) -> None:
        link = self._link
        if link is None:
            if isinstance(call, UpdateEngine):  # no engine session to refuse it
                self.apply(self.session.engine_updated(call))
            return
        if isinstance(call, CommitInput):
            # The resampler holds back the last few ms of the turn; the engine needs them now. Not at
            # a pause: the caller goes on, and a flush there would end the filter's stream mid-turn,
            # leaving a step in the audio of every turn the caller paused in (the early
            # transcription a pause starts can do without the few ms of quiet still held back).
            tail = self._reader.flush_input()
            if tail:
                self._recorder.caller_audio(tail)
                link.submit(AppendAudio(pcm=tail))
        if isinstance(call, UpdateEngine):
            self._reader.update_sent()
        link.submit(call)

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
            self.apply(self.session.tick(asyncio.get_running_loop().time()))
        except Exception:  # a bug must cost this session only
            logger.exception("timer of session %s failed", self.session_id)
            self.fail(Failure.INTERNAL)


def _backchannel_rule(settings: GatewaySettings) -> BackchannelRule:
    """The gateway's ``session.backchannels`` as the rule sessions hold replies by."""
    b = settings.session.backchannels
    return BackchannelRule(
        policy=OverlapPolicy(b.policy),
        barge_in_ms=b.barge_in_ms,
        settle_ms=b.settle_ms,
        max_hold_ms=b.max_hold_ms,
    )
