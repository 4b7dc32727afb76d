"""Read-only Realtime clients of a live session: dashboards and human takeover watching a phone call.

An observer attaches by call id (``/v1/realtime?call_id=...``, as OpenAI's sideband
connection to a SIP call does) and from then on gets every event of the session
in OpenAI Realtime GA form: the caller's transcripts, DTMF, replies, barge-ins.
It cannot steer the call: whatever it sends is answered with an error, unless the call lets
its sideband control it (a WebRTC call's, as OpenAI's does): then what it sends goes to the
session as the call's own client's events, and only a refusal comes back to it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from duplex_gateway.dialects.realtime import RealtimeDialect
from duplex_gateway.host.closing import Failure, close_for
from duplex_gateway.host.transport import Attachment
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode
from duplex_gateway.vocabulary.frames import Socket

__all__ = ["Control", "Observers"]

#: Hands a sideband client's text to the session; returns why it was refused (None: taken).
Control = Callable[[str], str | None]

#: Observers per session at most; a dashboard that reconnects in a loop cannot pile them up.
MAX_OBSERVERS = 8


class Observers:
    """The observers of one session; each gets its own numbered Realtime event stream."""

    def __init__(
        self, session_id: str, *, max_message_bytes: int, send_queue_size: int, send_timeout_s: float
    ) -> None:
        self.session_id = session_id
        self._max_message_bytes = max_message_bytes
        self._queue_size = send_queue_size
        self._timeout_s = send_timeout_s
        self._watching: dict[Attachment, tuple[RealtimeDialect, list[int]]] = {}

    def __len__(self) -> int:
        return len(self._watching)

    async def serve(
        self, socket: Socket, greeting: ev.ServerEvent, ended: asyncio.Event, control: Control | None = None
    ) -> None:
        """Serve ``socket`` as an observer, ``greeting`` first, until its client leaves or ``ended`` is set.

        ``control``: what the observer sends goes there (a sideband that steers the call).
        """
        attachment = self.attach(socket, greeting)
        if attachment is None:
            refused = close_for(Failure.TOO_MANY_OBSERVERS)
            with contextlib.suppress(Exception):
                await socket.close(int(refused.code), refused.reason)
            return
        try:
            while not ended.is_set():
                message = await socket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                refusal = "a binary frame" if text is None else None
                if control is not None and text is not None:
                    refusal = control(text)
                    if refusal is not None:
                        self.refuse(attachment, refusal, controlling=True)
                    continue
                self.refuse(attachment, refusal or str(text))
        finally:
            await self.finish(attachment, "observer_left" if not ended.is_set() else "call_ended")

    def attach(self, socket: Socket, greeting: ev.ServerEvent) -> Attachment | None:
        """Start sending the session's events to ``socket``, ``greeting`` first (None: too many observers)."""
        if len(self._watching) >= MAX_OBSERVERS:
            return None
        attachment = Attachment(
            socket,
            high_water=self._queue_size,
            stall_timeout_s=self._timeout_s,
            on_stalled=lambda: None,  # a slow observer is dropped by its own writer, never the call
            name=f"observer:{self.session_id}",
        )
        dialect = RealtimeDialect(
            session_id=self.session_id, beta=False, duplex=False, max_message_bytes=self._max_message_bytes
        )
        self._watching[attachment] = (dialect, [0])
        self._send_to(attachment, greeting)
        return attachment

    def send(self, event: ev.ServerEvent) -> None:
        """``event`` to every observer (but ``overlap.decision``: strict Realtime clients know no such event)."""
        if isinstance(event, ev.OverlapDecision):
            return
        for attachment in list(self._watching):
            if attachment.stalled:
                self.detach(attachment)
                continue
            self._send_to(attachment, event)

    def refuse(self, attachment: Attachment, what: str, *, controlling: bool = False) -> None:
        """An observer tried to act on the call (``controlling``: a sideband sent what it may not)."""
        message = what[:200] if controlling else f"observers are read-only: {what[:64]} was not sent"
        self._send_to(attachment, ev.ErrorEvent(code=ErrorCode.INVALID_EVENT, message=message))

    def _send_to(self, attachment: Attachment, event: ev.ServerEvent) -> None:
        dialect, seq = self._watching[attachment]
        frame = dialect.render(event, seq=seq[0] + 1)
        if frame is not None:
            seq[0] += 1
            attachment.send(frame)

    def detach(self, attachment: Attachment) -> None:
        self._watching.pop(attachment, None)

    async def finish(self, attachment: Attachment, reason: str) -> None:
        """Let one observer go (its client left, or the call is over)."""
        self.detach(attachment)
        with contextlib.suppress(Exception):
            await attachment.finish(close_for(Failure.OBSERVER_DONE, reason), self._timeout_s)

    def close_all(self, reason: str) -> None:
        """The session is over: every observer's socket is closed once its events are out."""
        for attachment in list(self._watching):
            attachment.close_after(close_for(Failure.OBSERVER_DONE, reason))
        self._watching.clear()
