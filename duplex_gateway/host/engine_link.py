"""The calls a session makes into its engine session: in order, one way, from one task.

The session decides synchronously; the calls it decides on are handed to an
:class:`EngineLink`, which makes them one after another on its own task. An engine
whose appends never wait (``appends_without_waiting``) has an append made at once
instead, in the task that submits it, when nothing is queued or running before it: the
order is the same, and a caller's frame costs no task switch while the engine keeps up. Nothing
waits for an engine call while holding the session: the caller's audio keeps
flowing, and the engine's events keep coming back, while a slow call runs. The
link counts the caller audio it holds; above its high water mark the connection
stops reading the socket until the engine has caught up (input backpressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

from duplex_gateway.engine import port
from duplex_gateway.ops.metrics import GatewayMetrics, call_name
from duplex_gateway.session.machine import (
    AckPlayback,
    AddFunctionCall,
    AddFunctionOutput,
    AddItem,
    AppendAudio,
    AppendText,
    BargeInEngine,
    CallerPaused,
    CancelInput,
    CancelResponse,
    ClearInput,
    CommitInput,
    DeleteItem,
    EngineCall,
    SignalTurn,
    StartResponse,
    TruncateReply,
    UpdateEngine,
)

__all__ = ["MAX_MERGED_AUDIO_BYTES", "EngineLink"]

logger = logging.getLogger(__name__)

#: Caller audio handed to the engine in one call at most, when several appends are waiting.
MAX_MERGED_AUDIO_BYTES = 64 * 1024


class EngineLink:
    """Makes one engine session's calls in the order they were submitted.

    ``on_error`` hears of every call that failed or timed out (after
    ``timeout_s``); the link goes on with the next call. ``on_done`` hears of
    every call the engine took (the session waits on some: ``UpdateEngine``).
    ``metrics`` hears how long each call took, or how it failed.
    """

    def __init__(
        self,
        engine_session: port.EngineSession,
        *,
        timeout_s: float,
        on_error: Callable[[EngineCall, BaseException], None],
        high_water_bytes: int,
        name: str,
        on_done: Callable[[EngineCall], None] | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.engine_session = engine_session
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._on_error = on_error
        self._on_done = on_done
        self._high_water = high_water_bytes
        self._calls: deque[EngineCall] = deque()
        #: A call is being made on the link's task (an append made at once must not overtake it).
        self._busy = False
        self._inline = engine_session.appends_without_waiting
        self._audio_bytes = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task = asyncio.create_task(self._run(), name=f"engine-link:{name}")

    @property
    def calling(self) -> bool:
        """A call is being made on the link's own task (it may still be waiting for the engine)."""
        return self._busy

    @property
    def backlogged(self) -> bool:
        """More caller audio is waiting for the engine than the high water mark."""
        return self._audio_bytes > self._high_water

    def submit(self, call: EngineCall) -> None:
        """Make ``call`` after every call submitted before it; returns at once."""
        if self._inline and not self._busy and not self._calls and isinstance(call, AppendAudio):
            self._append_now(call)
            return
        self._calls.append(call)
        if isinstance(call, AppendAudio):
            self._audio_bytes += len(call.pcm)
            if self._audio_bytes > self._high_water:
                self._drained.clear()
        self._wake.set()

    async def drained(self) -> None:
        """Wait until the audio waiting for the engine is at most half the high water mark."""
        await self._drained.wait()

    async def close(self) -> None:
        """Stop making calls (those still queued are dropped: the engine session is closing)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._calls.clear()
        self._drained.set()

    def _append_now(self, call: AppendAudio) -> None:
        """Make an append of an engine whose appends never wait, here and now."""
        began = time.monotonic()
        step = cast("Coroutine[Any, Any, None]", self._make(call))
        try:
            step.send(None)
        except StopIteration:
            if self._metrics is not None:
                self._metrics.engine_call("append_audio", time.monotonic() - began)
            if self._on_done is not None:
                self._on_done(call)
            return
        except Exception as exc:  # reported as the link's task reports a failed call
            refused = isinstance(exc, port.EngineRefused | port.EngineSessionLimit)
            if self._metrics is not None:
                self._metrics.engine_call_failed("append_audio", "refused" if refused else "failed")
            if isinstance(exc, port.EngineRefused):
                logger.info("engine refused AppendAudio: %s", exc)
            else:
                logger.exception("engine call AppendAudio failed")
            self._on_error(call, exc)
            return
        # It waited after all: the engine broke its word. The append is lost; say so loudly.
        step.close()
        self._inline = False
        problem = RuntimeError(
            f"{type(self.engine_session).__name__}.append_audio waited, though its engine says its appends never wait"
        )
        logger.error("%s; its appends go through the link's task from now on", problem)
        if self._metrics is not None:
            self._metrics.engine_call_failed("append_audio", "failed")
        self._on_error(call, problem)

    async def _run(self) -> None:
        calls = self._calls
        while True:
            if not calls:
                self._wake.clear()
                await self._wake.wait()
                continue
            call = calls.popleft()
            self._busy = True
            if isinstance(call, AppendAudio) and calls and _mergeable(call, calls[0]):
                # The engine fell behind: what waits goes in as one append, in order, so a
                # busy engine pays its per-call cost once per batch instead of once per frame.
                call = _merge(call, calls)
            try:
                with self._metrics.timed_call(call_name(call)) if self._metrics else contextlib.nullcontext():
                    async with asyncio.timeout(self._timeout_s):
                        await self._make(call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any engine failure is reported the same way
                if isinstance(exc, port.EngineRefused):
                    logger.info("engine refused %s: %s", type(call).__name__, exc)
                else:
                    logger.exception("engine call %s failed", type(call).__name__)
                self._on_error(call, exc)
            else:
                if self._on_done is not None:
                    self._on_done(call)
            finally:
                self._busy = False
                if isinstance(call, AppendAudio):
                    self._audio_bytes -= len(call.pcm)
                    if self._audio_bytes <= self._high_water // 2:
                        self._drained.set()

    def _make(self, call: EngineCall) -> Awaitable[None]:
        session = self.engine_session
        if isinstance(call, AppendAudio):
            return session.append_audio(
                call.pcm, is_speech=call.is_speech, hints=call.hints, video_frames=call.video_frames
            )
        if isinstance(call, CommitInput):
            return session.commit(
                item_id=call.item_id,
                response_id=call.response_id,
                final=call.final,
                engine_decides=call.engine_decides,
                is_speech=call.is_speech,
            )
        if isinstance(call, CancelInput):
            return session.cancel_input()
        if isinstance(call, AppendText):
            return session.append_text(call.text)
        if isinstance(call, SignalTurn):
            return session.signal_turn(call.event, call.payload)
        if isinstance(call, CallerPaused):
            return session.caller_paused()
        if isinstance(call, ClearInput):
            return session.clear_input()
        if isinstance(call, AddItem):
            return session.add_item(
                item_id=call.item_id,
                role=call.role,
                text=call.text,
                previous_item_id=call.previous_item_id,
                images=call.images,
            )
        if isinstance(call, DeleteItem):
            return session.delete_item(call.item_id, response_id=call.response_id, call_id=call.call_id)
        if isinstance(call, StartResponse):
            return session.create_response(
                response_id=call.response_id, instructions=call.instructions, options=call.options
            )
        if isinstance(call, AddFunctionCall):
            return session.add_function_call(
                item_id=call.item_id,
                call_id=call.call_id,
                name=call.name,
                arguments=call.arguments,
                previous_item_id=call.previous_item_id,
            )
        if isinstance(call, AddFunctionOutput):
            return session.add_function_output(
                item_id=call.item_id,
                call_id=call.call_id,
                output=call.output,
                previous_item_id=call.previous_item_id,
            )
        if isinstance(call, CancelResponse):
            return session.cancel_response(call.response_id)
        if isinstance(call, BargeInEngine):
            return session.barge_in()
        if isinstance(call, AckPlayback):
            return session.ack_playback(response_id=call.response_id, played_ms=call.played_ms)
        if isinstance(call, TruncateReply):
            return session.truncate_reply(response_id=call.response_id, audio_end_ms=call.audio_end_ms)
        if isinstance(call, UpdateEngine):
            return session.update(call.config)
        raise TypeError(f"not an engine call: {call!r}")


def _mergeable(first: AppendAudio, call: EngineCall) -> bool:
    """``call`` can ride in one append with ``first``: audio the client said the same of.

    Camera frames ride at the end of the audio they were taken with, so an append
    with frames ends a merge: it may close one, never open or continue it.
    """
    return (
        isinstance(call, AppendAudio)
        and not first.video_frames
        and call.is_speech == first.is_speech
        and call.hints == first.hints
    )


def _merge(first: AppendAudio, calls: deque[EngineCall]) -> AppendAudio:
    """``first`` and the appends right behind it in ``calls`` (taken out), as one append."""
    parts = [first.pcm]
    size = len(first.pcm)
    frames = first.video_frames
    while not frames and calls and _mergeable(first, nxt := calls[0]):
        assert isinstance(nxt, AppendAudio)
        if size + len(nxt.pcm) > MAX_MERGED_AUDIO_BYTES:
            break
        calls.popleft()
        parts.append(nxt.pcm)
        size += len(nxt.pcm)
        frames = nxt.video_frames
    return AppendAudio(pcm=b"".join(parts), is_speech=first.is_speech, hints=first.hints, video_frames=frames)
