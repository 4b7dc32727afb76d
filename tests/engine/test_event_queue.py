"""The engine event queue: order, bounds, and events handed to a taker past an empty queue."""

from __future__ import annotations

import asyncio

import pytest

from duplex_gateway.engine import port
from duplex_gateway.engine.event_queue import EngineEventQueue


def audio(n: int) -> port.EngineAudio:
    return port.EngineAudio(response_id="resp", pcm=bytes([n]))


async def read_all(queue: EngineEventQueue) -> list[port.EngineEvent]:
    return [event async for event in queue.stream()]


async def test_the_stream_reads_in_order_and_ends_after_closed() -> None:
    queue = EngineEventQueue(8)
    for n in range(3):
        await queue.put(audio(n))
    queue.put_urgent(port.EngineClosed(reason="done"))
    events = await read_all(queue)
    assert events == [audio(0), audio(1), audio(2), port.EngineClosed(reason="done")]


async def test_put_urgent_drops_the_oldest_and_offer_the_newest_when_full() -> None:
    queue = EngineEventQueue(2)
    queue.offer(audio(0))
    queue.offer(audio(1))
    queue.offer(audio(2))  # superseded output: dropped
    queue.put_urgent(port.EngineClosed(reason="gone"))  # gets in; audio(0) makes room
    assert await read_all(queue) == [audio(1), port.EngineClosed(reason="gone")]


async def test_a_taker_takes_events_put_past_an_empty_queue() -> None:
    queue = EngineEventQueue(8)
    stream = queue.stream()
    taken: list[port.EngineEvent] = []
    stream.take_at_once(lambda event: taken.append(event) is None)
    await queue.put(audio(0))
    queue.offer(audio(1))
    queue.put_urgent(audio(2))
    assert taken == [audio(0), audio(1), audio(2)]
    # The stream still ends the reader's loop: EngineClosed is never taken at once.
    queue.put_urgent(port.EngineClosed(reason="done"))
    assert [event async for event in stream] == [port.EngineClosed(reason="done")]


async def test_an_event_behind_a_queued_one_is_queued_too() -> None:
    """Order: once the taker declined one event, later ones wait behind it for the stream."""
    queue = EngineEventQueue(8)
    stream = queue.stream()
    taken: list[port.EngineEvent] = []
    willing = False

    def take(event: port.EngineEvent) -> bool:
        if willing:
            taken.append(event)
        return willing

    stream.take_at_once(take)
    await queue.put(audio(0))  # declined: queued
    willing = True
    await queue.put(audio(1))  # the taker would, but audio(0) is still queued
    assert taken == []
    assert await anext(stream) == audio(0)
    assert await anext(stream) == audio(1)
    await queue.put(audio(2))  # the queue is empty again
    assert taken == [audio(2)]


async def test_a_queued_event_the_reader_was_woken_for_is_not_overtaken() -> None:
    """The reader's task, woken for an event, has not run yet: the next event must queue behind it."""
    queue = EngineEventQueue(8)
    stream = queue.stream()
    taken: list[port.EngineEvent] = []
    stream.take_at_once(lambda event: taken.append(event) is None)
    stream.take_at_once(None)
    reader = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)  # the reader waits on the empty queue
    await queue.put(audio(0))  # nobody takes it at once: it wakes the reader
    stream.take_at_once(lambda event: taken.append(event) is None)
    await queue.put(audio(1))  # audio(0) is still queued until the reader runs
    assert taken == []
    assert await reader == audio(0)
    assert await anext(stream) == audio(1)


async def test_take_at_once_none_stops_taking() -> None:
    queue = EngineEventQueue(8)
    stream = queue.stream()
    taken: list[port.EngineEvent] = []
    stream.take_at_once(lambda event: taken.append(event) is None)
    stream.take_at_once(None)
    await queue.put(audio(0))
    assert taken == []
    assert await asyncio.wait_for(anext(stream), 1) == audio(0)


async def test_discard_takes_back_unread_events() -> None:
    queue = EngineEventQueue(8)
    for n in range(4):
        await queue.put(audio(n))
    queue.discard(lambda event: isinstance(event, port.EngineAudio) and event.pcm[0] % 2 == 1)
    queue.put_urgent(port.EngineClosed(reason="done"))
    assert await read_all(queue) == [audio(0), audio(2), port.EngineClosed(reason="done")]


@pytest.mark.parametrize("maxsize", [1, 4])
async def test_put_waits_for_room(maxsize: int) -> None:
    queue = EngineEventQueue(maxsize)
    for n in range(maxsize):
        await queue.put(audio(n))
    blocked = asyncio.create_task(queue.put(audio(99)))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    stream = queue.stream()
    assert await anext(stream) == audio(0)
    await asyncio.wait_for(blocked, 1)
