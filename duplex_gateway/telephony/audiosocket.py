"""Asterisk AudioSocket: phone calls over plain TCP (``AudioSocket(<uuid>,host:port)``).

Asterisk connects to the gateway and both sides exchange frames of one kind byte, a
two-byte big-endian length and the payload: ``0x01`` the call's UUID (first), ``0x10``
signed linear audio at 8 kHz (``0x11``-``0x18`` at the higher rates, from the
AudioSocket channel driver), ``0x03`` a DTMF digit, ``0x00`` hang up, ``0xFF`` an error.

Asterisk writes the audio it receives straight to the channel: there is no buffer to
clear and no mark to echo, so reply audio goes out in 20 ms frames at real time (plus
the playout's lead) and the clock is the played cursor; barge-in is stopping sending.

Three parts: :class:`TlvReader` and :func:`encode_frame`, the framing as a pure codec;
:class:`AudioSocketCarrier`, the call's messages as call events (a :class:`Carrier`
whose frames are one whole TLV frame each); :class:`AudioSocketServer`, the TCP
listener, which serves each connection through a :class:`StreamSocket` exactly as a
carrier's WebSocket is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, ClassVar

from duplex_gateway.telephony import carrier as call
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import MAX_RATE, AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame, Socket

__all__ = [
    "KIND_AUDIO",
    "KIND_DTMF",
    "KIND_ERROR",
    "KIND_HANGUP",
    "KIND_UUID",
    "AudioSocketCarrier",
    "AudioSocketServer",
    "StreamSocket",
    "TlvReader",
    "decode_frame",
    "encode_frame",
    "start_audiosocket",
]

logger = logging.getLogger(__name__)

KIND_HANGUP = 0x00
KIND_UUID = 0x01
KIND_DTMF = 0x03
KIND_AUDIO = 0x10  # signed linear, 8 kHz
KIND_ERROR = 0xFF
#: Audio kinds and their signed linear rates (0x11-0x18: Asterisk 20.17, 21.12, 22.7, 23.1 and later).
AUDIO_RATES = {
    0x10: 8_000,
    0x11: 12_000,
    0x12: 16_000,
    0x13: 24_000,
    0x14: 32_000,
    0x15: 44_100,
    0x16: 48_000,
    0x17: 96_000,
    0x18: 192_000,
}
_KINDS_BY_RATE = {rate: kind for kind, rate in AUDIO_RATES.items()}
#: Asterisk's own error codes (the payload of a 0xFF frame).
_ERRORS = {0x01: "the caller hung up", 0x02: "frame forwarding error", 0x04: "memory error"}
HEADER_BYTES = 3
MAX_PAYLOAD = 0xFFFF
#: AudioSocket frames carry 20 ms of audio.
FRAME_MS = 20


# -- the framing ---------------------------------------------------------------------------


def encode_frame(kind: int, payload: bytes = b"") -> bytes:
    """One TLV frame: kind, big-endian length, payload."""
    if not 0 <= kind <= 0xFF:
        raise ValueError(f"an AudioSocket kind is one byte, not {kind}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"an AudioSocket payload holds at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    return bytes((kind, len(payload) >> 8, len(payload) & 0xFF)) + payload


def decode_frame(frame: bytes) -> tuple[int, bytes]:
    """The kind and payload of one whole TLV frame; a ``ProtocolError`` for anything else."""
    if len(frame) < HEADER_BYTES:
        raise call.bad_message(f"an AudioSocket frame of {len(frame)} bytes is shorter than its header")
    length = int.from_bytes(frame[1:HEADER_BYTES], "big")
    if len(frame) != HEADER_BYTES + length:
        raise call.bad_message(
            f"an AudioSocket frame says {length} payload bytes and carries {len(frame) - HEADER_BYTES}"
        )
    return frame[0], frame[HEADER_BYTES:]


class TlvReader:
    """Whole TLV frames out of a byte stream that arrives in pieces of any size."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes (each header and payload together), in order."""
        self._buffer += data
        frames: list[bytes] = []
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= HEADER_BYTES:
            end = offset + HEADER_BYTES + int.from_bytes(buffer[offset + 1 : offset + HEADER_BYTES], "big")
            if end > len(buffer):
                break
            frames.append(bytes(buffer[offset:end]))
            offset = end
        del buffer[:offset]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buffer)


# -- the carrier ---------------------------------------------------------------------------


class AudioSocketCarrier:
    """One AudioSocket connection's frames, as call events and back.

    The call starts at its first audio frame, whose kind says the rate (the UUID
    comes first, alone); the reply goes back at that same rate.
    """

    name: ClassVar[str] = "audiosocket"
    has_marks = False

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.format: AudioFormat | None = None
        self._kind = KIND_AUDIO
        self._framing = call.Framing(chunk_ms=FRAME_MS, multiple=_frame_bytes(8_000))
        #: The call's audio was refused: the next frame ends the call.
        self._refused = False

    @property
    def framing(self) -> call.Framing:
        return self._framing

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """An AudioSocket UUID frame."""
        return isinstance(frame, bytes) and len(frame) == HEADER_BYTES + 16 and frame[:3] == b"\x01\x00\x10"

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        if self._refused:
            self._refused = False
            return [call.CallEnded("unsupported_format")]
        if not isinstance(frame, bytes):
            raise ProtocolError(ErrorCode.INVALID_EVENT, "AudioSocket frames are binary")
        kind, payload = decode_frame(frame)
        rate = AUDIO_RATES.get(kind)
        if rate is not None:
            return self._audio(rate, kind, payload)
        if kind == KIND_UUID:
            if len(payload) != 16:
                raise call.bad_message(f"an AudioSocket UUID has 16 bytes, not {len(payload)}")
            if self.call_id is None:
                self.call_id = str(uuid.UUID(bytes=payload))
            return []
        if kind == KIND_DTMF:
            digit = payload[:1].decode("ascii", "replace")
            return [call.Dtmf(digit)] if digit.isprintable() and digit.strip() else []
        if kind == KIND_HANGUP:
            return [call.CallEnded("hangup")]
        if kind == KIND_ERROR:
            code = payload[0] if payload else 0
            return [call.CarrierError(f"audiosocket_{code:#04x}", _ERRORS.get(code, f"error {code:#04x}"))]
        raise call.bad_message(f"unknown AudioSocket kind {kind:#04x}")

    def _audio(self, rate: int, kind: int, payload: bytes) -> list[call.CallEvent]:
        if len(payload) % 2:
            raise ProtocolError(
                ErrorCode.INVALID_AUDIO_LENGTH,
                f"{len(payload)} bytes is not whole 16-bit AudioSocket samples",
            )
        if self.format is not None:
            if rate != self.format.rate:
                raise call.bad_message(f"AudioSocket audio changed from {self.format.rate} Hz to {rate} Hz")
            return [call.CallAudio(payload)] if payload else []
        if rate > MAX_RATE:
            self._refused = True
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_SAMPLE_RATE,
                f"AudioSocket audio at {rate} Hz is not supported (signed linear up to {MAX_RATE} Hz)",
            )
        fmt = self.format = AudioFormat(encoding=Encoding.PCM16, rate=rate)
        self._kind = kind
        self._framing = call.Framing(chunk_ms=FRAME_MS, multiple=_frame_bytes(rate))
        start = call.CallStart(
            carrier=self.name,
            call_id=self.call_id,
            stream_id=self.call_id,
            input_format=fmt,
            output_format=fmt,
        )
        return [start, call.CallAudio(payload)] if payload else [start]

    def media(self, audio: bytes) -> Sequence[Frame]:
        step = self._framing.multiple
        audio += b"\x00" * (len(audio) % 2)
        return [encode_frame(self._kind, audio[i : i + step]) for i in range(0, len(audio), step)]

    def mark(self, name: str) -> Frame | None:
        return None

    def clear(self) -> Frame | None:
        return None  # Asterisk played what it got at once: stopping sending is the barge-in

    def hangup(self) -> Frame | None:
        return encode_frame(KIND_HANGUP)


def _frame_bytes(rate: int) -> int:
    return rate * FRAME_MS // 1000 * 2


# -- the transport -----------------------------------------------------------------------------


class StreamSocket:
    """A TCP connection as the :class:`~duplex_gateway.host.transport.Socket` a session reads.

    Each whole TLV frame is one binary message; the end of the stream is a disconnect
    (1000 at a frame boundary, 1006 for a reset or a frame cut short).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._tlv = TlvReader()
        self._frames: deque[bytes] = deque()
        self._ended: int | None = None
        self.peer = writer.get_extra_info("peername")
        raw = writer.get_extra_info("socket")
        with contextlib.suppress(AttributeError, OSError):
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def receive(self) -> MutableMapping[str, Any]:
        while not self._frames:
            if self._ended is not None:
                return {"type": "websocket.disconnect", "code": self._ended}
            try:
                data = await self._reader.read(1 << 16)
            except (ConnectionError, OSError):
                data, self._ended = b"", 1006
            if not data:
                if self._ended is None:
                    self._ended = 1006 if self._tlv.pending else 1000
                continue
            self._frames.extend(self._tlv.feed(data))
        return {"type": "websocket.receive", "bytes": self._frames.popleft()}

    async def send_bytes(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def send_text(self, data: str) -> None:
        logger.debug("AudioSocket has no text messages; dropped %d characters", len(data))

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        writer = self._writer
        if writer.is_closing():
            return
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    def abort(self) -> None:
        """Drop the connection at once (the gateway is stopping)."""
        self._writer.transport.abort()


#: Serves one call's socket with the carrier's translator (``_Gateway.serve_call``).
CallServer = Callable[[Socket, call.Carrier], Awaitable[None]]


class AudioSocketServer:
    """The TCP listener: each connection is one call, served like a carrier's WebSocket."""

    def __init__(self, serve_call: CallServer, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._serve_call = serve_call
        self._server: asyncio.Server | None = None
        self._calls: dict[asyncio.Task[Any], StreamSocket] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        logger.info("AudioSocket listening on %s:%d", self.host, self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = StreamSocket(reader, writer)
        task = asyncio.current_task()
        if task is not None:
            self._calls[task] = stream
        try:
            await self._serve_call(stream, AudioSocketCarrier())
        except Exception:  # a bug must cost this call only, never the listener
            logger.exception("AudioSocket call from %s failed", stream.peer)
        finally:
            await stream.close()
            if task is not None:
                self._calls.pop(task, None)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop listening, end the calls still connected and wait for them."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        calls = dict(self._calls)
        for stream in calls.values():
            stream.abort()  # the session reads the end of the stream and closes
        if calls:
            _, stuck = await asyncio.wait(calls, timeout=timeout_s)
            for task in stuck:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*stuck, return_exceptions=True)


async def start_audiosocket(serve_call: CallServer, host: str, port: int | None) -> AudioSocketServer | None:
    """An AudioSocket listener on ``host:port``, started (None: no port configured)."""
    if port is None:
        return None
    server = AudioSocketServer(serve_call, host, port)
    await server.start()
    return server
