"""Twilio Media Streams, message by message, and the call dialect it drives."""

from __future__ import annotations

import base64
import json

import pytest

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.twilio import TwilioCarrier
from duplex_gateway.telephony.dialect import CallDialect, CallProfile, CallSetup
from duplex_gateway.telephony.registry import DetectingCarrier
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig, TurnDetection
from tests.telephony.twilio_wire import CALL_SID, STREAM_SID, TwilioWire

ULAW = AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)


def started(parameters: dict[str, str] | None = None) -> tuple[TwilioCarrier, list[call.CallEvent]]:
    twilio = TwilioCarrier()
    events: list[call.CallEvent] = []
    for frame in TwilioWire(parameters).greeting():
        events.extend(twilio.parse(frame))
    return twilio, events


def test_start_media_mark_dtmf_stop() -> None:
    twilio, events = started({"from": "+14155550100", "to": "+14155550199", "tenant": "acme"})
    (start,) = events  # "connected" carries nothing
    assert isinstance(start, call.CallStart)
    assert (start.call_id, start.stream_id, start.caller, start.callee) == (
        CALL_SID,
        STREAM_SID,
        "+14155550100",
        "+14155550199",
    )
    assert start.parameters["tenant"] == "acme" and start.input_format == start.output_format == ULAW
    wire = TwilioWire()
    assert twilio.parse(wire.media(b"\xff" * 160, 0)) == [call.CallAudio(b"\xff" * 160)]
    assert twilio.parse(wire.mark_played("0.3")) == [call.MarkPlayed("0.3")]
    assert twilio.parse(wire.dtmf("7")) == [call.Dtmf("7")]
    assert twilio.parse(wire.stop()) == [call.CallEnded("stop")]


def test_outbound_messages_in_twilios_shapes() -> None:
    twilio, _ = started()
    (media,) = twilio.media(b"\x7f\xff")
    assert json.loads(media) == {"event": "media", "streamSid": STREAM_SID, "media": {"payload": "f/8="}}
    assert json.loads(str(twilio.mark("1.2"))) == {
        "event": "mark",
        "streamSid": STREAM_SID,
        "mark": {"name": "1.2"},
    }
    assert json.loads(str(twilio.clear())) == {"event": "clear", "streamSid": STREAM_SID}
    assert twilio.hangup() is None  # closing the stream ends a <Connect><Stream> call


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", ErrorCode.INVALID_JSON),
        ("[]", ErrorCode.INVALID_EVENT),
        (b"\x00", ErrorCode.BINARY_NOT_SUPPORTED),
        ('{"event":"media"}', ErrorCode.INVALID_EVENT),
        ('{"event":"media","media":{"payload":"***"}}', ErrorCode.INVALID_EVENT),
        ('{"event":"start","start":{"callSid":"CA1"}}', ErrorCode.INVALID_EVENT),
        (
            '{"event":"start","start":{"streamSid":"MZ1","mediaFormat":{"encoding":"audio/x-l16"}}}',
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
        ),
        ('{"event":"nonsense"}', ErrorCode.INVALID_EVENT),
    ],
)
def test_malformed_messages_are_protocol_errors(frame: str | bytes, code: ErrorCode) -> None:
    with pytest.raises(ProtocolError) as info:
        TwilioCarrier().parse(frame)
    assert info.value.code is code


def test_outbound_track_media_and_nameless_marks_are_ignored() -> None:
    twilio, _ = started()
    outbound = {"event": "media", "media": {"track": "outbound", "payload": base64.b64encode(b"x").decode()}}
    assert twilio.parse(json.dumps(outbound)) == []
    assert twilio.parse('{"event":"mark","mark":{}}') == []


def test_slash_telephony_recognizes_twilio_from_its_start() -> None:
    detecting = DetectingCarrier()
    connected, start = TwilioWire().greeting()
    assert detecting.parse(connected) == []  # held: Twilio, Telnyx and Exotel all greet so
    (event,) = detecting.parse(start)
    assert isinstance(event, call.CallStart) and isinstance(detecting.detected, TwilioCarrier)
    with pytest.raises(ProtocolError):
        detecting2 = DetectingCarrier()
        for _ in range(9):
            detecting2.parse('{"event":"unheard_of"}')


# -- the call dialect, driven by Twilio ----------------------------------------------------


def dialect(setup: CallSetup | None = None, parameters: dict[str, str] | None = None) -> CallDialect:
    d = CallDialect(TwilioCarrier(), setup, wall_clock=lambda: 1764540000.5)
    for frame in TwilioWire(parameters).greeting():
        d.parse(frame)
    return d


def test_the_start_opens_the_session_in_the_calls_format_with_the_numbers_profile() -> None:
    setup = CallSetup(
        profiles={
            "+14155550199": CallProfile(instructions="You are the front desk.", voice="joe"),
            "vip": CallProfile(instructions="Greet the VIP."),
        }
    )
    d = CallDialect(TwilioCarrier(), setup)
    connected, start = TwilioWire({"to": "+14155550199"}).greeting()
    assert d.parse(connected) == []
    (update,) = d.parse(start)
    assert isinstance(update, cmd.SessionUpdate)
    patch = update.session
    assert patch.input_format == patch.output_format == ULAW
    assert (patch.instructions, patch.voice) == ("You are the front desk.", "joe")
    assert patch.input_transcription is not None
    vip = dialect(setup, {"to": "+14155550199", "profile": "vip"})
    assert vip.profile == CallProfile(instructions="Greet the VIP.")


def test_caller_audio_dtmf_marks_and_hang_up_become_commands() -> None:
    d = dialect()
    wire = TwilioWire()
    assert d.parse(wire.media(b"\xff" * 160, 0)) == [cmd.InputAudioAppend(audio=b"\xff" * 160)]
    assert d.parse(wire.dtmf("#")) == [cmd.CallDtmf(digit="#", received_at=1764540000)]
    assert d.parse(wire.mark_played("0.99")) == []  # not a mark of ours
    assert d.parse(wire.stop()) == [cmd.SessionClose(reason="call_ended:stop")]
    assert d.render(ev.SessionClosed(session_id="s", reason="x"), seq=1) is None


def test_reply_audio_is_paced_and_a_barge_in_clears_and_truncates() -> None:
    d = dialect()
    d.render(ev.SessionCreated(session_id="s", config=SessionConfig()), seq=1)
    assert (
        d.render(
            ev.AudioDelta(response_id="r1", item_id="i1", audio=bytes(8_000), rate=8_000, encoded=True), seq=2
        )
        is None
    )
    frames, wake = d.pump(0.0)
    kinds = [json.loads(f)["event"] for f in frames]
    assert kinds == ["media", "mark"] * 3 and wake is not None
    first_mark = json.loads(frames[1])["mark"]["name"]
    assert d.parse(TwilioWire().mark_played(first_mark)) == [
        cmd.PlaybackAck(response_id="r1", item_id="i1", played_ms=40)
    ]
    d.tick(0.05)
    clear = d.render(ev.SpeechStarted(audio_start_ms=900, item_id="i2"), seq=3)
    assert clear is not None and json.loads(clear) == {"event": "clear", "streamSid": STREAM_SID}
    assert d.take_commands() == [cmd.ConversationItemTruncate(item_id="i1", content_index=0, audio_end_ms=40)]
    assert d.pump(0.05) == ([], None)  # the rest of the reply is gone
    # Twilio's echoes of the dropped marks say nothing about what was played.
    later = json.loads(frames[3])["mark"]["name"]
    assert d.parse(TwilioWire().mark_played(later)) == []


def test_no_interruption_when_turn_detection_does_not_interrupt() -> None:
    d = dialect()
    quiet = SessionConfig(turn_detection=TurnDetection(interrupt_response=False))
    d.render(ev.SessionUpdated(session_id="s", config=quiet), seq=1)
    d.render(ev.AudioDelta(response_id="r1", item_id="i1", audio=bytes(800), rate=8_000, encoded=True), seq=2)
    d.pump(0.0)
    assert d.render(ev.SpeechStarted(audio_start_ms=0, item_id="i2"), seq=3) is None
    # A cancelled reply is cleared all the same.
    clear = d.render(ev.ResponseDone(response_id="r1", status="cancelled"), seq=4)
    assert clear is not None and json.loads(clear)["event"] == "clear"


def test_a_call_in_a_format_the_gateway_cannot_take_is_ended() -> None:
    d = CallDialect(TwilioCarrier())
    start = json.loads(TwilioWire().greeting()[1])
    start["start"]["mediaFormat"]["encoding"] = "audio/x-l16"
    assert d.parse(json.dumps(start)) == [cmd.SessionClose(reason="unsupported_call_format")]
    assert d.ended and d.start is None
