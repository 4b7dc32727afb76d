"""``WS /v1/live/sessions``: the Live API on a real app, in process, with the echo engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app

PATH = "/v1/live/sessions"
KEYS = [{"name": "player", "key": "sk-player", "scopes": ["realtime"]}]


def _client(**overrides: Any) -> TestClient:
    settings = load_settings(None, **{"server.web_demo": False, "engine.name": "echo", **overrides})
    return TestClient(create_app(settings, EchoEngine()))


@pytest.fixture
def client() -> Iterator[TestClient]:
    with _client() as test_client:
        yield test_client


def _until(ws: Any, kind: str, limit: int = 50) -> dict[str, Any]:
    for _ in range(limit):
        message = json.loads(ws.receive_text())
        if message["type"] == kind:
            return message
        assert message["type"] != "error", message
    raise AssertionError(f"no {kind} in {limit} messages")


def test_a_session_starts_and_closes_as_the_live_api_says(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        ws.send_text(
            json.dumps({"type": "session.start", "event_id": "s1", "session": {"model": "gpt-live-1"}})
        )
        started = _until(ws, "session.started")
        assert started["client_event_id"] == "s1"
        session = started["session"]
        assert session["model"] == "gpt-live-1" and session["status"] == "active"
        assert session["audio"]["format"] == {"type": "audio/pcm", "rate": 24_000}
        assert session["delegation"] == {"type": "client"}
        ws.send_text(json.dumps({"type": "session.start", "event_id": "s2", "session": {"model": "m"}}))
        error = json.loads(ws.receive_text())
        assert error["type"] == "error" and error["error"]["code"] == "session_already_started"
        assert error["error"]["client_event_id"] == "s2"
        ws.send_text(json.dumps({"type": "session.close", "event_id": "bye"}))
        closed = _until(ws, "session.closed")
        assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
    text = client.get("/metrics").text
    assert 'dialect="live"' in text


def test_nothing_before_session_start(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        ws.send_text(json.dumps({"type": "session.input_audio.append", "audio": "AAAA", "event_id": "a1"}))
        error = json.loads(ws.receive_text())
        assert error["error"]["code"] == "session_not_started" and error["error"]["client_event_id"] == "a1"


def test_the_live_route_takes_the_realtime_routes_keys() -> None:
    with _client(**{"auth.keys": KEYS}) as client:
        with pytest.raises(WebSocketDenialResponse) as refused, client.websocket_connect(PATH):
            pass
        assert refused.value.status_code == 401
        with client.websocket_connect(PATH, headers={"Authorization": "Bearer sk-player"}) as ws:
            ws.send_text(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
            assert _until(ws, "session.started")["session"]["id"].startswith("sess")
        # A browser's key rides in a subprotocol beside "realtime", which the gateway picks.
        protocols = ["realtime", "openai-insecure-api-key.sk-player"]
        with client.websocket_connect(PATH, subprotocols=protocols) as ws:
            assert ws.accepted_subprotocol == "realtime"


def test_a_live_session_is_recorded_for_replay_on_its_own_path(tmp_path: Any) -> None:
    overrides = {"recording.enabled": True, "recording.directory": str(tmp_path)}
    with _client(**overrides) as client, client.websocket_connect(PATH) as ws:
        ws.send_text(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        _until(ws, "session.started")
        ws.send_text(json.dumps({"type": "session.input_audio.append", "audio": "AAAAAA=="}))
        ws.send_text(json.dumps({"type": "session.close"}))
        _until(ws, "session.closed")
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    lines = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    header = lines[0]
    assert header["dialect"] == "live" and header["endpoint"]["path"] == PATH
    appends = [line for line in lines if line.get("frame", {}).get("type") == "session.input_audio.append"]
    assert appends and "$audio" in appends[0]["frame"]["audio"]
