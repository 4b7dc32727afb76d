"""Plivo audio streams: the carrier against Plivo's message shapes, then calls into a real gateway."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import numpy as np
import pytest

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.plivo import PlivoCarrier, extra_headers
from duplex_gateway.telephony.carriers.telnyx import TelnyxCarrier
from duplex_gateway.telephony.carriers.twilio import TwilioCarrier
from duplex_gateway.telephony.dialect import CallDialect
from duplex_gateway.telephony.registry import DetectingCarrier
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from tests.e2e.helpers import Gateway, GatewayFactory, decode, encode
from tests.fixtures import load_speech
from tests.telephony.echo_calls import echo_call
from tests.telephony.plivo_wire import CALL_ID, STREAM_ID, PlivoWire
from tests.telephony.telnyx_wire import TelnyxWire
from tests.telephony.twilio_wire import TwilioWire
from tests.typed import narrow


def _started(wire: PlivoWire | None = None) -> tuple[PlivoCarrier, PlivoWire, call.CallStart]:
    wire = wire or PlivoWire()
    carrier = PlivoCarrier()
    (start,) = wire.greeting()
    events = carrier.parse(start)
    assert len(events) == 1 and isinstance(events[0], call.CallStart)
    return carrier, wire, events[0]


def _start_with(media_format: object) -> str:
    message = PlivoWire().start()
    if media_format is None:
        del narrow(message["start"], dict)["mediaFormat"]
    else:
        narrow(message["start"], dict)["mediaFormat"] = media_format
    return json.dumps(message)


def _payload_of(frame: str | bytes) -> bytes:
    return base64.b64decode(json.loads(frame)["media"]["payload"])


# -- recognizing a Plivo stream -------------------------------------------------------------------


def test_recognizes_a_plivo_start_and_no_other_carriers() -> None:
    (start,) = PlivoWire().greeting()
    assert PlivoCarrier.recognizes(start)
    assert not PlivoCarrier.recognizes(PlivoWire().media(b"\xff" * 160, 0))
    assert not PlivoCarrier.recognizes(TwilioWire().greeting()[1])
    assert not PlivoCarrier.recognizes(TelnyxWire().greeting()[1])
    # The others do not take a Plivo start for theirs.
    assert not TwilioCarrier.recognizes(start) and not TelnyxCarrier.recognizes(start)


@pytest.mark.parametrize(
    "frame",
    [b"\x00", "not json", "[]", "7", '{"start": ["streamId", "callId"]}', '{"start": {"streamId": "x"}}'],
)
def test_recognizes_never_raises(frame: str | bytes) -> None:
    assert not PlivoCarrier.recognizes(frame)


def test_the_gateway_detects_a_plivo_call_by_its_start() -> None:
    detecting = DetectingCarrier()
    (start,) = PlivoWire().greeting()
    events = detecting.parse(start)
    assert isinstance(detecting.detected, PlivoCarrier)
    assert [type(e) for e in events] == [call.CallStart]


# -- the start ---------------------------------------------------------------------------------------


def test_start_names_the_call_and_its_format() -> None:
    carrier, _, start = _started()
    assert start.carrier == "plivo"
    assert start.call_id == CALL_ID
    assert start.stream_id == STREAM_ID == carrier.stream_id
    assert start.parameters == {
        "userId": "12345",
        "sessionId": "abc",
        "from": "14155550100",
        "to": "14155550199",
    }
    assert (start.caller, start.callee) == ("14155550100", "14155550199")
    assert start.input_format == start.output_format == AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)


@pytest.mark.parametrize(
    ("media_format", "expected"),
    [
        (
            {"encoding": "audio/x-mulaw", "sampleRate": 8000},
            AudioFormat(encoding=Encoding.G711_ULAW, rate=8000),
        ),
        ({"encoding": "audio/x-l16", "sampleRate": 8000}, AudioFormat(encoding=Encoding.PCM16, rate=8000)),
        ({"encoding": "audio/x-l16", "sampleRate": 16000}, AudioFormat(encoding=Encoding.PCM16, rate=16000)),
        (
            {"encoding": "audio/x-l16", "sampleRate": "16000"},
            AudioFormat(encoding=Encoding.PCM16, rate=16000),
        ),
        ({"encoding": "audio/x-l16;rate=16000"}, AudioFormat(encoding=Encoding.PCM16, rate=16000)),
        ({"encoding": "AUDIO/X-MULAW;rate=8000"}, AudioFormat(encoding=Encoding.G711_ULAW, rate=8000)),
        # The <Stream contentType> default is audio/x-l16;rate=8000.
        (None, AudioFormat(encoding=Encoding.PCM16, rate=8000)),
        ({}, AudioFormat(encoding=Encoding.PCM16, rate=8000)),
    ],
)
def test_start_formats(media_format: dict[str, object] | None, expected: AudioFormat) -> None:
    (start,) = PlivoCarrier().parse(_start_with(media_format))
    assert isinstance(start, call.CallStart)
    assert start.input_format == start.output_format == expected


@pytest.mark.parametrize(
    ("media_format", "named"),
    [
        ({"encoding": "audio/x-mulaw", "sampleRate": 16000}, "16000"),
        ({"encoding": "audio/x-l16", "sampleRate": 24000}, "24000"),
        ({"encoding": "audio/x-alaw", "sampleRate": 8000}, "audio/x-alaw"),
        ({"encoding": "audio/x-l16", "sampleRate": "fast"}, "sampleRate"),
        ("audio/x-l16", "not an object"),
    ],
)
def test_a_format_the_gateway_cannot_take_is_refused_and_ends_the_call(
    media_format: object, named: str
) -> None:
    start = _start_with(media_format)
    with pytest.raises(ProtocolError) as refused:
        PlivoCarrier().parse(start)
    assert named in refused.value.message
    assert refused.value.code in (ErrorCode.UNSUPPORTED_AUDIO_FORMAT, ErrorCode.UNSUPPORTED_SAMPLE_RATE)
    # The call is not left silent: the call dialect ends it.
    dialect = CallDialect(PlivoCarrier())
    assert dialect.parse(start) == [cmd.SessionClose(reason="unsupported_call_format")]
    assert dialect.ended


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("userId=12345;sessionId=abc", {"userId": "12345", "sessionId": "abc"}),
        ("from=14155550100,to=14155550199", {"from": "14155550100", "to": "14155550199"}),
        (" a = b ; ;c=;=x;novalue", {"a": "b", "c": ""}),
        ("", {}),
        ("{}", {}),
        ('{"tenant": "acme", "n": 2}', {"tenant": "acme", "n": "2"}),
        ("{broken", {}),
    ],
)
def test_extra_headers(raw: str, expected: dict[str, str]) -> None:
    assert extra_headers(raw) == expected


def test_extra_headers_as_an_object_or_absent() -> None:
    message = PlivoWire().start()
    message["extra_headers"] = {"tenant": "acme"}
    (start,) = PlivoCarrier().parse(json.dumps(message))
    assert isinstance(start, call.CallStart) and start.parameters == {"tenant": "acme"}
    del message["extra_headers"]
    (start,) = PlivoCarrier().parse(json.dumps(message))
    assert isinstance(start, call.CallStart) and start.parameters == {} and start.caller is None


# -- media, both ways ------------------------------------------------------------------------------


def test_mulaw_both_ways() -> None:
    carrier, wire, _ = _started()
    audio = bytes(range(160))
    assert carrier.parse(wire.media(audio, 0)) == [call.CallAudio(audio)]
    (frame,) = carrier.media(audio)
    assert json.loads(frame) == {
        "event": "playAudio",
        "streamId": STREAM_ID,
        "media": {
            "contentType": "audio/x-mulaw",
            "sampleRate": 8000,
            "payload": base64.b64encode(audio).decode(),
        },
    }


def test_l16_is_little_endian_pcm16_both_ways() -> None:
    carrier, wire, start = _started(PlivoWire(encoding="l16", rate=16_000))
    assert start.input_format == AudioFormat(encoding=Encoding.PCM16, rate=16_000)
    speech = load_speech(16_000)
    on_the_wire = encode(speech, "pcm16")  # little-endian int16
    heard = b"".join(
        e.audio
        for n, i in enumerate(range(0, len(on_the_wire), 640))
        for e in carrier.parse(wire.media(on_the_wire[i : i + 640], n))
        if isinstance(e, call.CallAudio)
    )
    assert heard == on_the_wire
    (frame,) = carrier.media(heard[:1280])
    message = json.loads(frame)
    assert message["media"]["contentType"] == "audio/x-l16" and message["media"]["sampleRate"] == 16000
    assert _payload_of(frame) == on_the_wire[:1280]
    assert np.array_equal(
        np.frombuffer(_payload_of(frame), "<i2"), (np.clip(speech[:640], -1, 1) * 32767).astype(np.int16)
    )


def test_checkpoint_clear_and_no_inband_hangup() -> None:
    carrier, _, _ = _started()
    assert json.loads(carrier.mark("0.4") or "") == {
        "event": "checkpoint",
        "streamId": STREAM_ID,
        "name": "0.4",
    }
    assert json.loads(carrier.clear() or "") == {"event": "clearAudio", "streamId": STREAM_ID}
    assert carrier.hangup() is None
    assert carrier.has_marks and carrier.framing.chunk_ms == 40


def test_played_stream_cleared_audio_and_dtmf() -> None:
    carrier, wire, _ = _started()
    assert carrier.parse(wire.mark_played("customer greeting audio")) == [
        call.MarkPlayed("customer greeting audio")
    ]
    assert carrier.parse(wire.cleared()) == [call.CarrierCleared()]
    assert carrier.parse(wire.dtmf("5")) == [call.Dtmf("5")]
    assert carrier.parse('{"event": "dtmf", "sequenceNumber": 12, "dtmf": {"digit": 7}}') == [call.Dtmf("7")]
    # Plivo sends no stop, but one that did would end the call.
    assert carrier.parse('{"event": "stop", "sequenceNumber": 30}') == [call.CallEnded("stop")]


def test_only_the_inbound_track_is_the_caller() -> None:
    carrier, _, _ = _started()
    outbound = {
        "event": "media",
        "sequenceNumber": 4,
        "streamId": STREAM_ID,
        "media": {"track": "outbound", "payload": "/w=="},
    }
    assert carrier.parse(json.dumps(outbound)) == []


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x01",
        "not json",
        "[]",
        '{"event": "hangup"}',
        '{"event": "media", "sequenceNumber": 2}',
        '{"event": "media", "sequenceNumber": 2, "media": {"track": "inbound"}}',
        '{"event": "media", "sequenceNumber": 2, "media": {"payload": "%%%"}}',
        '{"event": "playedStream", "sequenceNumber": 3, "streamId": "x"}',
        '{"event": "dtmf", "sequenceNumber": 3, "dtmf": {"digit": ""}}',
        '{"event": "dtmf", "sequenceNumber": 3}',
        '{"event": "start", "sequenceNumber": 1, "start": "now"}',
        '{"event": "start", "sequenceNumber": 1, "start": {"callId": "c"}}',
        '{"event": "start", "sequenceNumber": 1, "start": {"callId": "c", "streamId": "s", "mediaFormat": "l16"}}',
    ],
)
def test_malformed_messages_raise_protocol_errors(frame: str | bytes) -> None:
    carrier, _, _ = _started()
    with pytest.raises(ProtocolError):
        carrier.parse(frame)


def test_an_l16_payload_of_half_a_sample_is_refused() -> None:
    carrier, wire, _ = _started(PlivoWire(encoding="l16", rate=8_000))
    with pytest.raises(ProtocolError):
        carrier.parse(wire.media(b"\x00\x01\x02", 0))


# -- calls into a real gateway ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0}}}, name="plivo-echo"
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("encoding", "rate"), [("mulaw", 8_000), ("l16", 16_000)], ids=["mulaw-8k", "l16-16k"]
)
async def test_a_plivo_call(echo_gateway: Gateway, encoding: str, rate: int) -> None:
    fmt = "g711_ulaw" if encoding == "mulaw" else "pcm16"
    codec: tuple[Callable[[np.ndarray], bytes], Callable[[bytes], np.ndarray]] = (
        lambda samples: encode(samples, fmt),
        lambda data: decode(data, fmt),
    )
    wire = PlivoWire(encoding=encoding, rate=rate)
    await echo_call(
        echo_gateway,
        "/telephony/plivo",
        wire,
        CALL_ID,
        rate=rate,
        encode=codec[0],
        decode=codec[1],
        marks_echoed_on_clear=False,
    )
    # Plivo answered the clear with clearedAudio.
    assert wire.cleared_at
