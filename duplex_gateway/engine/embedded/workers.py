"""A fixed pool of inference threads that runs the most urgent job first.

A caller waiting for the first words of a reply should not wait behind another
caller's partial transcript: jobs carry a :class:`Priority`, and each free
thread takes the most urgent job queued (first come, first served within a
priority).
"""

from __future__ import annotations

import concurrent.futures
import enum
import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["Priority", "PriorityWorkers"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Priority(enum.IntEnum):
    """Lower runs first."""

    SPEECH = 0  # reply audio someone is waiting to hear
    FINAL = 1  # a turn's final transcript, which the reply waits for
    BACKGROUND = 2  # partial transcripts, decoder upkeep


class PriorityWorkers:
    """``workers`` daemon threads draining one priority queue."""

    def __init__(self, workers: int, *, name: str = "inference") -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._heap: list[tuple[int, int, concurrent.futures.Future[Any], Callable[[], Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, priority: Priority, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        """Queue ``fn(*args, **kwargs)``; cancelling the future before it starts drops the job."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the worker pool is shut down")
            heapq.heappush(self._heap, (priority, next(self._order), future, lambda: fn(*args, **kwargs)))
            self._ready.notify()
        return future

    def shutdown(self) -> None:
        """Refuse new jobs, cancel the queued ones; running jobs finish on their own."""
        with self._ready:
            self._closed = True
            for _, _, future, _ in self._heap:
                future.cancel()
            self._heap.clear()
            self._ready.notify_all()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._closed:
                    self._ready.wait()
                if not self._heap:
                    return
                _, _, future, job = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)
