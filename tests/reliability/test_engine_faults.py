"""An engine that crashes, hangs or falls behind, against REAL processes on loopback.

The gateway under test runs the ``remote`` engine in front of one backend: another real
gateway process with the echo engine, speaking vLLM-Omni's duplex protocol (as a vLLM-Omni
server would). So the engine's failures are real process failures:

* crash (SIGKILL): every live session gets an ``engine_error`` and close 4003, ``/readyz``
  turns 503 and new sessions are refused (1013); when a backend is up again on the same
  address, ``/readyz`` is 200 again and a new session is answered;
* backpressure (SIGSTOP for a few seconds while a caller uploads as fast as it can): the
  caller is slowed down by TCP, nothing is dropped (the echo comes back whole), memory
  stays bounded;
* hang (SIGSTOP with sessions live): the health probe fails, the sessions' sockets give
  no pong for ``unresponsive_after_s``, and each session gets its error and close then
  (not after the sockets' 20 s + 20 s keepalive).

Each figure is kept under ``out/reliability/`` (see docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    free_port,
    recv_until,
    send_json,
    ws_connect,
)
from tests.reliability.clients import record
from tests.reliability.probes import readyz, rss_kib

pytestmark = pytest.mark.e2e

RATE = 24_000
BACKEND: dict[str, Any] = {
    "server": {"web_demo": False},
    "engine": {"echo": {"chunk_ms": 50, "pace": 1.0, "max_turn_s": 400}},
    "limits": {"resume_grace_s": 5},
}


def start_on(factory: GatewayFactory, port: int, config: dict[str, Any], name: str, **kw: Any) -> Gateway:
    """A gateway on ``port`` (a backend restarted where its front expects it)."""
    with mock.patch("tests.e2e.helpers.free_port", return_value=port):
        return factory.start(config, name=name, **kw)


@pytest.fixture
def pool(gateway_factory: GatewayFactory) -> Iterator[tuple[Gateway, Gateway, int]]:
    """A front gateway (engine remote) and its one echo backend; the backend's port, for a restart."""
    port = free_port()
    backend = start_on(gateway_factory, port, BACKEND, "backend")
    front = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {
                "name": "remote",
                "remote": {
                    "backends": [{"url": backend.ws_url, "max_sessions": 16}],
                    "health_path": "/readyz",
                    "health_interval_s": 0.2,
                    "health_timeout_s": 1.0,
                    "unhealthy_after": 1,
                    "connect_timeout_s": 1.0,
                    "resume_timeout_s": 1.0,
                    # Longer than the 5 s stop of the backpressure test, less the probe's second.
                    "unresponsive_after_s": 6.0,
                },
            },
        },
        name="front",
    )
    yield front, backend, port
    for proc in (backend.proc,):
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)


async def open_turn(front: Gateway, seconds: float) -> tuple[Any, EventLog]:
    ws = await ws_connect(front, compression=None)
    log = EventLog(ws.recv)
    await log.wait_for("session.created")
    await send_json(ws, {"type": "session.update", "session": {"type": "realtime", "turn_detection": None}})
    await log.wait_for("session.updated")
    await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(bytes(int(RATE * seconds) * 2))})
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    await send_json(ws, {"type": "response.create"})
    return ws, log


async def poll(check: Any, timeout: float) -> float:
    started = time.monotonic()
    while not await asyncio.to_thread(check):
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def answered(front: Gateway) -> None:
    ws, log = await open_turn(front, 0.5)
    try:
        _, done = await log.wait_for("response.done", 10)
        assert done["response"]["status"] == "completed", done
    finally:
        await log.aclose()
        await ws.close()


async def refused(front: Gateway) -> None:
    """A new session is told the engine is unavailable, and to come back (1013)."""
    async with ws_connect(front, compression=None) as ws:
        error, _ = await recv_until(ws, "error")
        assert error["error"]["code"] == "engine_unavailable", error
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.close_code == 1013


async def test_an_engine_crash_ends_every_session_with_an_error_and_4003_and_it_recovers(
    pool: tuple[Gateway, Gateway, int],
    gateway_factory: GatewayFactory,
) -> None:
    front, backend, port = pool
    clients = [await open_turn(front, 3.0) for _ in range(3)]
    for _, log in clients:
        await log.wait_for("response.output_audio.delta", 10)
    backend.proc.kill()
    killed = time.monotonic()
    ended = []
    for ws, log in clients:
        _, error = await log.wait_for("error", 10)
        assert error["error"]["code"] == "engine_error", error
        await asyncio.wait_for(ws.wait_closed(), 10)
        assert ws.close_code == 4003, ws.close_code
        ended.append(time.monotonic() - killed)
        await log.aclose()
    not_ready = await poll(lambda: readyz(front.base_url)["http_status"] == 503, 10) + ended[-1]
    await refused(front)  # while it is down, holding nothing
    backend.stopped = True  # killed on purpose: its factory must not count that as a failure
    restarted_at = time.monotonic()
    start_on(gateway_factory, port, BACKEND, "backend-again")
    ready_again = await poll(lambda: readyz(front.base_url)["http_status"] == 200, 10)
    back_s = time.monotonic() - restarted_at
    await answered(front)
    state = readyz(front.base_url)
    record(
        "engine_crash",
        sessions=len(clients),
        error_and_4003_after_s=[round(e, 3) for e in ended],
        readyz_503_after_s=round(not_ready, 3),
        readyz_200_after_restart_s=round(ready_again, 3),
        answered_after_restart_s=round(back_s, 2),
    )
    assert max(ended) < 2.0, ended
    assert state["sessions"] <= 1 and state["engine_sessions"] <= 1, state


async def test_an_engine_that_falls_behind_slows_the_caller_and_drops_nothing(
    pool: tuple[Gateway, Gateway, int],
) -> None:
    front, backend, _ = pool
    # 6 minutes of audio at 40 times real time, the backend stopped for 5 s of it: more than the
    # TCP buffers on the way hold, so the stop must reach the caller.
    seconds, frame_s, stop_s, speed = 360.0, 0.1, 5.0, 40.0
    audio = bytes(int(RATE * seconds) * 2)
    step = int(RATE * frame_s) * 2  # the same 100 ms of silence, sent again and again
    ws = await ws_connect(front, compression=None, max_size=None)
    log = EventLog(ws.recv)
    rss_before = rss_kib(front.proc.pid)
    peak = [rss_before]
    try:
        await log.wait_for("session.created")
        await send_json(
            ws, {"type": "session.update", "session": {"type": "realtime", "turn_detection": None}}
        )
        await log.wait_for("session.updated")

        async def stall_backend() -> None:
            await asyncio.sleep(1.0)
            backend.proc.send_signal(signal.SIGSTOP)
            try:
                for _ in range(int(stop_s / 0.1)):
                    peak.append(await asyncio.to_thread(rss_kib, front.proc.pid))
                    await asyncio.sleep(0.1)
            finally:
                backend.proc.send_signal(signal.SIGCONT)

        stall = asyncio.create_task(stall_backend())
        gaps, last = [], time.monotonic()
        started = last
        chunk = json.dumps({"type": "input_audio_buffer.append", "audio": b64(audio[:step])})
        for index in range(len(audio) // step):
            await ws.send(chunk)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            due = started + (index + 1) * frame_s / speed
            if due > now:
                await asyncio.sleep(due - now)
        upload_s = time.monotonic() - started
        await stall
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "response.create"})
        index, created = await log.wait_for("response.created", 20)
        response_id = created["response"]["id"]
        # The echo comes back paced at real time: read the first seconds of it, then cancel.
        await log.wait_for("response.output_audio.delta", 20, start=index)
        await send_json(ws, {"type": "response.cancel"})
        done_index, _ = await log.wait_for("response.done", 20, start=index)
        errors = [e for e in log.events if e["type"] == "error"]
        transcript = next(
            (
                e["transcript"]
                for e in log.events[index : done_index + 1]
                if e["type"].endswith("transcript.done")
            ),
            "",
        )
    finally:
        await log.aclose()
        await ws.close()
    growth_mib = (max(peak) - rss_before) / 1024
    record(
        "engine_backpressure",
        uploaded_s=seconds,
        upload_speed=speed,
        upload_took_s=round(upload_s, 2),
        upload_at_full_speed_s=round(seconds / speed, 2),
        backend_stopped_s=stop_s,
        longest_send_wait_s=round(max(gaps), 2),
        errors=len(errors),
        echo_transcript=transcript,
        rss_growth_mib=round(growth_mib, 1),
        response_id=response_id,
    )
    assert not errors, errors
    # The stop reached the caller: once the buffers on the way were full, its sends waited
    # (TCP backpressure), and it caught up when the backend went on.
    assert max(gaps) > 0.25, max(gaps)
    # The backend heard the whole turn: the echo names its length.
    assert f"{seconds:.1f} s" in transcript, transcript
    assert growth_mib < 32, growth_mib


async def test_an_engine_that_hangs_ends_its_sessions_with_an_error_and_a_close(
    pool: tuple[Gateway, Gateway, int],
) -> None:
    front, backend, _ = pool
    clients = [await open_turn(front, 3.0) for _ in range(3)]
    for _, log in clients:
        await log.wait_for("response.output_audio.delta", 10)
    backend.proc.send_signal(signal.SIGSTOP)
    hung = time.monotonic()
    try:
        not_ready = await poll(lambda: readyz(front.base_url)["http_status"] == 503, 20)
        await refused(front)
        ended, codes = [], []
        for ws, log in clients:
            _, error = await log.wait_for("error", 120)
            await asyncio.wait_for(ws.wait_closed(), 30)
            ended.append(time.monotonic() - hung)
            codes.append((error["error"]["code"], ws.close_code))
            await log.aclose()
    finally:
        backend.proc.send_signal(signal.SIGCONT)
    ready_again = await poll(lambda: readyz(front.base_url)["http_status"] == 200, 20)
    await answered(front)
    record(
        "engine_hang",
        sessions=len(clients),
        readyz_503_after_s=round(not_ready, 2),
        error_and_close_after_s=[round(e, 1) for e in ended],
        codes=codes,
        readyz_200_after_resume_s=round(ready_again, 2),
    )
    assert all(code == ("engine_error", 4003) for code in codes), codes
    # A probe times out after 1 s, then the sessions' pings get no pong for 6 s: about 7 s.
    assert max(ended) < 15, ended
