"""Vonage's Voice API WebSocket: the carrier against Vonage's message shapes, then a call into a real gateway."""

from __future__ import annotations

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
from tests.telephony import vonage_wire as wire
from tests.telephony.exotel_wire import ExotelWire
from tests.telephony.phone import Phone
from tests.telephony.twilio_wire import TwilioWire
from tests.telephony.vonage_wire import VonageWire

# -- the shapes of Vonage's docs ------------------------------------------------------------------


def _connected(content_type: object = "audio/l16;rate=16000", **headers: object) -> str:
    return json.dumps({"event": "websocket:connected", "content-type": content_type, **headers})


DTMF = '{"event":"websocket:dtmf","digit":"5","duration":260}'
NOTIFY = '{"event":"websocket:notify","payload":{"mark":"0.7"}}'
CLEARED = '{"event":"websocket:cleared"}'


def _started(rate: int = 16_000) -> VonageCarrier:
    carrier = VonageCarrier()
    carrier.parse(_connected(f"audio/l16;rate={rate}"))
    return carrier


# -- inbound ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
def test_websocket_connected_opens_the_call_at_the_nccos_rate_with_its_headers(rate: int) -> None:
    message = _connected(
        f"audio/l16;rate={rate}", uuid=wire.CALL_UUID, tenant="acme", **{"from": wire.CALLER}
    )
    (start,) = VonageCarrier().parse(message)
    pcm = AudioFormat(encoding=Encoding.PCM16, rate=rate)
    assert start == call.CallStart(
        carrier="vonage",
        call_id=wire.CALL_UUID,
        caller=wire.CALLER,
        callee=None,
        parameters={"uuid": wire.CALL_UUID, "tenant": "acme", "from": wire.CALLER},
        input_format=pcm,
        output_format=pcm,
    )


def test_the_numbers_and_the_call_id_come_from_common_header_names() -> None:
    message = _connected(call_uuid="c-1", caller="441", callee="442")
    (start,) = VonageCarrier().parse(message)
    assert isinstance(start, call.CallStart)
    assert (start.call_id, start.caller, start.callee) == ("c-1", "441", "442")
    (start,) = VonageCarrier().parse(_connected(to="443"))
    assert isinstance(start, call.CallStart)
    assert (start.call_id, start.caller, start.callee, start.parameters) == (None, None, "443", {"to": "443"})


def test_headers_of_any_json_value_become_text_parameters() -> None:
    (start,) = VonageCarrier().parse(_connected(n=5, flag=True, nested={"a": [1, 2]}, none=None))
    assert isinstance(start, call.CallStart)
    assert start.parameters == {"n": "5", "flag": "true", "nested": '{"a":[1,2]}', "none": "null"}


@pytest.mark.parametrize(
    ("content_type", "rate"),
    [
        ("audio/l16;rate=8000", 8_000),
        ("Audio/L16; rate=24000", 24_000),
        ("audio/l16", 16_000),
        (None, 16_000),
    ],
)
def test_the_content_type_is_read_leniently(content_type: str | None, rate: int) -> None:
    message = {"event": "websocket:connected"} | ({"content-type": content_type} if content_type else {})
    (start,) = VonageCarrier().parse(json.dumps(message))
    assert isinstance(start, call.CallStart) and start.input_format == AudioFormat(
        encoding=Encoding.PCM16, rate=rate
    )


def test_binary_frames_are_caller_audio() -> None:
    carrier = _started()
    frame = bytes(range(256)) * 2 + bytes(128)  # 640 bytes: 20 ms at 16 kHz
    assert carrier.parse(frame) == [call.CallAudio(frame)]
    assert carrier.parse(b"") == []


def test_binary_audio_before_websocket_connected_is_an_error() -> None:
    with pytest.raises(ProtocolError):
        VonageCarrier().parse(b"\x00" * 640)


def test_after_a_refused_start_the_audio_is_dropped_without_an_error_per_frame() -> None:
    carrier = VonageCarrier()
    with pytest.raises(ProtocolError):
        carrier.parse(_connected("audio/l16;rate=44100"))
    assert carrier.parse(b"\x00" * 640) == []
    assert carrier.format is None


def test_dtmf_notify_and_cleared_are_call_events() -> None:
    carrier = _started()
    assert carrier.parse(DTMF) == [call.Dtmf("5")]
    assert carrier.parse('{"event":"websocket:dtmf","dtmf":{"digit":"#","duration":100}}') == [call.Dtmf("#")]
    assert carrier.parse('{"event":"websocket:dtmf","digit":7}') == [call.Dtmf("7")]
    assert carrier.parse('{"event":"websocket:dtmf","digits":"12"}') == [call.Dtmf("1"), call.Dtmf("2")]
    assert carrier.parse(NOTIFY) == [call.MarkPlayed("0.7")]
    assert carrier.parse(CLEARED) == [call.CarrierCleared()]


def test_what_carries_nothing_for_the_call_is_ignored() -> None:
    carrier = _started()
    assert carrier.parse('{"event":"websocket:dtmf"}') == []
    assert (
        carrier.parse('{"event":"websocket:notify","payload":{"reply_id":"r7"}}') == []
    )  # someone else's notify
    assert carrier.parse('{"event":"websocket:notify"}') == []
    assert carrier.parse('{"event":"websocket:something-new","x":1}') == []
    assert carrier.parse('{"no":"event"}') == []
    assert carrier.parse(_connected("audio/l16;rate=8000")) == []  # a second connected changes nothing
    assert carrier.format == AudioFormat(encoding=Encoding.PCM16, rate=16_000)


# -- outbound -------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
def test_reply_audio_goes_out_as_whole_20_ms_binary_frames(rate: int) -> None:
    carrier = _started(rate)
    frame = rate * 2 // 50
    audio = bytes(range(1, 256)) * (2 * frame // 255 + 1)
    audio = audio[: 2 * frame + 10]
    frames = [f for f in carrier.media(audio) if isinstance(f, bytes)]  # binary frames only
    assert [len(f) for f in frames] == [frame, frame, frame]
    assert b"".join(frames) == audio + bytes(frame - 10)  # the tail is padded with silence
    assert carrier.media(b"") == []
    assert carrier.framing.multiple == frame


def test_marks_are_notifies_and_clear_is_an_action() -> None:
    carrier = _started()
    mark = carrier.mark("0.7")
    assert isinstance(mark, str) and json.loads(mark) == {"action": "notify", "payload": {"mark": "0.7"}}
    clear = carrier.clear()
    assert isinstance(clear, str) and json.loads(clear) == {"action": "clear"}
    assert carrier.hangup() is None  # closing the socket ends the call
    assert carrier.has_marks


def test_no_audio_goes_out_before_the_call_is_connected() -> None:
    assert VonageCarrier().media(b"\x00" * 640) == []


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
def test_the_paced_reply_is_20_ms_frames_with_a_notify_after_each_100_ms(rate: int) -> None:
    dialect = CallDialect(VonageCarrier())
    dialect.parse(_connected(f"audio/l16;rate={rate}"))
    audio = np.random.default_rng(rate).integers(1, 256, size=2 * rate + 2 * 7, dtype=np.uint8).tobytes()
    for offset in range(0, len(audio), 962):
        dialect.render(
            ev.AudioDelta(response_id="r1", item_id="i1", audio=audio[offset : offset + 962], rate=rate),
            seq=0,
        )
    dialect.render(ev.AudioDone(response_id="r1", item_id="i1"), seq=0)
    frames: list[str | bytes] = []
    now = 0.0
    for _ in range(10_000):
        out, wake = dialect.pump(now)
        frames += out
        if wake is None:
            break
        now = wake + 1e-6
    binary = [f for f in frames if isinstance(f, bytes)]
    assert {len(f) for f in binary} == {rate * 2 // 50}
    sent = b"".join(binary)
    assert sent[: len(audio)] == audio and set(sent[len(audio) :]) == {0}
    text = [json.loads(f) for f in frames if isinstance(f, str)]
    assert text and all(m["action"] == "notify" for m in text)
    # A second is ten 100 ms pieces of five frames, each followed by its notify; then the padded tail.
    groups: list[int] = []
    run = 0
    for frame in frames:
        if isinstance(frame, bytes):
            run += 1
        else:
            groups.append(run)
            run = 0
    assert groups == [5] * 10 + [1] and run == 0


# -- malformed input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "[1, 2]",
        '"websocket:connected"',
        _connected("audio/pcmu;rate=8000"),
        _connected("audio/l16;rate=44100"),
        _connected("audio/l16;rate=fast"),
        _connected(16000),
        _connected(["audio/l16"]),
    ],
)
def test_malformed_messages_raise_protocol_errors(frame: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        VonageCarrier().parse(frame)


def test_an_unsupported_rate_says_so() -> None:
    with pytest.raises(ProtocolError) as raised:
        VonageCarrier().parse(_connected("audio/l16;rate=11025"))
    assert raised.value.code is ErrorCode.UNSUPPORTED_SAMPLE_RATE
    with pytest.raises(ProtocolError) as raised:
        VonageCarrier().parse(_connected("audio/pcmu"))
    assert raised.value.code is ErrorCode.UNSUPPORTED_AUDIO_FORMAT


_ODD_VALUES: list[Any] = [None, True, 0, -1, 1e308, "", "x", ";", "rate=", [], [1], {}, {"a": {}}]


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
    "message",
    [
        _connected(uuid=wire.CALL_UUID),
        DTMF,
        NOTIFY,
        CLEARED,
        '{"event":"websocket:dtmf","dtmf":{"digit":"1"}}',
    ],
)
@pytest.mark.parametrize("connected", [False, True])
def test_any_mangled_message_is_an_event_or_a_protocol_error(message: str, connected: bool) -> None:
    for mangled in _mutations(json.loads(message)):
        carrier = _started() if connected else VonageCarrier()
        try:
            events = carrier.parse(json.dumps(mangled))
        except ProtocolError:
            continue
        kinds = call.CallStart | call.Dtmf | call.MarkPlayed | call.CarrierCleared
        assert all(isinstance(e, kinds) for e in events), (mangled, events)
        assert all(isinstance(e.digit, str) and e.digit for e in events if isinstance(e, call.Dtmf))


# -- telling carriers apart ---------------------------------------------------------------------------


def test_vonage_recognizes_websocket_connected_and_nothing_else() -> None:
    assert VonageCarrier.recognizes(_connected())
    assert VonageCarrier.recognizes(VonageWire(8_000).connected())
    others: list[str | bytes] = [
        _connected().encode(),  # only a text frame is Vonage's greeting
        b"\x00" * 640,
        DTMF,
        NOTIFY,
        CLEARED,
        *TwilioWire().greeting(),
        *ExotelWire().greeting(),
        "not json",
        "[]",
        '{"event":"connected"}',
    ]
    for frame in others:
        assert not VonageCarrier.recognizes(frame), frame


def test_the_other_carriers_do_not_take_vonages_greeting_for_theirs() -> None:
    for frame in VonageWire().greeting():
        assert not TwilioCarrier.recognizes(frame)
        assert not ExotelCarrier.recognizes(frame)


def test_the_telephony_path_detects_vonage() -> None:
    carrier = DetectingCarrier()
    (start,) = carrier.parse(VonageWire(24_000).connected())
    assert isinstance(carrier.detected, VonageCarrier)
    assert isinstance(start, call.CallStart) and start.input_format.rate == 24_000
    assert carrier.parse(b"\x00" * 960) == [call.CallAudio(b"\x00" * 960)]


# -- a call into a real gateway ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0}}}, name="vonage-echo"
    )


def _pcm(samples: np.ndarray) -> bytes:
    return encode(samples, "pcm16")


@pytest.mark.e2e
async def test_a_call_is_answered_in_binary_frames_and_the_caller_can_talk_over_the_reply(
    echo_gateway: Gateway,
) -> None:
    rate = 16_000
    vonage = VonageWire(rate)
    speech = load_speech(rate)
    async with ws_connect(echo_gateway, "/telephony/vonage") as ws, Phone(ws, vonage) as phone:
        # A turn: the echo engine answers with the caller's own audio, in 20 ms binary frames.
        await phone.say(
            _pcm(np.concatenate([np.zeros(rate * 3 // 10, np.float32), speech, np.zeros(rate, np.float32)]))
        )
        await phone.wait(lambda p: len(p.played) >= 1.5 * vonage.bytes_per_second and bool(p.played_marks))
        assert not phone.clears

        # The caller talks over the reply: Vonage is told to clear, and nothing of the cut reply follows.
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

        assert vonage.problems == []
        assert all(len(o.audio) == 640 for o in phone.media())
        assert any(o.kind == "mark" for o in phone.sent)
        await phone.hang_up()
