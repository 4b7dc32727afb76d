"""A fixed pool of inference threads that runs the most urgent job first.

A caller waiting for the first words of a reply should not wait behind another
caller's partial transcript: jobs carry a :class:`Priority`, and each free
thread takes the most urgent job queued (first come, first served within a
priority).

On a CPU with as few cores as threads, a job that merely could be useful must
not take the cores from one somebody waits for: each Whisper or Piper call
already spreads over every core, and a partial transcript holds the GIL while
it decodes. So a priority may be capped to a number of jobs at a time (the
engine lets one speculative transcription run at once, keeping a thread free
for committed turns and replies), and background jobs may be made to wait while
anything more urgent runs or waits: partials fall behind under load (the
engine then drops their backlog) instead of slowing down a reply.
"""

from __future__ import annotations

import concurrent.futures
import enum
import heapq
import itertools
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

__all__ = ["Priority", "PriorityWorkers", "default_workers"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Priority(enum.IntEnum):
    """Lower runs first."""

    SPEECH = 0  # reply audio someone is waiting to hear
    FINAL = 1  # a committed turn's final transcript, which the reply waits for
    EARLY = 2  # a guess at a turn's transcript when its caller pauses
    BACKGROUND = 3  # partial transcripts, decoder upkeep


class PriorityWorkers:
    """``workers`` daemon threads draining one priority queue.

    ``limits``: the most jobs of a priority that may run at once (unlimited when
    absent). ``yielding``: priorities whose jobs start only while no more
    urgent job is running or queued.
    """

    def __init__(
        self,
        workers: int,
        *,
        name: str = "inference",
        limits: Mapping[Priority, int] | None = None,
        yielding: frozenset[Priority] = frozenset(),
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if limits and min(limits.values()) < 1:
            raise ValueError("a priority's limit must be at least 1")
        self._heap: list[tuple[int, int, concurrent.futures.Future[Any], Callable[[], Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._limits = dict(limits or {})
        self._yielding = yielding
        self._running: dict[int, int] = dict.fromkeys(Priority, 0)
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

    def running(self, priority: Priority) -> int:
        """Jobs of ``priority`` running now."""
        with self._ready:
            return self._running[priority]

    def load(self, *priorities: Priority) -> int:
        """Jobs of these priorities running or queued (and not cancelled) now."""
        with self._ready:
            queued = sum(1 for p, _, future, _ in self._heap if p in priorities and not future.cancelled())
            return queued + sum(self._running[p] for p in priorities)

    def _take(self) -> tuple[int, concurrent.futures.Future[Any], Callable[[], Any]] | None:
        """The most urgent job allowed to start now, out of the heap (lock held)."""
        if not self._limits and not self._yielding:
            if not self._heap:
                return None
            priority, _, future, job = heapq.heappop(self._heap)
            return priority, future, job
        if any(entry[2].cancelled() for entry in self._heap):
            # A cancelled job held back by its priority's cap must not hold back others.
            self._heap = [entry for entry in self._heap if not entry[2].cancelled()]
            heapq.heapify(self._heap)
        for index, (priority, _, future, job) in enumerate(sorted(self._heap)):
            if self._running[priority] >= self._limits.get(Priority(priority), len(self._threads)):
                continue
            if priority in self._yielding and (
                index > 0 or any(self._running[p] for p in Priority if p < priority)
            ):
                # ``index > 0``: a more urgent job is queued, held back only by its limit.
                return None
            self._heap.remove(next(entry for entry in self._heap if entry[2] is future))
            heapq.heapify(self._heap)
            return priority, future, job
        return None

    def _work(self) -> None:
        while True:
            with self._ready:
                while (taken := self._take()) is None and not self._closed:
                    self._ready.wait()
                if taken is None:
                    return
                priority, future, job = taken
                self._running[priority] += 1
            try:
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    result = job()
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            finally:
                with self._ready:
                    self._running[priority] -= 1
                    # A finished job may let a capped or yielding one start.
                    self._ready.notify_all()


def default_workers() -> int:
    """The cores this process may run on: the pool's size unless configured."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
