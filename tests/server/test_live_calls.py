"""``POST /v1/live/sessions``: what it refuses, and how, on a real app in process with the echo engine.

The offers it answers are answered end to end by ``tests/e2e/test_live_webrtc.py``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app

PATH = "/v1/live/sessions"
OFFER = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
KEYS = [
    {"name": "server", "key": "sk-server", "scopes": ["realtime", "client_secrets"]},
    {"name": "operator", "key": "sk-operator", "scopes": ["telephony"]},
]
PAGE = "https://app.example.com"


def _client(**overrides: Any) -> TestClient:
    settings = load_settings(None, **{"server.web_demo": False, "engine.name": "echo", **overrides})
    return TestClient(create_app(settings, EchoEngine()))


@pytest.fixture
def client() -> Iterator[TestClient]:
    with _client() as test_client:
        yield test_client


def _body(session: object = None, **transport: object) -> dict[str, object]:
    return {
        "session": {"model": "gpt-live-1"} if session is None else session,
        "transport": {"type": "webrtc", "sdp": OFFER, **transport},
    }


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    return error


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"{not json", "invalid_json", None),
        (b"[]", "invalid_type", ""),
        (json.dumps({"session": {"model": "m"}}).encode(), "missing_required_parameter", "transport"),
        (json.dumps({**_body(), "model": "m"}).encode(), "unknown_parameter", "model"),
        (json.dumps(_body(type="sip")).encode(), "invalid_value", "transport.type"),
        (json.dumps(_body(sdp="hello")).encode(), "invalid_value", "transport.sdp"),
        (json.dumps(_body(extra=1)).encode(), "unknown_parameter", "transport.extra"),
        (json.dumps({"transport": _body()["transport"]}).encode(), "missing_required_parameter", "session"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "no-transport",
        "unknown-field",
        "not-webrtc",
        "not-sdp",
        "extra",
        "no-session",
    ],
)
def test_a_bad_request_is_refused_with_400(
    client: TestClient, body: bytes, code: str, param: str | None
) -> None:
    error = _error(client.post(PATH, content=body, headers={"Content-Type": "application/json"}), 400)
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert client.get("/readyz").json()["sessions"] == 0


@pytest.mark.parametrize(
    "session",
    [
        {},
        {"model": "m", "voice": "marin"},
        {"model": "m", "delegation": {"type": "decisions", "decisions": {}}},
        {"model": "m", "input": [{"role": "robot", "content": [{"type": "input_text", "text": "hi"}]}]},
    ],
    ids=["no-model", "unknown-field", "decisions", "bad-role"],
)
def test_a_bad_session_gets_the_error_session_start_gets(client: TestClient, session: dict[str, Any]) -> None:
    error = _error(client.post(PATH, json=_body(session)), 400)
    with client.websocket_connect(PATH) as ws:
        ws.send_text(json.dumps({"type": "session.start", "session": session}))
        over_the_websocket = json.loads(ws.receive_text())["error"]
    assert error == {key: over_the_websocket.get(key) for key in ("type", "code", "message", "param")}


def test_a_format_is_refused_since_the_tracks_negotiate_it(client: TestClient) -> None:
    session = {"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 24_000}}}
    error = _error(client.post(PATH, json=_body(session)), 400)
    assert (error["code"], error["param"]) == ("unknown_parameter", "session.audio.format")


def test_a_body_over_the_limit_is_refused_with_413() -> None:
    with _client(**{"limits.max_message_bytes": 1024}) as client:
        session = {"model": "m", "instructions": "x" * (100 << 10)}
        error = _error(client.post(PATH, json=_body(session)), 413)
        assert error["code"] == "message_too_large"


def test_without_the_webrtc_extra_the_endpoint_says_so_with_501(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "aiortc", None)  # as where it is not installed: importing it fails
    error = _error(client.post(PATH, json=_body()), 501)
    assert error["code"] == "webrtc_unavailable" and "webrtc" in error["message"]


def test_a_gateway_at_its_limit_refuses_the_offer_with_429() -> None:
    with _client(**{"limits.max_sessions": 1}) as client, client.websocket_connect(PATH) as ws:
        ws.send_text(json.dumps({"type": "session.start", "session": {"model": "m"}}))
        assert json.loads(ws.receive_text())["type"] == "session.started"
        error = client.post(PATH, json=_body()).json()["error"]
        assert error["code"] == "session_limit"


def test_it_takes_the_live_websockets_credentials_and_hanging_up_the_telephony_scope() -> None:
    settings = {"auth.keys": KEYS, "auth.token_secret": "a-token-secret-of-at-least-32-chars!"}
    with _client(**settings) as client:
        refused = client.post(PATH, json=_body())
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        bad = {"Authorization": "Bearer sk-server", "Content-Type": "application/json"}
        assert _error(client.post(PATH, content=b"{", headers=bad), 400)["code"] == "invalid_json"
        # A browser's client secret is let in too (and then the body is read).
        minted = client.post("/v1/realtime/client_secrets", headers={"Authorization": "Bearer sk-server"})
        secret = {"Authorization": f"Bearer {minted.json()['value']}", "Content-Type": "application/json"}
        assert _error(client.post(PATH, content=b"{", headers=secret), 400)["code"] == "invalid_json"
        # OpenAI's hang-up, by the session's id: for a key that may hang calls up.
        hangup = f"{PATH}/sess_1/hangup"
        assert client.post(hangup, headers={"Authorization": "Bearer sk-server"}).status_code == 403
        missing = client.post(hangup, headers={"Authorization": "Bearer sk-operator"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_page_on_another_origin_may_post_and_read_the_answer() -> None:
    with _client(**{"auth.allowed_origins": [PAGE]}) as client:
        ask = {
            "origin": PAGE,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type",
        }
        preflight = client.options(PATH, headers=ask)
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == PAGE
        answer = client.post(PATH, json=_body(sdp="hello"), headers={"origin": PAGE})
        assert answer.status_code == 400 and answer.headers["access-control-allow-origin"] == PAGE
