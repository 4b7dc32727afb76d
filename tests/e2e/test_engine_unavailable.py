"""A gateway whose engine cannot open sessions: ``/readyz`` says so, and callers are told to retry.

The engine is ``remote`` with its only backend on a port nobody listens on: the
process is up (``/healthz`` 200) but no session can be placed, so ``/readyz``
answers 503 and every WebSocket that needs an engine session gets
``engine_unavailable`` and close 1013 (try again later), on both handshakes.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import EventLog, Gateway, GatewayFactory, free_port, send_json, wait_closed, ws_connect

pytestmark = pytest.mark.e2e


@pytest.fixture
def no_backend(gateway_factory: GatewayFactory) -> Gateway:
    dead = f"ws://127.0.0.1:{free_port()}"
    return gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {
                "name": "remote",
                "remote": {
                    "backends": [{"url": dead, "max_sessions": 4}],
                    "health_interval_s": 0.2,
                    "health_timeout_s": 0.5,
                    "connect_timeout_s": 1,
                },
            },
        },
        name="no-backend",
        ready=False,
    )


async def _refused(ws: object) -> tuple[dict[str, object], int | None]:
    log = EventLog(ws.recv)  # type: ignore[attr-defined]
    try:
        _, error = await log.wait_for("error", 10)
        code = await wait_closed(ws)
        assert log.types() == ["error"], log.types()
    finally:
        await log.aclose()
    return error["error"], code


async def test_readyz_is_503_and_sessions_close_1013_engine_unavailable(no_backend: Gateway) -> None:
    status, body = no_backend.get("/healthz")
    assert (status, body) == (200, {"status": "ok"})
    status, body = no_backend.get("/readyz")
    assert status == 503, (status, body)
    assert body["status"] == "not_ready" and body["engine"] == "remote" and body["sessions"] == 0, body

    # /v1/realtime opens its engine session on connect.
    async with ws_connect(no_backend) as ws:
        error, code = await _refused(ws)
    assert error["code"] == "engine_unavailable", error
    assert code == 1013

    # The duplex handshake opens it with the first session.update.
    async with ws_connect(no_backend, "/v1/duplex") as ws:
        await send_json(ws, {"type": "session.update", "session": {"type": "realtime"}, "event_id": "open"})
        error, code = await _refused(ws)
    assert error["code"] == "engine_unavailable", error
    assert code == 1013

    # Refused sessions hold no slot.
    status, body = no_backend.get("/readyz")
    assert status == 503 and body["sessions"] == 0, (status, body)
