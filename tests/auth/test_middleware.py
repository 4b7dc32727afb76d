"""The auth layer in front of the app, in process: refusals before the upgrade, client secrets, the check."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from duplex_gateway.auth.gate import Gate
from duplex_gateway.auth.keys import KeyStore
from duplex_gateway.auth.middleware import AuthMiddleware
from duplex_gateway.auth.principal import Principal
from duplex_gateway.auth.tokens import TokenSigner
from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app
from tests.typed import narrow

KEYS = [
    {
        "name": "server",
        "key": "sk-server",
        "scopes": ["realtime", "duplex", "client_secrets"],
        "max_sessions": 1,
    },
    {"name": "minter", "key": "sk-minter", "scopes": ["client_secrets"]},
    {"name": "player", "key": "sk-player", "scopes": ["realtime"]},
]
SECRET = "a-token-secret-of-at-least-32-chars!"


@pytest.fixture
def client() -> Any:
    settings = load_settings(
        None,
        **{"server.web_demo": False, "engine.name": "echo", "auth.keys": KEYS, "auth.token_secret": SECRET},
    )
    with TestClient(create_app(settings, EchoEngine())) as test_client:
        yield test_client


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _refused(client: TestClient, path: str = "/v1/realtime", **kwargs: Any) -> WebSocketDenialResponse:
    with pytest.raises(WebSocketDenialResponse) as info, client.websocket_connect(path, **kwargs):
        pass
    return info.value


def test_a_refused_handshake_gets_a_status_and_a_json_error(client: TestClient) -> None:
    gateway = client.app.state.gateway  # type: ignore[attr-defined]
    response = _refused(client)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")
    response = _refused(client, headers=_bearer("sk-wrong"))
    assert response.status_code == 401 and "not valid" in response.json()["error"]["message"]
    response = _refused(client, "/v1/realtime?call_id=CA1", headers=_bearer("sk-server"))
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert gateway.registry.count == 0 and gateway.engine.active_sessions == 0
    # Counted by reason in the gateway's metrics.
    rendered = gateway.metrics.render()
    metrics = rendered.decode() if isinstance(rendered, bytes) else str(rendered)
    for reason in ("missing_key", "invalid_key", "scope"):
        assert f'reason="{reason}"' in metrics, metrics


def test_handlers_read_the_principal(client: TestClient) -> None:
    with client.websocket_connect("/v1/realtime", headers=_bearer("sk-server")) as ws:
        assert ws.receive_json()["type"] == "session.created"
        assert narrow(ws.scope["auth"], Principal).name == "server"
        # The key's cap: one session; a second is refused before the upgrade.
        response = _refused(client, subprotocols=["realtime", "openai-insecure-api-key.sk-server"])
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        assert response.json()["error"]["code"] == "session_limit"
    # Released when the socket closed.
    with client.websocket_connect("/v1/realtime", headers=_bearer("sk-server")) as ws:
        assert ws.receive_json()["type"] == "session.created"


def test_mint_a_client_secret_and_open_a_session_with_it(client: TestClient) -> None:
    body = {
        "expires_after": {"anchor": "created_at", "seconds": 120},
        "session": {"type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "alloy"}}},
    }
    response = client.post("/v1/realtime/client_secrets", headers=_bearer("sk-server"), json=body)
    assert response.status_code == 200, response.text
    minted = response.json()
    assert set(minted) == {"value", "expires_at", "session"} and minted["value"].startswith("ek_")
    assert (
        minted["session"]["instructions"] == "Be brief."
        and minted["session"]["audio"]["output"]["voice"] == "alloy"
    )
    assert minted["session"]["type"] == "realtime" and "id" not in minted["session"]
    token = minted["value"]
    with client.websocket_connect(
        "/v1/realtime", subprotocols=["realtime", f"openai-insecure-api-key.{token}"]
    ) as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created"
        # The session config the server minted it with is this session's start.
        assert created["session"]["instructions"] == "Be brief."
        assert created["session"]["audio"]["output"]["voice"] == "alloy"
    # The check endpoint tells a page who it is.
    check = client.get("/v1/auth/check", headers=_bearer(token)).json()
    assert check == {
        "kind": "client_secret",
        "key": "server",
        "scopes": ["duplex", "realtime"],
        "expires_at": minted["expires_at"],
        "max_sessions": 1,
        "open_sessions": 0,
    }
    # A client secret opens what its key opens, and no more; it mints nothing.
    assert client.post("/v1/realtime/client_secrets", headers=_bearer(token)).status_code == 403
    assert _refused(client, "/v1/realtime?call_id=CA1", headers=_bearer(token)).status_code == 403


def test_minting_without_a_body_uses_the_defaults(client: TestClient) -> None:
    import time

    response = client.post("/v1/realtime/client_secrets", headers=_bearer("sk-server"))
    assert response.status_code == 200
    assert abs(response.json()["expires_at"] - (time.time() + 600)) < 5


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"expires_after": {"anchor": "created_at", "seconds": 9}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": "60"}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "last_used", "seconds": 60}}, "expires_after.anchor"),
        ({"expires_after": 60}, "expires_after"),
        ({"session": "realtime"}, "session"),
        ({"session": {"type": "video"}}, "session.type"),
        (
            {"session": {"audio": {"input": {"format": {"type": "audio/flac"}}}}},
            "session.audio.input.format.type",
        ),
    ],
)
def test_bad_mint_requests(client: TestClient, body: dict[str, Any], param: str) -> None:
    response = client.post("/v1/realtime/client_secrets", headers=_bearer("sk-server"), json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_bad_mint_bodies(client: TestClient) -> None:
    headers = {**_bearer("sk-server"), "Content-Type": "application/json"}
    assert client.post("/v1/realtime/client_secrets", headers=headers, content=b"{").json()["error"][
        "code"
    ] == ("invalid_json")
    assert client.post("/v1/realtime/client_secrets", headers=headers, content=b"[]").status_code == 400
    assert (
        client.post("/v1/realtime/client_secrets", headers=headers, content=b" " * (65 << 10)).status_code
        == 413
    )
    too_big = {"session": {"instructions": __import__("secrets").token_hex(5000)}}
    response = client.post("/v1/realtime/client_secrets", headers=headers, json=too_big)
    assert response.status_code == 400 and "session.update" in response.json()["error"]["message"]


def test_who_may_mint(client: TestClient) -> None:
    assert client.post("/v1/realtime/client_secrets").status_code == 401
    assert client.post("/v1/realtime/client_secrets", headers=_bearer("sk-player")).status_code == 403
    # A minting-only key has no session scope to hand on.
    response = client.post("/v1/realtime/client_secrets", headers=_bearer("sk-minter"))
    assert response.status_code == 403 and "opens no sessions" in response.json()["error"]["message"]


def test_the_check_endpoint_answers_as_the_handshake_would(client: TestClient) -> None:
    assert client.get("/v1/auth/check").status_code == 401
    assert client.get("/v1/auth/check", headers=_bearer("sk-player")).json()["key"] == "player"
    response = client.get("/v1/auth/check?scope=duplex", headers=_bearer("sk-player"))
    assert response.status_code == 403 and "duplex" in response.json()["error"]["message"]
    with client.websocket_connect("/v1/realtime", headers=_bearer("sk-server")) as ws:
        ws.receive_json()
        response = client.get("/v1/auth/check", headers=_bearer("sk-server"))
        assert response.status_code == 503 and response.json()["error"]["code"] == "session_limit"


def test_open_gateway_mints_for_anyone_and_applies_the_session() -> None:
    settings = load_settings(None, **{"server.web_demo": False, "engine.name": "echo"})
    with TestClient(create_app(settings, EchoEngine())) as client:
        minted = client.post(
            "/v1/realtime/client_secrets", json={"session": {"instructions": "Open."}}
        ).json()
        with client.websocket_connect("/v1/realtime", headers=_bearer(minted["value"])) as ws:
            assert ws.receive_json()["session"]["instructions"] == "Open."
        with client.websocket_connect("/v1/realtime", headers=_bearer("anything")) as ws:
            assert ws.receive_json()["session"]["instructions"] == ""


def test_origin_allowlist() -> None:
    settings = load_settings(
        None,
        **{
            "server.web_demo": False,
            "engine.name": "echo",
            "auth.allowed_origins": ["https://app.example.com"],
        },
    )
    with TestClient(create_app(settings, EchoEngine()), base_url="http://gw.test") as client:
        response = _refused(client, headers={"Origin": "https://evil.example"})
        assert response.status_code == 403 and response.json()["error"]["code"] == "origin_not_allowed"
        assert client.get("/healthz", headers={"Origin": "https://evil.example"}).status_code == 403
        with client.websocket_connect("/v1/realtime", headers={"Origin": "https://app.example.com"}) as ws:
            assert ws.receive_json()["type"] == "session.created"
        assert client.get("/healthz", headers={"Origin": "http://gw.test"}).status_code == 200


async def test_a_server_without_the_denial_extension_gets_a_close_before_accept() -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    gate = Gate(keys=KeyStore.from_plaintext(["sk-1"]), signer=TokenSigner(b"k" * 32), engine="echo")
    middleware = AuthMiddleware(app, gate)
    sent: list[dict[str, Any]] = []
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    inbox.put_nowait({"type": "websocket.connect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "path": "/v1/realtime",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "extensions": {},
    }
    await middleware(scope, inbox.get, send)
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": "unauthorized"}] and reached == []
    # With the key, the app runs and finds the principal.
    inbox.put_nowait({"type": "websocket.connect"})
    scope = {**scope, "headers": [(b"authorization", b"Bearer sk-1")]}
    await middleware(scope, inbox.get, send)
    assert reached == ["/v1/realtime"] and narrow(scope["auth"], Principal).name.startswith("key-")


async def test_lifespan_passes_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    gate = Gate(keys=KeyStore.from_plaintext(["sk-1"]), signer=TokenSigner(b"k" * 32), engine="echo")
    await AuthMiddleware(app, gate)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"] and json.dumps(seen)


def test_engine_admin_routes_ask_for_the_admin_scope() -> None:
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    class AdminEcho(EchoEngine):
        def admin_routes(self, api_keys: tuple[str, ...]) -> list[Route]:
            assert api_keys == ()  # the gateway's auth layer guards them, not the engine

            async def ping(request: Request) -> Response:
                return JSONResponse({"caller": request.auth.name})

            return [Route("/admin/ping", ping)]

    keys = [
        {"name": "ops", "key": "sk-ops", "scopes": ["admin"]},
        {"name": "app", "key": "sk-app", "scopes": ["realtime"]},
    ]
    settings = load_settings(None, **{"server.web_demo": False, "engine.name": "echo", "auth.keys": keys})
    with TestClient(create_app(settings, AdminEcho())) as client:
        assert client.get("/admin/ping").status_code == 401
        assert client.get("/admin/ping", headers=_bearer("sk-app")).status_code == 403
        response = client.get("/admin/ping", headers={"X-API-Key": "sk-ops"})
        assert response.status_code == 200 and response.json() == {"caller": "ops"}


def test_a_signed_webhook_body_is_read_once_for_the_check_and_again_by_the_handler() -> None:
    from duplex_gateway.telephony.carriers.twilio import twilio_signature
    from duplex_gateway.telephony.webhooks import MAX_WEBHOOK_BODY_BYTES

    token = "twilio-token-for-the-auth-layer"
    settings = load_settings(
        None,
        **{
            "server.web_demo": False,
            "engine.name": "echo",
            "telephony.twilio.auth_token": token,
            "telephony.public_url": "https://gw.example.com",
            "auth.api_keys": ["sk-1"],
        },
    )
    form = {"From": "+15550100", "To": "+15550199"}
    signature = twilio_signature(token, "https://gw.example.com/telephony/twilio/voice", form)
    with TestClient(create_app(settings, EchoEngine())) as client:
        # No API key: a carrier proves itself by its signature.
        answer = client.post("/telephony/twilio/voice", data=form, headers={"X-Twilio-Signature": signature})
        assert answer.status_code == 200 and 'value="+15550100"' in answer.text
        refused = client.post(
            "/telephony/twilio/voice", data=form, headers={"X-Twilio-Signature": "bm9wZQ=="}
        )
        assert (refused.status_code, refused.text) == (403, "invalid signature")
        huge = b"a=" + b"x" * MAX_WEBHOOK_BODY_BYTES
        headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature}
        assert client.post("/telephony/twilio/voice", content=huge, headers=headers).status_code == 413
