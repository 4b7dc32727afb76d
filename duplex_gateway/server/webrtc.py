"""OpenAI's WebRTC interface: ``POST /v1/realtime/calls``, one peer connection per session, on aiortc.

A client posts its SDP offer (the body as ``application/sdp``, or multipart with ``sdp`` and a
``session`` object); the gateway answers ``201`` with its SDP answer and
``Location: /v1/realtime/calls/{call_id}``, then serves the session over the connection once it
is up: the ``oai-events`` data channel carries the Realtime events, one Opus track each way
carries the audio. The call is served by the same :class:`~duplex_gateway.host.connection.Connection`
as a WebSocket: :class:`CallSocket` is the :class:`~duplex_gateway.vocabulary.frames.Socket` it
reads and writes, the dialect (:mod:`duplex_gateway.dialects.realtime_webrtc`) paces the reply
onto the track. This module is only the I/O: SDP, ICE, the tracks' frames.

The Live API's ``POST /v1/live/sessions`` (:mod:`duplex_gateway.server.live_calls`) answers its
offers with the same calls (:meth:`WebRtcCalls.accept`): its events come on whichever data
channel the client opens first, and its session starts with what the POST carried.

Networks: ICE offers host candidates on ``webrtc.host_addresses`` (127.0.0.1 included when
listed, which aioice leaves out by itself) or on every interface; ``webrtc.ice_servers`` adds
STUN and TURN. A call whose connection is not up within ``webrtc.connect_timeout_s`` is ended and
its engine session released, as is one whose ICE or DTLS transport fails later.

aiortc is the ``webrtc`` extra; without it the endpoint answers 501 saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from duplex_gateway.auth.policy import CALLS_PATH
from duplex_gateway.dialects.realtime_webrtc import CLEAR_TRACK, MEDIA_RATE
from duplex_gateway.server.webrtc_jitter import LossTolerantJitterBuffer, tolerate_loss

__all__ = [
    "CALLS_PATH",
    "EVENTS_CHANNEL",
    "AnsweredCall",
    "BadCall",
    "CallRequest",
    "CallSocket",
    "IceServer",
    "WebRtcCalls",
    "call_error",
    "read_call_request",
    "unavailable",
    "webrtc_available",
]

logger = logging.getLogger(__name__)

#: The data channel OpenAI's Realtime clients open for the events (the Live API names none).
EVENTS_CHANNEL = "oai-events"
#: The track's frames: 20 ms, as browsers send Opus.
FRAME_SAMPLES = MEDIA_RATE // 50
_FRAME_BYTES = FRAME_SAMPLES * 2
#: The most reply audio the outgoing track holds (the dialect keeps ~100 ms ahead): a bound, not a buffer.
_TRACK_LIMIT_BYTES = MEDIA_RATE * 2 * 2
#: The longest jump in the caller track's clock filled with silence (a longer one is an outage, not a gap).
_MAX_GAP_S = fractions.Fraction(1)
#: Caller audio frames waiting for the session (20 ms each): about 2 s.
_INBOX_FRAMES = 128
#: Data channel bytes not yet on the wire past which sending waits (a client that stopped reading).
_CHANNEL_HIGH_WATER = 1 << 20
#: What a sideband connection (``/v1/realtime?call_id=``) may send a call: what steers its session.
SIDEBAND_EVENTS = frozenset(
    {
        "session.update",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
    }
)
MAX_SIDEBAND_BYTES = 1 << 20
#: The largest SDP offer accepted (a browser's is 2-6 KB).
MAX_SDP_BYTES = 64 << 10


def webrtc_available() -> bool:
    """The ``webrtc`` extra (aiortc, PyAV) is installed."""
    try:
        import aiortc  # noqa: F401
        import av  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class CallRequest:
    """What a ``POST /v1/realtime/calls`` asked for: the offer, and a session to start with."""

    sdp: str
    session: Mapping[str, object] | None = None


class BadCall(Exception):
    """A request the endpoint refuses with 400 and this message."""


async def read_call_request(request: Request) -> CallRequest:
    """The offer and session of a ``POST /v1/realtime/calls``, in either of OpenAI's forms."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        try:
            form = await request.form(max_files=2, max_fields=4, max_part_size=MAX_SDP_BYTES)
        except Exception as exc:  # any malformed body is the client's error
            raise BadCall(f"the multipart body could not be read: {exc}") from exc
        sdp = _text(form.get("sdp"))
        raw = form.get("session")
        session = None
        if raw is not None:
            try:
                session = json.loads(_text(raw) or "null")
            except ValueError as exc:
                raise BadCall(f"'session' is not JSON: {exc}") from exc
            if not isinstance(session, dict):
                raise BadCall("'session' must be a JSON object")
    elif kind in ("application/sdp", "text/plain", ""):
        body = await request.body()
        if len(body) > MAX_SDP_BYTES:
            raise BadCall(f"an SDP offer of {len(body)} bytes is over {MAX_SDP_BYTES}")
        sdp, session = body.decode("utf-8", "replace"), None
    else:
        raise BadCall(f"the offer is sent as application/sdp or multipart/form-data, not {kind!r}")
    if not sdp or not sdp.lstrip().startswith("v=0"):
        raise BadCall("the body holds no SDP offer (it starts with v=0)")
    return CallRequest(sdp=sdp, session=session)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    data = getattr(value, "file", None)
    if data is not None:  # an uploaded part
        return bytes(data.read(MAX_SDP_BYTES + 1)).decode("utf-8", "replace")
    return str(value)


# -- the media -------------------------------------------------------------------------------------


def _reply_track_type() -> type[Any]:
    """The outgoing track (aiortc imported lazily: it is an extra)."""
    import av
    import numpy as np
    from aiortc.mediastreams import MediaStreamTrack

    time_base = fractions.Fraction(1, MEDIA_RATE)

    class ReplyTrack(MediaStreamTrack):
        """Reply audio, 20 ms a frame in real time; silence when none is queued.

        The dialect paces what it writes (PCM16 mono at ``rate``, the engine's) a little ahead of
        real time; this track converts it to the track's 48 kHz with libswresample, which holds
        back under a millisecond where the session's soxr would hold back ~20 ms, turns it into
        frames on the track's own clock, and drops what it holds when told to (a barge-in).
        """

        kind = "audio"

        def __init__(self, rate: int = MEDIA_RATE) -> None:
            super().__init__()
            self.rate = rate
            self._audio = bytearray()
            self._start: float | None = None
            self._pts = 0
            self._silence = bytes(_FRAME_BYTES)
            self._resampler = self._new_resampler()

        def _new_resampler(self) -> Any:
            if self.rate == MEDIA_RATE:
                return None
            return av.AudioResampler(format="s16", layout="mono", rate=MEDIA_RATE)

        def write(self, pcm: bytes) -> None:
            if self._resampler is not None and pcm:
                frame = av.AudioFrame.from_ndarray(
                    np.frombuffer(pcm, "<i2").reshape(1, -1), format="s16", layout="mono"
                )
                frame.sample_rate = self.rate
                pcm = b"".join(
                    out.to_ndarray().astype("<i2", copy=False).tobytes()
                    for out in self._resampler.resample(frame)
                )
            if len(self._audio) + len(pcm) > _TRACK_LIMIT_BYTES:
                # The dialect never runs this far ahead; should it, keep the newest and say so.
                logger.warning("reply track over %d bytes: older audio dropped", _TRACK_LIMIT_BYTES)
                del self._audio[: len(self._audio) + len(pcm) - _TRACK_LIMIT_BYTES]
            self._audio.extend(pcm)

        def clear(self) -> None:
            self._audio.clear()
            self._resampler = self._new_resampler()  # its last fraction of a ms is the cut reply's

        async def recv(self) -> Any:
            loop = asyncio.get_running_loop()
            if self._start is None:
                self._start = loop.time()
            else:
                self._pts += FRAME_SAMPLES
                delay = self._start + self._pts / MEDIA_RATE - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            chunk = bytes(self._audio[:_FRAME_BYTES])
            del self._audio[:_FRAME_BYTES]
            if len(chunk) < _FRAME_BYTES:
                chunk += self._silence[len(chunk) :]
            frame = av.AudioFrame.from_ndarray(
                np.frombuffer(chunk, "<i2").reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate = MEDIA_RATE
            frame.pts = self._pts
            frame.time_base = time_base
            return frame

    return ReplyTrack


class CallSocket:
    """A WebRTC call as the socket a :class:`~duplex_gateway.host.connection.Connection` serves.

    ``receive`` gives the data channel's text messages and the incoming track's audio (bytes,
    PCM16 mono at the session's input rate) in the order they came; ``send_text`` writes the data
    channel (waiting for it to open), ``send_bytes`` the outgoing track. The end of the connection
    is a disconnect.
    """

    def __init__(
        self,
        pc: Any,
        reply_track: Any,
        *,
        open_timeout_s: float,
        send_timeout_s: float,
        input_rate: int = MEDIA_RATE,
        events_channel: str | None = EVENTS_CHANNEL,
        opening: str | None = None,
    ) -> None:
        """``input_rate``: the rate the caller's track is decoded to (the engine's input rate).

        ``events_channel``: the label of the data channel that carries the events (None: the
        first one the client opens, whatever its label, as the Live API has it). ``opening``: a
        client event the session reads before anything the call brings (the Live API's
        ``session.start``, which the POST carried).
        """
        self._pc = pc
        self.reply_track = reply_track
        self.input_rate = input_rate
        self._events_channel = events_channel
        #: A Realtime sideband (``/v1/realtime?call_id=``) may steer the call: its events are
        #: Realtime ones, which only a Realtime call reads as their sender means them.
        self.steerable = True
        self._inbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue(_INBOX_FRAMES)
        if opening is not None:
            self._inbox.put_nowait({"type": "websocket.receive", "text": opening})
        self._channel: Any = None
        self._opened = asyncio.Event()
        self._ended: int | None = None
        self._open_timeout_s = open_timeout_s
        self._send_timeout_s = send_timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        #: Caller audio filled with silence where the track's clock jumped (lost packets, DTX).
        self.gap_ms = 0.0
        #: The incoming track's jitter buffers (their ``lost`` and ``late`` counts).
        self.jitter: list[LossTolerantJitterBuffer] = []

    # the peer connection's callbacks

    def attach_channel(self, channel: Any) -> None:
        """The client's data channel: its messages are the session's events (one channel a call)."""
        wanted = self._events_channel
        if self._channel is not None or (wanted is not None and channel.label != wanted):
            logger.info(
                "data channel %r ignored (events come on %r)",
                channel.label,
                wanted if self._channel is None else self._channel.label,
            )
            return
        self._channel = channel

        @channel.on("message")  # type: ignore[untyped-decorator]
        def on_message(message: str | bytes) -> None:
            item: MutableMapping[str, Any] = {"type": "websocket.receive"}
            item["text" if isinstance(message, str) else "bytes"] = message
            self._deliver(item)

        @channel.on("close")  # type: ignore[untyped-decorator]
        def on_close() -> None:
            self.end(1000)

        if channel.readyState == "open":
            self._opened.set()
        else:
            channel.on("open", self._opened.set)

    def attach_track(self, track: Any) -> None:
        """The caller's microphone: decoded, made mono 48 kHz, handed to the session in order."""
        if track.kind != "audio":
            return
        task = asyncio.get_running_loop().create_task(self._read_track(track), name="webrtc:track")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_track(self, track: Any) -> None:
        import av
        from aiortc.mediastreams import MediaStreamError

        # libswresample, in one step with the decoder's stereo to mono: under 1 ms held back.
        resampler = av.AudioResampler(format="s16", layout="mono", rate=self.input_rate)
        #: Where (seconds of the track's own clock) the audio handed on so far ends.
        heard_to: fractions.Fraction | None = None
        while self._ended is None:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if frame.pts is not None and frame.time_base is not None:
                start = frame.pts * frame.time_base
                if heard_to is not None and 0 < start - heard_to <= _MAX_GAP_S:
                    # A packet lost (or a sender's DTX pause): the caller's clock goes on in silence.
                    self.gap_ms += float(start - heard_to) * 1000
                    silence = bytes(round((start - heard_to) * self.input_rate) * 2)
                    await self._inbox.put({"type": "websocket.receive", "bytes": silence})
                heard_to = start + fractions.Fraction(frame.samples, frame.sample_rate)
            for out in resampler.resample(frame):
                pcm = out.to_ndarray().astype("<i2", copy=False).tobytes()
                await self._inbox.put({"type": "websocket.receive", "bytes": pcm})

    def _deliver(self, item: MutableMapping[str, Any]) -> None:
        try:
            self._inbox.put_nowait(item)
        except asyncio.QueueFull:
            # Events are never dropped: wait for room in a task of its own (order kept by the queue's waiters).
            task = asyncio.get_running_loop().create_task(self._inbox.put(item))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def end(self, code: int) -> None:
        """The connection is over (``code`` is what the session reads as the close)."""
        if self._ended is not None:
            return
        self._ended = code
        self._opened.set()  # a sender waiting for the channel gives up
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait({"type": "websocket.disconnect", "code": code})

    def control(self, text: str) -> str | None:
        """A sideband client's event, read as if the call's own client had sent it on the data channel.

        Only what steers the session is taken (its audio is the tracks'); returns why an event
        was refused, or None.
        """
        try:
            kind = json.loads(text).get("type") if len(text) <= MAX_SIDEBAND_BYTES else None
        except (ValueError, AttributeError):
            return "the sideband takes JSON client events"
        if kind not in SIDEBAND_EVENTS:
            allowed = ", ".join(sorted(SIDEBAND_EVENTS))
            return f"the sideband may send {allowed}; not {str(kind)[:40]!r}"
        if self._ended is not None:
            return "the call is over"
        self._deliver({"type": "websocket.receive", "text": text})
        return None

    @property
    def connected(self) -> bool:
        return self._channel is not None and self._opened.is_set() and self._ended is None

    # the Socket the session uses

    async def receive(self) -> MutableMapping[str, Any]:
        if self._ended is not None and self._inbox.empty():
            return {"type": "websocket.disconnect", "code": self._ended}
        return await self._inbox.get()

    async def send_text(self, data: str) -> None:
        if not self._opened.is_set():
            try:
                async with asyncio.timeout(self._open_timeout_s):
                    await self._opened.wait()
            except TimeoutError:
                self.end(1006)
                raise ConnectionError("the call's data channel did not open") from None
        channel = self._channel
        if self._ended is not None or channel is None or channel.readyState != "open":
            raise ConnectionError("the call's data channel is closed")
        if channel.bufferedAmount > _CHANNEL_HIGH_WATER:
            async with asyncio.timeout(self._send_timeout_s):
                while channel.bufferedAmount > _CHANNEL_HIGH_WATER // 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        channel.send(data)

    async def send_bytes(self, data: bytes) -> None:
        if data == CLEAR_TRACK:
            self.reply_track.clear()
        else:
            self.reply_track.write(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.end(code)
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._pc.close()


# -- the endpoint ------------------------------------------------------------------------------------

#: Serves one call: its socket and its call id.
CallServer = Callable[[CallSocket, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class AnsweredCall:
    """An offer answered: the call's id and the SDP answer (the call is then served)."""

    call_id: str
    sdp: str


@dataclass(frozen=True, slots=True)
class IceServer:
    """A STUN or TURN server offered to ICE (``webrtc.ice_servers``)."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None


class WebRtcCalls:
    """The WebRTC calls of one gateway: answers offers, serves each call, reaps those that fail."""

    def __init__(
        self,
        *,
        host_addresses: Sequence[str] = (),
        ice_servers: Sequence[IceServer] = (),
        connect_timeout_s: float = 15.0,
        send_timeout_s: float = 10.0,
    ) -> None:
        self._host_addresses = tuple(host_addresses)
        self._ice_servers = tuple(ice_servers)
        self._connect_timeout_s = connect_timeout_s
        self._send_timeout_s = send_timeout_s
        self._calls: dict[str, tuple[asyncio.Task[None], CallSocket]] = {}

    @property
    def count(self) -> int:
        return len(self._calls)

    def socket(self, call_id: str) -> CallSocket | None:
        """The live call ``call_id``'s socket (None: no such call here)."""
        entry = self._calls.get(call_id)
        return entry[1] if entry is not None else None

    async def answer(
        self, sdp: str, serve: CallServer, *, input_rate: int = MEDIA_RATE, output_rate: int = MEDIA_RATE
    ) -> Response:
        """The response to a Realtime offer: ``201`` with the SDP answer, the call then served by ``serve``.

        ``input_rate`` / ``output_rate``: the PCM16 rates the tracks are decoded to and encoded
        from for the session (the engine's: no second conversion in the session).
        """
        answered = await self.accept(sdp, serve, input_rate=input_rate, output_rate=output_rate)
        if not isinstance(answered, AnsweredCall):
            return answered
        return Response(
            answered.sdp,
            status_code=201,
            media_type="application/sdp",
            headers={"Location": f"{CALLS_PATH}/{answered.call_id}"},
        )

    async def accept(
        self,
        sdp: str,
        serve: CallServer,
        *,
        input_rate: int = MEDIA_RATE,
        output_rate: int = MEDIA_RATE,
        call_id: str | None = None,
        events_channel: str | None = EVENTS_CHANNEL,
        opening: str | None = None,
        steerable: bool = True,
    ) -> AnsweredCall | Response:
        """Answer an offer and serve the call with ``serve``; or the error response refusing it.

        ``call_id``: the id to serve it under (None: a new ``rtc_...``). ``events_channel`` and
        ``opening``: as :class:`CallSocket` takes them. ``steerable``: a Realtime sideband may
        steer the call (:attr:`CallSocket.steerable`). The endpoint frames the answer.
        """
        if not webrtc_available():
            return unavailable()
        from aiortc import RTCPeerConnection, RTCSessionDescription

        _offer_host_addresses(self._host_addresses)
        pc = RTCPeerConnection(self._configuration())
        socket = CallSocket(
            pc,
            _reply_track_type()(output_rate),
            open_timeout_s=self._connect_timeout_s,
            send_timeout_s=self._send_timeout_s,
            input_rate=input_rate,
            events_channel=events_channel,
            opening=opening,
        )
        socket.steerable = steerable
        pc.on("datachannel", socket.attach_channel)
        pc.on("track", socket.attach_track)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                socket.end(1006 if pc.connectionState == "failed" else 1000)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
            if not audio:
                raise BadCall("the offer has no audio section (m=audio)")
            socket.jitter.extend(b for b in (tolerate_loss(t.receiver) for t in audio) if b is not None)
            pc.addTrack(socket.reply_track)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except BadCall as exc:
            await pc.close()
            return call_error(400, "invalid_offer", str(exc))
        except Exception as exc:  # noqa: BLE001 - aiortc raises many kinds for a bad offer
            await pc.close()
            return call_error(400, "invalid_offer", f"the SDP offer was refused: {exc}")
        call_id = call_id or "rtc_" + secrets.token_hex(12)
        task = asyncio.get_running_loop().create_task(
            self._run(call_id, socket, serve), name=f"webrtc:{call_id}"
        )
        self._calls[call_id] = (task, socket)
        return AnsweredCall(call_id=call_id, sdp=pc.localDescription.sdp)

    def _configuration(self) -> Any:
        from aiortc import RTCConfiguration, RTCIceServer

        servers = [
            RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
            for s in self._ice_servers
        ]
        return RTCConfiguration(iceServers=servers)

    async def _run(self, call_id: str, socket: CallSocket, serve: CallServer) -> None:
        reaper = asyncio.get_running_loop().call_later(self._connect_timeout_s, self._reap, call_id)
        try:
            await serve(socket, call_id)
        except Exception:  # a bug must cost this call only
            logger.exception("WebRTC call %s failed", call_id)
        finally:
            reaper.cancel()
            await socket.close()
            self._calls.pop(call_id, None)
            lost = sum(b.lost for b in socket.jitter)
            if lost or socket.gap_ms:
                logger.info(
                    "WebRTC call %s: %d caller packets lost, %d late; %.0f ms of its audio filled with silence",
                    call_id,
                    lost,
                    sum(b.late for b in socket.jitter),
                    socket.gap_ms,
                )

    def _reap(self, call_id: str) -> None:
        entry = self._calls.get(call_id)
        if entry is not None and not entry[1].connected:
            logger.info("WebRTC call %s never connected in %.0f s: ended", call_id, self._connect_timeout_s)
            entry[1].end(1006)

    async def close(self, timeout_s: float = 5.0) -> None:
        """End every call and wait for them (the gateway is stopping)."""
        calls = list(self._calls.values())
        for _, socket in calls:
            socket.end(1001)
        tasks = [task for task, _ in calls]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout_s)
            for task in stuck:
                task.cancel()


def unavailable() -> Response:
    """What the endpoint answers where the ``webrtc`` extra is not installed."""
    return call_error(
        501, "webrtc_unavailable", "WebRTC needs the 'webrtc' extra: pip install 'duplex-gateway[webrtc]'"
    )


def call_error(status: int, code: str, message: str) -> Response:
    """An OpenAI-shaped error response of the calls endpoint."""
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": None}
    return JSONResponse({"error": error}, status)


def _offer_host_addresses(addresses: Sequence[str]) -> None:
    """Have ICE offer host candidates on ``addresses`` (empty: every interface but loopback, aioice's own).

    aioice reads its host addresses from one module function; the gateway serves one
    configuration per process, so setting it there is setting it for every call.
    """
    import aioice.ice

    original = getattr(_offer_host_addresses, "original", None)
    if original is None:
        original = aioice.ice.get_host_addresses
        _offer_host_addresses.original = original  # type: ignore[attr-defined]
    if not addresses:
        aioice.ice.get_host_addresses = original
        return
    chosen = list(addresses)

    def configured(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = configured
