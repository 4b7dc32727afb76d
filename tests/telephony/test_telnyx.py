"""Telnyx media streaming: the carrier against Telnyx's message shapes, then calls into a real gateway."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.plivo import PlivoCarrier
from duplex_gateway.telephony.carriers.telnyx import REORDER_WINDOW, MediaReorder, TelnyxCarrier
from duplex_gateway.telephony.carriers.twilio import TwilioCarrier
from duplex_gateway.telephony.dialect import CallDialect
from duplex_gateway.telephony.registry import DetectingCarrier
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from tests.e2e.helpers import Gateway, GatewayFactory, decode, encode
from tests.fixtures import load_speech
from tests.telephony.echo_calls import echo_call
from tests.telephony.plivo_wire import PlivoWire
from tests.telephony.telnyx_wire import (
    CALL_CONTROL_ID,
    CALLEE,
    CALLER,
    CLIENT_STATE,
    STREAM_ID,
    TelnyxWire,
)
from tests.telephony.twilio_wire import TwilioWire
from tests.typed import narrow


def _started(wire: TelnyxWire | None = None) -> tuple[TelnyxCarrier, TelnyxWire, call.CallStart]:
    wire = wire or TelnyxWire()
    carrier = TelnyxCarrier()
    connected, start = wire.greeting()
    assert carrier.parse(connected) == []
    events = carrier.parse(start)
    assert len(events) == 1 and isinstance(events[0], call.CallStart)
    return carrier, wire, events[0]


def _start_with(media_format: object) -> str:
    message = TelnyxWire().start()
    narrow(message["start"], dict)["media_format"] = media_format
    return json.dumps(message)


def _audio(events: object) -> bytes:
    assert isinstance(events, list)
    return b"".join(e.audio for e in events if isinstance(e, call.CallAudio))


def _be16(samples: np.ndarray) -> bytes:
    """Float samples as RTP L16: 16-bit big-endian (network byte order)."""
    return (np.clip(samples, -1, 1) * 32767).astype(">i2").tobytes()


# -- recognizing a Telnyx stream ------------------------------------------------------------


def test_recognizes_a_telnyx_start_and_no_other_carriers() -> None:
    wire = TelnyxWire()
    connected, start = wire.greeting()
    assert TelnyxCarrier.recognizes(start)
    assert not TelnyxCarrier.recognizes(connected)
    assert not TelnyxCarrier.recognizes(TwilioWire().greeting()[1])
    assert not TelnyxCarrier.recognizes(PlivoWire().greeting()[0])
    # The others do not take a Telnyx start for theirs.
    assert not TwilioCarrier.recognizes(start) and not PlivoCarrier.recognizes(start)


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x01",
        "not json",
        "[1, 2]",
        "null",
        '{"stream_id": "x"}',
        '{"stream_id": "x", "start": "call"}',
        "",
    ],
)
def test_recognizes_never_raises(frame: str | bytes) -> None:
    assert not TelnyxCarrier.recognizes(frame)


def test_the_gateway_detects_a_telnyx_call_by_its_start() -> None:
    detecting = DetectingCarrier()
    connected, start = TelnyxWire().greeting()
    assert detecting.parse(connected) == []
    events = detecting.parse(start)
    assert isinstance(detecting.detected, TelnyxCarrier)
    assert [type(e) for e in events] == [call.CallStart]


# -- the start -------------------------------------------------------------------------------


def test_start_names_the_call_and_its_format() -> None:
    carrier, _, start = _started()
    assert start.carrier == "telnyx"
    assert start.call_id == CALL_CONTROL_ID
    assert start.stream_id == STREAM_ID == carrier.stream_id
    assert (start.caller, start.callee) == (CALLER, CALLEE)
    assert start.parameters == {"customer_id": "customer_123", "client_state": CLIENT_STATE}
    assert start.input_format == start.output_format == AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)
    # Reply pieces of 40 ms, never under the 20 ms Telnyx plays.
    assert (carrier.framing.chunk_ms, carrier.framing.min_bytes) == (40, 160)


@pytest.mark.parametrize(
    ("media_format", "expected"),
    [
        (
            {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
            AudioFormat(encoding=Encoding.G711_ULAW, rate=8000),
        ),
        (
            {"encoding": "audio/x-mulaw", "sample_rate": 8000},
            AudioFormat(encoding=Encoding.G711_ULAW, rate=8000),
        ),
        ({"encoding": "PCMA", "sample_rate": 8000}, AudioFormat(encoding=Encoding.G711_ALAW, rate=8000)),
        ({"encoding": "L16", "sample_rate": 16000}, AudioFormat(encoding=Encoding.PCM16, rate=16000)),
        ({"encoding": "L16", "sample_rate": "8000"}, AudioFormat(encoding=Encoding.PCM16, rate=8000)),
        ({"encoding": "L16", "sample_rate": 24000}, AudioFormat(encoding=Encoding.PCM16, rate=24000)),
        ({}, AudioFormat(encoding=Encoding.G711_ULAW, rate=8000)),  # PCMU is Telnyx's default
    ],
)
def test_start_formats(media_format: dict[str, object], expected: AudioFormat) -> None:
    (start,) = TelnyxCarrier().parse(_start_with(media_format))
    assert isinstance(start, call.CallStart)
    assert start.input_format == start.output_format == expected


def test_call_control_custom_parameters_as_a_list() -> None:
    wire = TelnyxWire()
    message = wire.start()
    narrow(message["start"], dict)["custom_parameters"] = [{"name": "profile", "value": "support"}]
    del narrow(message["start"], dict)["client_state"]
    (start,) = TelnyxCarrier().parse(json.dumps(message))
    assert isinstance(start, call.CallStart) and start.parameters == {"profile": "support"}


@pytest.mark.parametrize(
    ("media_format", "named"),
    [
        ({"encoding": "OPUS", "sample_rate": 16000}, "OPUS"),
        ({"encoding": "AMR-WB", "sample_rate": 16000}, "AMR-WB"),
        ({"encoding": "G729"}, "G729"),
        ({"encoding": "L16", "sample_rate": 44100}, "44100"),
        ({"encoding": "PCMU", "channels": 2}, "2 channels"),
        ({"encoding": "L16", "sample_rate": "fast"}, "fast"),
        ("PCMU", "not an object"),
    ],
)
def test_a_codec_the_gateway_cannot_decode_is_refused_and_ends_the_call(
    media_format: object, named: str
) -> None:
    start = _start_with(media_format)
    with pytest.raises(ProtocolError) as refused:
        TelnyxCarrier().parse(start)
    assert named in refused.value.message
    assert refused.value.code in (ErrorCode.UNSUPPORTED_AUDIO_FORMAT, ErrorCode.UNSUPPORTED_SAMPLE_RATE)
    # The call is not left silent: the call dialect ends it.
    dialect = CallDialect(TelnyxCarrier())
    assert dialect.parse(start) == [cmd.SessionClose(reason="unsupported_call_format")]
    assert dialect.ended


def test_g722_both_ways() -> None:
    import G722 as g722  # a pinned dependency of the gateway

    carrier = TelnyxCarrier()
    (start,) = carrier.parse(_start_with({"encoding": "G722", "sample_rate": 8000}))
    assert isinstance(start, call.CallStart)
    # G.722 is 16 kHz audio (RTP clocks it at 8 kHz): the session hears and speaks PCM16 at 16 kHz.
    assert start.input_format == start.output_format == AudioFormat(encoding=Encoding.PCM16, rate=16_000)
    assert carrier.framing.multiple == 4
    tone = (np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000) * 8000).astype(np.int16)
    # Reply audio goes out as G.722 that an independent decoder plays back as the tone.
    sent = b"".join(
        base64.b64decode(
            json.loads(carrier.media(tone[i : i + 640].astype("<i2").tobytes())[0])["media"]["payload"]
        )
        for i in range(0, len(tone), 640)
    )
    assert len(sent) == len(tone) // 2  # 64 kbit/s: a byte for two samples
    played = np.asarray(g722.G722(16_000, 64_000, use_numpy=False).decode(sent), dtype=np.float64)
    assert _snr_db(tone, played) > 20
    # Caller audio in G.722 reaches the session as the tone.
    coded = g722.G722(16_000, 64_000, use_numpy=False).encode(tone)
    heard = b"".join(
        _audio(carrier.parse(wire_media)) for wire_media in _telnyx_frames(bytes(coded), 160, first_seq=2)
    )
    assert _snr_db(tone, np.frombuffer(heard, "<i2").astype(np.float64)) > 20


def _snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    """The codec's signal-to-noise ratio, past its start-up and at its group delay."""
    reference = reference.astype(np.float64)
    lag = max(range(64), key=lambda d: float(np.dot(reference[1000:15000], decoded[1000 + d : 15000 + d])))
    error = reference[1000:15000] - decoded[1000 + lag : 15000 + lag]
    return float(10 * np.log10(np.sum(reference[1000:15000] ** 2) / np.sum(error**2)))


def _telnyx_frames(payload: bytes, size: int, *, first_seq: int) -> list[str]:
    return [
        json.dumps(
            {
                "event": "media",
                "sequence_number": str(first_seq + n),
                "media": {
                    "track": "inbound",
                    "chunk": str(n + 1),
                    "payload": base64.b64encode(payload[i : i + size]).decode(),
                },
                "stream_id": STREAM_ID,
            }
        )
        for n, i in enumerate(range(0, len(payload), size))
    ]


# -- media, both ways ----------------------------------------------------------------------------


def test_mulaw_media_passes_as_it_is() -> None:
    carrier, wire, _ = _started()
    audio = bytes(range(160))
    assert carrier.parse(wire.media(audio, 0)) == [call.CallAudio(audio)]
    (frame,) = carrier.media(audio)
    assert json.loads(frame) == {"event": "media", "media": {"payload": base64.b64encode(audio).decode()}}


def test_l16_is_big_endian_on_the_wire_and_little_endian_in_the_gateway() -> None:
    carrier, wire, start = _started(TelnyxWire(encoding="L16", rate=16_000))
    assert start.input_format == AudioFormat(encoding=Encoding.PCM16, rate=16_000)
    samples = np.array([0, 1, -1, 0x1234, -0x1234, 32767, -32768, 256], dtype=np.int16)
    on_the_wire = samples.astype(">i2").tobytes()
    assert on_the_wire[:8] == b"\x00\x00\x00\x01\xff\xff\x12\x34"
    # In: the session hears the same samples as little-endian PCM16.
    assert _audio(carrier.parse(wire.media(on_the_wire, 0))) == samples.astype("<i2").tobytes()
    # Out: reply PCM16 goes back big-endian.
    (frame,) = carrier.media(samples.astype("<i2").tobytes())
    assert base64.b64decode(json.loads(frame)["media"]["payload"]) == on_the_wire
    assert (carrier.framing.min_bytes, carrier.framing.multiple) == (640, 2)  # 20 ms of 16 kHz PCM16


def test_l16_round_trip_of_speech() -> None:
    carrier, wire, _ = _started(TelnyxWire(encoding="L16", rate=16_000))
    speech = load_speech(16_000)
    wire_bytes = _be16(speech)
    heard = b"".join(
        _audio(carrier.parse(wire.media(wire_bytes[i : i + 640], n)))
        for n, i in enumerate(range(0, len(wire_bytes), 640))
    )
    assert np.array_equal(np.frombuffer(heard, "<i2"), np.frombuffer(wire_bytes, ">i2"))
    back = b"".join(
        base64.b64decode(json.loads(carrier.media(heard[i : i + 1280])[0])["media"]["payload"])
        for i in range(0, len(heard), 1280)
    )
    assert back == wire_bytes


def test_outbound_mark_clear_and_no_inband_hangup() -> None:
    carrier, _, _ = _started()
    assert json.loads(carrier.mark("0.7") or "") == {"event": "mark", "mark": {"name": "0.7"}}
    assert json.loads(carrier.clear() or "") == {"event": "clear"}
    assert carrier.hangup() is None
    assert carrier.has_marks


def test_mark_dtmf_error_and_stop() -> None:
    carrier, wire, _ = _started()
    assert carrier.parse(wire.mark_played("0.3")) == [call.MarkPlayed("0.3")]
    assert carrier.parse(wire.dtmf("1")) == [call.Dtmf("1")]
    assert carrier.parse(wire.error()) == [
        call.CarrierError(code="100005", message="rate_limit_reached: Too many requests")
    ]
    assert carrier.parse(wire.stop()) == [call.CallEnded("stop")]


def test_the_outbound_track_is_not_the_caller() -> None:
    carrier, wire, _ = _started()
    assert carrier.parse(wire.media(b"\x00" * 160, 0, track="outbound")) == []
    # The caller's chunks are counted on their own track: its first is not held for the other's.
    assert carrier.parse(wire.media(b"\x01" * 160, 0)) == [call.CallAudio(b"\x01" * 160)]


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x01",
        "not json",
        "[]",
        '{"event": "ring"}',
        '{"event": "media", "sequence_number": "5"}',
        '{"event": "media", "sequence_number": "5", "media": {"track": "inbound"}}',
        '{"event": "media", "sequence_number": "5", "media": {"payload": "***"}}',
        '{"event": "media", "sequence_number": "five", "media": {"payload": "AAAA"}}',
        '{"event": "media", "sequence_number": true, "media": {"payload": "AAAA"}}',
        '{"event": "media", "media": {"chunk": "2.5", "payload": "AAAA"}}',
        '{"event": "mark", "sequence_number": "5", "mark": {}}',
        '{"event": "dtmf", "sequence_number": "5", "dtmf": {"digit": ""}}',
        '{"event": "error", "sequence_number": "5", "error": "boom"}',
        '{"event": "start", "sequence_number": "1", "start": "now", "stream_id": "x"}',
        '{"event": "start", "start": {"media_format": "PCMU"}, "stream_id": "x"}',
    ],
)
def test_malformed_messages_raise_protocol_errors(frame: str | bytes) -> None:
    carrier, _, _ = _started()
    with pytest.raises(ProtocolError):
        carrier.parse(frame)


def test_an_l16_payload_of_half_a_sample_is_refused() -> None:
    carrier, wire, _ = _started(TelnyxWire(encoding="L16", rate=8_000))
    with pytest.raises(ProtocolError):
        carrier.parse(wire.media(b"\x00\x01\x02", 0))


def test_a_frame_held_from_before_the_start_in_half_samples_is_dropped_not_a_crash() -> None:
    # Found by fuzzing: a frame that came before the start was held for reordering unchecked,
    # and once the start said L16, its odd length failed the byte swap (a ValueError, the call lost).
    wire = TelnyxWire(encoding="L16", rate=8_000)
    carrier = TelnyxCarrier()
    connected, start = wire.greeting()
    carrier.parse(connected)
    ahead = json.loads(wire.media(b"\x00\x01\x02", 0))
    ahead["media"]["chunk"] = "2"  # ahead of a chunk 1 that never comes: held
    assert carrier.parse(json.dumps(ahead)) == []
    assert isinstance(carrier.parse(start)[0], call.CallStart)
    assert carrier.parse(wire.stop()) == [call.CallEnded("stop")]


# -- media out of order ------------------------------------------------------------------------------


def _frames(wire: TelnyxWire, count: int) -> list[tuple[bytes, str]]:
    """``count`` distinct 20 ms μ-law frames and the messages carrying them, in order."""
    audio = [bytes([n % 256]) * wire.frame_bytes for n in range(count)]
    return [(a, wire.media(a, n)) for n, a in enumerate(audio)]


def test_frames_out_of_order_come_out_in_order() -> None:
    carrier, wire, _ = _started()
    frames = _frames(wire, 12)
    arrival = [1, 0, 3, 4, 2, 5, 9, 6, 8, 7, 11, 10]
    heard = b"".join(_audio(carrier.parse(frames[i][1])) for i in arrival)
    assert heard == b"".join(a for a, _ in frames)
    assert carrier.by_chunk.gaps == carrier.by_chunk.late == carrier.by_chunk.duplicates == 0
    assert carrier.by_sequence.held == 0  # the frames' sequence numbers filled their slots there too


def test_a_frame_ahead_of_a_missing_one_waits_for_it() -> None:
    carrier, wire, _ = _started()
    frames = _frames(wire, 3)
    assert carrier.parse(frames[1][1]) == []  # held: frame 0 has not come yet
    assert carrier.by_chunk.held == 1
    assert _audio(carrier.parse(frames[0][1])) == frames[0][0] + frames[1][0]
    assert _audio(carrier.parse(frames[2][1])) == frames[2][0]


def test_a_gap_that_never_fills_is_given_up_after_the_window_and_the_late_frame_still_counts() -> None:
    carrier, wire, _ = _started()
    frames = _frames(wire, REORDER_WINDOW + 3)
    out = [_audio(carrier.parse(message)) for _, message in frames[1 : REORDER_WINDOW + 1]]
    assert out == [b""] * REORDER_WINDOW  # frame 0 is missing: the window holds what came after it
    # One frame more than the window: the gap is given up and everything held is released, in order.
    released = _audio(carrier.parse(frames[REORDER_WINDOW + 1][1]))
    assert released == b"".join(a for a, _ in frames[1 : REORDER_WINDOW + 2])
    assert carrier.by_chunk.gaps == 1 and carrier.by_chunk.held == 0
    # The lost frame turns up after all: late, but the caller said it, so it is heard (once).
    assert _audio(carrier.parse(frames[0][1])) == frames[0][0]
    assert _audio(carrier.parse(frames[0][1])) == b""  # a duplicate is not heard twice
    assert (carrier.by_chunk.late, carrier.by_chunk.duplicates) == (1, 1)
    assert _audio(carrier.parse(frames[REORDER_WINDOW + 2][1])) == frames[REORDER_WINDOW + 2][0]


def test_a_message_that_never_reaches_the_socket_does_not_hold_caller_audio() -> None:
    carrier, wire, _ = _started()
    first = wire.media(b"\x01" * 160, 0)
    wire._seq += 3  # sequence numbers taken by messages this socket never sees
    second = wire.media(b"\x02" * 160, 1)
    # media.chunk counts the caller's frames only: no frame is missing, so none waits.
    assert carrier.parse(first) == [call.CallAudio(b"\x01" * 160)]
    assert carrier.parse(second) == [call.CallAudio(b"\x02" * 160)]


def _without_chunk(message: str) -> str:
    data = json.loads(message)
    del data["media"]["chunk"]
    return json.dumps(data)


def test_sequence_number_orders_frames_without_a_chunk() -> None:
    carrier, wire, _ = _started()
    frames = [(a, _without_chunk(m)) for a, m in _frames(wire, 6)]
    heard = b"".join(_audio(carrier.parse(frames[i][1])) for i in (0, 2, 1, 5, 3, 4))
    assert heard == b"".join(a for a, _ in frames)
    assert carrier.by_sequence.held == 0


def test_other_messages_fill_their_sequence_numbers() -> None:
    carrier, wire, _ = _started()
    first = _without_chunk(wire.media(b"\x01" * 160, 0))
    dtmf = wire.dtmf("7")
    outbound = wire.media(b"\x02" * 160, 1, track="outbound")
    second = _without_chunk(wire.media(b"\x03" * 160, 2))
    assert carrier.parse(first) == [call.CallAudio(b"\x01" * 160)]
    # Caller audio after a DTMF and an outbound-track frame is not held waiting for them.
    assert carrier.parse(dtmf) == [call.Dtmf("7")]
    assert carrier.parse(outbound) == []
    assert carrier.parse(second) == [call.CallAudio(b"\x03" * 160)]
    assert carrier.by_sequence.held == 0


def test_a_held_frame_is_released_before_the_mark_that_follows_it() -> None:
    carrier, wire, _ = _started()
    frames = _frames(wire, 2)
    mark = wire.mark_played("0.1")
    assert carrier.parse(frames[1][1]) == []
    assert carrier.parse(frames[0][1]) == [call.CallAudio(frames[0][0]), call.CallAudio(frames[1][0])]
    assert carrier.parse(mark) == [call.MarkPlayed("0.1")]


def test_stop_releases_what_is_held() -> None:
    carrier, wire, _ = _started()
    frames = _frames(wire, 4)
    for _, message in frames[1:]:
        assert carrier.parse(message) == []
    events = carrier.parse(wire.stop())
    assert events == [*(call.CallAudio(a) for a, _ in frames[1:]), call.CallEnded("stop")]


def test_chunk_orders_frames_without_a_sequence_number() -> None:
    carrier, _, _ = _started()

    def frame(chunk: int) -> str:
        payload = base64.b64encode(bytes([chunk]) * 160).decode()
        return json.dumps(
            {"event": "media", "media": {"track": "inbound", "chunk": str(chunk), "payload": payload}}
        )

    heard = b"".join(_audio(carrier.parse(frame(c))) for c in (1, 3, 2, 4))
    assert heard == b"".join(bytes([c]) * 160 for c in (1, 2, 3, 4))


def test_a_counter_that_starts_over_is_followed_not_dropped() -> None:
    reorder = MediaReorder(first=1)
    assert [a for k in range(1, 101) for a in reorder.push(k, bytes([k]))] == [
        bytes([k]) for k in range(1, 101)
    ]
    assert reorder.push(100, b"dup") == [] and reorder.duplicates == 1  # just behind: a duplicate
    reorder.push(103, b"\x67")  # held: 101 and 102 have not come
    # Far behind and never given up: the counter started over. What was held goes first.
    assert reorder.push(1, b"\x01") == [b"\x67", b"\x01"]
    assert reorder.push(3, b"\x03") == [] and reorder.push(2, b"\x02") == [b"\x02", b"\x03"]
    assert reorder.restarts == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.permutations(range(REORDER_WINDOW + 1)), min_size=1, max_size=8))
def test_reordering_within_the_window_restores_the_order_exactly(blocks: list[list[int]]) -> None:
    # Each block of window + 1 frames arrives in any order: never more than the window is held.
    reorder = MediaReorder(first=0)
    arrival = [
        base + i for n, block in enumerate(blocks) for base in [n * (REORDER_WINDOW + 1)] for i in block
    ]
    out = [a for key in arrival for a in reorder.push(key, key.to_bytes(2, "big"))]
    assert out == [k.to_bytes(2, "big") for k in range(len(arrival))]
    assert reorder.gaps == reorder.late == 0 and reorder.held == 0


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(60)))
def test_no_frame_is_ever_lost_whatever_the_order(arrival: list[int]) -> None:
    reorder = MediaReorder(first=0)
    out = [a for key in arrival for a in reorder.push(key, key.to_bytes(2, "big"))]
    out += reorder.flush()
    assert sorted(out) == [k.to_bytes(2, "big") for k in range(60)]
    assert reorder.duplicates == 0


# -- calls into a real gateway ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0}}}, name="telnyx-echo"
    )


#: A mark echo and the clear may cross on the socket: one played this long before the clear may not have counted.
@pytest.mark.e2e
@pytest.mark.parametrize(
    ("encoding", "rate", "shuffle"),
    [("PCMU", 8_000, True), ("L16", 16_000, False)],
    ids=["pcmu-8k-out-of-order", "l16-16k"],
)
async def test_a_telnyx_call(echo_gateway: Gateway, encoding: str, rate: int, shuffle: bool) -> None:
    if encoding == "PCMU":
        codec: tuple[Callable[[np.ndarray], bytes], Callable[[bytes], np.ndarray]] = (
            lambda samples: encode(samples, "g711_ulaw"),
            lambda data: decode(data, "g711_ulaw"),
        )
    else:
        codec = (_be16, lambda data: np.frombuffer(data, ">i2").astype(np.float32) / 32768)
    await echo_call(
        echo_gateway,
        "/telephony/telnyx",
        TelnyxWire(encoding=encoding, rate=rate),
        CALL_CONTROL_ID,
        rate=rate,
        encode=codec[0],
        decode=codec[1],
        marks_echoed_on_clear=True,
        shuffle=shuffle,
    )
