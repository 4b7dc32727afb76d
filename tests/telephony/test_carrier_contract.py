"""The promises every carrier in the table keeps, run over each one through its ``CarrierSpec``.

The carrier's side of each exchange is its wire fixture (``tests/telephony/*_wire.py``, the
shapes the acceptance script speaks): its start opens the call, its media is the caller's
audio, and what the gateway sends back (media, marks, clears) parses as the carrier reads it.
The control plane is asked through the real app: the answer webhook points the call at the
carrier's stream, a signed webhook is let in and a tampered one refused, and a hang-up is
the REST call the carrier documents. A carrier added to the table without a case here fails
the first test.
"""

from __future__ import annotations

import base64
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient

from duplex_gateway.config import GatewaySettings, load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.plivo import plivo_v3_signature
from duplex_gateway.telephony.carriers.twilio import twilio_signature
from duplex_gateway.telephony.control import HangupOutcome, HangupRequest
from duplex_gateway.telephony.registry import CARRIERS, DetectingCarrier, spec
from tests.telephony import asterisk_wire, exotel_wire, plivo_wire, telnyx_wire, twilio_wire, vonage_wire
from tests.telephony.phone import Wire

PUBLIC = "https://gw.example.com"
FORM = {"From": "+14155550100", "To": "+14155550199", "CallSid": "CA1", "CallUUID": "c-1"}
TOKEN = "contract-token"
TELNYX_KEY = Ed25519PrivateKey.generate()

#: Signs a webhook request (its full URL and its form body) as the carrier would: the headers.
Signer = Callable[[str, bytes, Mapping[str, str]], dict[str, str]]


def _twilio_signer(url: str, body: bytes, form: Mapping[str, str]) -> dict[str, str]:
    return {"X-Twilio-Signature": twilio_signature(TOKEN, url, form)}


def _plivo_signer(url: str, body: bytes, form: Mapping[str, str]) -> dict[str, str]:
    nonce = "73214902713390571934"
    return {
        "X-Plivo-Signature-V3": plivo_v3_signature(TOKEN, url, nonce, form),
        "X-Plivo-Signature-V3-Nonce": nonce,
    }


def _telnyx_signer(url: str, body: bytes, form: Mapping[str, str]) -> dict[str, str]:
    stamp = str(int(time.time()))
    signature = base64.b64encode(TELNYX_KEY.sign(stamp.encode() + b"|" + body)).decode()
    return {"telnyx-signature-ed25519": signature, "telnyx-timestamp": stamp}


def _telnyx_public_key() -> str:
    raw = TELNYX_KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Case:
    """One carrier's side of the contract."""

    wire: Callable[[], Wire]
    call_id: str
    #: ``telephony.<carrier>`` settings that turn its signature check on (with ``signer``), and its hang-up.
    signing: Mapping[str, Any] = field(default_factory=dict)
    signer: Signer | None = None
    credentials: Mapping[str, Any] = field(default_factory=dict)
    #: The hang-up the carrier documents: method, and URL after its API's base; None: it has no REST hang-up.
    hangup: tuple[str, str] | None = None
    subprotocols: tuple[str, ...] = ()


CASES: dict[str, Case] = {
    "twilio": Case(
        twilio_wire.TwilioWire,
        twilio_wire.CALL_SID,
        signing={"auth_token": TOKEN},
        signer=_twilio_signer,
        credentials={"account_sid": "AC1", "auth_token": TOKEN, "api_base_url": "https://api.twilio.test"},
        hangup=("POST", f"https://api.twilio.test/2010-04-01/Accounts/AC1/Calls/{twilio_wire.CALL_SID}.json"),
    ),
    "telnyx": Case(
        telnyx_wire.TelnyxWire,
        telnyx_wire.CALL_CONTROL_ID,
        signing={"public_key": _telnyx_public_key()},
        signer=_telnyx_signer,
        credentials={"api_key": "KEY1", "api_base_url": "https://api.telnyx.test/"},
        hangup=("POST", f"https://api.telnyx.test/v2/calls/{telnyx_wire.CALL_CONTROL_ID}/actions/hangup"),
    ),
    "plivo": Case(
        plivo_wire.PlivoWire,
        plivo_wire.CALL_ID,
        signing={"auth_token": TOKEN},
        signer=_plivo_signer,
        credentials={"auth_id": "MA1", "auth_token": TOKEN, "api_base_url": "https://api.plivo.test"},
        hangup=("DELETE", f"https://api.plivo.test/v1/Account/MA1/Call/{plivo_wire.CALL_ID}/"),
    ),
    "exotel": Case(exotel_wire.ExotelWire, exotel_wire.CALL_SID),
    "vonage": Case(
        vonage_wire.VonageWire,
        vonage_wire.CALL_UUID,
        credentials={"jwt": "eyJ.contract.jwt", "api_base_url": "https://api.vonage.test"},
        hangup=("PUT", f"https://api.vonage.test/v1/calls/{vonage_wire.CALL_UUID}"),
    ),
    "asterisk": Case(asterisk_wire.AsteriskWire, asterisk_wire.CHANNEL_ID, subprotocols=("media",)),
}

NAMES = list(CARRIERS)


def _spec(name: str) -> call.CarrierSpec[Any]:
    found = spec(name)
    assert found is not None and found.name == name
    return found


def _settings(name: str, section: Mapping[str, Any]) -> GatewaySettings:
    overrides = {f"telephony.{name}.{key}": value for key, value in section.items()}
    return load_settings(None, **{"server.web_demo": False, "telephony.public_url": PUBLIC, **overrides})


def _started(name: str, wire: Wire) -> tuple[call.Carrier, list[call.CallEvent]]:
    carrier = _spec(name).wire()
    events = [event for frame in wire.greeting() for event in carrier.parse(frame)]
    return carrier, events


def _outs(wire: Wire, frames: Sequence[str | bytes] | str | bytes | None) -> list[Any]:
    if frames is None:
        return []
    return [wire.parse(frame) for frame in ([frames] if isinstance(frames, str | bytes) else frames)]


def test_every_carrier_in_the_table_has_a_case() -> None:
    assert sorted(CASES) == sorted(CARRIERS)


@pytest.mark.parametrize("name", NAMES)
def test_the_start_opens_the_call_and_telephony_recognizes_it(name: str) -> None:
    case = CASES[name]
    _, events = _started(name, case.wire())
    starts = [e for e in events if isinstance(e, call.CallStart)]
    assert len(starts) == 1 and starts[0].carrier == name and starts[0].call_id == case.call_id
    # /telephony tells it apart from every other carrier by the same messages.
    detecting = DetectingCarrier()
    detected = [e for frame in case.wire().greeting() for e in detecting.parse(frame)]
    assert detecting.detected is not None and detecting.detected.name == name
    assert [type(e) for e in detected] == [type(e) for e in events]


@pytest.mark.parametrize("name", NAMES)
def test_caller_media_comes_in_as_the_callers_audio(name: str) -> None:
    wire = CASES[name].wire()
    carrier, _ = _started(name, wire)
    frames = [bytes((i * 7 + n) % 256 for n in range(wire.frame_bytes)) for i in range(3)]
    heard = [e for i, audio in enumerate(frames) for e in carrier.parse(wire.media(audio, i))]
    assert all(isinstance(e, call.CallAudio) for e in heard)
    assert b"".join(e.audio for e in heard if isinstance(e, call.CallAudio)) == b"".join(frames)


@pytest.mark.parametrize("name", NAMES)
def test_reply_media_goes_out_as_the_carrier_plays_it(name: str) -> None:
    wire = CASES[name].wire()
    carrier, _ = _started(name, wire)
    framing = carrier.framing
    size = max(framing.min_bytes, 3_200)
    audio = bytes(n % 251 for n in range(size - size % framing.multiple))
    outs = _outs(wire, carrier.media(audio))
    assert outs and all(out.kind == "media" for out in outs)
    assert b"".join(out.audio for out in outs) == audio


@pytest.mark.parametrize("name", NAMES)
def test_marks_come_back_played_and_a_clear_is_understood(name: str) -> None:
    wire = CASES[name].wire()
    carrier, _ = _started(name, wire)
    assert carrier.has_marks, f"{name} gives no played position"
    marks = _outs(wire, carrier.mark("m1"))
    assert [(out.kind, out.name) for out in marks] == [("mark", "m1")]
    played = wire.mark_played("m1")
    assert played is not None and list(carrier.parse(played)) == [call.MarkPlayed("m1")]
    assert [out.kind for out in _outs(wire, carrier.clear())] == ["clear"]
    confirmation = wire.cleared()
    if confirmation is not None:
        assert list(carrier.parse(confirmation)) == [call.CarrierCleared()]


@pytest.mark.parametrize("name", NAMES)
def test_the_carriers_stop_ends_the_call(name: str) -> None:
    wire = CASES[name].wire()
    carrier, _ = _started(name, wire)
    stop = wire.stop()
    if stop is None:
        pytest.skip(f"{name} has no stop message: the socket's close ends the call")
    assert [type(e) for e in carrier.parse(stop)] == [call.CallEnded]


@pytest.mark.parametrize("name", NAMES)
def test_the_answer_webhook_points_the_call_at_the_carriers_stream(name: str) -> None:
    hook = _spec(name).answer_hook
    if hook is None:
        pytest.skip(f"{name} has no answer webhook")
    client = TestClient(create_app(_settings(name, {}), EchoEngine()), base_url="http://10.0.0.5:8000")
    for method in hook.methods:
        url = f"/telephony/{name}/{hook.path}?profile=sales"
        response = client.request(method, url, data=FORM if method == "POST" else None)
        assert response.status_code == 200, (method, response.text)
        assert f"wss://gw.example.com/telephony/{name}" in response.text
        assert response.headers["content-type"].split(";")[0] in ("text/xml", "application/json")


@pytest.mark.parametrize("name", NAMES)
def test_a_signed_webhook_is_let_in_and_a_tampered_one_refused(name: str) -> None:
    case = CASES[name]
    found = _spec(name)
    if case.signer is None:
        assert not found.signatures(found.settings_of(_settings(name, case.credentials).telephony))
        pytest.skip(f"{name} signs no webhook")
    assert found.answer_hook is not None
    assert not found.signatures(found.settings_of(_settings(name, {}).telephony)), (
        "signatures on without a key"
    )
    client = TestClient(
        create_app(_settings(name, case.signing), EchoEngine()), base_url="http://10.0.0.5:8000"
    )
    path = f"/telephony/{name}/{found.answer_hook.path}?profile=sales"
    body = urllib.parse.urlencode(FORM).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", **case.signer(PUBLIC + path, body, FORM)}
    assert client.post(path, content=body, headers=headers).status_code == 200
    tampered = urllib.parse.urlencode({**FORM, "To": "+10000000000"}).encode()
    assert client.post(path, content=tampered, headers=headers).status_code == 403
    unsigned = {"Content-Type": "application/x-www-form-urlencoded"}
    assert client.post(path, content=body, headers=unsigned).status_code == 403


@pytest.mark.parametrize("name", NAMES)
def test_a_hang_up_is_the_rest_call_the_carrier_documents(name: str) -> None:
    case = CASES[name]
    found = _spec(name)
    unconfigured = found.hangup_request(case.call_id, found.settings_of(_settings(name, {}).telephony))
    if case.hangup is None:
        assert unconfigured == (HangupOutcome.UNSUPPORTED, None)
        pytest.skip(f"{name} has no REST hang-up: closing the stream (or its in-band hang-up) ends the call")
    assert unconfigured == (HangupOutcome.NOT_CONFIGURED, None)
    request = found.hangup_request(
        case.call_id, found.settings_of(_settings(name, case.credentials).telephony)
    )
    assert isinstance(request, HangupRequest)
    assert (request.method, request.url) == case.hangup
    assert request.auth is not None or request.headers.get("Authorization", "").startswith("Bearer ")
    assert not found.already_ended(500, frozenset())
