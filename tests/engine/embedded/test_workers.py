from __future__ import annotations

import threading
import time

import pytest

from duplex_gateway.engine.embedded.workers import Priority, PriorityWorkers


def test_the_most_urgent_queued_job_runs_first() -> None:
    workers = PriorityWorkers(1)
    gate = threading.Event()
    order: list[str] = []
    blocker = workers.submit(Priority.BACKGROUND, gate.wait, 5)
    time.sleep(0.05)  # the only thread is now busy
    jobs = [
        workers.submit(Priority.BACKGROUND, order.append, "partial"),
        workers.submit(Priority.FINAL, order.append, "final"),
        workers.submit(Priority.SPEECH, order.append, "speech-1"),
        workers.submit(Priority.SPEECH, order.append, "speech-2"),
    ]
    gate.set()
    for job in [blocker, *jobs]:
        job.result(timeout=5)
    assert order == ["speech-1", "speech-2", "final", "partial"]
    workers.shutdown()


def test_results_exceptions_and_cancellation() -> None:
    workers = PriorityWorkers(2)
    assert workers.submit(Priority.FINAL, sum, [1, 2, 3]).result(timeout=5) == 6
    with pytest.raises(ZeroDivisionError):
        workers.submit(Priority.FINAL, lambda: 1 / 0).result(timeout=5)
    gate = threading.Event()
    busy = [workers.submit(Priority.SPEECH, gate.wait, 5) for _ in range(2)]
    time.sleep(0.05)
    queued = workers.submit(Priority.BACKGROUND, lambda: "ran")
    assert queued.cancel()
    gate.set()
    for job in busy:
        job.result(timeout=5)
    workers.shutdown()
    with pytest.raises(RuntimeError):
        workers.submit(Priority.FINAL, lambda: None)


def test_shutdown_cancels_queued_jobs() -> None:
    workers = PriorityWorkers(1)
    gate = threading.Event()
    running = workers.submit(Priority.SPEECH, gate.wait, 5)
    time.sleep(0.05)
    waiting = workers.submit(Priority.FINAL, lambda: "never")
    workers.shutdown()
    gate.set()
    assert running.result(timeout=5) is True
    assert waiting.cancelled()
