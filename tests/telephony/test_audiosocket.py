"""Asterisk AudioSocket: the TLV codec, the carrier, the TCP transport, and calls into a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from duplex_gateway.cli import _parser
from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.audiosocket import (
    AUDIO_RATES,
    KIND_AUDIO,
    KIND_DTMF,
    KIND_ERROR,
    KIND_HANGUP,
    KIND_UUID,
    AudioSocketCarrier,
    AudioSocketServer,
    StreamSocket,
    TlvReader,
    decode_frame,
    encode_frame,
)
from duplex_gateway.telephony.playout import Playout
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Socket
from tests.e2e.helpers import Gateway, GatewayFactory, encode, free_port
from tests.fixtures import load_speech as load_fixture_speech

CALL_UUID = uuid.UUID("4f6c9e8a-2b1d-4c3e-9f7a-1b2c3d4e5f60")
SLIN_8K = AudioFormat(encoding=Encoding.PCM16, rate=8_000)


def _uuid_frame(value: uuid.UUID = CALL_UUID) -> bytes:
    return encode_frame(KIND_UUID, value.bytes)


# -- the TLV codec ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "payload", "wire"),
    [
        (KIND_HANGUP, b"", b"\x00\x00\x00"),
        (KIND_DTMF, b"5", b"\x03\x00\x015"),
        (KIND_AUDIO, b"\x01\x02" * 160, b"\x10\x01\x40" + b"\x01\x02" * 160),
        (0x12, b"\x00" * 640, b"\x12\x02\x80" + b"\x00" * 640),
        (KIND_ERROR, b"\x02", b"\xff\x00\x01\x02"),
    ],
)
def test_frames_encode_as_the_protocol_writes_them(kind: int, payload: bytes, wire: bytes) -> None:
    assert encode_frame(kind, payload) == wire
    assert decode_frame(wire) == (kind, payload)


def test_the_codec_round_trips_every_kind_and_length() -> None:
    rng = random.Random(3)
    for kind in range(256):
        for length in (0, 1, 2, 255, 256, 320, 65_535):
            payload = rng.randbytes(length)
            assert decode_frame(encode_frame(kind, payload)) == (kind, payload)
    with pytest.raises(ValueError):
        encode_frame(KIND_AUDIO, b"\x00" * 65_536)
    with pytest.raises(ValueError):
        encode_frame(256)


@pytest.mark.parametrize("frame", [b"", b"\x10", b"\x10\x00", b"\x10\x00\x02\x00", b"\x10\x00\x01\x00\x00"])
def test_a_frame_that_is_not_whole_is_a_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_frame(frame)


def test_the_reader_reassembles_frames_from_reads_of_any_size() -> None:
    rng = random.Random(5)
    frames = [_uuid_frame()] + [
        encode_frame(
            rng.choice([KIND_AUDIO, KIND_DTMF, KIND_HANGUP, 0x12]), rng.randbytes(rng.randint(0, 700))
        )
        for _ in range(60)
    ]
    stream = b"".join(frames)
    for split in ("bytes", "random", "whole"):
        reader = TlvReader()
        got: list[bytes] = []
        offset = 0
        while offset < len(stream):
            step = 1 if split == "bytes" else len(stream) if split == "whole" else rng.randint(1, 900)
            got += reader.feed(stream[offset : offset + step])
            offset += step
        assert got == frames and reader.pending == 0
    reader = TlvReader()
    assert reader.feed(b"\x10\x01") == [] and reader.pending == 2
    assert reader.feed(b"\x40" + b"\x00" * 319) == [] and reader.pending == 322
    assert reader.feed(b"\x00" * 4 + b"\x03") == [encode_frame(KIND_AUDIO, b"\x00" * 320), b"\x00\x00\x00"]
    assert reader.pending == 1


# -- the carrier ------------------------------------------------------------------------------------


def _started(kind: int = KIND_AUDIO) -> tuple[AudioSocketCarrier, call.CallStart]:
    carrier = AudioSocketCarrier()
    assert carrier.parse(_uuid_frame()) == []
    events = carrier.parse(encode_frame(kind, b"\x01\x00" * 160))
    start = events[0]
    assert isinstance(start, call.CallStart) and events[1:] == [call.CallAudio(b"\x01\x00" * 160)]
    return carrier, start


def test_the_call_starts_with_its_uuid_and_first_audio() -> None:
    carrier, start = _started()
    assert start.carrier == "audiosocket"
    assert start.call_id == start.stream_id == str(CALL_UUID)
    assert start.input_format == start.output_format == SLIN_8K
    assert carrier.framing == call.Framing(chunk_ms=20, multiple=320)
    assert carrier.has_marks is False
    assert AudioSocketCarrier.recognizes(_uuid_frame())
    assert not AudioSocketCarrier.recognizes(encode_frame(KIND_AUDIO, b"\x00" * 16))
    assert not AudioSocketCarrier.recognizes("MEDIA_START")


@pytest.mark.parametrize(("kind", "rate"), [(k, r) for k, r in AUDIO_RATES.items() if r <= 48_000])
def test_each_slin_kind_sets_the_calls_rate(kind: int, rate: int) -> None:
    carrier, start = _started(kind)
    assert start.input_format == AudioFormat(encoding=Encoding.PCM16, rate=rate)
    assert carrier.framing.chunk_ms == 20 and carrier.framing.multiple == rate * 20 // 1000 * 2
    (frame,) = carrier.media(b"\x00\x01" * 10)
    assert isinstance(frame, bytes) and frame[0] == kind  # the reply goes back at the call's rate


@pytest.mark.parametrize("kind", [0x17, 0x18])
def test_rates_above_48_khz_are_refused_and_the_call_ends(kind: int) -> None:
    carrier = AudioSocketCarrier()
    carrier.parse(_uuid_frame())
    with pytest.raises(ProtocolError) as info:
        carrier.parse(encode_frame(kind, b"\x00" * 64))
    assert info.value.code is ErrorCode.UNSUPPORTED_SAMPLE_RATE
    assert carrier.parse(encode_frame(kind, b"\x00" * 64)) == [call.CallEnded("unsupported_format")]


def test_every_kind_asterisk_sends() -> None:
    carrier, _ = _started()
    assert carrier.parse(encode_frame(KIND_AUDIO, b"\x02\x00" * 160)) == [call.CallAudio(b"\x02\x00" * 160)]
    assert carrier.parse(encode_frame(KIND_AUDIO)) == []
    assert carrier.parse(encode_frame(KIND_DTMF, b"5")) == [call.Dtmf("5")]
    assert carrier.parse(encode_frame(KIND_DTMF, b"#")) == [call.Dtmf("#")]
    assert carrier.parse(encode_frame(KIND_DTMF, b"")) == []
    assert carrier.parse(encode_frame(KIND_ERROR, b"\x02")) == [
        call.CarrierError("audiosocket_0x02", "frame forwarding error")
    ]
    assert carrier.parse(encode_frame(KIND_ERROR)) == [call.CarrierError("audiosocket_0x00", "error 0x00")]
    assert carrier.parse(_uuid_frame(uuid.uuid4())) == []  # the call keeps its first id
    assert carrier.call_id == str(CALL_UUID)
    assert carrier.parse(encode_frame(KIND_HANGUP)) == [call.CallEnded("hangup")]


def test_dtmf_and_hangup_before_any_audio() -> None:
    carrier = AudioSocketCarrier()
    assert carrier.parse(_uuid_frame()) == []
    assert carrier.parse(encode_frame(KIND_DTMF, b"1")) == [call.Dtmf("1")]
    assert carrier.parse(encode_frame(KIND_HANGUP)) == [call.CallEnded("hangup")]


@pytest.mark.parametrize(
    "frame",
    [
        "MEDIA_START",
        b"",
        b"\x10\x00",
        b"\x10\x00\x05\x00",
        encode_frame(KIND_UUID, b"\x00" * 15),
        encode_frame(KIND_AUDIO, b"\x00" * 3),
        encode_frame(0x02, b"x"),
        encode_frame(0x47, b"ET / HTTP/1.1"),
    ],
)
def test_malformed_frames_are_protocol_errors(frame: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        AudioSocketCarrier().parse(frame)


def test_the_rate_of_a_call_cannot_change() -> None:
    carrier, _ = _started(KIND_AUDIO)
    with pytest.raises(ProtocolError):
        carrier.parse(encode_frame(0x12, b"\x00" * 640))


def test_fuzzed_frames_raise_nothing_but_protocol_errors() -> None:
    rng = random.Random(9)
    for _ in range(3000):
        carrier = AudioSocketCarrier()
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice([0x00, 0x01, 0x03, 0x10, 0x11, 0x12, 0x17, 0xFF, rng.randrange(256)])
            payload = rng.randbytes(rng.choice([0, 1, 2, 15, 16, 17, 320, rng.randrange(700)]))
            frame = encode_frame(kind, payload)
            if rng.random() < 0.2:
                frame = frame[: rng.randrange(len(frame) + 1)] + rng.randbytes(rng.randrange(3))
            with contextlib.suppress(ProtocolError):
                assert isinstance(carrier.parse(frame), list)


def test_reply_audio_goes_out_in_20_ms_frames() -> None:
    carrier, _ = _started()
    frames = carrier.media(b"\x03\x00" * 400)  # 100 ms
    assert [len(f) for f in frames] == [3 + 320] * 2 + [3 + 160]
    assert all(isinstance(f, bytes) and f[0] == KIND_AUDIO for f in frames)
    assert b"".join(decode_frame(f)[1] for f in frames if isinstance(f, bytes)) == b"\x03\x00" * 400
    assert carrier.media(b"") == []
    assert carrier.mark("1.1") is None
    assert carrier.clear() is None  # nothing to flush: stopping sending is the barge-in
    assert carrier.hangup() == b"\x00\x00\x00"


def test_the_playout_paces_whole_frames_by_the_clock() -> None:
    carrier, start = _started()
    playout = Playout(start.output_format, carrier.framing, lead_ms=100, marks=carrier.has_marks)
    playout.queue("resp_1", "item_1", b"\x04\x00" * 8_000 + b"\x04\x00" * 7)  # 1 s and a bit
    playout.finish("resp_1")
    sent_ms = 0.0
    now = 0.0
    while now < 1.5:
        pieces, _ = playout.due(now)
        for piece in pieces:
            for frame in carrier.media(piece.audio):
                assert isinstance(frame, bytes) and len(frame) == 3 + 320
                sent_ms += 20
        assert sent_ms <= now * 1000 + 100 + 20  # real time plus the lead (and the frame that crosses it)
        now += 0.005
    assert sent_ms == 1020
    assert playout.heard_ms(0.5) > 0  # the clock is the cursor


# -- the TCP transport -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _tcp_pair() -> AsyncIterator[tuple[StreamSocket, asyncio.StreamReader, asyncio.StreamWriter]]:
    accepted: asyncio.Queue[StreamSocket] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(StreamSocket(reader, writer))

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    stream = await asyncio.wait_for(accepted.get(), 5)
    try:
        yield stream, reader, writer
    finally:
        writer.close()
        await stream.close()
        server.close()
        await server.wait_closed()


async def test_the_stream_socket_hands_over_whole_frames_and_the_end_of_the_stream() -> None:
    async with _tcp_pair() as (stream, reader, writer):
        frames = [_uuid_frame(), encode_frame(KIND_AUDIO, b"\x05\x00" * 160), encode_frame(KIND_DTMF, b"9")]
        data = b"".join(frames)
        for offset in range(0, len(data), 7):  # dribbled in 7-byte writes
            writer.write(data[offset : offset + 7])
            await writer.drain()
            await asyncio.sleep(0)
        for frame in frames:
            message = await asyncio.wait_for(stream.receive(), 5)
            assert message == {"type": "websocket.receive", "bytes": frame}
        await stream.send_bytes(encode_frame(KIND_HANGUP))
        await stream.send_text("ignored: AudioSocket has no text")
        assert await asyncio.wait_for(reader.readexactly(3), 5) == b"\x00\x00\x00"
        writer.close()
        assert await asyncio.wait_for(stream.receive(), 5) == {"type": "websocket.disconnect", "code": 1000}
        assert await stream.receive() == {"type": "websocket.disconnect", "code": 1000}


async def test_a_stream_cut_mid_frame_is_a_dropped_connection() -> None:
    async with _tcp_pair() as (stream, _, writer):
        writer.write(b"\x10\x01\x40" + b"\x00" * 100)
        await writer.drain()
        writer.close()
        assert await asyncio.wait_for(stream.receive(), 5) == {"type": "websocket.disconnect", "code": 1006}


async def test_closing_the_stream_socket_ends_the_peers_stream() -> None:
    async with _tcp_pair() as (stream, reader, _):
        await stream.close(1000, "bye")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert await asyncio.wait_for(stream.receive(), 5) == {"type": "websocket.disconnect", "code": 1000}


async def test_the_server_serves_each_connection_and_ends_them_when_it_closes() -> None:
    served: list[tuple[Socket, call.Carrier]] = []

    async def serve_call(socket: Socket, carrier: call.Carrier) -> None:
        served.append((socket, carrier))
        while (await socket.receive())["type"] != "websocket.disconnect":
            pass

    server = AudioSocketServer(serve_call, "127.0.0.1", 0)
    await server.start()
    assert server.port > 0
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(_uuid_frame())
    await writer.drain()
    for _ in range(200):
        if served:
            break
        await asyncio.sleep(0.01)
    assert isinstance(served[0][1], AudioSocketCarrier)
    await asyncio.wait_for(server.close(timeout_s=2), 5)
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", server.port)


# -- configuration ---------------------------------------------------------------------------------


def test_the_port_is_a_setting_and_a_serve_flag() -> None:
    assert load_settings().telephony.audiosocket_port is None
    assert load_settings(None, **{"telephony.audiosocket_port": 9092}).telephony.audiosocket_port == 9092
    with pytest.raises(ConfigError):
        load_settings(None, **{"telephony.audiosocket_port": 70_000})
    args = _parser().parse_args(["serve", "--audiosocket-port", "9092"])
    assert args.audiosocket_port == 9092


# -- calls into a real gateway ------------------------------------------------------------------------


@dataclass
class TcpPhone:
    """Asterisk's side of an AudioSocket call: the UUID, 20 ms slin frames at real time, what comes back."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    received: list[tuple[float, int, bytes]] = field(default_factory=list)
    ended_at: float | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def dial(cls, port: int) -> TcpPhone:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        phone = cls(reader, writer)
        writer.write(_uuid_frame())
        phone._tasks.append(asyncio.create_task(phone._receive()))
        return phone

    async def say(self, pcm: bytes) -> None:
        """Stream ``pcm`` (slin 8 kHz) in 20 ms frames, one per 20 ms, as Asterisk reads the channel."""
        start = time.monotonic()
        for index, offset in enumerate(range(0, len(pcm), 320)):
            self.writer.write(encode_frame(KIND_AUDIO, pcm[offset : offset + 320]))
            await self.writer.drain()
            delay = start + (index + 1) * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    def keep_talking(self) -> None:
        """The channel goes on sending (silence) while the reply plays, as a live channel does."""
        self._tasks.append(asyncio.create_task(self._silence()))

    async def _silence(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while self.ended_at is None:
                await self.say(b"\x00" * 3_200)

    async def hang_up(self) -> None:
        for task in self._tasks[1:]:
            task.cancel()
        self.writer.write(encode_frame(KIND_HANGUP))
        await self.writer.drain()

    async def _receive(self) -> None:
        tlv = TlvReader()
        while data := await self.reader.read(1 << 16):
            now = time.monotonic()
            for frame in tlv.feed(data):
                kind, payload = decode_frame(frame)
                self.received.append((now, kind, payload))
        self.ended_at = time.monotonic()

    def audio(self) -> list[tuple[float, bytes]]:
        return [(at, payload) for at, kind, payload in self.received if kind == KIND_AUDIO]

    async def wait(self, match: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not match(self):
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.writer.close()


@pytest.fixture(scope="module")
def audiosocket_gateway(module_gateway_factory: GatewayFactory) -> tuple[Gateway, int]:
    port = free_port()
    # pace 0: the echo engine hands over the whole reply at once, so the pacing measured is the gateway's.
    gateway = module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 0}}},
        args=["--audiosocket-port", str(port)],
        name="audiosocket-echo",
    )
    return gateway, port


def _caller() -> bytes:
    speech = load_fixture_speech(8_000)
    return encode(np.concatenate([np.zeros(4_000, np.float32), speech, np.zeros(9_600, np.float32)]), "pcm16")


@pytest.mark.e2e
async def test_an_audiosocket_call_is_answered_at_real_time_and_hung_up_with_kind_0(
    audiosocket_gateway: tuple[Gateway, int],
) -> None:
    gateway, port = audiosocket_gateway
    lead_s, frame_s = 0.1, 0.02  # telephony.lead_ms, and the frame that crosses it
    phone = await TcpPhone.dial(port)
    try:
        await phone.say(_caller())
        phone.keep_talking()
        await phone.wait(lambda p: len(p.audio()) >= 5, timeout=20)
        assert (await gateway.wait_sessions(1))["sessions"] == 1
        # The whole reply, then a second with nothing more.
        await phone.wait(lambda p: p.audio() and time.monotonic() - p.audio()[-1][0] > 1.0, timeout=30)
        audio = phone.audio()
        assert all(len(payload) == 320 for _, payload in audio), {len(p) for _, p in audio}
        assert len(audio) * frame_s > 2.5  # the echo of a 3 s sentence
        # Never ahead of real time by more than the lead: Asterisk plays what it gets at once.
        first = audio[0][0]
        ahead = max((index + 1) * frame_s - (at - first) for index, (at, _) in enumerate(audio))
        assert ahead <= lead_s + frame_s + 0.08, f"{ahead * 1000:.0f} ms ahead of real time"
        took = audio[-1][0] - first
        assert took >= len(audio) * frame_s - lead_s - frame_s - 0.08, f"{len(audio)} frames in {took:.2f} s"
        assert not [kind for _, kind, _ in phone.received if kind != KIND_AUDIO]
        # Kind 0x00 ends the call: the gateway closes the connection and the session.
        await phone.hang_up()
        await phone.wait(lambda p: p.ended_at is not None, timeout=10)
        await gateway.wait_sessions(0, timeout=10)
    finally:
        await phone.close()


@pytest.mark.e2e
async def test_asterisk_closing_the_connection_ends_the_call(
    audiosocket_gateway: tuple[Gateway, int],
) -> None:
    gateway, port = audiosocket_gateway
    phone = await TcpPhone.dial(port)
    try:
        await phone.say(b"\x00" * 3_200)
        await gateway.wait_sessions(1)
    finally:
        await phone.close()
    await gateway.wait_sessions(0, timeout=10)


@pytest.mark.e2e
async def test_a_gateway_shutting_down_hangs_up_its_audiosocket_calls(
    gateway_factory: GatewayFactory,
) -> None:
    port = free_port()
    gateway = gateway_factory.start(
        {"server": {"web_demo": False}, "telephony": {"audiosocket_port": port}}, name="audiosocket-stop"
    )
    phone = await TcpPhone.dial(port)
    try:
        await phone.say(b"\x00" * 3_200)
        phone.keep_talking()
        await gateway.wait_sessions(1)
        await asyncio.to_thread(gateway.stop)  # SIGTERM: a graceful shutdown
        await phone.wait(lambda p: p.ended_at is not None, timeout=5)
        assert (KIND_HANGUP, b"") in [(kind, payload) for _, kind, payload in phone.received]
    finally:
        await phone.close()
