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


def test_a_capped_priority_runs_one_job_at_a_time() -> None:
    workers = PriorityWorkers(2, limits={Priority.FINAL: 1})
    lock = threading.Lock()
    running = peak = 0

    def final() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    jobs = [workers.submit(Priority.FINAL, final) for _ in range(4)]
    speech = workers.submit(Priority.SPEECH, lambda: "spoken")
    assert speech.result(timeout=5) == "spoken"  # the second thread is still free for other work
    for job in jobs:
        job.result(timeout=5)
    assert peak == 1
    workers.shutdown()


def test_yielding_jobs_wait_while_anything_more_urgent_runs_or_waits() -> None:
    workers = PriorityWorkers(2, limits={Priority.FINAL: 1}, yielding=frozenset({Priority.BACKGROUND}))
    gate = threading.Event()
    order: list[str] = []
    first = workers.submit(Priority.FINAL, gate.wait, 5)
    second = workers.submit(Priority.FINAL, order.append, "final")  # held back by the cap
    partial = workers.submit(Priority.BACKGROUND, order.append, "partial")
    time.sleep(0.1)
    assert not partial.done() and workers.running(Priority.FINAL) == 1  # a thread is free, yet it waits
    gate.set()
    for job in (first, second, partial):
        job.result(timeout=5)
    assert order == ["final", "partial"]
    workers.shutdown()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PriorityWorkers(1, limits={Priority.FINAL: 0})
