"""``semantic_vad``'s judge: the end-of-turn model run on a session's caller audio, off the session.

The session asks (:class:`~duplex_gateway.session.engine_calls.AssessTurn`) when the caller has
been quiet a moment; :class:`TurnJudge` takes the latest audio the input stage kept, has the
process-wide batcher run the model on it, and hands the session the probability that the caller
is done, with the time it took. One judgement per session at a time: a newer one replaces one
still running, whose silence has since grown. A model that fails or runs past its deadline is a
judgement of None, which ends the turn as the silence would have: a caller is never left waiting
on a broken model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from duplex_gateway.session.engine_calls import AssessTurn

__all__ = ["JUDGE_TIMEOUT_S", "TurnJudge"]

logger = logging.getLogger(__name__)

#: The longest one judgement may take (queued behind other sessions' included).
JUDGE_TIMEOUT_S = 1.0

Judge = Callable[[npt.NDArray[np.float32]], Awaitable[float]]


def _shared_judge() -> Judge:
    from duplex_gateway.audio.turn_batch import TurnBatcher

    return TurnBatcher.shared().completion


class TurnJudge:
    """Runs one session's end-of-turn judgements and hands each verdict back."""

    def __init__(
        self,
        *,
        recent: Callable[[], npt.NDArray[np.float32]],
        verdict: Callable[[AssessTurn, float | None, float], None],
        name: str,
        judge: Judge | None = None,
        timeout_s: float = JUDGE_TIMEOUT_S,
    ) -> None:
        """``recent``: the caller's latest audio at 16 kHz; ``verdict(call, probability, ms)`` takes each result."""
        self._recent = recent
        self._verdict = verdict
        self._name = name
        self._judge = judge
        self._timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def assess(self, call: AssessTurn) -> None:
        """Judge the caller's audio as it is now, for ``call``."""
        if self._closed:
            return
        if self._task is not None:
            self._task.cancel()  # its silence has grown since: this judgement supersedes it
        if self._judge is None:
            self._judge = _shared_judge()
        samples = self._recent()
        self._task = asyncio.get_running_loop().create_task(
            self._run(call, samples), name=f"turn-{self._name}"
        )

    async def _run(self, call: AssessTurn, samples: npt.NDArray[np.float32]) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        probability: float | None = None
        assert self._judge is not None
        try:
            async with asyncio.timeout(self._timeout_s):
                probability = await self._judge(samples)
        except TimeoutError:
            logger.warning("session %s: the end-of-turn model took over %g s", self._name, self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # a model failure ends the turn by its silence, not the session
            logger.exception("session %s: the end-of-turn model failed", self._name)
        if not self._closed:
            self._verdict(call, probability, (loop.time() - began) * 1000.0)

    async def close(self) -> None:
        """The session ends: a judgement in flight is dropped."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
