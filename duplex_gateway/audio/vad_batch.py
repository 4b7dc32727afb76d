"""Voice activity for every session of the process, batched on one worker thread.

Each caller's 20 ms frame completes at most one or two 32 ms VAD windows. Handing
each frame to a thread pool costs the event loop more than the rest of the frame's
work, and runs the model once per window. The :class:`VadBatcher` instead takes the
windows of all sessions that are waiting, runs them through the model as one batch
per step (a stream's own windows go in order, since each needs the state the last
one left), and hands the results back to the event loop in one call per batch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio.vad import SileroVad, SileroVadStream, VadWindow

__all__ = ["VadBatcher"]

#: Streams in one model call; more waiting streams go in the next call.
MAX_BATCH: Final = 64


@dataclass(slots=True, eq=False)
class _Request:
    stream: SileroVadStream
    inputs: npt.NDArray[np.float32]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[float]]
    probabilities: list[float] = field(default_factory=list)


class VadBatcher:
    """Infers VAD windows for many streams at once, off the event loop.

    One per process (:meth:`shared`); safe to call from any event loop. A stream
    must not have two requests in flight (each session awaits its own).
    """

    _shared: VadBatcher | None = None
    _shared_lock: Final = threading.Lock()

    def __init__(self, model: SileroVad | None = None, *, max_batch: int = MAX_BATCH) -> None:
        self._model = model if model is not None else SileroVad.shared()
        self._max_batch = max_batch
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="vad-batch", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> VadBatcher:
        """The process-wide batcher, started on first use."""
        shared = cls._shared
        if shared is None:
            with cls._shared_lock:
                shared = cls._shared
                if shared is None:
                    shared = cls._shared = cls()
        return shared

    @property
    def model(self) -> SileroVad:
        return self._model

    async def windows(self, stream: SileroVadStream, samples: npt.NDArray[np.floating]) -> list[VadWindow]:
        """Feed ``samples`` (16 kHz) to ``stream``; the windows they complete, with probabilities."""
        inputs = stream.take_windows(samples)
        if inputs.shape[0] == 0:
            return []  # no window completed: nothing to wait for
        loop = asyncio.get_running_loop()
        request = _Request(stream, inputs, loop, loop.create_future())
        self._requests.put(request)
        probabilities = await request.future
        return stream.windows_ending(probabilities)

    def close(self) -> None:
        """Stop the worker thread (requests still queued are abandoned)."""
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
            try:
                self._infer(batch)
            except Exception as exc:  # noqa: BLE001 - a model failure fails these requests, not the thread
                self._deliver(batch, exc)
            else:
                self._deliver(batch, None)

    def _infer(self, batch: list[_Request]) -> None:
        steps = max(request.inputs.shape[0] for request in batch)
        for step in range(steps):
            active = [request for request in batch if step < request.inputs.shape[0]]
            windows = np.stack([request.inputs[step] for request in active])
            states = np.concatenate([request.stream.state for request in active], axis=1)
            probabilities, next_states = self._model.infer_batch(windows, states)
            for index, request in enumerate(active):
                state = np.ascontiguousarray(next_states[:, index : index + 1, :])
                request.probabilities.append(request.stream.advance(float(probabilities[index]), state))

    @staticmethod
    def _deliver(batch: list[_Request], error: Exception | None) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        for request in batch:
            by_loop.setdefault(request.loop, []).append(request)
        for loop, requests in by_loop.items():
            # One wake-up of the loop per batch, however many sessions it served.
            try:
                loop.call_soon_threadsafe(_resolve, requests, error)
            except RuntimeError:  # that loop has closed: nobody is waiting any more
                continue


def _resolve(requests: list[_Request], error: Exception | None) -> None:
    for request in requests:
        if request.future.done():
            continue  # the session went away while its windows were inferred
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(request.probabilities)
