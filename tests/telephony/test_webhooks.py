"""The answer webhooks the gateway serves (TwiML, TeXML, Plivo XML, NCCO), their signature checks,
and the signed upgrade of Twilio's media stream."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient
from websockets.exceptions import InvalidStatus

from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app
from duplex_gateway.telephony.carriers.plivo import plivo_v3_signature
from duplex_gateway.telephony.carriers.twilio import twilio_body_hash, twilio_signature
from duplex_gateway.telephony.webhooks import MAX_WEBHOOK_BODY_BYTES
from tests.e2e.helpers import Gateway, GatewayFactory, ws_connect
from tests.telephony.twilio_wire import TwilioWire

TOKEN = "twilio-auth-token-for-tests"
PUBLIC = "https://gw.example.com"
CALLER, CALLED = "+14155550100", "+14155550199"
TWILIO_FORM = {"CallSid": "CA0123456789abcdef", "AccountSid": "AC0123", "From": CALLER, "To": CALLED}


def _client(base_url: str = "http://10.0.0.5:8000", **overrides: Any) -> TestClient:
    settings = load_settings(None, **{"server.web_demo": False, **overrides})
    return TestClient(create_app(settings, EchoEngine()), base_url=base_url)


def _xml(text: bytes) -> ET.Element:
    assert text.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
    return ET.fromstring(text)


def _twiml_stream(root: ET.Element) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The ``<Stream>`` of ``<Response><Connect><Stream>``: its attributes and its parameters."""
    assert root.tag == "Response"
    (connect,) = list(root)
    assert connect.tag == "Connect"
    (stream,) = list(connect)
    assert stream.tag == "Stream"
    params = []
    for child in stream:
        assert child.tag == "Parameter"
        assert set(child.attrib) == {"name", "value"}
        params.append((child.attrib["name"], child.attrib["value"]))
    return dict(stream.attrib), params


# -- Twilio --------------------------------------------------------------------------------------


def test_twilio_voice_answers_connect_stream_with_who_called_whom() -> None:
    client = _client(**{"telephony.public_url": PUBLIC})
    response = client.post("/telephony/twilio/voice", data=TWILIO_FORM)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/xml")
    attributes, params = _twiml_stream(_xml(response.content))
    assert attributes == {"url": "wss://gw.example.com/telephony/twilio"}
    assert params == [("from", CALLER), ("to", CALLED)]


def test_twilio_voice_escapes_values_and_passes_lowercase_query_parameters() -> None:
    client = _client(**{"telephony.public_url": PUBLIC + "/"})
    tricky = 'client:ann & "bob" <x/>'
    response = client.post(
        "/telephony/twilio/voice?profile=sales&Ignored=1&tenant=a%26b", data={**TWILIO_FORM, "From": tricky}
    )
    assert response.status_code == 200
    assert b"<x/>" not in response.content and b"&amp;" in response.content
    attributes, params = _twiml_stream(_xml(response.content))
    assert attributes == {"url": "wss://gw.example.com/telephony/twilio"}
    assert params == [("from", tricky), ("to", CALLED), ("profile", "sales"), ("tenant", "a&b")]


def test_twilio_stream_url_follows_the_request_without_public_url() -> None:
    for base, expected in (
        ("https://voice.example.org", "wss://voice.example.org/telephony/twilio"),
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/telephony/twilio"),
    ):
        response = _client(base).post("/telephony/twilio/voice", data=TWILIO_FORM)
        assert _twiml_stream(_xml(response.content))[0] == {"url": expected}
    prefixed = _client(**{"telephony.public_url": "https://gw.example.com/voice"})
    response = prefixed.post("/telephony/twilio/voice", data=TWILIO_FORM)
    assert _twiml_stream(_xml(response.content))[0] == {"url": "wss://gw.example.com/voice/telephony/twilio"}


def test_twilio_voice_checks_the_signature_when_a_token_is_set() -> None:
    client = _client(**{"telephony.public_url": PUBLIC, "telephony.twilio.auth_token": TOKEN})
    url = f"{PUBLIC}/telephony/twilio/voice?profile=sales"
    good = twilio_signature(TOKEN, url, TWILIO_FORM)
    path = "/telephony/twilio/voice?profile=sales"
    ok = client.post(path, data=TWILIO_FORM, headers={"X-Twilio-Signature": good})
    assert ok.status_code == 200
    assert ("profile", "sales") in _twiml_stream(_xml(ok.content))[1]
    # Twilio may sign the URL with the default port.
    with_port = twilio_signature(TOKEN, url.replace(".com", ".com:443"), TWILIO_FORM)
    assert client.post(path, data=TWILIO_FORM, headers={"X-Twilio-Signature": with_port}).status_code == 200
    for headers, form in (
        ({}, TWILIO_FORM),
        ({"X-Twilio-Signature": good}, {**TWILIO_FORM, "From": "+15555550123"}),
        ({"X-Twilio-Signature": twilio_signature("another-token", url, TWILIO_FORM)}, TWILIO_FORM),
        ({"X-Twilio-Signature": twilio_signature(TOKEN, url + "&x=1", TWILIO_FORM)}, TWILIO_FORM),
    ):
        refused = client.post(path, data=form, headers=headers)
        assert refused.status_code == 403
        assert refused.text == "invalid signature"
        assert not refused.headers["content-type"].startswith("text/xml")


def test_twilio_voice_signature_without_public_url_uses_the_host() -> None:
    client = _client("https://voice.example.org", **{"telephony.twilio.auth_token": TOKEN})
    good = twilio_signature(TOKEN, "https://voice.example.org/telephony/twilio/voice", TWILIO_FORM)
    response = client.post("/telephony/twilio/voice", data=TWILIO_FORM, headers={"X-Twilio-Signature": good})
    assert response.status_code == 200
    forged = twilio_signature(TOKEN, "https://elsewhere.example/telephony/twilio/voice", TWILIO_FORM)
    response = client.post(
        "/telephony/twilio/voice", data=TWILIO_FORM, headers={"X-Twilio-Signature": forged}
    )
    assert response.status_code == 403


def test_twilio_voice_json_body_is_checked_by_its_hash() -> None:
    client = _client(**{"telephony.public_url": PUBLIC, "telephony.twilio.auth_token": TOKEN})
    body = json.dumps({"From": CALLER, "To": CALLED}).encode()
    path = f"/telephony/twilio/voice?bodySHA256={twilio_body_hash(body)}"
    signature = twilio_signature(TOKEN, PUBLIC + path)
    headers = {"X-Twilio-Signature": signature, "Content-Type": "application/json"}
    response = client.post(path, content=body, headers=headers)
    assert response.status_code == 200
    assert _twiml_stream(_xml(response.content))[1] == [("from", CALLER), ("to", CALLED)]
    assert client.post(path, content=body.replace(b"0100", b"0101"), headers=headers).status_code == 403


def test_webhooks_refuse_other_methods_and_huge_bodies() -> None:
    client = _client()
    assert client.get("/telephony/twilio/voice").status_code == 405
    assert client.get("/telephony/telnyx/texml").status_code == 405
    huge = b"a=" + b"x" * MAX_WEBHOOK_BODY_BYTES
    response = client.post(
        "/telephony/twilio/voice", content=huge, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert response.status_code == 413


# -- Telnyx --------------------------------------------------------------------------------------


def _telnyx_keys() -> tuple[Ed25519PrivateKey, str]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, base64.b64encode(raw).decode()


TELNYX_FORM = {"CallSid": "v3:abc", "From": CALLER, "To": CALLED, "AccountSid": "acc"}
TEXML_STREAM = {
    "url": "wss://gw.example.com/telephony/telnyx",
    "codec": "PCMU",
    "bidirectionalMode": "rtp",
    "bidirectionalCodec": "PCMU",
    "bidirectionalSamplingRate": "8000",
}


def test_telnyx_texml_answers_a_bidirectional_rtp_stream() -> None:
    response = _client(**{"telephony.public_url": PUBLIC}).post("/telephony/telnyx/texml", data=TELNYX_FORM)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/xml")
    attributes, params = _twiml_stream(_xml(response.content))
    assert attributes == TEXML_STREAM
    assert params == []


def test_telnyx_texml_checks_the_ed25519_signature_when_a_key_is_set() -> None:
    private, public = _telnyx_keys()
    client = _client(**{"telephony.public_url": PUBLIC, "telephony.telnyx.public_key": public})
    body = urllib.parse.urlencode(TELNYX_FORM).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    def signed(stamp: int, payload: bytes = body, key: Ed25519PrivateKey = private) -> dict[str, str]:
        signature = base64.b64encode(key.sign(str(stamp).encode() + b"|" + payload)).decode()
        return {**form, "telnyx-signature-ed25519": signature, "telnyx-timestamp": str(stamp)}

    now = int(time.time())
    ok = client.post("/telephony/telnyx/texml", content=body, headers=signed(now))
    assert ok.status_code == 200
    assert _twiml_stream(_xml(ok.content))[0] == TEXML_STREAM
    for headers, content in (
        (form, body),
        (signed(now, payload=b"other"), body),
        (signed(now - 3600), body),
        (signed(now, key=Ed25519PrivateKey.generate()), body),
        (signed(now), body + b"&x=1"),
    ):
        assert client.post("/telephony/telnyx/texml", content=content, headers=headers).status_code == 403


def test_a_bad_telnyx_public_key_fails_at_start() -> None:
    with pytest.raises(ConfigError, match=r"telephony\.telnyx\.public_key"):
        _client(**{"telephony.telnyx.public_key": "bm90IGEga2V5"})
    not_ed25519 = (
        rsa.generate_private_key(public_exponent=65537, key_size=1024)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ConfigError, match=r"telephony\.telnyx\.public_key: .*not an Ed25519 key"):
        _client(**{"telephony.telnyx.public_key": not_ed25519.decode()})


# -- Plivo ---------------------------------------------------------------------------------------

PLIVO_TOKEN = "plivo-auth-token-for-tests"
PLIVO_FORM = {"CallUUID": "3f9a-1", "From": "14155550100", "To": "+1 415 555 0199", "Direction": "inbound"}
PLIVO_STREAM = {
    "bidirectional": "true",
    "keepCallAlive": "true",
    "contentType": "audio/x-mulaw;rate=8000",
    "extraHeaders": "from=14155550100,to=14155550199",
}


def _plivo_stream(root: ET.Element) -> ET.Element:
    assert root.tag == "Response"
    (stream,) = list(root)
    assert stream.tag == "Stream"
    assert list(stream) == []
    return stream


def test_plivo_answer_is_a_bidirectional_stream() -> None:
    response = _client(**{"telephony.public_url": PUBLIC}).post("/telephony/plivo/answer", data=PLIVO_FORM)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/xml")
    stream = _plivo_stream(_xml(response.content))
    assert stream.attrib == PLIVO_STREAM
    assert stream.text == "wss://gw.example.com/telephony/plivo"


def test_plivo_answer_checks_the_v3_signature_when_a_token_is_set() -> None:
    client = _client(**{"telephony.public_url": PUBLIC, "telephony.plivo.auth_token": PLIVO_TOKEN})
    url = f"{PUBLIC}/telephony/plivo/answer?profile=sales"
    nonce = "12345678901234567890"
    good = plivo_v3_signature(PLIVO_TOKEN, url, nonce, PLIVO_FORM)
    headers = {"X-Plivo-Signature-V3": f"b3RoZXI=,{good}", "X-Plivo-Signature-V3-Nonce": nonce}
    ok = client.post("/telephony/plivo/answer?profile=sales", data=PLIVO_FORM, headers=headers)
    assert ok.status_code == 200
    assert (
        _plivo_stream(_xml(ok.content)).attrib["extraHeaders"]
        == "from=14155550100,to=14155550199,profile=sales"
    )
    refused = [
        client.post("/telephony/plivo/answer?profile=sales", data={**PLIVO_FORM, "To": "1"}, headers=headers),
        client.post(
            "/telephony/plivo/answer?profile=sales",
            data=PLIVO_FORM,
            headers={**headers, "X-Plivo-Signature-V3-Nonce": "0"},
        ),
        client.post("/telephony/plivo/answer?profile=sales", data=PLIVO_FORM),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403]
    # GET answer URLs sign the sorted query.
    query = urllib.parse.urlencode(PLIVO_FORM)
    get_url = f"{PUBLIC}/telephony/plivo/answer?{query}"
    signed = {
        "X-Plivo-Signature-V3": plivo_v3_signature(PLIVO_TOKEN, get_url, nonce, None, "GET"),
        "X-Plivo-Signature-V3-Nonce": nonce,
    }
    response = client.get(f"/telephony/plivo/answer?{query}", headers=signed)
    assert response.status_code == 200
    assert _plivo_stream(_xml(response.content)).attrib == PLIVO_STREAM


# -- Vonage --------------------------------------------------------------------------------------

VONAGE_QUERY = {
    "from": "447700900000",
    "to": "447700900001",
    "uuid": "aaaa-bbbb",
    "conversation_uuid": "CON-1",
}


def _expected_ncco(headers: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "action": "connect",
            "endpoint": [
                {
                    "type": "websocket",
                    "uri": "wss://gw.example.com/telephony/vonage",
                    "content-type": "audio/l16;rate=16000",
                    "headers": headers,
                }
            ],
        }
    ]


def test_vonage_answer_is_an_ncco_connecting_a_websocket() -> None:
    client = _client(**{"telephony.public_url": PUBLIC})
    headers = {"from": "447700900000", "to": "447700900001", "uuid": "aaaa-bbbb"}
    response = client.get("/telephony/vonage/answer?" + urllib.parse.urlencode(VONAGE_QUERY))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == _expected_ncco(headers)
    posted = client.post("/telephony/vonage/answer?profile=sales", json=VONAGE_QUERY)
    assert posted.json() == _expected_ncco({**headers, "profile": "sales"})


# -- through a real gateway: the signed upgrade of Twilio's media stream ---------------------------------


@pytest.fixture(scope="module")
def signed_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo"},
            "telephony": {"public_url": PUBLIC, "twilio": {"auth_token": TOKEN}},
        },
        name="twilio-signed",
    )


def _post(gw: Gateway, path: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        gw.base_url + path, data=urllib.parse.urlencode(form).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def _engine_sessions(gw: Gateway, expected: int, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = await asyncio.to_thread(gw.readyz)
        if body["engine_sessions"] == expected and body["sessions"] == expected:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"/readyz still reports {body}, expected {expected} sessions")


@pytest.mark.e2e
def test_twilio_webhook_through_a_real_gateway(signed_gateway: Gateway) -> None:
    url = f"{PUBLIC}/telephony/twilio/voice"
    status, body = _post(
        signed_gateway,
        "/telephony/twilio/voice",
        TWILIO_FORM,
        {"X-Twilio-Signature": twilio_signature(TOKEN, url, TWILIO_FORM)},
    )
    assert status == 200
    attributes, params = _twiml_stream(_xml(body))
    assert attributes == {"url": "wss://gw.example.com/telephony/twilio"}
    assert params == [("from", CALLER), ("to", CALLED)]
    status, body = _post(
        signed_gateway, "/telephony/twilio/voice", TWILIO_FORM, {"X-Twilio-Signature": "bm9wZQ=="}
    )
    assert (status, body) == (403, b"invalid signature")


@pytest.mark.e2e
async def test_an_unsigned_twilio_stream_is_refused_before_any_session(signed_gateway: Gateway) -> None:
    stream_url = "wss://gw.example.com/telephony/twilio"
    for headers in (
        {},
        {"X-Twilio-Signature": "bm9wZQ=="},
        {"X-Twilio-Signature": twilio_signature("another-token", stream_url)},
        {"X-Twilio-Signature": twilio_signature(TOKEN, "wss://elsewhere.example/telephony/twilio")},
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(signed_gateway, "/telephony/twilio", additional_headers=headers):
                pass
        assert refused.value.response.status_code == 403
    ready = await asyncio.to_thread(signed_gateway.readyz)
    assert ready["sessions"] == 0
    assert ready["engine_sessions"] == 0


@pytest.mark.e2e
async def test_a_signed_twilio_stream_opens_its_session(signed_gateway: Gateway) -> None:
    # The URL Twilio signs is the stream URL the TwiML gave it, without parameters.
    headers = {"X-Twilio-Signature": twilio_signature(TOKEN, "wss://gw.example.com/telephony/twilio")}
    async with ws_connect(signed_gateway, "/telephony/twilio", additional_headers=headers) as ws:
        for message in TwilioWire({"from": CALLER, "to": CALLED}).greeting():
            await ws.send(message)
        await _engine_sessions(signed_gateway, 1)
    await _engine_sessions(signed_gateway, 0)
