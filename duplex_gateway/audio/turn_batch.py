"""End-of-turn checks for every session of the process, batched on one worker thread.

A session asks once per pause whether its caller has finished (:meth:`TurnBatcher.completion`).
Each check costs tens of milliseconds of CPU (the features and the model), far too
much for the event loop, so the :class:`TurnBatcher` does both on its own thread:
the checks that are waiting when it gets to them, from whatever sessions, go
through the model as one batch, and each event loop gets its results back in
one call per batch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio.turn_model import WINDOW_SAMPLES, SmartTurn

__all__ = ["MAX_BATCH", "TurnBatcher"]

#: Checks in one model call; more waiting checks go in the next call.
MAX_BATCH: Final = 8


@dataclass(slots=True, eq=False)
class _Request:
    samples: npt.NDArray[np.float32]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[float]


class TurnBatcher:
    """Runs Smart Turn for many sessions at once, off the event loop.

    One per process (:meth:`shared`); safe to call from any event loop, and a
    session may have any number of checks in flight.
    """

    _shared: TurnBatcher | None = None
    _shared_lock: Final = threading.Lock()

    def __init__(self, model: SmartTurn | None = None, *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._model = model if model is not None else SmartTurn.shared()
        self._max_batch = max_batch
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="turn-batch", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> TurnBatcher:
        """The process-wide batcher, started on first use."""
        shared = cls._shared
        if shared is None:
            with cls._shared_lock:
                shared = cls._shared
                if shared is None:
                    shared = cls._shared = cls()
        return shared

    @property
    def model(self) -> SmartTurn:
        return self._model

    async def completion(self, samples_16k: npt.NDArray[np.floating]) -> float:
        """The probability (0..1) that the turn ending with ``samples_16k`` (mono 16 kHz) is complete.

        Only the last 8 s count. The samples are copied, so the caller may go on
        appending to its buffer while the check waits.
        """
        audio = np.asarray(samples_16k)
        if audio.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {audio.shape}")
        loop = asyncio.get_running_loop()
        tail = np.array(audio[-WINDOW_SAMPLES:], dtype=np.float32)  # a copy, even of float32 input
        request = _Request(tail, loop, loop.create_future())
        self._requests.put(request)
        return await request.future

    def close(self) -> None:
        """Stop the worker thread (checks still queued are abandoned)."""
        self._requests.put(None)

    # -- the worker thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._requests.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    more = self._requests.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._requests.put(None)  # stop after this batch
                    break
                batch.append(more)
            # Nobody waits for a check whose session went away (cancelled future): skip its work.
            batch = [request for request in batch if not request.future.done()]
            if not batch:
                continue
            try:
                features = np.stack([self._model.prepare(request.samples) for request in batch])
                probabilities = self._model.predict(features)
            except Exception as exc:  # noqa: BLE001 - a model failure fails these checks, not the thread
                self._deliver(batch, [], exc)
            else:
                self._deliver(batch, probabilities, None)

    @staticmethod
    def _deliver(batch: list[_Request], probabilities: list[float], error: Exception | None) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request, float]]] = {}
        for index, request in enumerate(batch):
            value = probabilities[index] if error is None else float("nan")
            by_loop.setdefault(request.loop, []).append((request, value))
        for loop, results in by_loop.items():
            # One wake-up of the loop per batch, however many sessions it served.
            try:
                loop.call_soon_threadsafe(_resolve, results, error)
            except RuntimeError:  # that loop has closed: nobody is waiting any more
                continue


def _resolve(results: list[tuple[_Request, float]], error: Exception | None) -> None:
    for request, probability in results:
        if request.future.done():
            continue  # the session went away while its check ran
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(probability)
