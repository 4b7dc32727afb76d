"""The reader's one timer per connection: a wait for a message that lasts too long, and nothing else, is cut."""

from __future__ import annotations

import asyncio

from duplex_gateway.host.read_deadline import ReadDeadline

FOREVER = 1e9


async def _wait(deadline: ReadDeadline, seconds: float) -> str:
    """One wait for a message that comes after ``seconds``: what became of it."""
    deadline.begin()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if deadline.expired():
            return "expired"
        raise
    finally:
        deadline.end()
    return "message"


async def test_a_wait_longer_than_the_idle_timeout_is_cut() -> None:
    async def read() -> list[str]:
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(task, 0.05, lambda: FOREVER)
        try:
            return [await _wait(deadline, 0.01), await _wait(deadline, 1.0)]
        finally:
            deadline.close()

    assert await asyncio.wait_for(read(), 2.0) == ["message", "expired"]


async def test_time_spent_between_waits_does_not_count_as_idle() -> None:
    # Many short waits with work between them add up to far more than the idle timeout.
    async def read() -> list[str]:
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(task, 0.05, lambda: FOREVER)
        outcomes = []
        try:
            for _ in range(6):
                outcomes.append(await _wait(deadline, 0.02))
                await asyncio.sleep(0.06)  # busy with the message: not waiting for the client
        finally:
            deadline.close()
        return outcomes

    assert await asyncio.wait_for(read(), 5.0) == ["message"] * 6


async def test_the_sessions_deadline_cuts_a_wait_however_recent_the_last_message() -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.08

    async def read() -> list[str]:
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(task, 10.0, lambda: end)
        outcomes = []
        try:
            while not outcomes or outcomes[-1] == "message":
                outcomes.append(await _wait(deadline, 0.03))
        finally:
            deadline.close()
        return outcomes

    outcomes = await asyncio.wait_for(read(), 2.0)
    assert outcomes[-1] == "expired" and loop.time() >= end


async def test_a_cancellation_of_its_own_goes_on() -> None:
    async def read() -> str:
        task = asyncio.current_task()
        assert task is not None
        deadline = ReadDeadline(task, 10.0, lambda: FOREVER)
        try:
            return await _wait(deadline, 10.0)
        finally:
            deadline.close()

    task = asyncio.create_task(read())
    await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        assert task.cancelled()
    else:
        raise AssertionError("the reader's own cancellation was swallowed")
