"""Carriers' webhook signatures: Twilio's published vectors, Plivo V3 by its documented algorithm,
Telnyx Ed25519 with a key pair made here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from duplex_gateway.telephony.carriers.plivo import plivo_v3_signature, validate_plivo_v3
from duplex_gateway.telephony.carriers.telnyx import telnyx_public_key, validate_telnyx
from duplex_gateway.telephony.carriers.twilio import twilio_body_hash, twilio_signature, validate_twilio
from duplex_gateway.telephony.signatures import url_port_variants

# -- Twilio: the vectors of twilio-python's request validator tests --------------------------------

TOKEN = "12345"
URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Digits": "1234",
    "From": "+14158675309",
    "To": "+18005551212",
    "Caller": "+14158675309",
}
BODY = '{"property": "value", "boolean": true}'
BODY_HASH = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620"


def test_twilio_vector_form_params() -> None:
    assert twilio_signature(TOKEN, URL, PARAMS) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert validate_twilio(TOKEN, URL, PARAMS, "RSOYDt4T1cUTdK1PDd93/VVr8B8=")


def test_twilio_vector_default_port() -> None:
    # Twilio signed the URL with :443; the request's URL has no port, and the other way round.
    assert twilio_signature(TOKEN, URL.replace(".com", ".com:443"), PARAMS) == "kvajT1Ptam85bY51eRf/AJRuM3w="
    assert validate_twilio(TOKEN, URL, PARAMS, "kvajT1Ptam85bY51eRf/AJRuM3w=")
    assert validate_twilio(TOKEN, URL.replace(".com", ".com:443"), PARAMS, "RSOYDt4T1cUTdK1PDd93/VVr8B8=")


def test_twilio_vector_json_body() -> None:
    assert twilio_body_hash(BODY) == BODY_HASH
    url = f"{URL}&bodySHA256={BODY_HASH}"
    assert validate_twilio(TOKEN, url, None, "a9nBmqA0ju/hNViExpshrM61xv4=", body=BODY)
    assert validate_twilio(TOKEN, url, None, "a9nBmqA0ju/hNViExpshrM61xv4=", body=BODY.encode())
    # The signature covers the URL only, so the body must match its hash.
    assert not validate_twilio(TOKEN, url, None, "a9nBmqA0ju/hNViExpshrM61xv4=", body=BODY + " ")
    assert not validate_twilio(TOKEN, url, None, "a9nBmqA0ju/hNViExpshrM61xv4=")


def test_twilio_vector_repeated_params() -> None:
    expected = "IK+Dwps556ElfBT0I3Rgjkr1wJU="
    pairs = [
        ("Sid", "CA123"),
        ("SidAccount", "AC123"),
        ("Digits", "5678"),
        ("Digits", "1234"),
        ("Digits", "1234"),
    ]
    assert twilio_signature(TOKEN, URL, pairs) == expected
    mapping = {"Sid": "CA123", "SidAccount": "AC123", "Digits": ["5678", "1234"]}
    assert twilio_signature(TOKEN, URL, mapping) == expected
    assert validate_twilio(TOKEN, URL, pairs, expected)


def test_twilio_refuses_what_does_not_match() -> None:
    good = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert not validate_twilio("54321", URL, PARAMS, good)
    assert not validate_twilio(TOKEN, URL, {**PARAMS, "Digits": "9"}, good)
    assert not validate_twilio(TOKEN, URL.replace("foo=1", "foo=2"), PARAMS, good)
    assert not validate_twilio(TOKEN, URL, PARAMS, None)
    assert not validate_twilio(TOKEN, URL, PARAMS, "")
    assert not validate_twilio(TOKEN, URL, PARAMS, "not base64 at all")


def test_twilio_any_port_is_dropped_and_the_default_added() -> None:
    assert url_port_variants("https://h.example:8443/p?q=1") == [
        "https://h.example:8443/p?q=1",
        "https://h.example/p?q=1",
    ]
    assert url_port_variants("wss://h.example/telephony/twilio") == [
        "wss://h.example/telephony/twilio",
        "wss://h.example:443/telephony/twilio",
    ]
    assert url_port_variants("http://h.example/x") == ["http://h.example/x", "http://h.example:80/x"]
    signed = twilio_signature(TOKEN, "http://h.example:80/x", PARAMS)
    assert validate_twilio(TOKEN, "http://h.example/x", PARAMS, signed)


# -- Plivo V3: base64(HMAC-SHA256(auth token, signed URL + "." + nonce)) -----------------------------

PLIVO_TOKEN = "MzQ4ZjFlNWY4ZmQ5ZDc0YjE5NjNmZmI2"
NONCE = "05429567804466091622"


def _plivo_expected(message: str) -> str:
    digest = hmac.new(PLIVO_TOKEN.encode(), message.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def test_plivo_v3_post_params_are_appended_sorted() -> None:
    url = "https://gw.example.com/telephony/plivo/answer"
    params = {"To": "14155550199", "From": "14155550100", "CallUUID": "b4f2"}
    # POST: "<url>?" then every name+value sorted by name, then "." and the nonce.
    expected = _plivo_expected(f"{url}?CallUUIDb4f2From14155550100To14155550199.{NONCE}")
    assert plivo_v3_signature(PLIVO_TOKEN, url, NONCE, params) == expected
    assert validate_plivo_v3(PLIVO_TOKEN, url, NONCE, expected, params)
    assert not validate_plivo_v3(PLIVO_TOKEN, url, NONCE, expected, {**params, "To": "1"})
    assert not validate_plivo_v3(PLIVO_TOKEN, url, "1" + NONCE, expected, params)
    assert not validate_plivo_v3("other", url, NONCE, expected, params)


def test_plivo_v3_query_is_sorted_and_joined_with_a_dot() -> None:
    url = "https://gw.example.com/answer?tenant=acme&profile=sales"
    params = {"From": "14155550100"}
    post = _plivo_expected(f"https://gw.example.com/answer?profile=sales&tenant=acme.From14155550100.{NONCE}")
    assert plivo_v3_signature(PLIVO_TOKEN, url, NONCE, params) == post
    get = _plivo_expected(f"https://gw.example.com/answer?profile=sales&tenant=acme.{NONCE}")
    assert plivo_v3_signature(PLIVO_TOKEN, url, NONCE, None, "GET") == get
    bare = _plivo_expected(f"https://gw.example.com/answer.{NONCE}")
    assert plivo_v3_signature(PLIVO_TOKEN, "https://gw.example.com/answer", NONCE) == bare


def test_plivo_v3_header_may_hold_several_signatures() -> None:
    url = "https://gw.example.com/telephony/plivo/answer"
    good = plivo_v3_signature(PLIVO_TOKEN, url, NONCE, {"From": "1"})
    assert validate_plivo_v3(PLIVO_TOKEN, url, NONCE, f"c29tZXRoaW5nIGVsc2U=,{good}", {"From": "1"})
    assert validate_plivo_v3(PLIVO_TOKEN, url, NONCE, f"{good}, c29tZXRoaW5nIGVsc2U=", {"From": "1"})
    assert not validate_plivo_v3(PLIVO_TOKEN, url, NONCE, "c29tZXRoaW5nIGVsc2U=,b3RoZXI=", {"From": "1"})
    assert not validate_plivo_v3(PLIVO_TOKEN, url, None, good, {"From": "1"})
    assert not validate_plivo_v3(PLIVO_TOKEN, url, NONCE, None, {"From": "1"})


# -- Telnyx: Ed25519 over "timestamp|payload" --------------------------------------------------------


@pytest.fixture(scope="module")
def telnyx_keys() -> tuple[Ed25519PrivateKey, str]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, base64.b64encode(raw).decode()


def _telnyx_sign(private: Ed25519PrivateKey, timestamp: str, payload: bytes) -> str:
    return base64.b64encode(private.sign(timestamp.encode() + b"|" + payload)).decode()


PAYLOAD = b'{"data":{"event_type":"call.initiated","payload":{"from":"+13125550100"}}}'


def test_telnyx_signature_verifies(telnyx_keys: tuple[Ed25519PrivateKey, str]) -> None:
    private, public = telnyx_keys
    stamp = str(int(time.time()))
    signature = _telnyx_sign(private, stamp, PAYLOAD)
    assert validate_telnyx(public, PAYLOAD, signature, stamp)
    assert validate_telnyx(telnyx_public_key(public), PAYLOAD, signature, stamp)


def test_telnyx_refuses_tampering_other_keys_and_stale_timestamps(
    telnyx_keys: tuple[Ed25519PrivateKey, str],
) -> None:
    private, public = telnyx_keys
    now = 1_750_000_000.0
    stamp = str(int(now))
    signature = _telnyx_sign(private, stamp, PAYLOAD)
    assert validate_telnyx(public, PAYLOAD, signature, stamp, now=now + 299)
    assert not validate_telnyx(public, PAYLOAD, signature, stamp, now=now + 301)
    assert not validate_telnyx(public, PAYLOAD, signature, stamp, now=now - 301)  # from the future
    assert validate_telnyx(public, PAYLOAD, signature, stamp, now=now + 50, tolerance_s=60)
    assert not validate_telnyx(public, PAYLOAD, signature, stamp, now=now + 61, tolerance_s=60)
    assert not validate_telnyx(public, PAYLOAD + b" ", signature, stamp, now=now)
    # The timestamp is signed too.
    assert not validate_telnyx(public, PAYLOAD, signature, str(int(now) + 1), now=now)
    other = Ed25519PrivateKey.generate()
    assert not validate_telnyx(public, PAYLOAD, _telnyx_sign(other, stamp, PAYLOAD), stamp, now=now)
    assert not validate_telnyx(public, PAYLOAD, None, stamp, now=now)
    assert not validate_telnyx(public, PAYLOAD, signature, None, now=now)
    assert not validate_telnyx(public, PAYLOAD, "%%%", stamp, now=now)
    assert not validate_telnyx(public, PAYLOAD, signature, "yesterday", now=now)


def test_telnyx_public_key_forms(telnyx_keys: tuple[Ed25519PrivateKey, str]) -> None:
    private = telnyx_keys[0]
    pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    stamp = str(int(time.time()))
    assert validate_telnyx(pem, PAYLOAD, _telnyx_sign(private, stamp, PAYLOAD), stamp)
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(ValueError):
            telnyx_public_key(bad)
        assert not validate_telnyx(bad, PAYLOAD, _telnyx_sign(private, stamp, PAYLOAD), stamp)
