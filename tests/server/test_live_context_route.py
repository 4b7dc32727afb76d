"""``WS /v1/live/sessions`` with the echo engine: context appends and mute, end to end."""

from __future__ import annotations

import base64
import json
from typing import Any

from starlette.testclient import TestClient

from duplex_gateway.config import load_settings
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.server.app import create_app
from tests.server.test_live_route import PATH


def _client() -> TestClient:
    settings = load_settings(None, **{"server.web_demo": False, "engine.name": "echo"})
    # The echo engine's reply starts late, so the second commentary arrives while it is under way.
    return TestClient(create_app(settings, EchoEngine(start_delay_ms=300)))


def _events(ws: Any, until: str, limit: int = 200) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for _ in range(limit):
        seen.append(json.loads(ws.receive_text()))
        if seen[-1]["type"] == until:
            return seen
    raise AssertionError(f"no {until} in {[m['type'] for m in seen]}")


def test_context_appends_and_mute_are_acknowledged_and_commentary_during_a_reply_is_no_error() -> None:
    silence = base64.b64encode(b"\x00\x00" * 2400).decode("ascii")  # 100 ms at 24 kHz
    with _client() as client, client.websocket_connect(PATH) as ws:
        ws.send_text(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        _events(ws, "session.started")
        ws.send_text(json.dumps({"type": "session.input_audio.append", "audio": silence}))
        for n, channel in enumerate(("instructions", "thinking", "commentary", "commentary"), 1):
            append = {"type": f"session.{channel}.append", "event_id": f"c{n}", "delegation_id": None}
            ws.send_text(json.dumps({**append, "content": f"Note {n}."}))
        ws.send_text(json.dumps({"type": "session.input_audio.mute", "event_id": "m1"}))
        ws.send_text(json.dumps({"type": "session.input_audio.append", "audio": silence}))
        ws.send_text(json.dumps({"type": "session.input_audio.unmute", "event_id": "m2"}))
        seen = _events(ws, "session.input_audio.unmuted")
        assert not [m for m in seen if m["type"] == "error"], seen
        acks = [(m["type"], m.get("client_event_id")) for m in seen if m["type"].endswith("appended")]
        assert acks == [
            ("session.instructions.appended", "c1"),
            ("session.thinking.appended", "c2"),
            ("session.commentary.appended", "c3"),
            # The first commentary had the model speak; the second joins the context, no error.
            ("session.commentary.appended", "c4"),
        ]
        assert [m["type"] for m in seen if "muted" in m["type"]] == [
            "session.input_audio.muted",
            "session.input_audio.unmuted",
        ]
        ws.send_text(json.dumps({"type": "session.close"}))
        _events(ws, "session.closed")
