"""Responses delegation's backend model: the rounds a Live session's dialect asks for, sent over HTTP.

:class:`ResponsesBackend` is the gateway's one backend model (an OpenAI-compatible chat endpoint,
``live.responses`` or the embedded engine's ``engine.embedded.llm``), shared by every session.
:class:`Delegator` runs one session's rounds (each a
:class:`~duplex_gateway.dialects.live_backend.BackendRequest` the dialect made) as tasks, at most
a few at a time and each within a deadline, and hands what the backend streams back to the dialect
as it comes; the connection then sends the dialect's frames and gives the session its commands.
A failure of the backend is a failed round the client and the engine both hear of, never a failed
session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from duplex_gateway.dialects.live_backend import (
    BackendCall,
    BackendCallMade,
    BackendFailed,
    BackendFinished,
    BackendMessage,
    BackendRequest,
    BackendResult,
    BackendText,
)

if TYPE_CHECKING:
    from duplex_gateway.config import GatewaySettings
    from duplex_gateway.engine.embedded.chat_llm import ChatClient, ChatMessage, ChatSettings

__all__ = ["ROUND_TIMEOUT_S", "DelegatingDialect", "Delegator", "ResponsesBackend", "backend_settings"]

logger = logging.getLogger(__name__)

#: The longest one backend round may take, start to end (a stalled backend fails its round).
ROUND_TIMEOUT_S = 120.0


@runtime_checkable
class DelegatingDialect(Protocol):
    """A dialect that hands delegated work to the backend (the Live dialect under Responses delegation)."""

    def take_backend_requests(self) -> list[BackendRequest]:
        """Backend rounds to run now."""
        ...

    def backend_result(self, result: BackendResult) -> None:
        """What a round streamed, as it comes."""
        ...


def backend_settings(settings: GatewaySettings) -> ChatSettings | None:
    """The backend model's endpoint: ``live.responses``, else the embedded engine's model, else None."""
    from duplex_gateway.engine.embedded.spec import chat_settings

    responses = settings.live.responses
    if responses.url is not None:
        return chat_settings(responses, "live.responses")
    if settings.engine.name == "embedded":
        llm = getattr(getattr(settings.engine, "embedded", None), "llm", None)
        if llm is not None and llm.url is not None:
            return chat_settings(llm, "engine.embedded.llm")
    return None


class ResponsesBackend:
    """The gateway's backend model: one chat client for every session's delegated work."""

    def __init__(self, chat: ChatClient) -> None:
        self._chat = chat

    @classmethod
    async def connect(cls, settings: ChatSettings) -> ResponsesBackend | None:
        """The backend at ``settings``, its model the first the endpoint lists when none is configured.

        None when it names no model and lists none; an endpoint that does not answer now is
        still used (it may come up later): its rounds fail until it does.
        """
        from duplex_gateway.engine.embedded.chat_llm import ChatClient, ChatUnavailable

        chat = ChatClient(settings)
        if settings.model:
            return cls(chat)
        try:
            listed = await chat.models()
        except ChatUnavailable as exc:
            listed = ()
            logger.warning("Responses delegation backend %s: %s", chat.where, exc)
        await chat.aclose()
        if not listed:
            logger.warning(
                "Responses delegation backend %s names no model and none is configured (live.responses.model); "
                "the voice engine does the delegated work itself",
                chat.where,
            )
            return None
        return cls(ChatClient(dataclasses.replace(settings, model=listed[0])))

    @property
    def model(self) -> str:
        """The model every round asks for (whatever model the client named)."""
        return self._chat.settings.model

    @property
    def where(self) -> str:
        return self._chat.where

    async def aclose(self) -> None:
        await self._chat.aclose()

    async def stream(self, request: BackendRequest) -> AsyncIterator[BackendResult]:
        """One round: the backend's words and calls as they stream, then its end (or a failure)."""
        from duplex_gateway.engine.embedded.chat_llm import (
            ChatError,
            Finished,
            TextDelta,
            ToolCallDone,
        )

        respond = request.response_id
        try:
            stream = self._chat.stream(
                [_chat_message(m) for m in request.messages],
                tools=request.tools,
                tool_choice=request.tool_choice,
                max_tokens=request.max_output_tokens,
            )
            async with contextlib.aclosing(stream) as events:
                async for item in events:
                    if isinstance(item, TextDelta):
                        yield BackendText(response_id=respond, delta=item.text)
                    elif isinstance(item, ToolCallDone):
                        call = BackendCall(
                            call_id=item.call.id, name=item.call.name, arguments=item.call.arguments
                        )
                        yield BackendCallMade(response_id=respond, call=call)
                    elif isinstance(item, Finished):
                        yield BackendFinished(
                            response_id=respond,
                            reason=item.reason,
                            input_tokens=item.input_tokens,
                            output_tokens=item.output_tokens,
                        )
        except ChatError as exc:
            yield BackendFailed(response_id=respond, message=str(exc))


def _chat_message(message: BackendMessage) -> ChatMessage:
    from duplex_gateway.engine.embedded.chat_llm import ChatMessage, ChatToolCall

    return ChatMessage(
        role=message.role,  # type: ignore[arg-type]  # the dialect writes chat roles only
        content=message.content,
        tool_calls=tuple(
            ChatToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in message.tool_calls
        ),
        tool_call_id=message.tool_call_id,
    )


class Delegator:
    """Runs one session's backend rounds and hands their results to its dialect."""

    #: Rounds of one session in flight at once; the dialect bounds its delegations below this.
    MAX_RUNNING = 8

    def __init__(
        self,
        backend: ResponsesBackend,
        dialect: DelegatingDialect,
        *,
        delivered: Callable[[], None],
        name: str,
        timeout_s: float = ROUND_TIMEOUT_S,
    ) -> None:
        """``delivered`` is called after each result the dialect took (its frames and commands are due)."""
        self._backend = backend
        self._dialect = dialect
        self._delivered = delivered
        self._name = name
        self._timeout_s = timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def poll(self) -> None:
        """Start the rounds the dialect asks for."""
        if self._closed:
            return
        for request in self._dialect.take_backend_requests():
            if len(self._tasks) >= self.MAX_RUNNING:
                refused = BackendFailed(response_id=request.response_id, message="too many rounds in flight")
                asyncio.get_running_loop().call_soon(self._deliver, refused)  # not within the step polling
                continue
            task = asyncio.get_running_loop().create_task(self._run(request), name=f"delegation-{self._name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, request: BackendRequest) -> None:
        ended = False
        try:
            async with asyncio.timeout(self._timeout_s):
                async for result in self._backend.stream(request):
                    ended = isinstance(result, BackendFinished | BackendFailed)
                    self._deliver(result)
            if not ended:
                self._deliver(
                    BackendFailed(response_id=request.response_id, message="the backend sent no end")
                )
        except TimeoutError:
            self._deliver(
                BackendFailed(
                    response_id=request.response_id,
                    message=f"{self._backend.where} did not finish within {self._timeout_s:g} s",
                )
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must cost this round only
            logger.exception("delegation round %s of session %s failed", request.response_id, self._name)
            self._deliver(BackendFailed(response_id=request.response_id, message="internal error"))

    def _deliver(self, result: BackendResult) -> None:
        if self._closed:
            return
        self._dialect.backend_result(result)
        self._delivered()

    async def close(self) -> None:
        """Give up every round in flight (the session ends): their HTTP requests close."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
