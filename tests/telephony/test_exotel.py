"""Exotel's Voicebot stream: the carrier against Exotel's message shapes, then a call into a real gateway."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.exotel import ExotelCarrier
from duplex_gateway.telephony.carriers.twilio import TwilioCarrier
from duplex_gateway.telephony.carriers.vonage import VonageCarrier
from duplex_gateway.telephony.dialect import CallDialect
from duplex_gateway.telephony.registry import DetectingCarrier
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from tests.e2e.helpers import Gateway, GatewayFactory, encode, ws_connect
from tests.fixtures import PHRASES, load_speech
from tests.telephony import exotel_wire as wire
from tests.telephony.exotel_wire import ExotelWire
from tests.telephony.phone import Phone
from tests.telephony.twilio_wire import TwilioWire
from tests.telephony.vonage_wire import VonageWire

# -- the shapes of Exotel's docs ------------------------------------------------------------------

CONNECTED = '{"event":"connected"}'
MEDIA = json.dumps(
    {
        "event": "media",
        "sequence_number": "3",
        "stream_sid": wire.STREAM_SID,
        "media": {
            "chunk": "2",
            "timestamp": "200",
            "payload": base64.b64encode(b"\x01\x00\xff\x7f").decode(),
        },
    }
)
DTMF = json.dumps(
    {
        "event": "dtmf",
        "sequence_number": "7",
        "stream_sid": wire.STREAM_SID,
        "dtmf": {"digit": "5", "duration": "100"},
    }
)
MARK = json.dumps(
    {"event": "mark", "sequence_number": "15", "stream_sid": wire.STREAM_SID, "mark": {"name": "turn-3"}}
)
STOP = json.dumps(
    {
        "event": "stop",
        "sequence_number": "40",
        "stream_sid": wire.STREAM_SID,
        "stop": {"call_sid": wire.CALL_SID, "account_sid": wire.ACCOUNT_SID, "reason": "callended"},
    }
)


def _start(rate: object = "8000", **media_format: object) -> str:
    return json.dumps(
        {
            "event": "start",
            "sequence_number": "1",
            "stream_sid": wire.STREAM_SID,
            "start": {
                "stream_sid": wire.STREAM_SID,
                "call_sid": wire.CALL_SID,
                "account_sid": wire.ACCOUNT_SID,
                "from": wire.CALLER,
                "to": wire.CALLEE,
                "custom_parameters": {"key1": "value1"},
                "media_format": {
                    "encoding": "audio/x-raw",
                    "sample_rate": rate,
                    "bit_rate": "16",
                    **media_format,
                },
            },
        }
    )


def _started(rate: int = 8_000) -> ExotelCarrier:
    carrier = ExotelCarrier()
    carrier.parse(_start(str(rate)))
    return carrier


# -- inbound ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
def test_the_start_opens_the_call_in_raw_pcm16_at_the_applets_rate(rate: int) -> None:
    carrier = ExotelCarrier()
    assert carrier.parse(CONNECTED) == []
    (start,) = carrier.parse(_start(str(rate)))
    pcm = AudioFormat(encoding=Encoding.PCM16, rate=rate)
    assert start == call.CallStart(
        carrier="exotel",
        call_id=wire.CALL_SID,
        stream_id=wire.STREAM_SID,
        caller=wire.CALLER,
        callee=wire.CALLEE,
        parameters={"key1": "value1"},
        input_format=pcm,
        output_format=pcm,
    )


def test_a_start_without_a_media_format_is_exotels_default_and_numbers_are_read_as_text() -> None:
    message = json.loads(_start())
    del message["start"]["media_format"]
    (start,) = ExotelCarrier().parse(json.dumps(message))
    assert isinstance(start, call.CallStart) and start.input_format == AudioFormat(
        encoding=Encoding.PCM16, rate=8_000
    )
    (start,) = ExotelCarrier().parse(_start(16000))  # a number, where Exotel writes a string
    assert isinstance(start, call.CallStart) and start.input_format.rate == 16_000


def test_the_stream_sid_may_be_only_at_the_top_of_the_start() -> None:
    message = json.loads(_start())
    del message["start"]["stream_sid"]
    carrier = ExotelCarrier()
    (start,) = carrier.parse(json.dumps(message))
    assert isinstance(start, call.CallStart) and start.stream_id == wire.STREAM_SID == carrier.stream_sid


def test_media_dtmf_mark_and_stop_are_call_events() -> None:
    carrier = _started()
    assert carrier.parse(MEDIA) == [call.CallAudio(b"\x01\x00\xff\x7f")]
    assert carrier.parse(DTMF) == [call.Dtmf("5")]
    assert carrier.parse(MARK) == [call.MarkPlayed("turn-3")]
    assert carrier.parse(STOP) == [call.CallEnded("callended")]
    assert carrier.parse('{"event":"stop","stream_sid":"MZ"}') == [call.CallEnded("stop")]


def test_a_mark_or_dtmf_without_a_name_or_digit_is_nothing() -> None:
    carrier = _started()
    assert carrier.parse('{"event":"mark","mark":{}}') == []
    assert carrier.parse('{"event":"mark"}') == []
    assert carrier.parse('{"event":"dtmf","dtmf":{"duration":"100"}}') == []


# -- outbound -------------------------------------------------------------------------------------


def test_media_mark_and_clear_carry_the_stream_sid() -> None:
    carrier = _started()
    audio = bytes(range(256)) * 25  # 6400 bytes
    (media,) = carrier.media(audio)
    assert isinstance(media, str)
    assert json.loads(media) == {
        "event": "media",
        "stream_sid": wire.STREAM_SID,
        "media": {"payload": base64.b64encode(audio).decode()},
    }
    mark = carrier.mark("turn-3")
    assert isinstance(mark, str)
    assert json.loads(mark) == {"event": "mark", "stream_sid": wire.STREAM_SID, "mark": {"name": "turn-3"}}
    clear = carrier.clear()
    assert isinstance(clear, str)
    assert json.loads(clear) == {"event": "clear", "stream_sid": wire.STREAM_SID}
    assert carrier.hangup() is None  # closing the socket hands the call to the next applet
    assert carrier.has_marks


def _pumped(rate: int, deltas: list[int]) -> tuple[list[bytes], bytes]:
    """Reply audio of ``deltas`` byte counts through a call dialect: the media payloads sent, and the audio."""
    dialect = CallDialect(ExotelCarrier())
    dialect.parse(_start(str(rate)))
    rng = np.random.default_rng(rate)
    audio = b"".join(rng.integers(1, 256, size=n, dtype=np.uint8).tobytes() for n in deltas)
    offset = 0
    for n in deltas:
        dialect.render(
            ev.AudioDelta(response_id="r1", item_id="i1", audio=audio[offset : offset + n], rate=rate), seq=0
        )
        offset += n
    dialect.render(ev.AudioDone(response_id="r1", item_id="i1"), seq=0)
    dialect.render(ev.ResponseDone(response_id="r1", status="completed"), seq=0)
    payloads: list[bytes] = []
    now = 0.0
    for _ in range(10_000):  # at real time: ask again when the dialect says to
        frames, wake = dialect.pump(now)
        for frame in frames:
            assert isinstance(frame, str)
            message = json.loads(frame)
            if message["event"] == "media":
                payloads.append(base64.b64decode(message["media"]["payload"]))
        if wake is None:
            break
        now = wake + 1e-6  # just after: at exactly ``wake`` float rounding may keep the piece waiting
    return payloads, audio


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
@pytest.mark.parametrize(
    "deltas",
    [
        [2],  # one sample
        [962, 4_800, 2, 318],  # odd sizes, less than a piece in all
        [4_800] * 30,  # 100 ms deltas at 24 kHz
        [2 * 24_000 * 3 + 6],  # three seconds and three samples in one delta
    ],
    ids=["one-sample", "odd", "steady", "long"],
)
def test_every_media_payload_the_gateway_sends_obeys_exotels_chunk_rules(
    rate: int, deltas: list[int]
) -> None:
    payloads, audio = _pumped(rate, deltas)
    assert payloads
    for payload in payloads:
        assert wire.MIN_BYTES <= len(payload) <= wire.MAX_BYTES, len(payload)
        assert len(payload) % wire.MULTIPLE == 0, len(payload)
    sent = b"".join(payloads)
    # All of the reply, in order, and only silence after it (the last piece's padding).
    assert sent[: len(audio)] == audio
    assert set(sent[len(audio) :]) <= {0}
    assert len(sent) - len(audio) < max(wire.MIN_BYTES, wire.MULTIPLE)


# -- malformed input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x01",  # binary: Exotel sends text only
        "not json",
        "[1, 2]",
        '"start"',
        "{}",
        '{"event":"hello"}',
        '{"event":"media"}',
        '{"event":"media","media":"AAA="}',
        '{"event":"media","media":{}}',
        '{"event":"media","media":{"payload":5}}',
        '{"event":"media","media":{"payload":"not base64!"}}',
        '{"event":"start"}',
        '{"event":"start","start":[]}',
        '{"event":"start","start":{"call_sid":"CA1"}}',  # no stream_sid
        _start("44100"),
        _start("eight thousand"),
        _start("nan"),
        _start(encoding="audio/x-mulaw"),
        '{"event":"start","start":{"stream_sid":"MZ","call_sid":"CA","media_format":"audio/x-raw"}}',
    ],
)
def test_malformed_messages_raise_protocol_errors(frame: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        ExotelCarrier().parse(frame)


def test_an_unsupported_sample_rate_says_so() -> None:
    with pytest.raises(ProtocolError) as raised:
        ExotelCarrier().parse(_start("44100"))
    assert raised.value.code is ErrorCode.UNSUPPORTED_SAMPLE_RATE


_ODD_VALUES: list[Any] = [None, True, 0, -1, 1e308, "", "x", "!!!", [], [1], {}, {"a": {}}]


def _mutations(message: Any) -> Iterator[Any]:
    """``message`` with each value (at any depth) replaced by each odd value, and each key dropped."""
    if isinstance(message, dict):
        for key, value in message.items():
            rest = {k: v for k, v in message.items() if k != key}
            yield rest
            for odd in _ODD_VALUES:
                yield {**rest, key: odd}
            for inner in _mutations(value):
                yield {**rest, key: inner}


@pytest.mark.parametrize(
    "message", [CONNECTED, _start(), MEDIA, DTMF, MARK, STOP], ids=lambda m: json.loads(m)["event"]
)
def test_any_mangled_message_is_an_event_or_a_protocol_error(message: str) -> None:
    for mangled in _mutations(json.loads(message)):
        carrier = _started()
        try:
            events = carrier.parse(json.dumps(mangled))
        except ProtocolError:
            continue
        assert all(
            isinstance(e, call.CallStart | call.CallAudio | call.MarkPlayed | call.Dtmf | call.CallEnded)
            for e in events
        ), (mangled, events)


# -- telling carriers apart ---------------------------------------------------------------------------


def test_exotel_recognizes_its_start_and_nothing_else() -> None:
    assert ExotelCarrier.recognizes(_start())
    assert ExotelCarrier.recognizes(ExotelWire(16_000).start())
    others: list[str | bytes] = [
        CONNECTED,
        MEDIA,
        STOP,
        *TwilioWire().greeting(),
        *VonageWire().greeting(),
        b'{"start":{"stream_sid":"MZ","call_sid":"CA"}}',  # binary is never a start
        b"\x00" * 640,
        "not json",
        "[]",
        '{"start":"MZ"}',
    ]
    for frame in others:
        assert not ExotelCarrier.recognizes(frame), frame


def test_the_other_carriers_do_not_take_exotels_start_for_theirs() -> None:
    for frame in ExotelWire().greeting():
        assert not TwilioCarrier.recognizes(frame)
        assert not VonageCarrier.recognizes(frame)


def test_the_telephony_path_detects_exotel() -> None:
    carrier = DetectingCarrier()
    greeting = ExotelWire(16_000).greeting()
    assert carrier.parse(greeting[0]) == []  # "connected" is held until a start names the carrier
    (start,) = carrier.parse(greeting[1])
    assert isinstance(carrier.detected, ExotelCarrier)
    assert isinstance(start, call.CallStart) and start.input_format.rate == 16_000


# -- a call into a real gateway ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0}}}, name="exotel-echo"
    )


def _pcm(samples: np.ndarray) -> bytes:
    return encode(samples, "pcm16")


@pytest.mark.e2e
@pytest.mark.parametrize("rate", [8_000, 16_000])
async def test_a_call_is_answered_in_exotel_media_and_the_caller_can_talk_over_the_reply(
    echo_gateway: Gateway, rate: int
) -> None:
    exotel = ExotelWire(rate)
    speech = load_speech(rate)
    async with (
        ws_connect(echo_gateway, f"/telephony/exotel?sample-rate={rate}") as ws,
        Phone(ws, exotel) as phone,
    ):
        # A turn: the echo engine answers with the caller's own audio, in Exotel's media.
        await phone.say(
            _pcm(np.concatenate([np.zeros(rate * 3 // 10, np.float32), speech, np.zeros(rate, np.float32)]))
        )
        await phone.wait(lambda p: len(p.played) >= 1.5 * exotel.bytes_per_second and bool(p.played_marks))
        assert not phone.clears

        # The caller talks over the reply: Exotel is told to clear, and nothing of the cut reply follows.
        # Another voice and sentence than the reply's: the gateway's echo suppressor must not take the
        # caller for a speakerphone echo of the reply.
        barge_at = time.monotonic()
        await phone.say(_pcm(PHRASES[-4].load(rate)[: rate * 2]))
        speech_ended = time.monotonic()
        await phone.say(_pcm(np.zeros(rate, np.float32)))
        assert phone.clears, "no clear when the caller talked over the reply"
        cleared_at = phone.clears[0]
        assert barge_at < cleared_at < speech_ended
        # The echo's next reply comes only once the caller's turn is over: anything before is the cut reply's.
        await phone.wait(lambda p: any(o.at > cleared_at for o in p.media()))
        late = [o for o in phone.media() if cleared_at < o.at < speech_ended]
        assert not late, f"{len(late)} media frames of the cut reply after the clear"

        assert exotel.problems == []
        reply = phone.media()
        assert len(reply) >= 5
        for out in reply:  # Exotel's chunk rules, checked once more where a reader would look
            assert 3_200 <= len(out.audio) <= 100_000 and len(out.audio) % 320 == 0
        await phone.hang_up()
