"""The engine contract over the vLLM-Omni engines (run under ``.venv-omni``).

The same promises as ``tests/engine/contract/test_contract.py`` (echo and embedded),
over ``vllm-omni`` and ``vllm-omni-stream`` (vLLM-Omni's real ``DuplexOmni`` /
``AsyncOmni`` in this process, over the fake model stage) and ``remote`` (vLLM-Omni's
own duplex server, :mod:`tests.omni.backend_server`, over the same stage).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from duplex_gateway.engine import port
from duplex_gateway.engine.remote import BackendSpec, RemoteEngine
from duplex_gateway.engine.vllm_omni import VllmOmniEngine
from duplex_gateway.engine.vllm_omni_stream import VllmOmniStreamEngine
from tests.engine.contract.harness import EngineCase

# The promises (its __all__), collected as this module's tests.
from tests.engine.contract.promises import *  # noqa: F403
from tests.omni import fake_stage
from tests.omni.conftest import Backend, start_backend, stop_backends, wait_healthy

REPO = Path(__file__).resolve().parents[2]
#: Each fake reply: this many audio chunks, this far apart (long enough to stop one part-way).
CHUNKS = 8
CHUNK_DELAY_MS = 60


def _tone(seconds: float) -> Callable[[int], bytes]:
    return lambda rate: (np.sin(np.arange(int(seconds * rate)) / 7.0) * 9000).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    started = start_backend(
        tmp_path_factory.mktemp("omni-contract"), "omni", chunks=CHUNKS, chunk_delay_ms=CHUNK_DELAY_MS
    )
    try:
        wait_healthy([started])
        yield started
    finally:
        stop_backends([started])


def _cases(backend_url: Callable[[], str]) -> dict[str, EngineCase]:
    def remote() -> port.Engine:
        return RemoteEngine([BackendSpec(url=backend_url(), max_sessions=4)], health_timeout_s=5)

    return {
        "vllm-omni": EngineCase(
            name="vllm-omni",
            build=lambda: VllmOmniEngine(factory=fake_stage.duplex_omni, max_sessions=8),
            turn=_tone(1.0),
            long_turn=_tone(2.0),
        ),
        "vllm-omni-stream": EngineCase(
            name="vllm-omni-stream",
            build=lambda: VllmOmniStreamEngine(factory=fake_stage.async_omni, max_sessions=8),
            turn=_tone(1.0),
            long_turn=_tone(2.0),
        ),
        "remote": EngineCase(name="remote", build=remote, turn=_tone(1.0), long_turn=_tone(2.0)),
    }


@pytest.fixture(params=["vllm-omni", "vllm-omni-stream", "remote"])
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> EngineCase:
    name = request.param
    assert isinstance(name, str)
    # The fake stage reads these when the in-process engines build it (the server has its own).
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_OMNI_CALL_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_OMNI_CHUNKS", str(CHUNKS))
    monkeypatch.setenv("FAKE_OMNI_CHUNK_DELAY_MS", str(CHUNK_DELAY_MS))

    def backend_url() -> str:
        server = request.getfixturevalue("backend")
        assert isinstance(server, Backend)
        return server.url

    if name == "remote":
        backend_url()  # started before the test's clock, not inside its first engine build
    return _cases(backend_url)[name]
