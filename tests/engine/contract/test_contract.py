"""The engine contract over the engines of the main virtualenv: echo and embedded.

The vLLM-Omni engines (in process and remote) make the same promises in
``tests/omni/test_engine_contract.py``, which runs in the omni virtualenv.
"""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from duplex_gateway.engine import port
from duplex_gateway.engine.echo import EchoEngine
from tests.engine.contract.harness import EngineCase

# The promises (its __all__), collected as this module's tests.
from tests.engine.contract.promises import *  # noqa: F403
from tests.fixtures import load_speech


def _speech(rate: int) -> bytes:
    """The fixture sentence ("Please send me the weather report ..."), PCM16 at ``rate``."""
    return (np.clip(load_speech(rate), -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def _tone(seconds: float) -> Callable[[int], bytes]:
    return lambda rate: (np.sin(np.arange(int(seconds * rate)) / 7.0) * 9000).astype("<i2").tobytes()


def _echo() -> port.Engine:
    # Paced like speech, so a two-second reply is still running when it is stopped.
    return EchoEngine(rate=16_000, chunk_ms=50, pace=1.0)


def _embedded() -> port.Engine:
    pytest.importorskip("piper", reason="the embedded engine needs the embedded extra")
    from duplex_gateway.engine.embedded import EmbeddedEngine

    # Paced, so its replies last as long as they are heard and can be stopped part-way.
    return EmbeddedEngine(max_sessions=4, pace=1.0, whisper_cpu_threads=2, tts_threads=2)


CASES = [
    EngineCase(name="echo", build=_echo, turn=_tone(0.5), long_turn=_tone(3.0)),
    EngineCase(name="embedded", build=_embedded, turn=_speech, long_turn=_speech),
]


@pytest.fixture(params=CASES, ids=str)
def case(request: pytest.FixtureRequest) -> EngineCase:
    value = request.param
    assert isinstance(value, EngineCase)
    return value
