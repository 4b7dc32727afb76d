"""Where a request may carry its key, and the encoded subprotocol form."""

from __future__ import annotations

import base64

from duplex_gateway.auth.credentials import Credential, offered_subprotocols, presented


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_bearer_x_api_key_subprotocol_and_query_in_that_order() -> None:
    headers = {
        "authorization": "Bearer  sk-bearer ",
        "x-api-key": "sk-header",
        "sec-websocket-protocol": "realtime, openai-insecure-api-key.sk-proto",
    }
    assert presented(headers, {"api_key": "sk-query"}) == [
        Credential("sk-bearer", "bearer"),
        Credential("sk-header", "x-api-key"),
        Credential("sk-proto", "subprotocol"),
        Credential("sk-query", "query"),
    ]


def test_nothing_presented() -> None:
    assert presented({}, {}) == []
    # Other schemes, an empty bearer, a bare prefix and other subprotocols are not keys.
    headers = {
        "authorization": "Basic c2stYWxs",
        "sec-websocket-protocol": "realtime,openai-insecure-api-key.,openai-beta.realtime-v1",
    }
    assert presented(headers, {}) == []
    assert presented({"authorization": "Bearer   "}, {}) == []


def test_the_scheme_is_case_insensitive() -> None:
    assert presented({"authorization": "bearer sk-1"}, {}) == [Credential("sk-1", "bearer")]


def test_an_encoded_key_is_tried_as_sent_and_decoded() -> None:
    odd = "my secret/key=with spaces=="
    headers = {"sec-websocket-protocol": f"realtime, openai-insecure-api-key.b64.{_b64(odd)}"}
    assert [c.secret for c in presented(headers, {})] == [f"b64.{_b64(odd)}", odd]
    # The b64. form is read in a bearer token too (a page's fetch of a non-Latin-1 key).
    assert presented({"authorization": f"Bearer b64.{_b64('ключ')}"}, {})[-1].secret == "ключ"


def test_undecodable_encodings_are_only_tried_as_sent() -> None:
    for bad in ("b64.%%%", "b64.A", "b64." + base64.urlsafe_b64encode(b"\xff\xfe").decode()):
        headers = {"sec-websocket-protocol": f"openai-insecure-api-key.{bad}"}
        assert [c.secret for c in presented(headers, {})] == [bad]


def test_absurdly_long_values_are_not_keys() -> None:
    assert presented({"x-api-key": "k" * 10_000}, {}) == []


def test_offered_subprotocols() -> None:
    assert offered_subprotocols({"sec-websocket-protocol": " realtime ,, media"}) == ["realtime", "media"]
    assert offered_subprotocols({}) == []
