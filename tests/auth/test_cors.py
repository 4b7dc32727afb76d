"""CORS for a page on another origin posting a WebRTC offer: the preflight, and the headers the answer carries."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from duplex_gateway.auth.cors import cors_headers, is_cors_path, preflight
from duplex_gateway.auth.policy import OriginPolicy
from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app

PAGE = "https://app.example.com"
ASK = {
    "origin": PAGE,
    "host": "gateway.example.com",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization,content-type",
}


def test_only_the_offers_endpoints_answer_pages_on_other_origins() -> None:
    assert is_cors_path("/v1/realtime/calls") and is_cors_path("/v1/realtime/calls/rtc_1/hangup")
    assert is_cors_path("/v1/live/sessions") and is_cors_path("/v1/live/sessions/sess_1/hangup")
    assert not is_cors_path("/v1/realtime") and not is_cors_path("/v1/realtime/client_secrets")


def test_a_preflight_from_an_allowed_origin_is_answered_with_what_the_page_may_send() -> None:
    answer = preflight(ASK, OriginPolicy(["https://*.example.com"]))
    headers = dict(answer.headers)
    assert answer.status == 204
    assert headers[b"access-control-allow-origin"] == PAGE.encode()
    assert headers[b"access-control-allow-methods"] == b"POST, OPTIONS"
    assert headers[b"access-control-allow-headers"] == b"authorization, content-type"


@pytest.mark.parametrize(
    "change",
    [
        {"origin": "https://evil.test"},
        {"access-control-request-method": "DELETE"},
        {"access-control-request-headers": "authorization,x-something"},
    ],
)
def test_a_preflight_the_endpoint_would_refuse_gets_no_cors_headers(change: dict[str, str]) -> None:
    answer = preflight({**ASK, **change}, OriginPolicy(["https://*.example.com"]))
    assert answer.status == 403
    assert not any(name.startswith(b"access-control-") for name, _ in answer.headers)


def test_any_origin_is_allowed_when_none_is_configured() -> None:
    assert dict(cors_headers("https://anywhere.test", None, OriginPolicy()))[
        b"access-control-expose-headers"
    ] == (b"Location")
    assert cors_headers(None, None, OriginPolicy()) == []


@pytest.fixture
def client() -> Any:
    settings = load_settings(
        None,
        **{
            "server.web_demo": False,
            "engine.name": "echo",
            "auth.api_keys": ["sk-test"],
            "auth.allowed_origins": [PAGE],
        },
    )
    with TestClient(create_app(settings, EchoEngine())) as test_client:
        yield test_client


def test_the_gateway_answers_a_preflight_without_credentials_and_refusals_are_readable(
    client: TestClient,
) -> None:
    answer = client.options("/v1/realtime/calls", headers=ASK)
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == PAGE
    # The page can read why it was refused (no key), and the refusal is the auth layer's.
    refused = client.post(
        "/v1/realtime/calls", content=b"v=0\r\n", headers={"origin": PAGE, "content-type": "application/sdp"}
    )
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == PAGE
    other = client.post(
        "/v1/realtime/calls",
        content=b"v=0\r\n",
        headers={"origin": "https://evil.test", "authorization": "Bearer sk-test"},
    )
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_a_bad_offer_with_a_key_is_the_endpoints_400(client: TestClient) -> None:
    answer = client.post(
        "/v1/realtime/calls",
        content=b"v=0\r\nbroken\r\n",
        headers={"origin": PAGE, "authorization": "Bearer sk-test", "content-type": "application/sdp"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_offer"
    assert answer.headers["access-control-allow-origin"] == PAGE
