"""The ASGI app's own endpoints, in process: /readyz and its node id, and shutdown."""

from __future__ import annotations

import json

from starlette.requests import Request

from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app


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


async def test_metrics_are_served_in_prometheus_text_format_from_the_apps_own_registry() -> None:
    engine = EchoEngine()
    first = create_app(load_settings(None), engine).state.gateway
    second = create_app(load_settings(None), engine).state.gateway  # a second app in one process: no clash
    first.metrics.auth_refused("invalid_key")
    response = await first.metrics_endpoint(_request())
    assert response.media_type.startswith("text/plain; version=0.0.4")
    text = bytes(response.body).decode()
    assert 'duplex_gateway_auth_refusals_total{reason="invalid_key"} 1.0' in text
    assert "duplex_gateway_engine_sessions 0.0" in text
    assert "invalid_key" not in bytes((await second.metrics_endpoint(_request())).body).decode()


async def test_drain_stops_admitting_at_once_and_returns_when_nothing_is_live() -> None:
    engine = EchoEngine()
    gateway = create_app(load_settings(None), engine).state.gateway
    await engine.start()
    gateway.stop_admitting()  # what the signal handler does
    assert gateway.registry.draining and not gateway.registry.try_admit("sess_x")
    assert (await gateway.readyz(_request())).status_code == 503
    await gateway.drain(30.0)  # nothing to wait for
    assert gateway.metrics.registry.get_sample_value("duplex_gateway_draining") == 1
    await engine.shutdown()
