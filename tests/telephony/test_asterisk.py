"""Asterisk ``chan_websocket``: the carrier's translation, and calls into a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from typing import Any

import numpy as np
import pytest

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.asterisk import AsteriskCarrier, asterisk_format
from duplex_gateway.telephony.playout import Playout
from duplex_gateway.telephony.registry import DetectingCarrier, carrier_for
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from tests.e2e.helpers import Gateway, GatewayFactory, encode, ws_connect
from tests.fixtures import PHRASES
from tests.fixtures import load_speech as load_fixture_speech
from tests.telephony.asterisk_wire import CHANNEL_ID, CONNECTION_ID, AsteriskWire
from tests.telephony.phone import Phone

ULAW_8K = AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)


def _started(json_format: bool, **kwargs: object) -> tuple[AsteriskCarrier, call.CallStart]:
    carrier = AsteriskCarrier()
    (start,) = carrier.parse(AsteriskWire(json_format=json_format, **kwargs).greeting()[0])  # type: ignore[arg-type]
    assert isinstance(start, call.CallStart)
    return carrier, start


# -- recognizing a channel ---------------------------------------------------------------------


@pytest.mark.parametrize("json_format", [False, True])
def test_a_media_start_is_recognized_in_either_format(json_format: bool) -> None:
    (start,) = AsteriskWire(json_format=json_format).greeting()
    assert AsteriskCarrier.recognizes(start)
    assert isinstance(carrier_for("asterisk"), AsteriskCarrier)


@pytest.mark.parametrize("json_format", [False, True])
def test_telephony_without_a_carrier_recognizes_asterisk(json_format: bool) -> None:
    detecting = DetectingCarrier()
    (start,) = detecting.parse(AsteriskWire(json_format=json_format).greeting()[0])
    assert isinstance(detecting.detected, AsteriskCarrier)
    assert isinstance(start, call.CallStart) and start.carrier == "asterisk"
    assert detecting.framing.multiple == 160


@pytest.mark.parametrize(
    "frame",
    [
        b"MEDIA_START connection_id:x format:ulaw",
        "MEDIA_XOFF",
        '{"event":"MEDIA_XON"}',
        '{"event":"start","start":{"streamSid":"MZ1","callSid":"CA1"}}',
        "MEDIA_STARTED format:ulaw",
        "",
        "{",
        "[1, 2]",
        '"MEDIA_START"',
        "\x00\xff",
    ],
)
def test_other_frames_are_not_recognized(frame: str | bytes) -> None:
    assert not AsteriskCarrier.recognizes(frame)


def test_recognizing_never_raises() -> None:
    rng = random.Random(7)
    alphabet = 'MEDIA_START{}":, \n\t\\[]0123456789abc\x00\xff'
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        AsteriskCarrier.recognizes(text)
        AsteriskCarrier.recognizes(text.encode("utf-8", "replace"))


# -- MEDIA_START -----------------------------------------------------------------------------


def test_a_plain_text_start_opens_the_call() -> None:
    carrier, start = _started(False)
    assert start.carrier == "asterisk"
    assert start.call_id == CHANNEL_ID and start.stream_id == CONNECTION_ID
    assert start.input_format == start.output_format == ULAW_8K
    assert start.parameters == {} and start.caller is None and start.callee is None
    assert carrier.uses_json is False
    assert carrier.framing == call.Framing(chunk_ms=40, multiple=160)
    assert carrier.has_marks


def test_a_json_start_brings_the_channel_variables() -> None:
    variables = {"__CALLER": "+15551230000", "_CALLEE": "+15557654321", "profile": "sales"}
    carrier, start = _started(True, variables=variables)
    assert carrier.uses_json is True
    assert start.caller == "+15551230000" and start.callee == "+15557654321"
    assert start.parameters["profile"] == "sales"
    assert start.parameters["MEDIA_WEBSOCKET_CONNECTION_ID"] == CONNECTION_ID
    assert start.call_id == CHANNEL_ID


def test_caller_and_callee_come_from_callerid_and_exten_variables() -> None:
    _, start = _started(True, variables={"CALLERID(num)": "2001", "EXTEN": "600"})
    assert (start.caller, start.callee) == ("2001", "600")


def test_an_older_asterisk_start_without_channel_id_uses_the_connection_id() -> None:
    (start,) = AsteriskCarrier().parse(
        "MEDIA_START connection_id:abc channel:WebSocket/abc/0x1 format:ulaw optimal_frame_size:160 ptime:20"
    )
    assert isinstance(start, call.CallStart) and start.call_id == "abc"


@pytest.mark.parametrize(
    ("codec", "encoding", "rate"),
    [
        ("ulaw", Encoding.G711_ULAW, 8_000),
        ("alaw", Encoding.G711_ALAW, 8_000),
        ("slin", Encoding.PCM16, 8_000),
        ("slin12", Encoding.PCM16, 12_000),
        ("slin16", Encoding.PCM16, 16_000),
        ("slin24", Encoding.PCM16, 24_000),
        ("slin32", Encoding.PCM16, 32_000),
        ("slin44", Encoding.PCM16, 44_100),
        ("slin48", Encoding.PCM16, 48_000),
        ("sln16", Encoding.PCM16, 16_000),
    ],
)
def test_asterisk_formats_map_onto_the_gateways(codec: str, encoding: Encoding, rate: int) -> None:
    assert asterisk_format(codec) == AudioFormat(encoding=encoding, rate=rate)


def test_a_slin16_channel_frames_reply_audio_in_its_own_frames() -> None:
    carrier, start = _started(False, codec="slin16", optimal_frame_size=640)
    assert start.output_format == AudioFormat(encoding=Encoding.PCM16, rate=16_000)
    assert carrier.framing.multiple == 640 and carrier.framing.chunk_ms == 40


@pytest.mark.parametrize("codec", ["opus", "g722", "g729", "slin96", "slin192", "speex"])
@pytest.mark.parametrize("json_format", [False, True])
def test_unsupported_codecs_are_refused_and_the_call_ends(codec: str, json_format: bool) -> None:
    carrier = AsteriskCarrier()
    with pytest.raises(ProtocolError) as info:
        carrier.parse(AsteriskWire(json_format=json_format, codec=codec).greeting()[0])
    assert info.value.code is ErrorCode.UNSUPPORTED_AUDIO_FORMAT
    assert codec in info.value.message and "c(ulaw)" in info.value.message
    # The channel cannot be served: the next message ends the call (the socket closes, Asterisk hangs up).
    assert carrier.parse(b"\xff" * 160) == [call.CallEnded("unsupported_format")]


def test_a_repeated_start_changes_nothing() -> None:
    carrier, _ = _started(False)
    assert carrier.parse(AsteriskWire(json_format=False).greeting()[0]) == []


# -- events, in both formats ---------------------------------------------------------------------


@pytest.mark.parametrize("json_format", [False, True])
def test_every_asterisk_event(json_format: bool) -> None:
    carrier, _ = _started(json_format)
    wire = AsteriskWire(json_format=json_format)

    def event(name: str, plain: str, **fields: object) -> str:
        if json_format:
            return json.dumps({"event": name, "channel_id": CHANNEL_ID, **fields})
        return plain

    assert carrier.parse(b"\x7f" * 160) == [call.CallAudio(b"\x7f" * 160)]
    assert carrier.parse(b"") == []
    assert carrier.parse(wire.mark_played("3.17")) == [call.MarkPlayed("3.17")]
    assert carrier.parse(wire.xoff()) == [call.FlowPaused()]
    assert carrier.parse(wire.xon()) == [call.FlowResumed()]
    assert carrier.parse(wire.dtmf("5")) == [call.Dtmf("5")]
    assert carrier.parse(wire.dtmf("#")) == [call.Dtmf("#")]
    error = event(
        "ERROR",
        f"ERROR channel_id:{CHANNEL_ID} error_text:MARK_MEDIA not supported in passthrough mode",
        error_text="MARK_MEDIA not supported in passthrough mode",
    )
    assert carrier.parse(error) == [
        call.CarrierError("asterisk_error", "MARK_MEDIA not supported in passthrough mode")
    ]
    status = event(
        "STATUS",
        f"STATUS channel_id:{CHANNEL_ID} queue_length:120 xon_level:800 xoff_level:900 queue_full:false "
        "bulk_media:false media_paused:false",
        queue_length=120,
        xon_level=800,
        xoff_level=900,
        queue_full=False,
        bulk_media=False,
        media_paused=False,
    )
    assert carrier.parse(status) == []
    assert carrier.parse(event("QUEUE_DRAINED", "QUEUE_DRAINED")) == []
    assert (
        carrier.parse(event("MEDIA_BUFFERING_COMPLETED", "MEDIA_BUFFERING_COMPLETED b1", correlation_id="b1"))
        == []
    )
    assert (
        carrier.parse(event("MEDIA_BUFFERING_COMPLETED", "MEDIA_BUFFERING_COMPLETED", correlation_id=""))
        == []
    )
    # A mark without a name is no mark.
    assert carrier.parse(event("MEDIA_MARK_PROCESSED", "MEDIA_MARK_PROCESSED", correlation_id="")) == []


def test_events_before_the_start_and_audio_of_partial_samples() -> None:
    carrier = AsteriskCarrier()
    assert carrier.parse("MEDIA_XOFF") == [call.FlowPaused()]
    carrier.parse("MEDIA_START connection_id:c channel_id:1.2 format:slin16 optimal_frame_size:640 ptime:20")
    with pytest.raises(ProtocolError) as info:
        carrier.parse(b"\x00" * 641)
    assert info.value.code is ErrorCode.INVALID_AUDIO_LENGTH


# -- commands, in the channel's format --------------------------------------------------------------


def test_plain_text_commands() -> None:
    carrier, _ = _started(False)
    assert carrier.mark("3.17") == "MARK_MEDIA 3.17"
    assert carrier.clear() == "FLUSH_MEDIA"
    assert carrier.hangup() == "HANGUP"


def test_json_commands() -> None:
    carrier, _ = _started(True)
    assert json.loads(str(carrier.mark("3.17"))) == {"command": "MARK_MEDIA", "correlation_id": "3.17"}
    assert json.loads(str(carrier.clear())) == {"command": "FLUSH_MEDIA"}
    assert json.loads(str(carrier.hangup())) == {"command": "HANGUP"}


@pytest.mark.parametrize("json_format", [False, True])
def test_commands_stay_under_asterisks_limit(json_format: bool) -> None:
    carrier, _ = _started(json_format)
    assert len(str(carrier.mark("999999.99999999")).encode()) <= 128
    assert carrier.mark("x" * 200) is None  # Asterisk would ignore it: not sent


@pytest.mark.parametrize("size", [1, 100, 159, 160, 161, 320, 479, 1000])
def test_reply_audio_is_whole_frames(size: int) -> None:
    carrier, _ = _started(False)
    (frame,) = carrier.media(b"\x01" * size)
    assert isinstance(frame, bytes) and len(frame) % 160 == 0 and len(frame) >= size
    assert frame[:size] == b"\x01" * size and set(frame[size:]) <= {0xFF}  # μ-law silence
    assert carrier.media(b"") == []


@pytest.mark.parametrize(
    ("codec", "frame_bytes"), [("ulaw", 160), ("alaw", 160), ("slin16", 640), ("slin", 320)]
)
def test_paced_reply_audio_is_whole_frames(codec: str, frame_bytes: int) -> None:
    carrier, start = _started(True, codec=codec, optimal_frame_size=frame_bytes)
    playout = Playout(start.output_format, carrier.framing, lead_ms=100, marks=carrier.has_marks)
    width = start.output_format.encoding.bytes_per_sample
    playout.queue("resp_1", "item_1", b"\x02" * (start.output_format.byte_count(1234) + width * 3))
    playout.finish("resp_1")
    sizes: list[int] = []
    now = 0.0
    for _ in range(200):
        pieces, _ = playout.due(now)
        for piece in pieces:
            for frame in carrier.media(piece.audio):
                assert isinstance(frame, bytes)
                sizes.append(len(frame))
        now += 0.02
    assert sizes and all(size % frame_bytes == 0 for size in sizes)
    assert sum(sizes) >= start.output_format.byte_count(1234)


# -- malformed input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        "",
        "   ",
        "{",
        '{"event": 5}',
        "[1,2]",
        '{"command":"MARK_MEDIA"}',
        '"MEDIA_XOFF"',
        "media_xoff",
        "WHAT_IS_THIS",
        '{"event":"WHAT_IS_THIS"}',
        "MEDIA_START connection_id:x optimal_frame_size:160",
        '{"event":"MEDIA_START","connection_id":"x"}',
        '{"event":"MEDIA_START","format":["ulaw"]}',
        "MEDIA_START format:slin16 optimal_frame_size:641",
        "{}",
        "\x00\x01",
    ],
)
def test_malformed_messages_are_protocol_errors(frame: str) -> None:
    with pytest.raises(ProtocolError):
        AsteriskCarrier().parse(frame)


def test_fuzzed_messages_raise_nothing_but_protocol_errors() -> None:
    rng = random.Random(11)
    words = [
        "MEDIA_START",
        "MEDIA_XOFF",
        "DTMF_END",
        "ERROR",
        "MEDIA_MARK_PROCESSED",
        "format:",
        "ulaw",
        "slin16",
        "optimal_frame_size:",
        "0",
        "-1",
        "99999999999",
        "digit:",
        "{",
        "}",
        '"event"',
        ":",
        ",",
        '"format"',
        '"MEDIA_START"',
        "null",
        "true",
        "[",
        "]",
        "ptime:",
        "channel_variables",
        " ",
        "\u00e9",
        "\x00",
    ]
    for _ in range(3000):
        carrier = AsteriskCarrier()
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        for frame in (text, text.encode("utf-8", "replace")):
            try:
                events = carrier.parse(frame)
            except ProtocolError:
                continue
            assert isinstance(events, list)
    for _ in range(500):
        fields: dict[str, object] = {
            "event": "MEDIA_START",
            "format": rng.choice(["ulaw", "slin16", 5, None, "opus", ""]),
            "optimal_frame_size": rng.choice([160, "160", -5, 0, 1.5, None, True, "x", 10**9]),
            "ptime": rng.choice([20, "20", 0, None, [], 3]),
            "channel_variables": rng.choice([{}, {"A": 1}, [], None, "x", {"EXTEN": None}]),
            "connection_id": rng.choice(["c", 5, None]),
        }
        with contextlib.suppress(ProtocolError):
            AsteriskCarrier().parse(json.dumps(fields))


# -- calls into a real gateway ------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    # pace 0: the echo engine hands over the whole reply at once, so the gateway's playout does the pacing.
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 0}}}, name="asterisk-echo"
    )


def _caller(speech: np.ndarray, before_s: float = 0.5, after_s: float = 1.2) -> bytes:
    pad = np.zeros(int(8_000 * before_s), np.float32), np.zeros(int(8_000 * after_s), np.float32)
    return encode(np.concatenate([pad[0], speech, pad[1]]), "g711_ulaw")


def _connect(gateway: Gateway) -> Any:
    return ws_connect(gateway, "/telephony/asterisk", subprotocols=["media"])


@pytest.mark.e2e
async def test_a_plain_text_call_is_answered_in_binary_ulaw_and_cut_off_by_barge_in(
    echo_gateway: Gateway,
) -> None:
    wire = AsteriskWire(json_format=False)
    async with _connect(echo_gateway) as ws, Phone(ws, wire) as phone:
        assert ws.subprotocol == "media"
        await phone.say(_caller(load_fixture_speech(8_000)))
        # The reply plays: binary μ-law in whole 160-byte frames, each piece followed by a mark Asterisk processes.
        await phone.wait(lambda p: len(p.media()) >= 10 and len(p.played_marks) >= 5, timeout=20)
        assert all(len(o.audio) % 160 == 0 for o in phone.media())
        assert all(command in ("MARK_MEDIA", "FLUSH_MEDIA") for command, _ in wire.commands)
        assert not phone.clears
        # The caller talks over it (another sentence, so it is not the reply's echo).
        speech = PHRASES[1].load(8_000)
        speaking_from = time.monotonic()
        speaking = asyncio.create_task(phone.say(_caller(speech, before_s=0.0, after_s=1.2)))
        await phone.wait(lambda p: bool(p.clears), timeout=10)
        flushed_at = phone.clears[0]
        cut = len(phone.sent)
        await speaking
        # Nothing of the cut reply came after FLUSH_MEDIA; the next reply needs the caller to stop first
        # (and then 500 ms of silence).
        spoken_until = speaking_from + len(speech) / 8_000 + 0.3
        after = [o for o in phone.sent[cut:] if o.kind == "media" and o.at < spoken_until]
        assert not after, f"{len(after)} media frames of the cut reply after FLUSH_MEDIA at {flushed_at}"
        assert [command for command, _ in wire.commands].count("FLUSH_MEDIA") == 1
        # The barge-in is answered in turn.
        await phone.wait(lambda p: any(o.kind == "media" for o in p.sent[cut:]), timeout=20)
        await phone.hang_up()
    await echo_gateway.wait_sessions(0, timeout=10)


@pytest.mark.e2e
async def test_a_json_call_stops_its_audio_on_media_xoff_until_media_xon(echo_gateway: Gateway) -> None:
    wire = AsteriskWire(json_format=True, variables={"__CALLEE": "600"})
    async with _connect(echo_gateway) as ws, Phone(ws, wire) as phone:
        assert ws.subprotocol == "media"
        await phone.say(_caller(load_fixture_speech(8_000)))
        await phone.wait(lambda p: len(p.media()) >= 5, timeout=20)
        await ws.send(wire.xoff())
        paused_at = time.monotonic()
        await asyncio.sleep(1.0)
        # Frames already on their way may land just after the XOFF; then nothing.
        late = [o for o in phone.media() if o.at > paused_at + 0.15]
        assert not late, f"{len(late)} media frames while Asterisk's queue was full"
        resumed = len(phone.sent)
        await ws.send(wire.xon())
        await phone.wait(lambda p: any(o.kind == "media" for o in p.sent[resumed:]), timeout=3)
        await phone.wait(lambda p: bool(p.played_marks), timeout=5)
        assert wire.commands and all(command == "MARK_MEDIA" for command, _ in wire.commands)
        await phone.press("5")
        await phone.hang_up()
    await echo_gateway.wait_sessions(0, timeout=10)


@pytest.mark.e2e
async def test_a_channel_in_an_unsupported_codec_is_hung_up(echo_gateway: Gateway) -> None:
    async with _connect(echo_gateway) as ws:
        await ws.send(AsteriskWire(json_format=True, codec="opus").greeting()[0])
        await ws.send(b"\x00" * 80)  # Asterisk streams the caller's audio right after MEDIA_START
        async with asyncio.timeout(5):
            async for frame in ws:
                assert isinstance(frame, str) and json.loads(frame) == {"command": "HANGUP"}, frame
        assert ws.close_code == 1000
    await echo_gateway.wait_sessions(0, timeout=10)
