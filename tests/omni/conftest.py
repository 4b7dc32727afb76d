"""The in-process vLLM-Omni engines against a REAL gateway process, under ``.venv-omni``.

The gateway runs ``--engine vllm-omni`` / ``vllm-omni-stream`` with
``--omni-factory tests.omni.fake_stage:...``: vLLM-Omni's real stack with a fake
model stage (see :mod:`tests.omni.fake_stage`). The e2e fixtures are reused as they
are (:mod:`tests.e2e.conftest`), including the check that no gateway logs a
traceback. Test modules skip themselves where vLLM-Omni is not installed.
"""

from __future__ import annotations

import os

if os.environ.get("DUPLEX_GATEWAY_REQUIRE_OMNI") == "1":
    # Under make test's vLLM-Omni run a broken install must fail here, not skip every module.
    import vllm_omni  # noqa: F401

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import helpers
from tests.e2e.conftest import (  # noqa: F401 - fixtures, registered by import
    _no_traceback_in_gateway_logs,
    gateway_factory,
    module_gateway_factory,
)
from tests.e2e.helpers import REPO, Gateway, GatewayFactory, free_port, gateway_env

#: Starting vLLM-Omni (imports, orchestrator thread) takes ≈15 s on two cores.
OMNI_READY_TIMEOUT_S = 180.0
#: The same for a vLLM-Omni server, which may start beside another one.
BACKEND_READY_TIMEOUT_S = 240.0
#: Stopping a gateway in front of vLLM-Omni stops its stage too: 4 s alone on two cores, over 10 s
#: right after other vLLM-Omni gateways (measured on main before and after the redesign alike).
OMNI_STOP_TIMEOUT_S = 30.0
#: Chunks each fake answer is split into, and the pause between two of them.
CHUNKS = 8
CHUNK_DELAY_MS = 60


@pytest.fixture(scope="session", autouse=True)
def _omni_gateways_stop_slower() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(helpers, "STOP_TIMEOUT_S", OMNI_STOP_TIMEOUT_S)
        yield


def start_omni_gateway(
    factory: GatewayFactory,
    *,
    engine: str,
    omni_factory: str,
    calls: Path,
    name: str,
    config: dict[str, Any] | None = None,
) -> Gateway:
    """``serve --engine ENGINE --omni-factory OMNI_FACTORY``, the fake stage logging to ``calls``."""
    settings: dict[str, Any] = {"server": {"web_demo": False}, "engine": {"name": engine}}
    for key, value in (config or {}).items():
        settings[key] = {**settings.get(key, {}), **value}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_OMNI_CALL_LOG", str(calls))
        mp.setenv("FAKE_OMNI_CHUNKS", str(CHUNKS))
        mp.setenv("FAKE_OMNI_CHUNK_DELAY_MS", str(CHUNK_DELAY_MS))
        mp.setattr(helpers, "READY_TIMEOUT_S", OMNI_READY_TIMEOUT_S)
        return factory.start(settings, args=["--engine", engine, "--omni-factory", omni_factory], name=name)


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The engine-side calls the fake stage recorded (see ``FAKE_OMNI_CALL_LOG``)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


async def wait_calls(
    path: Path, match: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Wait until the fake stage has recorded ``count`` calls that satisfy ``match``; they, in order."""
    async with asyncio.timeout(timeout):
        while len(hits := [c for c in read_calls(path) if match(c)]) < count:
            await asyncio.sleep(0.02)  # the call log is a file another process appends to
    return hits


@pytest.fixture(scope="module")
def calls_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("omni-calls") / "calls.jsonl"


# -- vLLM-Omni's own server over the fake stage, for the remote engine ---------------------------


@dataclass
class Backend:
    """One vLLM-Omni server process (``python -m tests.omni.backend_server``)."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    calls: Path

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def opened(self) -> int:
        return sum(
            1 for c in read_calls(self.calls) if c.get("call") == "open_session.result" and c.get("ok")
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_backend(tmp: Path, name: str, *, chunks: int, chunk_delay_ms: int) -> Backend:
    """A vLLM-Omni server on a free port, starting (see :func:`wait_healthy`)."""
    port = free_port()
    log, calls = tmp / f"{name}.log", tmp / f"{name}.calls.jsonl"
    env = gateway_env()
    env.update(
        FAKE_OMNI_CALL_LOG=str(calls),
        FAKE_OMNI_CHUNKS=str(chunks),
        FAKE_OMNI_CHUNK_DELAY_MS=str(chunk_delay_ms),
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.omni.backend_server", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return Backend(port=port, proc=proc, log=log, calls=calls)


def wait_healthy(backends: list[Backend], timeout: float = BACKEND_READY_TIMEOUT_S) -> None:
    """Wait until every server answers ``/health`` (fails the test with its log if one does not)."""
    deadline = time.monotonic() + timeout
    for backend in backends:
        while not backend.healthy():
            if backend.proc.poll() is not None or time.monotonic() > deadline:
                tail = backend.log.read_text(errors="replace")[-4000:]
                pytest.fail(f"vLLM-Omni backend on {backend.port} did not come up:\n{tail}", pytrace=False)
            time.sleep(0.25)


def stop_backends(backends: list[Backend]) -> None:
    """Stop the servers; fail if one logged a traceback."""
    for backend in backends:
        backend.stop()
    problems = [
        b.log.read_text(errors="replace")[-6000:]
        for b in backends
        if "Traceback" in b.log.read_text(errors="replace")
    ]
    if problems:
        pytest.fail("a vLLM-Omni backend logged a traceback:\n" + "\n\n".join(problems), pytrace=False)
