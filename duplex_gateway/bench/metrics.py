"""What the bench measures, and the probes that measure the server process.

Latencies are kept as plain lists of milliseconds and summarized by
:func:`summarize`. :class:`ProcessProbe` reads a server's CPU time and resident
memory from ``/proc`` (its whole process tree: a server may fork helpers), so
the bench needs no extra dependency for it. :class:`LoopLag` watches the bench's
own event loop: when the load generator cannot keep its timers, every latency it
reports is suspect, and the report says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LoopLag", "ProcessProbe", "percentile", "summarize"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """``n``, ``p50``, ``p95``, ``p99``, ``max`` of ``values`` (milliseconds, rounded to 0.1)."""

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p95": r(percentile(values, 95)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)) if values else None,
    }


class ProcessProbe:
    """CPU seconds and RSS of a process and every process below it, from ``/proc``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            stat = _read_stat(int(entry.name))
            if stat is not None:
                children.setdefault(int(stat[1]), []).append(int(entry.name))
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, []))
        return tree

    def cpu_seconds(self) -> float:
        """User + system CPU time consumed so far by the process tree."""
        total = 0
        for pid in self._tree():
            stat = _read_stat(pid)
            if stat is not None:
                total += int(stat[11]) + int(stat[12])  # utime, stime
        return total / _CLOCK_TICKS

    def rss_bytes(self) -> int:
        """Resident memory of the process tree now."""
        total = 0
        for pid in self._tree():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        return total


def _read_stat(pid: int) -> list[str] | None:
    # The command name may hold spaces or parentheses: split after its closing one.
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


class LoopLag:
    """How late this event loop wakes a 10 ms timer, sampled while it runs."""

    INTERVAL_S = 0.01

    def __init__(self) -> None:
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="bench:loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        clock = time.perf_counter  # uvloop's own clock ticks in whole milliseconds
        while True:
            before = clock()
            await asyncio.sleep(self.INTERVAL_S)
            self.samples_ms.append(max(0.0, (clock() - before - self.INTERVAL_S) * 1000.0))
