"""One harness for the engine contract: a started engine, a session, its events.

An :class:`EngineCase` says how to start one engine and what a caller's turn is for
it; :mod:`tests.engine.contract.promises` holds the promises every engine makes
through the port, run over each case. What an engine does not offer is read from
its own :class:`~duplex_gateway.engine.port.EngineCapabilities` (or, for what the port
does not declare, its :class:`~duplex_gateway.engine.spec.EngineSpec`), and the promise
is skipped with the capability named.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from duplex_gateway.engine import port
from duplex_gateway.engine.registry import SPECS
from duplex_gateway.vocabulary.session_config import SessionConfig

E = TypeVar("E", bound=port.EngineEvent)

#: Longest wait for one event an engine owes (a real model on two cores, or a backend over a socket).
EVENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EngineCase:
    """One engine under the contract."""

    #: The engine's name, as its capabilities say it.
    name: str
    #: A fresh engine, not started (the harness starts it and shuts it down).
    build: Callable[[], port.Engine]
    #: A caller's turn (PCM16 mono at the engine's input rate) that gets a spoken reply.
    turn: Callable[[int], bytes]
    #: A turn whose reply lasts long enough to be stopped part-way.
    long_turn: Callable[[int], bytes]

    def __str__(self) -> str:
        return self.name


def require(promise: str, capability: str, engine: port.Engine) -> None:
    """Skip ``promise`` where the engine does not declare ``capability`` (in its capabilities, else its spec)."""
    caps = engine.capabilities
    declared = (
        getattr(caps, capability) if hasattr(caps, capability) else getattr(SPECS[caps.name], capability)
    )
    if not declared:
        pytest.skip(f"{caps.name} does not declare {capability}: the {promise} promise does not apply")


class Events:
    """Everything one engine session emits, read in the background as the gateway would."""

    def __init__(self, session: port.EngineSession) -> None:
        self.items: list[port.EngineEvent] = []
        self._task = asyncio.create_task(self._read(session))

    async def _read(self, session: port.EngineSession) -> None:
        async for event in session.events():
            self.items.append(event)

    @property
    def ended(self) -> bool:
        return self._task.done()

    async def wait(
        self, match: Callable[[port.EngineEvent], bool], timeout: float = EVENT_TIMEOUT_S
    ) -> port.EngineEvent:
        """The first event so far or to come that ``match``\\ es."""
        async with asyncio.timeout(timeout):
            while True:
                for event in self.items:
                    if match(event):
                        return event
                if self._task.done():
                    self._task.result()  # raises what the stream raised
                    pytest.fail(f"the event stream ended without the event awaited: {self.items!r}")
                await asyncio.sleep(0.01)

    async def done(self, response_id: str) -> port.EngineResponseDone:
        event = await self.wait(
            lambda e: isinstance(e, port.EngineResponseDone) and e.response_id == response_id
        )
        assert isinstance(event, port.EngineResponseDone)
        return event

    async def first(self, kind: type[E], response_id: str | None = None) -> E:
        event = await self.wait(
            lambda e: isinstance(e, kind) and response_id in (None, getattr(e, "response_id", None))
        )
        assert isinstance(event, kind)
        return event

    def of(self, response_id: str) -> list[port.EngineEvent]:
        """The events that belong to one reply, in order."""
        return [e for e in self.items if getattr(e, "response_id", None) == response_id]

    def kinds(self, kind: type[E]) -> list[E]:
        return [e for e in self.items if isinstance(e, kind)]

    async def end(self, timeout: float = EVENT_TIMEOUT_S) -> None:
        """Wait for the stream to end (after :class:`~duplex_gateway.engine.port.EngineClosed`)."""
        await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def started(case: EngineCase) -> AsyncIterator[port.Engine]:
    """The case's engine, started; shut down afterwards."""
    engine = case.build()
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


@contextlib.asynccontextmanager
async def opened(
    engine: port.Engine, session_id: str = "contract", config: SessionConfig | None = None
) -> AsyncIterator[tuple[port.EngineSession, Events]]:
    """A session of ``engine`` and its events; closed afterwards."""
    session = await engine.open_session(session_id, config or SessionConfig())
    events = Events(session)
    try:
        yield session, events
    finally:
        await session.close("contract over")
        with contextlib.suppress(TimeoutError):
            await events.end(10)
        await events.stop()


async def speak(session: port.EngineSession, pcm: bytes, *, chunk: int = 640, **kw: Any) -> None:
    """Append ``pcm`` as a client streams it: in small pieces (20 ms at 16 kHz), as fast as taken."""
    for offset in range(0, len(pcm), chunk):
        await session.append_audio(pcm[offset : offset + chunk], **kw)


async def turn(
    session: port.EngineSession, pcm: bytes, *, item_id: str, response_id: str | None, **kw: Any
) -> None:
    """One caller turn: its audio, then its commit (replied to as ``response_id`` when given)."""
    await speak(session, pcm, **kw)
    await session.commit(item_id=item_id, response_id=response_id)
