"""Authentication and limits through a real uvicorn server: refusals are HTTP answers before the upgrade.

A refused handshake is read the way any client sees it: ``websockets`` raises ``InvalidStatus``
with the server's response (status, headers, JSON body). Client secrets are minted over HTTP with a
real key and used the way OpenAI's browser flow uses them, as the subprotocol
``openai-insecure-api-key.<ek_...>``.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from duplex_gateway.auth.principal import Scope
from duplex_gateway.auth.tokens import TokenSigner
from tests.e2e.helpers import Gateway, GatewayFactory, recv_event, ws_connect

pytestmark = pytest.mark.e2e

SECRET = "e2e-token-secret-0123456789abcdef"
KEYS = [
    {"name": "server", "key": "sk-server", "scopes": ["realtime", "client_secrets"], "max_sessions": 1},
    {"name": "ops", "key": "sk-ops", "scopes": ["admin"]},
    {"name": "gpu-only", "key": "sk-gpu", "engines": ["remote"]},
]


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "auth": {"keys": KEYS, "token_secret": SECRET, "allowed_origins": ["https://app.example.com"]},
        },
        name="auth",
    )


def _post(gw: Gateway, path: str, body: dict[str, Any] | None, headers: dict[str, str]) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(
        gw.base_url + path, data=data, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def _refusal(gw: Gateway, path: str = "/v1/realtime", **connect: Any) -> tuple[int, Any, Any]:
    """The status, headers (case-insensitive) and JSON body of a refused handshake."""
    with pytest.raises(InvalidStatus) as info:
        async with ws_connect(gw, path, **connect):
            pass
    response = info.value.response
    return response.status_code, response.headers, json.loads(response.body)


def _protocol(key: str) -> list[str]:
    return ["realtime", f"openai-insecure-api-key.{key}"]


async def test_refused_handshakes_get_their_http_status(gateway: Gateway) -> None:
    status, headers, body = await _refusal(gateway)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert headers["Content-Type"] == "application/json" and headers["WWW-Authenticate"].startswith("Bearer")
    status, _, body = await _refusal(gateway, additional_headers={"Authorization": "Bearer sk-wrong"})
    assert status == 401 and "sk-wrong" not in json.dumps(body)
    status, _, body = await _refusal(gateway, subprotocols=_protocol("sk-wrong"))
    assert status == 401
    # A key not allowed here: 403.
    status, _, body = await _refusal(gateway, additional_headers={"Authorization": "Bearer sk-ops"})
    assert status == 403 and body["error"]["code"] == "forbidden" and "realtime" in body["error"]["message"]
    status, _, body = await _refusal(gateway, "/v1/duplex", subprotocols=_protocol("sk-server"))
    assert status == 403 and "duplex" in body["error"]["message"]
    status, _, body = await _refusal(gateway, additional_headers={"Authorization": "Bearer sk-gpu"})
    assert status == 403 and "remote" not in body["error"]["message"] and "echo" in body["error"]["message"]
    # A browser on an origin not listed: 403 before its key is even looked at.
    status, _, body = await _refusal(
        gateway,
        subprotocols=_protocol("sk-server"),
        origin="https://evil.example",  # type: ignore[arg-type]
    )
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    async with ws_connect(
        gateway, subprotocols=_protocol("sk-server"), origin="https://app.example.com"
    ) as ws:
        assert (await recv_event(ws))["type"] == "session.created"
    await gateway.wait_sessions(0)
    # Nothing was spent on the refused ones.
    ready = await asyncio.to_thread(gateway.readyz)
    assert ready["sessions"] == 0 and ready["engine_sessions"] == 0
    # What the gateway logged names the key, never the key itself.
    log = gateway.stderr()
    assert "sk-wrong" not in log and "sk-server" not in log and "refused WebSocket /v1/realtime" in log


async def test_a_client_secret_minted_with_a_real_key_opens_a_session(gateway: Gateway) -> None:
    session = {
        "type": "realtime",
        "instructions": "Answer in one sentence.",
        "audio": {"output": {"voice": "ash"}},
    }
    status, minted = await asyncio.to_thread(
        _post,
        gateway,
        "/v1/realtime/client_secrets",
        {"expires_after": {"anchor": "created_at", "seconds": 300}, "session": session},
        {"Authorization": "Bearer sk-server"},
    )
    assert status == 200, minted
    assert minted["value"].startswith("ek_") and 290 <= minted["expires_at"] - time.time() <= 300
    assert minted["session"]["instructions"] == "Answer in one sentence."
    # What a browser written for OpenAI's flow does: the secret as the insecure-key subprotocol.
    async with ws_connect(gateway, subprotocols=_protocol(minted["value"])) as ws:
        assert ws.subprotocol == "realtime"
        created = await recv_event(ws)
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "Answer in one sentence."
        assert created["session"]["audio"]["output"]["voice"] == "ash"
    await gateway.wait_sessions(0)
    # Minting takes a real key with the client_secrets scope.
    assert (await asyncio.to_thread(_post, gateway, "/v1/realtime/client_secrets", None, {}))[0] == 401
    denied = await asyncio.to_thread(
        _post, gateway, "/v1/realtime/client_secrets", None, {"Authorization": f"Bearer {minted['value']}"}
    )
    assert denied[0] == 403
    denied = await asyncio.to_thread(
        _post, gateway, "/v1/realtime/client_secrets", None, {"Authorization": "Bearer sk-ops"}
    )
    assert denied[0] == 403


async def test_expired_and_altered_client_secrets_are_refused(gateway: Gateway) -> None:
    signer = TokenSigner(SECRET.encode())
    expired, _ = signer.mint(key_name="server", scopes=[Scope.REALTIME], now=time.time() - 700, ttl_s=600)
    status, _, body = await _refusal(gateway, subprotocols=_protocol(expired))
    assert status == 401 and "expired" in body["error"]["message"]
    live, _ = signer.mint(key_name="server", scopes=[Scope.REALTIME], now=time.time(), ttl_s=600)
    altered = live[:-4] + ("AAAA" if not live.endswith("AAAA") else "BBBB")
    status, _, _ = await _refusal(gateway, subprotocols=_protocol(altered))
    assert status == 401
    other, _ = TokenSigner(b"another-gateway-secret-0123456789").mint(
        key_name="server", scopes=[Scope.REALTIME], now=time.time(), ttl_s=600
    )
    assert (await _refusal(gateway, additional_headers={"Authorization": f"Bearer {other}"}))[0] == 401
    async with ws_connect(gateway, subprotocols=_protocol(live)) as ws:
        assert (await recv_event(ws))["type"] == "session.created"
    await gateway.wait_sessions(0)


async def test_a_key_at_its_session_cap_gets_503(gateway: Gateway) -> None:
    async with ws_connect(gateway, additional_headers={"Authorization": "Bearer sk-server"}) as held:
        assert (await recv_event(held))["type"] == "session.created"
        status, headers, body = await _refusal(gateway, subprotocols=_protocol("sk-server"))
        assert status == 503 and body["error"]["code"] == "session_limit"
        assert int(headers["Retry-After"]) >= 1 and "'server'" in body["error"]["message"]
        # Its client secrets count against it too.
        signer = TokenSigner(SECRET.encode())
        secret, _ = signer.mint(key_name="server", scopes=[Scope.REALTIME], now=time.time(), ttl_s=60)
        assert (await _refusal(gateway, subprotocols=_protocol(secret)))[0] == 503
        # A page can ask why (a browser sees nothing of a refused handshake).
        status, check = await asyncio.to_thread(
            _get, gateway, "/v1/auth/check", {"Authorization": "Bearer sk-server"}
        )
        assert status == 503 and check["error"]["code"] == "session_limit"
    await gateway.wait_sessions(0)
    async with ws_connect(gateway, additional_headers={"Authorization": "Bearer sk-server"}) as ws:
        assert (await recv_event(ws))["type"] == "session.created"
    await gateway.wait_sessions(0)
    # The slot is the key's again once the server has let go of the socket.
    deadline = time.monotonic() + 5
    while True:
        status, check = await asyncio.to_thread(
            _get, gateway, "/v1/auth/check", {"Authorization": "Bearer sk-server"}
        )
        if status == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert status == 200 and check["key"] == "server" and check["open_sessions"] == 0


def _get(gw: Gateway, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(gw.base_url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def test_per_address_rate_and_session_cap(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "limits": {"connections_per_minute_per_ip": 4, "max_sessions_per_ip": 1},
        },
        name="limits",
    )
    async with ws_connect(gw) as held:  # 1st connection of the minute
        assert (await recv_event(held))["type"] == "session.created"
        status, headers, body = await _refusal(gw)  # 2nd: over the address's session cap
        assert status == 503 and body["error"]["code"] == "session_limit" and "Retry-After" in headers
    await gw.wait_sessions(0)
    for _ in range(2):  # 3rd, 4th
        async with ws_connect(gw) as ws:
            assert (await recv_event(ws))["type"] == "session.created"
        await gw.wait_sessions(0)
    status, headers, body = await _refusal(gw)  # 5th: over the rate
    assert status == 429 and body["error"]["code"] == "rate_limited"
    assert body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(headers["Retry-After"]) <= 15  # one connection every 15 s
    # Plain HTTP is not counted.
    assert (await asyncio.to_thread(gw.get, "/healthz"))[0] == 200
