"""Function calling end to end: a Realtime client, a real gateway, vLLM-Omni's real code.

Two gateways, one per engine that talks to vLLM-Omni's duplex sessions:

- ``vllm-omni``: the gateway runs a ``DuplexOmni`` in process
  (``--omni-factory tests.omni.fake_stage:duplex_omni``);
- ``remote``: the gateway is a client of vLLM-Omni's own server
  (``python -m tests.omni.backend_server``: its ``OmniDuplexSessionHandler`` on
  ``/v1/realtime`` over the same fake stage).

The fake model calls the tool its instructions mention (see
:func:`tests.omni.fake_stage.plugin.tool_to_call`) by writing the call in tool-call
markers; its plugin's data plane turns that into the ``function_call`` result that
vLLM-Omni's session runner and Realtime translator make into a function-call response.
The function's output comes back as a ``function_call_output`` item, and the reply
after it starts with what the function returned. The last test drives the ``vllm-omni``
engine through the port, in this process, for what a client can hardly provoke.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from duplex_gateway.engine import port
from duplex_gateway.engine.vllm_omni import VllmOmniEngine
from duplex_gateway.vocabulary.session_config import FunctionTool, SessionConfig
from tests.e2e.helpers import EventLog, Gateway, GatewayFactory, b64, load_speech, send_json, ws_connect
from tests.omni import fake_stage
from tests.omni.conftest import (
    CHUNK_DELAY_MS,
    CHUNKS,
    read_calls,
    start_backend,
    start_omni_gateway,
    stop_backends,
    wait_healthy,
)
from tests.omni.fake_stage.plugin import FakeEchoDuplexPlugin
from tests.omni.test_engines_in_process import REPO, Events, done_of, fake_env, running, send_turn

__all__ = ["fake_env"]  # the fixture, registered by import

pytestmark = pytest.mark.e2e

TURN_S = 1.0
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather where the caller is",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
INSTRUCTIONS = "When the caller asks about the weather, call get_weather."
FORECAST = '{"forecast": "sunny, 21 C"}'


class Target:
    """A gateway in front of vLLM-Omni and the fake stage's call log behind it."""

    def __init__(self, gateway: Gateway, calls: Path) -> None:
        self.gateway = gateway
        self.calls = calls


@pytest.fixture(scope="module", params=["vllm-omni", "remote"])
def target(
    request: pytest.FixtureRequest,
    module_gateway_factory: GatewayFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp(f"tools-{request.param}")
    limits = {"limits": {"input_rate_factor": 50, "input_burst_ms": 60_000}}
    if request.param == "vllm-omni":
        calls = tmp / "calls.jsonl"
        gateway = start_omni_gateway(
            module_gateway_factory,
            engine="vllm-omni",
            omni_factory="tests.omni.fake_stage:duplex_omni",
            calls=calls,
            name="tools-vllm-omni",
            config=limits,
        )
        yield Target(gateway, calls)
        return
    backend = start_backend(tmp, "omni", chunks=CHUNKS, chunk_delay_ms=CHUNK_DELAY_MS)
    try:
        wait_healthy([backend])
        config = {
            "server": {"web_demo": False},
            **limits,
            "engine": {"name": "remote", "remote": {"backends": [{"url": backend.url, "max_sessions": 2}]}},
        }
        yield Target(module_gateway_factory.start(config, name="tools-remote"), backend.calls)
    finally:
        stop_backends([backend])


class Client:
    """A raw Realtime client of the gateway (manual turns)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.log = EventLog(ws.recv)

    async def send(self, event: dict[str, Any]) -> None:
        await send_json(self.ws, event)

    async def turn(self) -> None:
        """One committed caller turn (the fixture's speech, 24 kHz PCM16)."""
        speech = load_speech(24_000)
        start = int(0.5 * 24_000) * 2  # the fixture's speech starts ≈0.5 s in
        pcm = speech[start : start + int(TURN_S * 24_000) * 2]
        for offset in range(0, len(pcm), 4800):
            await self.send({"type": "input_audio_buffer.append", "audio": b64(pcm[offset : offset + 4800])})
        await self.send({"type": "input_audio_buffer.commit"})

    async def reply(self, **response: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Ask for a reply; its events from ``response.created`` on, and its ``response.done``."""
        mark = len(self.log.events)
        await self.send({"type": "response.create", **({"response": response} if response else {})})
        start, created = await self.log.wait_for("response.created", 15, start=mark)
        rid = created["response"]["id"]
        end, done = await self.log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 20, start=start
        )
        return self.log.events[start : end + 1], done["response"]


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def test_a_tool_is_called_and_its_output_answered(target: Target) -> None:
    ws = await ws_connect(target.gateway, "/v1/realtime", close_timeout=1)
    client = Client(ws)
    try:
        _, created = await client.log.wait_for("session.created", 30)
        assert created["session"]["capabilities"]["function_calling"] is True
        await client.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "instructions": INSTRUCTIONS,
                    "tools": [WEATHER],
                    "tool_choice": "auto",
                    "audio": {"input": {"turn_detection": None}},
                },
            }
        )
        _, updated = await client.log.wait_for("session.updated", 10)
        assert [t["name"] for t in updated["session"]["tools"]] == ["get_weather"]
        # vLLM-Omni holds the session's tools where its model plugins read them.
        held = [c["config"]["extra_body"] for c in read_calls(target.calls) if c["call"] == "session_config"]
        assert held and held[-1]["realtime_tools"][0]["name"] == "get_weather"
        assert held[-1]["realtime_tool_choice"] == "auto"

        # -- the caller's turn needs the tool: the reply is a function call, and only that.
        await client.turn()
        events, response = await client.reply()
        kinds = [e["type"] for e in events]
        assert "response.output_audio.delta" not in kinds
        (added,) = _of(events, "response.output_item.added")
        item = added["item"]
        assert (item["type"], item["name"], item["status"]) == ("function_call", "get_weather", "in_progress")
        call_id = item["call_id"]
        deltas = _of(events, "response.function_call_arguments.delta")
        (args_done,) = _of(events, "response.function_call_arguments.done")
        (item_done,) = _of(events, "response.output_item.done")
        assert kinds.index("response.output_item.added") < kinds.index(
            "response.function_call_arguments.delta"
        )
        assert kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
        arguments = args_done["arguments"]
        assert "".join(d["delta"] for d in deltas) == arguments
        assert json.loads(arguments) == {"city": f"{TURN_S} s of caller audio", "days": 1}
        assert (args_done["call_id"], args_done["name"], args_done["item_id"]) == (
            call_id,
            "get_weather",
            item["id"],
        )
        assert item_done["item"]["status"] == "completed" and item_done["item"]["arguments"] == arguments
        assert response["status"] == "completed"
        assert [(o["type"], o["call_id"], o["arguments"]) for o in response["output"]] == [
            ("function_call", call_id, arguments)
        ]
        plans = [c for c in read_calls(target.calls) if c["call"] == "plan_append"]
        assert plans[-1]["tool_call"] == "get_weather"

        # -- the client runs the function and returns its output; the next reply uses it.
        await client.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": FORECAST,
                },
            }
        )
        _, output_added = await client.log.wait_for(
            lambda e: e["type"] == "conversation.item.added" and e["item"]["type"] == "function_call_output",
            5,
        )
        assert output_added["item"]["call_id"] == call_id
        events, response = await client.reply()
        assert response["status"] == "completed", response
        transcript = "".join(e["delta"] for e in _of(events, "response.output_audio_transcript.delta"))
        assert transcript.startswith(f"(the function said: {FORECAST})"), transcript
        audio = b"".join(base64.b64decode(e["delta"]) for e in _of(events, "response.output_audio.delta"))
        assert len(audio) / 2 / 24_000 > 0.5 * TURN_S
        assert [o["type"] for o in response["output"]] == ["message"]
        (received,) = [c for c in read_calls(target.calls) if c["call"] == "function_output"]
        assert (received["call_id"], received["output"]) == (call_id, FORECAST)

        # -- a reply's own tool choice cannot reach vLLM-Omni (its response.create refuses
        #    one): the gateway refuses it up front, naming the field, and the session goes on.
        mark = len(client.log.events)
        await client.send({"type": "response.create", "response": {"tool_choice": "none"}})
        _, error = await client.log.wait_for("error", 5, start=mark)
        assert (error["error"]["code"], error["error"]["param"]) == (
            "unsupported_by_engine",
            "response.tool_choice",
        )
        assert "session.update" in error["error"]["message"]
        assert not [e for e in client.log.events[mark:] if e["type"] == "response.created"]
        assert not [e for e in client.log.events if e["type"] == "error" and e is not error]
    finally:
        await client.log.aclose()
        await ws.close()
    await target.gateway.wait_sessions(0)


async def test_the_engine_puts_calls_on_its_reply_and_passes_replayed_calls_and_outputs(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    engine = VllmOmniEngine(factory=fake_stage.duplex_omni)
    async with running(engine):
        caps = engine.capabilities
        # Tools only: vLLM-Omni's response.create takes no per-reply voice, token limit or context.
        assert caps.tools and not caps.out_of_band and caps.response_options == frozenset()
        weather = FunctionTool(name="get_weather", parameters=WEATHER["parameters"])  # type: ignore[arg-type]
        session = await engine.open_session("s1", SessionConfig(instructions=INSTRUCTIONS, tools=(weather,)))
        events = Events(session)

        # vLLM-Omni wraps the call in a response of its own: the call is the turn's reply's.
        await send_turn(session)
        await session.commit(item_id="item_1", response_id="resp_1")
        done = await events.wait(done_of("resp_1"))
        assert isinstance(done, port.EngineResponseDone) and done.status == "completed"
        assert [e.response_id for e in events.of(port.EngineResponseStarted)] == ["resp_1"]
        (call,) = events.of(port.EngineFunctionCall)
        (delta,) = events.of(port.EngineFunctionCallDelta)
        assert (call.response_id, call.name, delta.call_id, delta.delta) == (
            "resp_1",
            "get_weather",
            call.call_id,
            call.arguments,
        )
        assert len(events.of(port.EngineResponseDone)) == 1 and not events.of(port.EngineAudio)

        # A call the client replays goes in as a function_call item, so vLLM-Omni takes its output.
        await session.add_function_call(
            item_id="item_old", call_id="call_old", name="get_weather", arguments="{}"
        )
        await session.add_function_output(item_id="item_old_out", call_id="call_old", output="rainy")
        # An output for a call vLLM-Omni never saw is refused by it (the session goes on).
        await session.add_function_output(item_id="item_bad", call_id="call_unknown", output="x")
        error = await events.wait(lambda e: isinstance(e, port.EngineError))
        assert isinstance(error, port.EngineError) and error.code == "invalid_function_call_output"

        # A reply with tools of its own fails here; nothing reaches vLLM-Omni.
        await session.create_response(
            response_id="resp_own", instructions=None, options=port.ResponseOptions()
        )
        refused = await events.wait(done_of("resp_own"))
        assert isinstance(refused, port.EngineResponseDone)
        assert (refused.status, refused.reason) == ("failed", "unsupported_by_engine")
        assert not events.of(port.EngineResponseStarted, "resp_own")

        # The reply after the outputs answers the turn with them (the replayed call's too).
        await session.add_function_output(item_id="item_out", call_id=call.call_id, output="sunny")
        await session.create_response(
            response_id="resp_2", instructions=None, options=port.ResponseOptions(tools=(weather,))
        )
        await events.wait(done_of("resp_2"))
        said = "".join(e.delta for e in events.of(port.EngineTranscript, "resp_2"))
        assert said.startswith("(the function said: rainy; sunny)"), said
        assert events.of(port.EngineAudio, "resp_2") and not events.of(port.EngineFunctionCall, "resp_2")
        await session.close("done")
        await events.closed()


async def test_an_update_right_after_the_open_returns_once_vllm_omni_took_it(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM-Omni follows session.created with a session.updated of its own, which answers no update."""
    monkeypatch.chdir(REPO)
    slow = FakeEchoDuplexPlugin.runtime_config_for_update

    def busy(plugin: Any, config: Any, current: Any) -> dict[str, object]:
        time.sleep(0.3)  # vLLM-Omni under load: the update is taken a while after it was sent
        return slow(plugin, config, current)

    monkeypatch.setattr(FakeEchoDuplexPlugin, "runtime_config_for_update", busy)
    engine = VllmOmniEngine(factory=fake_stage.duplex_omni)
    async with running(engine):
        session = await engine.open_session("s1", SessionConfig(instructions=INSTRUCTIONS))
        weather = FunctionTool(name="get_weather", parameters=WEATHER["parameters"])  # type: ignore[arg-type]
        # Before the session's events were read: the open's session.updated is still on its way.
        await session.update(SessionConfig(instructions=INSTRUCTIONS, tools=(weather,)))
        held = [c["config"]["extra_body"] for c in read_calls(fake_env) if c["call"] == "session_config"]
        assert len(held) == 2 and held[-1]["realtime_tools"][0]["name"] == "get_weather", held
        await session.close("done")
