"""Shared fixtures for the embedded engine's tests: real models, loaded once per test session.

Every model comes from an installed wheel; the hub is switched off so a test
that would reach for the network fails instead.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
import pytest

from duplex_gateway.engine.embedded import (
    EmbeddedEngine,
    FinalRecognizer,
    PartialRecognizerPool,
    PiperSynthesizer,
)
from tests.fixtures import load_speech

#: The responder's clock in engine tests: 15:15 UTC on a Tuesday.
FIXED_NOW = datetime(2025, 5, 6, 15, 15, tzinfo=UTC)


def to_pcm16(samples: npt.NDArray[np.float32]) -> bytes:
    """Float samples in -1..1 as PCM16 little-endian bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


@pytest.fixture(scope="session")
def speech_pcm() -> bytes:
    """The committed fixture sentence at 16 kHz as PCM16."""
    return to_pcm16(load_speech())


@pytest.fixture(scope="session")
def final_recognizer() -> FinalRecognizer:
    return FinalRecognizer.shared(cpu_threads=2)


@pytest.fixture(scope="session")
def synthesizer() -> PiperSynthesizer:
    return PiperSynthesizer.shared(threads=2)


@pytest.fixture(scope="session")
def partial_pool() -> PartialRecognizerPool:
    return PartialRecognizerPool.shared()


@pytest.fixture(scope="session")
def engine() -> Iterator[EmbeddedEngine]:
    """One started engine for the whole test session (its models load once)."""
    # Unpaced (pace=0): replies arrive as fast as they are made, which keeps the suite quick.
    started = EmbeddedEngine(
        max_sessions=8, pace=0.0, whisper_cpu_threads=2, tts_threads=2, clock=lambda: FIXED_NOW
    )
    asyncio.run(started.start())
    yield started
    asyncio.run(started.shutdown())
