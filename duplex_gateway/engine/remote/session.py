"""One gateway session on one backend WebSocket (the I/O around :class:`BackendWire`).

:func:`open_backend_session` connects to the backend's ``/v1/realtime?duplex=1``,
sends ``session.update`` and waits for ``session.created``. The
:class:`RemoteSession` then sends what port calls translate to and runs one reader
task that turns the backend's events into port events, acknowledging each
``server_event_seq`` (``session.event_ack``) so the backend can trim the journal
it keeps for resume.

When the socket drops without a close we asked for, the session tries
``session.resume`` on the same backend (within ``resume_timeout_s``, with the
``resume_token`` of ``session.created``); what port calls send meanwhile is held
and sent once resumed. A backend that refuses connections is gone: the session
reports a fatal :class:`port.EngineError` at once and the backend is marked down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from duplex_gateway.engine import port
from duplex_gateway.engine.event_queue import EngineEventQueue
from duplex_gateway.engine.remote.pool import Backend, realtime_url
from duplex_gateway.engine.remote.protocol import (
    FULL_CODES,
    RESUME_REFUSED_CODES,
    BackendKind,
    BackendWire,
    JsonObject,
    detect_kind,
    error_fields,
)
from duplex_gateway.engine.updates import PendingUpdates
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = ["BackendFull", "BackendRefused", "RemoteSession", "SessionOptions", "open_backend_session"]

logger = logging.getLogger(__name__)

_EVENT_QUEUE_SIZE = 1024
#: Largest backend frame accepted (a long reply chunk as base64 is well below this).
MAX_FRAME_BYTES = 64 << 20
#: Client events held while a dropped socket is being resumed, by count and by bytes.
_HELD_EVENTS = 2048
_HELD_BYTES = 16 << 20
#: For this long after a drop, a resume refused as if the session were not detached is retried.
_RESUME_RETRY_S = 1.0
_RESUME_EARLY_CODES = frozenset({"invalid_resume_token", "session_resume_conflict"})
#: How long ``close`` waits for the backend's ``session.closed``.
_CLOSE_WAIT_S = 2.0
#: How long a reply waits for the backend to announce a function's output.
_OUTPUT_TAKEN_TIMEOUT_S = 5.0
#: Caller input held for the backend's reply to end goes anyway once the backend has been
#: silent this long (a reply in progress streams; one done waits only for its playback).
_INPUT_HOLD_QUIET_S = 5.0


class BackendRefused(Exception):
    """The backend could not be reached, or it refused the session for another reason than room."""


class BackendFull(BackendRefused):
    """The backend answered the open with ``session_limit`` / ``resource_exhausted``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOptions:
    """The engine-wide settings every remote session uses."""

    input_rate: int
    output_rate: int
    connect_timeout_s: float = 3.0
    handshake_timeout_s: float = 5.0
    resume: bool = True
    resume_timeout_s: float = 5.0
    ping_interval_s: float | None = 20.0
    ping_timeout_s: float | None = 20.0
    #: A session that sent nothing for this long sends ``session.heartbeat`` (the backends
    #: count a connection silent for their idle timeout, 300 s by default, as dropped).
    heartbeat_interval_s: float = 30.0


def _headers(backend: Backend) -> dict[str, str]:
    return {"Authorization": f"Bearer {backend.spec.api_key}"} if backend.spec.api_key else {}


async def _connect(backend: Backend, options: SessionOptions, timeout_s: float) -> ClientConnection:
    return await connect(
        realtime_url(backend.url),
        open_timeout=timeout_s,
        close_timeout=2.0,
        max_size=MAX_FRAME_BYTES,
        ping_interval=options.ping_interval_s,
        ping_timeout=options.ping_timeout_s,
        additional_headers=_headers(backend),
        compression=None,  # base64 PCM hardly compresses; deflate would cost CPU per frame
    )


def _dumps(event: Mapping[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def _loads(raw: str | bytes) -> JsonObject | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def open_backend_session(
    backend: Backend,
    session_id: str,
    config: SessionConfig,
    options: SessionOptions,
    *,
    on_end: Callable[[RemoteSession], None],
) -> RemoteSession:
    """Open a session on ``backend``: connect, ``session.update``, wait for ``session.created``.

    Raises :class:`BackendFull` or :class:`BackendRefused`. Cancellation closes the socket.
    """
    try:
        ws = await _connect(backend, options, options.connect_timeout_s)
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
        raise BackendRefused(f"cannot connect to {backend.url}: {exc or type(exc).__name__}") from exc
    try:
        wire = BackendWire(
            kind=BackendKind.VLLM_OMNI, input_rate=options.input_rate, output_rate=options.output_rate
        )
        # A full gateway refuses before it reads anything: its error is already queued.
        with contextlib.suppress(ConnectionClosed):
            opening = wire.session_update(config, initial=True)
            assert opening is not None
            await ws.send(_dumps(opening))
        created = await _await_created(ws, backend, options.handshake_timeout_s)
    except BaseException:
        await _abort(ws)
        raise
    wire.kind = detect_kind(created)
    return RemoteSession(backend, session_id, ws, wire, created, options, on_end=on_end)


async def _await_created(ws: ClientConnection, backend: Backend, timeout_s: float) -> JsonObject:
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                event = _loads(await ws.recv())
                if event is None:
                    continue
                kind = event.get("type")
                if kind == "session.created":
                    return event
                if kind == "error":
                    code, message, _ = error_fields(event)
                    cls = BackendFull if code in FULL_CODES else BackendRefused
                    raise cls(f"{backend.url} refused the session: {code}: {message}")
    except TimeoutError:
        raise BackendRefused(f"{backend.url} sent no session.created within {timeout_s:g} s") from None
    except ConnectionClosed as exc:
        raise BackendRefused(f"{backend.url} closed the connection during the handshake ({exc})") from exc


async def _abort(ws: ClientConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(), 2.0)


class RemoteSession(port.EngineSession):
    """One gateway session held by one backend session."""

    def __init__(
        self,
        backend: Backend,
        session_id: str,
        ws: ClientConnection,
        wire: BackendWire,
        created: Mapping[str, Any],
        options: SessionOptions,
        *,
        on_end: Callable[[RemoteSession], None],
    ) -> None:
        self.backend = backend
        self.session_id = session_id
        self._ws = ws
        self._wire = wire
        self._options = options
        self._on_end = on_end
        session = created.get("session")
        session = session if isinstance(session, Mapping) else {}
        backend_id = created.get("session_id") or session.get("id") or session.get("session_id")
        #: The backend's own id for this session.
        self.backend_session_id: str | None = backend_id if isinstance(backend_id, str) else None
        token = created.get("resume_token")
        self._resume_token: str | None = token if isinstance(token, str) and token else None
        self._last_seq = 0
        self._events = EngineEventQueue(_EVENT_QUEUE_SIZE)
        #: Client events held while the socket is being resumed.
        self._held: deque[str] | None = None
        self._held_bytes = 0
        self._closing = False
        self._ended = False
        self._backend_closed = asyncio.Event()
        #: Set after every backend event handled (what a wait for an announcement wakes on).
        self._received = asyncio.Event()
        self._updates = PendingUpdates()
        self._last_sent = asyncio.get_running_loop().time()
        self._last_received = self._last_sent
        #: One batch of events goes out whole: the reader's (held input released) and the
        #: port calls' must not interleave, or a commit could overtake its turn's audio.
        self._send_lock = asyncio.Lock()
        #: Sends held caller input should the backend go quiet (see :meth:`_release_stuck_input`).
        self._input_watch: asyncio.Task[None] | None = None
        #: The liveness check running now (see :meth:`watch_liveness`).
        self._liveness: asyncio.Task[bool] | None = None
        self._reader = asyncio.create_task(self._read_loop(), name=f"remote-reader:{session_id}")

    @property
    def kind(self) -> BackendKind:
        return self._wire.kind

    @property
    def resumable(self) -> bool:
        return self._options.resume and self._resume_token is not None and self.backend_session_id is not None

    # -- port calls -------------------------------------------------------------------------

    async def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> None:
        if pcm:
            await self._send(
                self._wire.append_audio(pcm, is_speech=is_speech, hints=hints, video_frames=video_frames)
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
        await self._send(
            self._wire.commit(
                item_id=item_id,
                response_id=response_id,
                final=final,
                engine_decides=engine_decides,
                is_speech=is_speech,
            )
        )

    async def cancel_input(self) -> None:
        await self._send(self._wire.cancel_input())

    async def append_text(self, text: str) -> None:
        await self._send(self._wire.append_text(text))

    async def signal_turn(self, event: str, payload: Mapping[str, object]) -> None:
        await self._send(self._wire.signal_turn(event, payload))

    async def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        await self._send(
            self._wire.add_item(
                item_id=item_id, role=role, text=text, previous_item_id=previous_item_id, images=images
            )
        )

    async def add_function_call(
        self, *, item_id: str, call_id: str, name: str, arguments: str, previous_item_id: str | None = None
    ) -> None:
        await self._send(
            self._wire.add_function_call(
                item_id=item_id,
                call_id=call_id,
                name=name,
                arguments=arguments,
                previous_item_id=previous_item_id,
            )
        )

    async def add_function_output(
        self, *, item_id: str, call_id: str, output: str, previous_item_id: str | None = None
    ) -> None:
        await self._send(
            self._wire.add_function_output(
                item_id=item_id, call_id=call_id, output=output, previous_item_id=previous_item_id
            )
        )

    async def delete_item(
        self, item_id: str, *, response_id: str | None = None, call_id: str | None = None
    ) -> None:
        await self._send(self._wire.delete_item(item_id))

    async def clear_input(self) -> None:
        await self._send(self._wire.clear_input())

    async def create_response(
        self, *, response_id: str, instructions: str | None, options: port.ResponseOptions | None = None
    ) -> None:
        refusal = self._wire.reply_refusal(options)
        if refusal is not None:
            if self._ended or self._closing:
                return  # the session is over: nobody reads its events any more
            # Nothing goes to the backend: the reply ends here, failed, and the client is told why.
            await self._events.put(port.EngineError(code="unsupported_by_engine", message=refusal))
            await self._events.put(
                port.EngineResponseDone(
                    response_id=response_id, status="failed", reason="unsupported_by_engine"
                )
            )
            return
        await self._outputs_taken()
        await self._send(
            self._wire.create_response(response_id=response_id, instructions=instructions, options=options)
        )

    async def cancel_response(self, response_id: str) -> None:
        wire = self._wire.cancel_response(response_id)
        self._take_back(lambda stopped: stopped == response_id)
        await self._send(wire)

    async def barge_in(self) -> None:
        wire = self._wire.barge_in()
        self._take_back(lambda stopped: True)  # a barge-in stops every reply
        await self._send(wire)

    def _take_back(self, stopped: Callable[[str], bool]) -> None:
        """Take a stopped reply's output that the reader has not read yet back out of the queue.

        The translator drops what the backend still says of a reply once it is stopped; what it
        had translated before is already queued, and would reach the gateway after the stop.
        """
        self._events.discard(
            lambda event: isinstance(event, port.REPLY_OUTPUT_EVENTS) and stopped(event.response_id)
        )

    async def ack_playback(self, *, response_id: str, played_ms: int) -> None:
        await self._send(self._wire.ack_playback(response_id=response_id, played_ms=played_ms))

    async def truncate_reply(self, *, response_id: str, audio_end_ms: int) -> None:
        await self._send(self._wire.truncate_reply(response_id=response_id, audio_end_ms=audio_end_ms))

    async def update(self, config: SessionConfig) -> None:
        event = self._wire.session_update(config, initial=False)
        if event is None:
            return  # nothing the backend holds changed
        await self._updates.send(str(event["event_id"]), self._send([event]))

    async def close(self, reason: str) -> None:
        if self._closing:
            return
        self._closing = True
        if not self._ended and self._held is None:
            try:
                await self._ws.send(_dumps(self._wire.close(reason)))
                await asyncio.wait_for(self._backend_closed.wait(), _CLOSE_WAIT_S)
            except (ConnectionClosed, TimeoutError, OSError):
                pass
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        if self._liveness is not None:
            self._liveness.cancel()
        if self._input_watch is not None:
            self._input_watch.cancel()
        await _abort(self._ws)
        self._end(port.EngineClosed(reason=reason))

    def events(self) -> AsyncIterator[port.EngineEvent]:
        return self._events.stream()

    def watch_liveness(self, timeout_s: float) -> None:
        """Check in the background that the backend still answers on this session's socket.

        Asked of the sessions of a backend whose health check failed. A backend that still
        answers a ping here keeps its session (its health path may be what failed, or it was
        only slow); one that does not answer within ``timeout_s`` is hung, and waiting for
        the transport's keepalive would keep the caller on a dead line for
        ``ping_interval_s + ping_timeout_s``. Such a session fails with ``backend_lost``; no
        resume is tried, since the backend it would resume on is the one not answering.
        """
        if self._liveness is not None or self._ended or self._closing:
            return
        self._liveness = asyncio.create_task(
            self._check_alive(timeout_s), name=f"remote-liveness:{self.session_id}"
        )
        self._liveness.add_done_callback(self._liveness_done)

    def _liveness_done(self, task: asyncio.Task[bool]) -> None:
        if self._liveness is task:
            self._liveness = None

    async def _check_alive(self, timeout_s: float) -> bool:
        """Ping the backend socket; False (and the session failed) when no pong came in time."""
        if self._held is not None:
            return True  # resuming, under its own deadline
        ws = self._ws
        try:
            async with asyncio.timeout(timeout_s):
                pong = await ws.ping()
                await pong
            return True
        except TimeoutError:
            pass
        except ConnectionClosed:
            return True  # dropped, not hung: the reader sees it too, and resumes if it can
        except Exception:  # a bug here must not end a call that may be fine
            logger.exception("remote session %s: liveness check failed", self.session_id)
            return True
        if self._ws is not ws or self._ended or self._closing:
            return True  # resumed or ended meanwhile
        why = (
            f"{self.backend.url} did not answer a ping within {timeout_s:g} s"
            f" (health check: {self.backend.last_error})"
        )
        logger.warning("remote session %s: %s", self.session_id, why)
        self._fail("backend_lost", why)
        self._reader.cancel()
        # A hung peer cannot take part in a closing handshake: drop the connection.
        ws.transport.abort()
        return False

    async def keep_alive(self) -> None:
        """Send ``session.heartbeat`` if nothing went to the backend for ``heartbeat_interval_s``."""
        if asyncio.get_running_loop().time() - self._last_sent >= self._options.heartbeat_interval_s:
            await self._send([{"type": "session.heartbeat"}])

    async def _outputs_taken(self) -> None:
        """Wait until the backend announced the function outputs sent (see ``BackendWire.outputs_pending``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _OUTPUT_TAKEN_TIMEOUT_S
        while self._wire.outputs_pending and not (self._ended or self._closing):
            self._received.clear()
            try:
                await asyncio.wait_for(self._received.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                self._wire.forget_outputs()
                return

    # -- sending ------------------------------------------------------------------------------

    async def _send(self, events: list[JsonObject]) -> None:
        if events:
            async with self._send_lock:
                await self._send_now(events)
        if self._wire.input_waiting and (self._input_watch is None or self._input_watch.done()):
            self._input_watch = asyncio.create_task(
                self._release_stuck_input(), name=f"remote-input-hold:{self.session_id}"
            )

    async def _send_now(self, events: list[JsonObject]) -> None:
        for event in events:
            text = _dumps(event)
            if self._ended or self._closing:
                return
            if self._held is not None:
                self._hold(text)
                continue
            ws = self._ws
            try:
                await ws.send(text)
                self._last_sent = asyncio.get_running_loop().time()
            except ConnectionClosed:
                if self._ws is not ws and self._held is None:
                    # Resumed on a new socket while this send failed on the old one.
                    with contextlib.suppress(ConnectionClosed):
                        await self._ws.send(text)
                elif self.resumable:
                    # The reader sees the drop too; keep what would be lost for the resume.
                    if self._held is None:
                        self._held = deque()
                    self._hold(text)

    async def _release_stuck_input(self) -> None:
        """Send held caller input once the backend has said nothing for ``_INPUT_HOLD_QUIET_S``.

        The input waits for the backend's reply to end (or be reported played); a
        backend that stopped talking mid-reply must not keep the caller's turn for ever.
        """
        loop = asyncio.get_running_loop()
        while self._wire.input_waiting and not (self._ended or self._closing):
            quiet = loop.time() - self._last_received
            if quiet < _INPUT_HOLD_QUIET_S:
                await asyncio.sleep(_INPUT_HOLD_QUIET_S - quiet)
                continue
            logger.warning(
                "remote session %s: %s said nothing for %g s while caller input waited for its reply;"
                " sending the input",
                self.session_id,
                self.backend.url,
                _INPUT_HOLD_QUIET_S,
            )
            async with self._send_lock:
                await self._send_now(self._wire.release_input())

    def _hold(self, text: str) -> None:
        assert self._held is not None
        if len(self._held) >= _HELD_EVENTS or self._held_bytes + len(text) > _HELD_BYTES:
            logger.warning("remote session %s: dropping input held for resume (buffer full)", self.session_id)
            return
        self._held.append(text)
        self._held_bytes += len(text)

    # -- receiving ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                async for raw in self._ws:
                    if await self._handle(raw):
                        return  # the backend ended the session
            except ConnectionClosed:
                pass
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must end this session only, and say so
                logger.exception("remote session %s: reading %s failed", self.session_id, self.backend.url)
                self._fail("remote_error", "the backend connection failed")
                return
            if self._closing:
                return
            why = f"the connection to {self.backend.url} dropped ({self._ws.close_code or 'no close frame'})"
            logger.warning("remote session %s: %s", self.session_id, why)
            if self.resumable and await self._resume():
                continue
            self._fail("backend_lost", why)
            return

    async def _handle(self, raw: str | bytes) -> bool:
        """One backend event; True when it ends the session."""
        event = _loads(raw)
        if event is None:
            return False
        self._last_received = asyncio.get_running_loop().time()
        seq = event.get("server_event_seq")
        kind = event.get("type")
        if isinstance(seq, int) and not isinstance(seq, bool) and kind != "session.resumed":
            if seq <= self._last_seq:
                return False  # replayed after a resume: seen already
            self._last_seq = seq
            with contextlib.suppress(ConnectionClosed):
                await self._ws.send(_dumps({"type": "session.event_ack", "server_event_seq": seq}))
        if kind in ("session.closed", "session.expired"):
            self._backend_closed.set()
            reason = event.get("reason")
            self._end(port.EngineClosed(reason=reason if isinstance(reason, str) and reason else str(kind)))
            return True
        if kind == "session.resync_required":
            self._resume_token = None  # the backend stopped journaling: a resume would be refused
            return False
        if self._closing:
            return False
        outs = self._wire.receive(event)
        # What the event released goes out first: a port call made while its events are
        # put must queue behind them (the wire keeps them in order until taken).
        late = self._wire.take_outgoing()
        if late:
            await self._send(late)
        for out in outs:
            await self._events.put(out)
        self._received.set()
        for event_id, refusal in self._wire.take_update_answers():
            self._updates.settle(event_id, refusal)
        return False

    async def _resume(self) -> bool:
        """Re-attach to the backend session after a drop; False when that is not possible."""
        if self._held is None:
            self._held = deque()
        loop = asyncio.get_running_loop()
        dropped_at = loop.time()
        deadline = dropped_at + self._options.resume_timeout_s
        delay = 0.05
        while (remaining := deadline - loop.time()) > 0:
            try:
                ws = await _connect(
                    self.backend, self._options, min(self._options.connect_timeout_s, remaining)
                )
            except ConnectionRefusedError:
                return False  # nothing listens there any more: the backend is gone
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                logger.info("remote session %s: resume connect failed: %s", self.session_id, exc)
                await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
                delay = min(delay * 2, 0.5)
                continue
            try:
                outcome = await self._resume_on(ws, deadline - loop.time())
            except BaseException:
                await _abort(ws)
                raise
            if outcome is True:
                return True
            await _abort(ws)
            # A backend may not have noticed the drop yet (the session is still attached to
            # the old socket there): a refusal right after the drop is worth another try.
            if outcome is None and loop.time() - dropped_at < _RESUME_RETRY_S:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            return False
        return False

    async def _resume_on(self, ws: ClientConnection, timeout_s: float) -> bool | None:
        """True: resumed; False: refused for good; None: refused, maybe too early."""
        request = {
            "type": "session.resume",
            "session_id": self.backend_session_id,
            "resume_token": self._resume_token,
            "last_received_server_event_seq": self._last_seq,
        }
        try:
            await ws.send(_dumps(request))
            async with asyncio.timeout(max(timeout_s, 0.1)):
                while True:
                    event = _loads(await ws.recv())
                    if event is None:
                        continue
                    kind = event.get("type")
                    if kind == "session.resumed":
                        break
                    if kind == "error":
                        code, message, _ = error_fields(event)
                        logger.info(
                            "remote session %s: resume refused: %s: %s", self.session_id, code, message
                        )
                        return None if code in _RESUME_EARLY_CODES else False
                    if kind == "session.resync_required" or kind in RESUME_REFUSED_CODES:
                        return False
        except (ConnectionClosed, TimeoutError, OSError) as exc:
            logger.warning("remote session %s: resume failed: %s", self.session_id, exc)
            return False
        token = event.get("resume_token")
        if isinstance(token, str) and token:
            self._resume_token = token
        old, self._ws = self._ws, ws
        await _abort(old)
        # Send what was held, in order; port calls made meanwhile keep queueing behind it.
        held = self._held if self._held is not None else deque()
        while held:
            text = held.popleft()
            self._held_bytes -= len(text)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(text)
        self._held, self._held_bytes = None, 0
        logger.info(
            "remote session %s resumed on %s after event %d",
            self.session_id,
            self.backend.url,
            self._last_seq,
        )
        return True

    # -- ending ---------------------------------------------------------------------------------

    def _fail(self, code: str, message: str) -> None:
        """The backend session is lost: a fatal error, then the end of the stream."""
        if self._ended:
            return
        self.backend.mark_down(message)
        self._events.put_urgent(port.EngineError(code=code, message=message, fatal=True))
        self._end(port.EngineClosed(reason=code))

    def _end(self, closed: port.EngineClosed) -> None:
        if self._ended:
            return
        self._ended = True
        self._updates.refuse_all("session_closed", "the backend session ended")
        self._received.set()  # a reply waiting for an announcement waits no more
        self._held = None
        if self._input_watch is not None and self._input_watch is not asyncio.current_task():
            self._input_watch.cancel()
        self._events.put_urgent(closed)
        self._on_end(self)
