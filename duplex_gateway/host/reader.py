"""The read loop: one socket's messages into the session, one at a time, in the order they were sent.

A frame is read, parsed by the connection's dialect, decided on by the session, and
its outputs carried out, all in one go; then the reader does what that step left for
it (caller audio to convert, an engine to open) before it takes the next frame.
Keepalive pings and the hard frame-size limit are the server's (uvicorn); the idle
timeout and the maximum session duration are watched here.

The client's events are answered in the order it sent them, as OpenAI's server
answers them: after a ``session.update`` the reader takes the next message only
once the engine has answered the update (bounded; see :meth:`Reader.settle_updates`).

Input backpressure: the reader takes the next message from the socket only after
the previous one has gone through the input stage, and, while more caller audio is
waiting for the engine than the link's high water mark, only once the engine has
caught up. Meanwhile the server's WebSocket layer stops reading the TCP socket, so a
client that sends faster than the session can take its audio is slowed down by TCP
itself and no audio is dropped. The caller audio a session holds on its way in is
therefore one message (at most ``limits.max_message_bytes``; a long one is converted
in slices of :data:`INPUT_SLICE_MS`), what the link holds (at most its high water
mark plus one message), and what the WebSocket layer buffers: the frame it is
assembling (at most ``limits.hard_max_message_bytes``) and the rest of one TCP read.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio.stage import InputStage
from duplex_gateway.audio.vad_batch import VadBatcher
from duplex_gateway.config import LimitSettings
from duplex_gateway.dialects.base import Dialect
from duplex_gateway.host.closing import Failure, update_refusal
from duplex_gateway.host.pacing import Pacer
from duplex_gateway.host.read_deadline import ReadDeadline
from duplex_gateway.host.transport import Attachment
from duplex_gateway.ops.recording import Recorder
from duplex_gateway.ops.session_stats import SessionStats
from duplex_gateway.session.machine import EngineCall, Output, ProcessInput, Session, UpdateEngine
from duplex_gateway.vocabulary.commands import Command, SessionResume
from duplex_gateway.vocabulary.errors import ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetectionMode

__all__ = ["INPUT_SLICE_MS", "Outcome", "Reader", "ReaderHost"]

#: Caller audio goes through the input stage in pieces of at most this much, so a long
#: append is turn-detected as finely as streamed audio and converted with small buffers.
INPUT_SLICE_MS = 100
#: The caller audio the end-of-turn model hears: its whole window (Smart Turn's 8 s).
TURN_MODEL_MS = 8_000.0


def _duration(seconds: float) -> str:
    """``seconds`` in OpenAI's words for a session's maximum duration (``60 minutes``)."""
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} seconds"


class Outcome(enum.Enum):
    """How a socket's time with a session ended."""

    CLOSED = "closed"  # the session is over
    DROPPED = "dropped"  # the client vanished; the session may be resumed
    HANDED_OVER = "handed_over"  # the socket now serves a resumed session
    REPLACED = "replaced"  # a resume took the session over from this socket


class ReaderHost(Protocol):
    """What the reader asks of the connection it reads for."""

    @property
    def closed_by_server(self) -> bool:
        """The session is closing: no more messages are read."""
        ...

    @property
    def deadline(self) -> float:
        """The loop time the session reaches its maximum duration."""
        ...

    def apply(self, outputs: Sequence[Output]) -> None:
        """Carry out one step's outputs."""
        ...

    def send_error(self, exc: ProtocolError) -> None:
        """Answer what the client sent with an error (and close, where the failure table says so)."""
        ...

    def fail(self, failure: Failure, message: str, *, param: str | None = None) -> None:
        """Tell the client ``failure`` and close, as the failure table says."""
        ...

    def expire(self, failure: Failure, message: str) -> None:
        """End the session for ``failure`` (idle, too long), saying why."""
        ...

    def delegate(self) -> None:
        """Start the delegated work a client frame asked for (Responses delegation's next round)."""
        ...

    async def hand_over(self, command: SessionResume) -> bool:
        """Give this socket to the session ``command`` resumes; False if that was refused."""
        ...

    async def open_engine(self, config: SessionConfig) -> None:
        """Admit the session and open its engine session with ``config``."""
        ...

    async def engine_caught_up(self) -> None:
        """Return once the engine has taken the caller audio held for it down to its high water mark."""
        ...


class Reader:
    """Reads the session's current socket, and does the work each step leaves for it before the next."""

    def __init__(
        self,
        host: ReaderHost,
        session: Session,
        dialect: Dialect,
        *,
        limits: LimitSettings,
        input_rate: int,
        vad: VadBatcher | None,
        stats: SessionStats,
        recorder: Recorder,
        pacer: Pacer | None,
    ) -> None:
        self._host = host
        self._session = session
        self._dialect = dialect
        self._limits = limits
        self._input_rate = input_rate
        self._vad = vad
        #: Caller audio's way in: decode, resample to ``input_rate``, turn detection.
        self._input: InputStage | None = None
        self._stats = stats
        self._recorder = recorder
        self._pacer = pacer
        #: The task reading the socket now.
        self.task: asyncio.Task[object] | None = None
        #: Whether it was told to stop (a stalled client).
        self._stopped = False
        #: Readers of sockets a resume took the session from, with their attachments.
        self.superseded: dict[asyncio.Task[object], Attachment] = {}
        #: How the client ended it, when it did (its close code, and whether it meant to).
        self.client_close: tuple[str, int] | None = None
        # Work the last step left for the reader: audio to convert, an engine to open.
        self.pending_input: list[ProcessInput] = []
        self.pending_open: SessionConfig | None = None
        # session.update calls the engine has not answered yet; the reader holds the client's
        # next event until they are settled (see settle_updates).
        self._updates_pending = 0
        self._updates_settled = asyncio.Event()
        self._updates_settled.set()

    # -- what the rest of the connection tells it ---------------------------------------------

    def update_sent(self) -> None:
        """A ``session.update`` went to the engine: the next client event waits for its answer."""
        self._updates_pending += 1
        self._updates_settled.clear()

    def update_answered(self, call: EngineCall) -> None:
        """The engine took ``call``; a ``session.update``'s answer lets the client's next event go."""
        if isinstance(call, UpdateEngine):
            self._host.apply(self._session.engine_updated(call))
            self._update_settled()

    def update_refused(self, call: UpdateEngine, exc: BaseException) -> None:
        """The engine failed a ``session.update``: the session tells the client, and its next event goes."""
        code, message = update_refusal(exc, self._limits.engine_timeout_s)
        self._host.apply(self._session.engine_update_refused(call, code=code, message=message))
        self._update_settled()

    def _update_settled(self) -> None:
        self._updates_pending = max(0, self._updates_pending - 1)
        if not self._updates_pending:
            self._updates_settled.set()

    def forget_updates(self) -> None:
        """The engine link is gone with the calls still queued: nothing waits for their answers."""
        self._updates_pending = 0
        self._updates_settled.set()

    def recent_audio(self) -> npt.NDArray[np.float32]:
        """The caller's latest audio at 16 kHz, as the input stage kept it for the end-of-turn model."""
        return self._input.recent() if self._input is not None else np.zeros(0, dtype=np.float32)

    def flush_input(self) -> bytes:
        """The engine-rate audio the input stage still holds back (the end of a turn)."""
        return self._input.flush() if self._input is not None else b""

    def supersede(self, attachment: Attachment) -> None:
        """A resume took the session over: stop reading ``attachment``, whose client may never speak again."""
        task = self.task
        if task is not None:
            self.superseded[task] = attachment
            task.cancel()

    def stop(self) -> None:
        """Stop reading (a client that stopped reading): it may be waiting for a message that never comes."""
        task = self.task
        if task is not None and task is not asyncio.current_task() and not self._stopped:
            self._stopped = True
            task.cancel()

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self, attachment: Attachment) -> Outcome:
        """Read ``attachment``'s socket until the session closes, the client goes, or the socket changes hands."""
        reader = asyncio.current_task()
        self.task = reader
        try:
            return await self._read_messages(attachment)
        except asyncio.CancelledError:
            if reader is not None and reader in self.superseded and reader.cancelling() == 1:
                # Stopped by a resume that took the session over: the session goes on.
                reader.uncancel()
                return Outcome.REPLACED
            # Stopped by stop(), not by anyone above: the session is over.
            if reader is not None and self._stopped and reader.cancelling() == 1:
                reader.uncancel()
                return Outcome.CLOSED
            raise
        finally:
            if self.task is reader:
                self.task = None

    async def _read_messages(self, attachment: Attachment) -> Outcome:
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(task, self._limits.idle_timeout_s, lambda: self._host.deadline)
        try:
            return await self._read_until_done(attachment, deadline)
        finally:
            deadline.close()

    async def _read_until_done(self, attachment: Attachment, deadline: ReadDeadline) -> Outcome:
        host, session = self._host, self._session
        loop = asyncio.get_running_loop()
        idle = self._limits.idle_timeout_s
        first = True
        while not host.closed_by_server:
            deadline.begin()
            try:
                message = await attachment.socket.receive()
            except asyncio.CancelledError:
                if not deadline.expired():
                    raise
                if loop.time() >= host.deadline:
                    host.expire(Failure.MAX_DURATION, f"of {_duration(self._limits.max_session_s)}.")
                else:
                    host.expire(Failure.IDLE, f"no message from the client for {idle:g} s")
                return Outcome.CLOSED
            finally:
                deadline.end()
            if message["type"] == "websocket.disconnect":
                # A client that closes on purpose (1000, 1001) is done; anything else is a dropped
                # connection whose client may come back with session.resume.
                code = message.get("code", 1006)
                purposeful = code in (1000, 1001)
                self.client_close = ("client_closed" if purposeful else "client_dropped", code)
                return Outcome.CLOSED if purposeful else Outcome.DROPPED
            frame: Frame | None = message.get("text")
            if frame is None:
                frame = message.get("bytes", b"")
            self._stats.frame_in(frame)
            if self._pacer is not None:
                self._pacer.clock(loop.time())
            try:
                commands: Sequence[Command] = self._dialect.parse(frame)
            except ProtocolError as exc:
                self._recorder.client_command(frame, (), session.config.input_format)
                host.send_error(exc)
                continue
            self._recorder.client_command(frame, commands, session.config.input_format)
            if self._pacer is not None and self._pacer.wants_pump:
                self._pacer.pump_soon()  # e.g. the carrier takes audio again after a pause
            host.delegate()
            waited = 0.0
            for command in commands:
                if isinstance(command, SessionResume) and first and not session.configured:
                    if await host.hand_over(command):
                        return Outcome.HANDED_OVER
                    continue
                first = False
                host.apply(session.receive(command, now=loop.time()))
                began = loop.time()
                await self._finish_step()
                waited += loop.time() - began
            self._stats.input_wait(waited)
        return Outcome.CLOSED

    async def _finish_step(self) -> None:
        """Do what the last step left for the reader, which waits for it: the input stage, an engine to open."""
        if self.pending_open is not None:
            config, self.pending_open = self.pending_open, None
            await self._host.open_engine(config)
        while self.pending_input:
            await self._process_input(self.pending_input.pop(0))
        if self._updates_pending:
            await self.settle_updates()
        await self._host.engine_caught_up()

    async def settle_updates(self) -> None:
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
            self._host.fail(
                Failure.ENGINE_UPDATE_UNANSWERED,
                f"the engine has not answered the session update in {bound:g} s; "
                "the events sent after it are handled before it",
                param="session",
            )

    async def _process_input(self, chunk: ProcessInput) -> None:
        host = self._host
        stage = self._input_stage(chunk.format)
        audio = chunk.audio
        step = stage.wire.byte_count(INPUT_SLICE_MS)
        for offset in range(0, len(audio), step):
            try:
                processed = await stage.process(audio[offset : offset + step])
            except ProtocolError as exc:
                host.send_error(exc)
                return
            self._recorder.caller_audio(processed.pcm)
            # The chunk's camera frames were taken while it was spoken: they ride its last slice.
            last = offset + step >= len(audio)
            host.apply(
                self._session.input_processed(
                    processed.pcm,
                    processed.duration_ms,
                    processed.windows,
                    is_speech=chunk.is_speech,
                    hints=chunk.hints,
                    now=asyncio.get_running_loop().time(),
                    video_frames=chunk.video_frames if last else (),
                )
            )
            if host.closed_by_server:
                return

    def _input_stage(self, chunk_format: AudioFormat | None) -> InputStage:
        """The stage for audio in ``chunk_format`` (the session's input format when None).

        A chunk in a format of its own (vLLM-Omni's per-chunk ``format``) gets a stage
        of its own, placed on the same input clock.
        """
        wire, vad = chunk_format or self._session.config.input_format, self._session.gateway_vad
        td = self._session.config.turn_detection
        # semantic_vad's end-of-turn model hears the caller's latest seconds.
        recent_ms = (
            TURN_MODEL_MS if vad and td is not None and td.mode is TurnDetectionMode.SEMANTIC_VAD else 0.0
        )
        current = self._input
        if current is None or current.wire != wire or current.vad != vad or current.recent_ms != recent_ms:
            current = self._input = InputStage(
                wire,
                self._input_rate,
                vad=(self._vad or VadBatcher.shared()) if vad else None,
                start_ms=current.position_ms if current is not None else 0.0,
                recent_ms=recent_ms,
            )
        return current
