"""Every carrier's scripted call against the embedded engine (see :mod:`tests.telephony.acceptance`).

Each call uses the carrier's exact message shapes over a real socket and real speech
encoded as that carrier sends it: the reply must come back as intelligible speech in
the carrier's media, and a barge-in must clear the carrier within 50 ms of the
gateway's detection, with nothing of the cut reply after it and the truncation at
the last mark played.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from tests.e2e.helpers import Gateway, GatewayFactory, decode, encode
from tests.telephony import asterisk_wire, exotel_wire, plivo_wire, telnyx_wire, twilio_wire, vonage_wire
from tests.telephony.acceptance import run_call
from tests.telephony.phone import Wire

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Carrier:
    path: str
    wire: Callable[[], Wire]
    call_id: str
    rate: int
    codec: str  # tests.e2e.helpers' codec name
    subprotocols: tuple[str, ...] = ()


def _l16_be(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype(">i2").tobytes()


def _from_l16_be(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=">i2").astype(np.float32) / 32768


CARRIERS = {
    "twilio": Carrier("/telephony/twilio", twilio_wire.TwilioWire, twilio_wire.CALL_SID, 8_000, "g711_ulaw"),
    "telnyx": Carrier(
        "/telephony/telnyx", telnyx_wire.TelnyxWire, telnyx_wire.CALL_CONTROL_ID, 8_000, "g711_ulaw"
    ),
    "plivo": Carrier("/telephony/plivo", plivo_wire.PlivoWire, plivo_wire.CALL_ID, 8_000, "g711_ulaw"),
    "exotel": Carrier("/telephony/exotel", exotel_wire.ExotelWire, exotel_wire.CALL_SID, 8_000, "pcm16"),
    "vonage": Carrier("/telephony/vonage", vonage_wire.VonageWire, vonage_wire.CALL_UUID, 16_000, "pcm16"),
    "asterisk": Carrier(
        "/telephony/asterisk",
        asterisk_wire.AsteriskWire,
        asterisk_wire.CHANNEL_ID,
        8_000,
        "g711_ulaw",
        ("media",),
    ),
}


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "embedded"}, "limits": {"max_sessions": 2}},
        name="telephony-embedded",
    )


@pytest.mark.parametrize("name", list(CARRIERS))
async def test_a_call_is_understood_answered_and_cut_off_cleanly(gateway: Gateway, name: str) -> None:
    carrier = CARRIERS[name]
    await run_call(
        gateway,
        carrier.path,
        carrier.wire(),
        carrier.call_id,
        rate=carrier.rate,
        encode=lambda samples: encode(samples, carrier.codec),
        decode=lambda data: decode(data, carrier.codec),
        subprotocols=carrier.subprotocols,
    )
