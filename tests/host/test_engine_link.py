"""How the engine link merges caller audio that waited for a busy engine, and makes an idle engine's appends at once."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from duplex_gateway.engine.echo import EchoEngine, EchoSession
from duplex_gateway.host.engine_link import EngineLink, _merge
from duplex_gateway.session.machine import AppendAudio, ClearInput, CommitInput, EngineCall

FRAME = "/9j/4AAQ"


def test_waiting_audio_goes_in_as_one_append_in_order() -> None:
    calls: deque[EngineCall] = deque([AppendAudio(pcm=b"b"), AppendAudio(pcm=b"c"), ClearInput()])
    assert _merge(AppendAudio(pcm=b"a"), calls) == AppendAudio(pcm=b"abc")
    assert list(calls) == [ClearInput()]


def test_camera_frames_ride_the_end_of_the_audio_they_came_with() -> None:
    # A frame closes a merge: it stays at the end of its own audio, never moves onto later audio.
    calls: deque[EngineCall] = deque(
        [AppendAudio(pcm=b"b", video_frames=(FRAME,)), AppendAudio(pcm=b"c"), AppendAudio(pcm=b"d")]
    )
    assert _merge(AppendAudio(pcm=b"a"), calls) == AppendAudio(pcm=b"ab", video_frames=(FRAME,))
    assert _merge(calls.popleft(), calls) == AppendAudio(pcm=b"cd")
    # An append that carries frames takes no later audio with it.
    later: deque[EngineCall] = deque([AppendAudio(pcm=b"f")])
    assert _merge(AppendAudio(pcm=b"e", video_frames=(FRAME,)), later) == AppendAudio(
        pcm=b"e", video_frames=(FRAME,)
    )
    assert list(later) == [AppendAudio(pcm=b"f")]


# -- appends made at once, for an engine whose appends never wait ------------------------


class Recording(EchoSession):
    """The echo engine's session, noting each call it takes and whether the link's task made it."""

    def __init__(self, engine: EchoEngine) -> None:
        super().__init__(engine, "s")
        self.calls: list[tuple[str, bytes | None, bool]] = []
        self.commit_gate = asyncio.Event()
        self.link_task: asyncio.Task[None] | None = None

    def _note(self, name: str, pcm: bytes | None) -> None:
        self.calls.append((name, pcm, asyncio.current_task() is self.link_task))

    async def append_audio(self, pcm: bytes, **hints: Any) -> None:
        self._note("append", pcm)
        await super().append_audio(pcm, **hints)

    async def commit(self, **kwargs: Any) -> None:
        self._note("commit", None)
        await self.commit_gate.wait()  # a slow engine call: the link is busy meanwhile


def _link(session: Recording, errors: list[BaseException]) -> EngineLink:
    link = EngineLink(
        session, timeout_s=5.0, on_error=lambda _, exc: errors.append(exc), high_water_bytes=1 << 20, name="s"
    )
    session.link_task = link._task
    return link


async def test_an_append_is_made_before_submit_returns_when_nothing_is_ahead_of_it() -> None:
    session, errors = Recording(EchoEngine(rate=16_000)), []
    link = _link(session, errors)
    link.submit(AppendAudio(pcm=b"\x01\x00"))
    # Made already, in this task: no task switch for a frame while the engine keeps up.
    assert session.calls == [("append", b"\x01\x00", False)]
    assert not link.backlogged and errors == []
    await link.close()


async def test_an_append_behind_a_running_call_waits_its_turn() -> None:
    session, errors = Recording(EchoEngine(rate=16_000)), []
    link = _link(session, errors)
    link.submit(CommitInput(item_id="i1", response_id=None))
    await asyncio.sleep(0)  # the link's task is inside the commit now
    link.submit(AppendAudio(pcm=b"\x02\x00"))
    link.submit(AppendAudio(pcm=b"\x03\x00"))
    assert session.calls == [("commit", None, True)]  # nothing overtook the commit
    session.commit_gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    # In order, on the link's task (merged, as audio that waited is).
    assert session.calls == [("commit", None, True), ("append", b"\x02\x00\x03\x00", True)]
    link.submit(AppendAudio(pcm=b"\x04\x00"))  # idle again: at once
    assert session.calls[-1] == ("append", b"\x04\x00", False)
    assert errors == []
    await link.close()


async def test_an_engine_that_waits_after_promising_not_to_is_reported_and_goes_through_the_task() -> None:
    class Waits(Recording):
        async def append_audio(self, pcm: bytes, **hints: Any) -> None:
            self._note("append", pcm)
            await asyncio.sleep(0)

    session, errors = Waits(EchoEngine(rate=16_000)), []
    link = _link(session, errors)
    link.submit(AppendAudio(pcm=b"\x05\x00"))
    assert len(errors) == 1 and "append_audio waited" in str(errors[0])
    link.submit(AppendAudio(pcm=b"\x06\x00"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert session.calls == [("append", b"\x05\x00", False), ("append", b"\x06\x00", True)]
    await link.close()
