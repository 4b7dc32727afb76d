"""Operations against a REAL gateway process: ``/metrics`` values, JSON log lines, and a SIGTERM drain.

The metrics test runs one server-VAD turn (real speech, the gateway's VAD, the
echo engine), then scrapes ``/metrics`` and reads the session's summary line in
the JSON log. The drain test sends the process SIGTERM with three live sessions
(one mid-reply) and checks every promise of the drain: ``/readyz`` 503 at once,
new sessions refused 1013, ``session.closing`` only where asked for, the reply
finished, 1001, every engine session released, exit status 0.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    done_of,
    load_speech,
    send_json,
    speech_turn,
    stream_audio,
    wait_answered_turn,
    wait_closed,
    ws_connect,
)

pytestmark = pytest.mark.e2e

FRAME_100MS = 24000 * 2 // 10


def scrape(gw: Gateway) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``/metrics`` as {(sample name, labels): value}."""
    with urllib.request.urlopen(gw.base_url + "/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def json_lines(gw: Gateway) -> list[dict[str, Any]]:
    """The JSON log records in the gateway's stderr (libraries' own prints are not records)."""
    return [json.loads(line) for line in gw.stderr().splitlines() if line.startswith("{")]


async def wait_for_log(
    gw: Gateway, match: Any, count: int = 1, timeout: float = 10.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in json_lines(gw) if match(r)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def test_a_session_shows_in_metrics_and_in_one_json_summary_line(
    gateway_factory: GatewayFactory,
) -> None:
    gw = gateway_factory.start(
        {"server": {"web_demo": False, "log_format": "json"}, "engine": {"echo": {"pace": 0}}},
        name="ops-metrics",
    )
    turn = speech_turn(before_ms=500, after_ms=1200)
    async with ws_connect(gw) as ws:
        log = EventLog(ws.recv)
        try:
            _, created = await log.wait_for("session.created", 10)
            session_id = created["session"]["id"]
            await stream_audio(ws, turn, frame_ms=100, realtime=False)
            answered = await wait_answered_turn(log, 30)
            assert answered.done["response"]["status"] == "completed"
        finally:
            await log.aclose()
        await ws.close(1000)
    await gw.wait_sessions(0, timeout=10)

    samples = scrape(gw)
    labels = {"dialect": "realtime", "engine": "echo"}
    assert metric(samples, "duplex_gateway_sessions_total", **labels, reason="client_closed") == 1
    assert metric(samples, "duplex_gateway_sessions_active", **labels) == 0
    assert metric(samples, "duplex_gateway_first_audio_seconds_count", engine="echo") == 1
    # The gateway's VAD found the end of the caller's speech: that latency is measured too.
    assert metric(samples, "duplex_gateway_speech_end_to_first_audio_seconds_count", engine="echo") == 1
    first_audio = metric(samples, "duplex_gateway_first_audio_seconds_sum", engine="echo")
    speech_end = metric(samples, "duplex_gateway_speech_end_to_first_audio_seconds_sum", engine="echo")
    assert first_audio is not None and speech_end is not None and 0 <= first_audio <= speech_end < 30
    assert metric(samples, "duplex_gateway_replies_total", engine="echo", status="completed") == 1
    assert metric(samples, "duplex_gateway_engine_call_seconds_count", call="open_session") == 1
    assert (
        metric(samples, "duplex_gateway_engine_call_seconds_count", call="commit_input") == 1
    )  # it asks for the reply
    assert (metric(samples, "duplex_gateway_engine_call_seconds_count", call="append_audio") or 0) >= 1
    # base64 makes the audio 4/3 as large on the wire, and every message carries its JSON around it.
    bytes_in = metric(samples, "duplex_gateway_client_bytes_total", direction="in") or 0
    assert bytes_in > len(turn) * 4 / 3
    bytes_out = metric(samples, "duplex_gateway_client_bytes_total", direction="out") or 0
    assert bytes_out > 0
    assert (metric(samples, "duplex_gateway_input_backpressure_seconds_count") or 0) >= len(
        turn
    ) // FRAME_100MS
    assert (metric(samples, "duplex_gateway_output_chunk_gap_seconds_count", engine="echo") or 0) >= 1
    assert metric(samples, "duplex_gateway_engine_sessions") == 0
    assert metric(samples, "duplex_gateway_draining") == 0

    (summary,) = await wait_for_log(gw, lambda r: r.get("event") == "session_summary")
    assert summary["session_id"] == session_id and summary["logger"] == "duplex_gateway.host.connection"
    assert summary["turns"] == 1 and summary["replies"] == 1 and summary["barge_ins"] == 0
    assert summary["first_audio_ms"]["count"] == 1
    assert summary["first_audio_ms"]["median"] == pytest.approx(first_audio * 1000, abs=1)
    assert summary["speech_end_to_first_audio_ms"]["median"] == pytest.approx(speech_end * 1000, abs=1)
    assert summary["bytes_in"] == bytes_in and summary["bytes_out"] == bytes_out
    assert summary["close_code"] == 1000 and summary["close_reason"] == "client_closed"
    assert summary["dialect"] == "realtime" and summary["engine"] == "echo"
    assert 0 < summary["duration_s"] < 60
    assert summary["message"].startswith(f"session {session_id} ended after")
    # Every record went through the JSON formatter, uvicorn's own included.
    records = json_lines(gw)
    assert any(r["logger"].startswith("uvicorn") for r in records)
    assert not re.search(r"^\d{4}-\d\d-\d\d \S+ (INFO|WARNING|ERROR) ", gw.stderr(), re.MULTILINE)


async def test_sigterm_drains_live_sessions_then_exits_0(gateway_factory: GatewayFactory) -> None:
    grace = 8.0
    gw = gateway_factory.start(
        {
            "server": {"web_demo": False, "log_format": "json", "drain_grace_s": grace},
            "engine": {"echo": {"pace": 1.0, "chunk_ms": 100}},
        },
        name="ops-drain",
    )
    speech = load_speech()[: 24000 * 2 * 3]  # a 3 s reply, spoken in real time by the echo engine
    async with (
        ws_connect(gw, "/v1/duplex") as replying,
        ws_connect(gw) as asked,
        ws_connect(gw) as plain,
    ):
        logs = {
            name: EventLog(ws.recv)
            for name, ws in (("replying", replying), ("asked", asked), ("plain", plain))
        }
        try:
            # A vLLM-Omni duplex client, mid-reply.
            await send_json(
                replying,
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {"input": {"turn_detection": None}},
                    },
                },
            )
            await logs["replying"].wait_for("session.created", 10)
            for offset in range(0, len(speech), FRAME_100MS):
                chunk = speech[offset : offset + FRAME_100MS]
                await send_json(replying, {"type": "input_audio_buffer.append", "audio": b64(chunk)})
            await send_json(replying, {"type": "input_audio_buffer.commit"})
            await send_json(replying, {"type": "response.create"})
            _, created = await logs["replying"].wait_for("response.created", 10)
            response_id = created["response"]["id"]
            await logs["replying"].wait_for("response.output_audio.delta", 10)
            # A Realtime client that asked for the warning, and one that did not; both idle.
            await logs["asked"].wait_for("session.created", 10)
            await send_json(
                asked,
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "include": ["session.closing"]},
                },
            )
            await logs["asked"].wait_for("session.updated", 10)
            await logs["plain"].wait_for("session.created", 10)
            assert (await gw.wait_sessions(3))["engine_sessions"] == 3

            gw.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            status, body = await asyncio.to_thread(gw.get, "/readyz")
            assert status == 503 and body["status"] == "shutting_down"
            assert time.monotonic() - signalled < 2  # at once, not after the drain

            # A new session while draining: refused as a full gateway refuses one.
            async with ws_connect(gw) as late:
                refusal = json.loads(await asyncio.wait_for(late.recv(), 5))
                assert refusal["type"] == "error" and refusal["error"]["code"] == "server_shutting_down"
                assert await wait_closed(late) == 1013

            # The idle ones close at once; the one that asked was warned first.
            assert await wait_closed(asked, 5) == 1001 and await wait_closed(plain, 5) == 1001
            assert "session.closing" in logs["asked"].types()
            assert "session.closing" not in logs["plain"].types()
            _, warning = await logs["asked"].wait_for("session.closing", 1)
            assert warning["reason"] == "server_shutdown" and warning["grace_s"] == grace

            # The one mid-reply is warned, finishes its reply, then closes: before the grace is out.
            closing_at, _ = await logs["replying"].wait_for("session.closing", 5)
            done_at, done = await logs["replying"].wait_for(done_of(response_id), grace + 5)
            assert closing_at < done_at and done["response"]["status"] == "completed"
            assert await wait_closed(replying, 5) == 1001
            assert logs["replying"].types()[-1] == "session.closed"
            assert time.monotonic() - signalled < grace + 2
        finally:
            for log in logs.values():
                await log.aclose()

    exit_code = await asyncio.to_thread(gw.proc.wait, 20)
    assert exit_code == 0, gw.stderr()[-3000:]
    records = json_lines(gw)
    (stopped,) = [r for r in records if r.get("event") == "engine_stopped"]
    assert (
        stopped["engine_sessions"] == 0
        and stopped["engine_sessions_at_shutdown"] == 0
        and stopped["sessions"] == 0
    )
    summaries = [r for r in records if r.get("event") == "session_summary"]
    drained = [s for s in summaries if s["close_reason"] == "server_shutdown"]
    assert len(drained) == 3 and {s["close_code"] for s in drained} == {1001}
    assert {s["dialect"] for s in drained} == {"duplex", "realtime"}
    (refused,) = [s for s in summaries if s["close_reason"] == "server_shutting_down"]
    assert refused["close_code"] == 1013
