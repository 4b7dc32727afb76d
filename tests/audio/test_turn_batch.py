"""The batched end-of-turn check: sessions' checks share model calls and each gets its own answer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from duplex_gateway.audio.turn_batch import TurnBatcher
from duplex_gateway.audio.turn_model import SmartTurn
from tests.fixtures import load_speech

Features = npt.NDArray[np.float32] | Sequence[npt.NDArray[np.float32]]


class CountingTurn(SmartTurn):
    """The shared model, recording the size of every batch it is given."""

    def __init__(self) -> None:
        super().__init__(SmartTurn.shared()._session)
        self.batches: list[int] = []

    def predict(self, features: Features) -> list[float]:
        self.batches.append(len(features))
        return super().predict(features)


def _turns(count: int) -> list[np.ndarray]:
    speech = load_speech()
    # Each session's turn ends somewhere else in the sentence, so their answers differ.
    return [speech[: speech.size * (index + 3) // (count + 3)] for index in range(count)]


async def test_concurrent_checks_share_batches_and_get_their_own_answers() -> None:
    model = CountingTurn()
    batcher = TurnBatcher(model, max_batch=3)  # fewer than the sessions: batches split
    try:
        turns = _turns(7)
        expected = [model.completion(turn) for turn in turns]
        model.batches.clear()
        got = await asyncio.gather(*(batcher.completion(turn) for turn in turns))
        np.testing.assert_allclose(got, expected, atol=1e-3)
        assert sum(model.batches) == 7
        assert max(model.batches) <= 3
        # The checks queue while the first batch runs (tens of ms), so later batches are shared.
        assert max(model.batches) > 1
    finally:
        batcher.close()


async def test_the_samples_are_copied_before_the_caller_awaits() -> None:
    batcher = TurnBatcher(SmartTurn.shared())
    try:
        turn = load_speech()
        expected = SmartTurn.shared().completion(turn)
        buffer = turn.copy()
        check = asyncio.create_task(batcher.completion(buffer))
        await asyncio.sleep(0)  # the check has taken its samples and now waits
        buffer[:] = 0.0  # the session reuses its buffer
        assert await check == pytest.approx(expected, abs=1e-3)
    finally:
        batcher.close()


async def test_a_model_failure_fails_the_check_not_the_batcher() -> None:
    class Broken(SmartTurn):
        def predict(self, features: Features) -> list[float]:
            raise RuntimeError("model fault")

    batcher = TurnBatcher(Broken(SmartTurn.shared()._session))
    try:
        with pytest.raises(RuntimeError, match="model fault"):
            await batcher.completion(load_speech())
        with pytest.raises(RuntimeError, match="model fault"):
            await batcher.completion(load_speech())  # the worker is still there
        with pytest.raises(ValueError, match="mono"):
            await batcher.completion(np.zeros((2, 100), dtype=np.float32))
    finally:
        batcher.close()


async def test_a_cancelled_check_is_skipped_and_others_still_answered() -> None:
    entered, release = threading.Event(), threading.Event()

    class Gated(CountingTurn):
        def predict(self, features: Features) -> list[float]:
            entered.set()
            release.wait(5.0)  # hold the worker on the first batch
            return super().predict(features)

    model = Gated()
    batcher = TurnBatcher(model)
    try:
        turns = _turns(3)
        first = asyncio.create_task(batcher.completion(turns[0]))
        assert await asyncio.to_thread(entered.wait, 5.0)  # the worker holds the first check alone
        abandoned = asyncio.create_task(batcher.completion(turns[1]))
        kept = asyncio.create_task(batcher.completion(turns[2]))
        await asyncio.sleep(0)
        abandoned.cancel()  # its session went away
        await asyncio.sleep(0)
        release.set()
        await first
        assert await kept == pytest.approx(SmartTurn.shared().completion(turns[2]), abs=1e-3)
        assert abandoned.cancelled()
        # The cancelled check never reached the model.
        assert model.batches == [1, 1]
    finally:
        release.set()
        batcher.close()


def test_shared_batcher_is_one_instance() -> None:
    assert TurnBatcher.shared() is TurnBatcher.shared()
    assert TurnBatcher.shared().model is SmartTurn.shared()
