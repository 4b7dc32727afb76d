"""The ASGI app's own endpoints, in process: /readyz and its node id, and shutdown."""

from __future__ import annotations

import json

from starlette.requests import Request

from duplex_gateway.app import create_app
from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/readyz", "headers": [], "query_string": b""})


async def test_readyz_names_the_node_and_turns_503_once_shutdown_begins() -> None:
    engine = EchoEngine()
    gateway = create_app(load_settings(None, **{"server.node_id": "gw1"}), engine).state.gateway
    await engine.start()
    response = await gateway.readyz(_request())
    body = json.loads(response.body)
    assert response.status_code == 200 and body["status"] == "ready" and body["node"] == "gw1"
    await gateway.close_all()
    response = await gateway.readyz(_request())
    assert response.status_code == 503 and json.loads(response.body)["status"] == "shutting_down"
    await engine.shutdown()
