"""A Twilio call into a real gateway: Twilio's message shapes over a real socket."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from websockets.exceptions import InvalidStatus

from tests.e2e.helpers import Gateway, GatewayFactory, decode, encode, ws_connect
from tests.fixtures import load_speech as load_fixture_speech
from tests.sdk_models import validate_server_event
from tests.telephony.acceptance import observing
from tests.telephony.phone import Phone
from tests.telephony.twilio_wire import CALL_SID, TwilioWire

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0}}}, name="twilio-echo"
    )


def _caller(seconds_before: float = 0.5, seconds_after: float = 1.2) -> bytes:
    speech = load_fixture_speech(8_000)
    pad = np.zeros(int(8_000 * seconds_before), np.float32), np.zeros(int(8_000 * seconds_after), np.float32)
    return encode(np.concatenate([pad[0], speech, pad[1]]), "g711_ulaw")


async def test_a_call_is_answered_in_twilio_media(echo_gateway: Gateway) -> None:
    async with ws_connect(echo_gateway, "/telephony/twilio") as ws, Phone(ws, TwilioWire()) as phone:
        await phone.say(_caller())
        await phone.wait(lambda p: len(p.media()) > 10 and p.played_marks and not p._buffer, timeout=20)
        reply = b"".join(o.audio for o in phone.media())
        assert len(reply) > 8_000  # over a second of the echo, μ-law at 8 kHz
        assert not phone.clears
        await phone.hang_up()


async def _speakerphone(phone: Phone, seconds: float, *, delay_ms: float = 150, gain: float = 0.4) -> None:
    """Keep the line open as a speakerphone does: the microphone hears the reply being played."""
    frame = phone.wire.frame_bytes
    delay = int(8_000 * delay_ms / 1000)
    start = time.monotonic()
    for index in range(int(seconds * 50)):
        cursor = len(phone.played) - delay
        heard = bytes(phone.played[max(cursor, 0) : max(cursor, 0) + frame]) if cursor > 0 else b""
        mic = decode(heard, "g711_ulaw") * gain if heard else np.zeros(0, np.float32)
        mic = np.concatenate([mic, np.zeros(frame - mic.size, np.float32)])
        await phone.ws.send(phone.wire.media(encode(mic, "g711_ulaw"), index))
        await asyncio.sleep(max(0.0, start + (index + 1) * 0.02 - time.monotonic()))


@pytest.fixture(scope="module")
def echo_gateway_unprotected(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 1.0}},
            "telephony": {"echo_suppression": False},
        },
        name="twilio-echo-unprotected",
    )


@pytest.mark.parametrize("protected", [True, False])
async def test_a_speakerphone_does_not_cut_its_own_reply(
    protected: bool, echo_gateway: Gateway, echo_gateway_unprotected: Gateway
) -> None:
    """The reply leaks back into the caller's microphone; with echo suppression it plays to the end."""
    gateway = echo_gateway if protected else echo_gateway_unprotected
    async with ws_connect(gateway, "/telephony/twilio") as ws, Phone(ws, TwilioWire()) as phone:
        await phone.say(_caller(seconds_after=0.8))
        await _speakerphone(phone, 6.0)
        if protected:
            assert not phone.clears, "the reply's own echo cut it off"
            assert len(phone.played) > 8_000 * 2.5  # the echoed turn played whole
        else:
            assert phone.clears, "without suppression the echo barges in (the test can tell)"
        await phone.hang_up()


async def test_dtmf_and_transcripts_reach_an_observer_of_the_call(echo_gateway: Gateway) -> None:
    async with ws_connect(echo_gateway, "/telephony/twilio") as ws, Phone(ws, TwilioWire()) as phone:
        async with observing(echo_gateway, CALL_SID) as observer:
            _, created = await observer.wait(lambda e: e["type"] == "session.created")
            assert created["session"]["audio"]["input"]["format"]["type"] == "audio/pcmu"
            await phone.press("5")
            _, dtmf = await observer.wait(lambda e: e["type"] == "input_audio_buffer.dtmf_event_received")
            assert dtmf["event"] == "5" and abs(dtmf["received_at"] - time.time()) < 60
            validate_server_event(dtmf)  # OpenAI's own SIP event, exactly as the SDK types it
            await phone.say(_caller())
            await observer.wait(lambda e: e["type"] == "response.done", timeout=20)
            # Read-only: an observer's command is refused and the call goes on.
            await observer.send({"type": "response.cancel"})
            _, error = await observer.wait(lambda e: e["type"] == "error")
            assert "read-only" in error["error"]["message"]
        await phone.hang_up()
    # Nobody watches a call that is not there.
    with pytest.raises(InvalidStatus):
        async with ws_connect(echo_gateway, "/v1/realtime?call_id=CA_no_such_call"):
            pass
