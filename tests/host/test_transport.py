"""The attachment's writes: at once while the socket takes them, queued behind anything waiting, in order."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from duplex_gateway.host.closing import Close
from duplex_gateway.host.transport import Attachment
from duplex_gateway.vocabulary.errors import CloseCode


class PausingSocket:
    """A socket that writes at once unless paused; a paused one makes awaiting sends wait for it."""

    def __init__(self) -> None:
        self.wire: list[str] = []
        self.direct: list[str] = []
        self.resumed = asyncio.Event()
        self.resumed.set()

    def write_now(self, frame: str | bytes) -> bool:
        if not self.resumed.is_set():
            return False
        assert isinstance(frame, str)
        self.wire.append(frame)
        self.direct.append(frame)
        return True

    async def send_text(self, data: str) -> None:
        await self.resumed.wait()
        self.wire.append(data)

    async def receive(self) -> MutableMapping[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        pass


def _attach(socket: PausingSocket, queued: list[int]) -> Attachment:
    return Attachment(
        socket,
        high_water=100,
        stall_timeout_s=5.0,
        on_stalled=lambda: None,
        name="t",
        on_queued=queued.append,
    )


async def test_frames_go_out_at_once_while_the_socket_takes_them() -> None:
    socket, queued, sent_at = PausingSocket(), [], []
    attachment = _attach(socket, queued)
    attachment.send("a")
    attachment.send("b", on_sent=sent_at.append)
    # Written before send returned: no task switch, and the caller hears of it at once.
    assert socket.direct == ["a", "b"] and len(sent_at) == 1 and queued == [0, 0]
    await attachment.finish(None, 1.0)


async def test_frames_behind_a_paused_socket_keep_their_order() -> None:
    socket, queued = PausingSocket(), []
    attachment = _attach(socket, queued)
    attachment.send("a")
    socket.resumed.clear()
    attachment.send("b")  # the socket pushes back: queued for the writer
    await asyncio.sleep(0)  # the writer takes "b" and waits on the socket
    socket.resumed.set()  # the socket would take a direct write now, but "b" is not written yet
    attachment.send("c")
    attachment.send("d")
    await attachment.finish(Close(CloseCode.NORMAL, "done"), 1.0)
    assert socket.wire == ["a", "b", "c", "d"]
    assert socket.direct == ["a"]


async def test_nothing_is_written_after_a_close_is_queued() -> None:
    socket, queued = PausingSocket(), []
    attachment = _attach(socket, queued)
    attachment.send("a")
    attachment.close_after(Close(CloseCode.NORMAL, "done"))
    attachment.send("late")
    await attachment.finish(None, 1.0)
    assert socket.wire == ["a"]
