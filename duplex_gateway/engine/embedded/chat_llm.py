"""An optional language model for the embedded engine: any OpenAI-compatible chat-completions endpoint.

:class:`ChatClient` streams a reply from ``POST {url}/chat/completions`` (vLLM, llama.cpp's
server, Ollama, hosted APIs) as :class:`TextDelta`, :class:`ToolCallDelta` and
:class:`ToolCallDone` items, then one :class:`Finished`. :func:`sentences` groups the streamed
text into speakable sentences, so synthesis starts long before the reply is complete.

Failures split by what the caller can still do. :class:`ChatUnavailable` comes before any
output: nothing was said yet, so the caller falls back to the rule-based responder.
:class:`ChatStreamError` comes after some output. Iterate a stream under
``contextlib.aclosing``: a barge-in that cancels the reply then closes the HTTP response at once,
which is what tells the server to stop generating.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Final, Literal

import httpx2

from duplex_gateway.engine.embedded.tts import split_sentences
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice

__all__ = [
    "ChatClient",
    "ChatError",
    "ChatEvent",
    "ChatMessage",
    "ChatRole",
    "ChatSettings",
    "ChatStreamError",
    "ChatToolCall",
    "ChatUnavailable",
    "Finished",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallDone",
    "sentences",
]

#: Text of one reply beyond this is dropped and the reply ends as ``length``: a runaway model
#: must not talk for an hour.
MAX_TEXT_CHARS: Final = 16_384
#: One tool call's arguments beyond this break the stream (truncated JSON is useless).
MAX_ARGUMENT_CHARS: Final = 65_536
#: A sentence with no break this long is cut at a comma or space, so speech can start.
LONG_RUN_CHARS: Final = 200
#: One SSE event beyond this is not a chat chunk: it breaks the stream rather than eat memory.
_MAX_EVENT_CHARS: Final = 1 << 20
_ERROR_BODY_BYTES: Final = 4096
_DETAIL_CHARS: Final = 300
_PROBE_TIMEOUT_S: Final = 2.0
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

ChatRole = Literal["system", "user", "assistant", "tool"]
_ROLES: Final = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatSettings:
    """Where the model is and how it is asked."""

    #: Base URL of the API, up to its version: ``http://127.0.0.1:8080/v1``.
    url: str
    model: str
    #: Sent as ``Authorization: Bearer``; kept out of reprs and error messages.
    api_key: str | None = field(default=None, repr=False)
    #: Longest wait for the connection, the answer and its first chunk.
    timeout_s: float = 10.0
    #: Longest silence between two chunks once the reply streams.
    idle_timeout_s: float = 30.0
    max_tokens: int | None = None
    temperature: float | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the chat url must start with http:// or https://, not {self.url!r}")
        if self.timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("chat timeouts must be positive")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("chat max_tokens must be at least 1")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError("chat temperature must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatToolCall:
    """A function call the model made."""

    id: str
    name: str
    #: The arguments as JSON text, as the model wrote them (not validated here).
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatMessage:
    """One message of the conversation, in the roles OpenAI's chat API knows."""

    role: ChatRole
    content: str | None = None
    #: The calls an ``assistant`` message made.
    tool_calls: tuple[ChatToolCall, ...] = ()
    #: The call a ``tool`` message answers.
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"unknown chat role {self.role!r}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, names its tool_call_id")


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDelta:
    """A piece of a tool call as it streams; the first of a call announces it (maybe with no arguments)."""

    index: int
    call_id: str
    name: str
    arguments_delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDone:
    """A tool call with its complete arguments (when the next call starts, or at the end)."""

    call: ChatToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    """The end of a reply: OpenAI's ``finish_reason`` and the token usage when the server sent it."""

    reason: str | None
    input_tokens: int | None
    output_tokens: int | None


ChatEvent = TextDelta | ToolCallDelta | ToolCallDone | Finished


class ChatError(Exception):
    """A chat request that failed."""


class ChatUnavailable(ChatError):
    """The model gave no output: unreachable, refused, an error status, or a broken start. Fall back."""


class ChatStreamError(ChatError):
    """The reply broke off after some output (a malformed chunk, an error event, a stall)."""


class _Broken(Exception):
    """A failure that becomes :class:`ChatUnavailable` or :class:`ChatStreamError` by when it struck."""


class ChatClient:
    """Streams replies from one OpenAI-compatible endpoint; safe to share between sessions."""

    def __init__(self, settings: ChatSettings, *, client: httpx2.AsyncClient | None = None) -> None:
        self._settings = settings
        self._base = settings.url.rstrip("/")
        self._owned = client is None
        self._http = client if client is not None else httpx2.AsyncClient()
        self._timeout = httpx2.Timeout(settings.timeout_s, read=settings.idle_timeout_s)
        # Error messages name the endpoint without any credentials in its URL.
        self._where = str(httpx2.URL(self._base).copy_with(username=None, password=None, query=None))

    @property
    def settings(self) -> ChatSettings:
        return self._settings

    async def aclose(self) -> None:
        """Close the HTTP client if this object made it."""
        if self._owned:
            await self._http.aclose()

    @property
    def where(self) -> str:
        """The endpoint's base URL without any credentials in it (for logs)."""
        return self._where

    async def probe(self) -> bool:
        """Whether ``GET {url}/models`` answers with success within a couple of seconds."""
        try:
            await self.models()
        except ChatUnavailable:
            return False
        return True

    async def models(self) -> tuple[str, ...]:
        """The model ids ``GET {url}/models`` lists, within a couple of seconds.

        Empty when the answer is a success that lists none in OpenAI's shape (some servers
        answer with a bare ``200``). Otherwise raises :class:`ChatUnavailable` with the message
        ``"<url>: <why>"``.
        """
        limit = min(self._settings.timeout_s, _PROBE_TIMEOUT_S)
        try:
            async with asyncio.timeout(limit):
                response = await self._http.get(f"{self._base}/models", headers=self._headers())
                body = await response.aread()
        except TimeoutError:
            raise self._failure(False, f"no answer within {limit:g} s") from None
        except httpx2.HTTPError as exc:
            raise self._failure(False, self._describe(exc)) from None
        if not response.is_success:
            detail = _error_detail(body[:_ERROR_BODY_BYTES])
            raise self._failure(False, f"HTTP {response.status_code}: {detail}")
        try:
            listed = json.loads(body)
        except ValueError:
            return ()
        data = listed.get("data") if isinstance(listed, dict) else None
        return (
            tuple(
                entry["id"]
                for entry in data or ()
                if isinstance(entry, dict) and isinstance(entry.get("id"), str)
            )
            if isinstance(data, list)
            else ()
        )

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[FunctionTool] = (),
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
    ) -> AsyncGenerator[ChatEvent, None]:
        """The reply to ``messages``, item by item, ending with one :class:`Finished`.

        ``max_tokens`` overrides the settings' limit for this reply. Raises
        :class:`ChatUnavailable` before any output, :class:`ChatStreamError` after.
        """
        body = self._body(messages, tools, tool_choice, max_tokens)
        request = self._http.build_request(
            "POST",
            f"{self._base}/chat/completions",
            json=body,
            headers=self._headers() | {"Accept": "text/event-stream"},
            timeout=self._timeout,
        )
        deadline = asyncio.get_running_loop().time() + self._settings.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._http.send(request, stream=True)
        except TimeoutError:
            raise ChatUnavailable(
                f"{self._where} did not answer within {self._settings.timeout_s:g} s"
            ) from None
        except httpx2.HTTPError as exc:
            raise ChatUnavailable(f"{self._where} is unreachable: {self._describe(exc)}") from None
        output = False
        try:
            await self._check(response, deadline)
            reply = _Reply()
            async with contextlib.aclosing(_sse_data(response.aiter_bytes())) as events:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await anext(events, None)
                except TimeoutError:
                    raise _Broken(f"no chunk within {self._settings.timeout_s:g} s") from None
                while data is not None and data != "[DONE]":
                    for item in reply.feed(_decode(data)):
                        output = True
                        yield item
                    if reply.truncated:
                        break
                    data = await anext(events, None)
                if data is None and not reply.truncated and reply.reason is None:
                    raise _Broken("the stream ended before the reply was finished")
            for item in reply.finish():
                yield item
        except _Broken as exc:
            raise self._failure(output, str(exc)) from None
        except httpx2.TimeoutException:
            raise self._failure(output, f"no data for {self._settings.idle_timeout_s:g} s") from None
        except httpx2.HTTPError as exc:
            raise self._failure(output, f"the stream broke: {self._describe(exc)}") from None
        finally:
            # On cancellation too: closing an unfinished response drops the connection, which
            # is how the server learns to stop generating.
            await response.aclose()

    def _failure(self, output: bool, message: str) -> ChatError:
        message = self._redact(f"{self._where}: {message}")
        return ChatStreamError(message) if output else ChatUnavailable(message)

    async def _check(self, response: httpx2.Response, deadline: float) -> None:
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if response.status_code < 300 and content_type == "text/event-stream":
            return
        raw = bytearray()
        with contextlib.suppress(TimeoutError, httpx2.HTTPError):
            async with asyncio.timeout_at(deadline):
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if len(raw) >= _ERROR_BODY_BYTES:
                        break
        detail = _error_detail(bytes(raw[:_ERROR_BODY_BYTES]))
        if response.status_code >= 300:
            raise _Broken(f"HTTP {response.status_code}: {detail}")
        raise _Broken(f"answered {content_type or 'no content type'}, not an event stream: {detail}")

    def _headers(self) -> dict[str, str]:
        key = self._settings.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _redact(self, text: str) -> str:
        # Some servers echo a rejected key back in their error message.
        key = self._settings.api_key
        return text.replace(key, "***") if key else text

    def _describe(self, exc: Exception) -> str:
        return self._redact(f"{type(exc).__name__}: {exc}")[:_DETAIL_CHARS]

    def _body(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[FunctionTool],
        tool_choice: ToolChoice | None,
        max_tokens: int | None,
    ) -> dict[str, object]:
        settings = self._settings
        body: dict[str, object] = {
            "model": settings.model,
            "messages": [_message_json(message) for message in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        # OpenAI refuses a tool_choice without tools.
        if tools:
            body["tools"] = [_tool_json(tool) for tool in tools]
            if tool_choice is not None:
                body["tool_choice"] = _tool_choice_json(tool_choice)
        limit = max_tokens if max_tokens is not None else settings.max_tokens
        if limit is not None:
            body["max_tokens"] = limit
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        return body


async def sentences(
    deltas: AsyncIterable[str], *, max_chars: int = LONG_RUN_CHARS
) -> AsyncGenerator[str, None]:
    """Streamed text as speakable sentences, each as soon as it is known to have ended.

    The rules are :func:`~duplex_gateway.engine.embedded.tts.split_sentences`': a line break
    or ``.`` ``!`` ``?`` followed by a space ends a sentence, but not ``3.5``, ``Dr.`` or
    ``e.g.``; a run longer than ``max_chars`` is cut at a comma or space. A sentence end is
    only certain once the next word starts, so each sentence comes out with the next delta.
    """
    pending = ""
    async for delta in deltas:
        pending += delta
        if "\n" in pending:
            complete, _, pending = pending.rpartition("\n")
            for sentence in split_sentences(complete, max_chars=max_chars):
                yield sentence
        pieces = split_sentences(pending, max_chars=max_chars)
        if len(pieces) > 1:
            for sentence in pieces[:-1]:
                yield sentence
            # split_sentences drops trailing space, which still separates the next word.
            pending = pieces[-1] + (" " if pending[-1:].isspace() else "")
    for sentence in split_sentences(pending, max_chars=max_chars):
        yield sentence


@dataclass(slots=True)
class _PendingCall:
    index: int
    call_id: str
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0


class _Reply:
    """Turns decoded chunks into stream items: text within its cap, tool calls assembled."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.truncated = False
        self._usage: dict[str, int | None] = {"input_tokens": None, "output_tokens": None}
        self._text_chars = 0
        self._open: _PendingCall | None = None
        self._closed: set[int] = set()

    def feed(self, decoded: object) -> list[ChatEvent]:
        chunk = _want(decoded, dict, "the chunk")
        if chunk.get("error") is not None:  # how vLLM and others report a failure mid-stream
            raise _Broken(f"the server reported an error: {_message(chunk['error'])}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            for ours, theirs in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
                if isinstance(count := usage.get(theirs), int) and not isinstance(count, bool):
                    self._usage[ours] = count
        elif "choices" not in chunk:
            raise _Broken("malformed chunk: it has neither choices nor usage")
        items: list[ChatEvent] = []
        for choice in _want(chunk.get("choices"), list | None, "choices") or ():
            if _want(choice, dict, "a choice").get("index") not in (0, None):
                continue  # n > 1 was not asked for; only the first choice is spoken
            delta = _want(choice.get("delta"), dict | None, "the delta") or {}
            if content := _want(delta.get("content"), str | None, "the content"):
                items.extend(self._text(content))
            for call in _want(delta.get("tool_calls"), list | None, "tool_calls") or ():
                items.extend(self._tool_fragment(call))
            if (reason := _want(choice.get("finish_reason"), str | None, "finish_reason")) is not None:
                self.reason = reason
        return items

    def finish(self) -> list[ChatEvent]:
        items: list[ChatEvent] = [self._close()] if self._open is not None else []
        return [*items, Finished(reason=self.reason, **self._usage)]

    def _text(self, content: str) -> list[ChatEvent]:
        room = MAX_TEXT_CHARS - self._text_chars
        if len(content) > room:
            self.truncated, self.reason, content = True, "length", content[:room]
        self._text_chars += len(content)
        return [TextDelta(text=content)] if content else []

    def _tool_fragment(self, decoded: object) -> list[ChatEvent]:
        raw = _want(decoded, dict, "a tool call")
        function = _want(raw.get("function"), dict | None, "a tool call's function") or {}
        call_id = _want(raw.get("id"), str | None, "a tool call's id")
        name = _want(function.get("name"), str | None, "a tool call's name")
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)  # some servers send the arguments as an object
        fragment: str = _want(arguments, str | None, "a tool call's arguments") or ""
        index = raw.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # Some servers leave the index out: a new id is a new call.
            current = self._open
            if current is None:
                index = len(self._closed)
            else:
                index = current.index + (1 if call_id and call_id != current.call_id else 0)
        items: list[ChatEvent] = []
        announce = self._open is None or self._open.index != index
        if announce:
            if index in self._closed:
                raise _Broken(f"tool call {index} went on after a later one started")
            if self._open is not None:
                items.append(self._close())
            self._open = _PendingCall(index=index, call_id=call_id or f"call_{uuid.uuid4().hex[:24]}")
        pending = self._open
        assert pending is not None
        pending.name = pending.name or name or ""
        pending.size += len(fragment)
        if pending.size > MAX_ARGUMENT_CHARS:
            raise _Broken(f"tool call {index}'s arguments exceed {MAX_ARGUMENT_CHARS} characters")
        pending.arguments.append(fragment)
        if announce or fragment:
            delta = ToolCallDelta(
                index=index, call_id=pending.call_id, name=pending.name, arguments_delta=fragment
            )
            items.append(delta)
        return items

    def _close(self) -> ToolCallDone:
        pending, self._open = self._open, None
        assert pending is not None
        if not pending.name:
            raise _Broken(f"tool call {pending.index} has no function name")
        self._closed.add(pending.index)
        # A function without parameters may stream no arguments at all; "{}" is what OpenAI sends.
        arguments = "".join(pending.arguments) or "{}"
        return ToolCallDone(call=ChatToolCall(id=pending.call_id, name=pending.name, arguments=arguments))


def _want(value: object, kind: type[Any] | UnionType, what: str) -> Any:
    if not isinstance(value, kind):
        raise _Broken(f"malformed chunk: {what} is {type(value).__name__}")
    return value


async def _sse_data(chunks: AsyncIterable[bytes]) -> AsyncGenerator[str, None]:
    """The ``data`` of each server-sent event in ``chunks`` (lines may split anywhere)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer, size = "", 0
    data: list[str] = []

    def lines(text: str) -> list[str]:
        nonlocal buffer
        # A "\r" at the very end may be the first half of "\r\n": keep it for the next round.
        cut = len(text) - 1 if text.endswith("\r") else len(text)
        *complete, rest = _LINE_BREAK.split(text[:cut])
        buffer = rest + text[cut:]
        if len(buffer) > _MAX_EVENT_CHARS:
            raise _Broken(f"an event exceeds {_MAX_EVENT_CHARS} characters")
        return complete

    async for chunk in chunks:
        for line in lines(buffer + decoder.decode(chunk)):
            if not line:
                if data:
                    yield "\n".join(data)
                data, size = [], 0
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
                size += len(value)
                if size > _MAX_EVENT_CHARS:
                    raise _Broken(f"an event exceeds {_MAX_EVENT_CHARS} characters")
            elif name == "error":
                raise _Broken(f"the server reported an error: {_error_detail(value.encode())}")
            # Comments (":" lines), "event", "id" and "retry" carry nothing a reply needs.
    tail = buffer + decoder.decode(b"", final=True)
    if tail.startswith("data:"):
        data.append(tail[5:].removeprefix(" "))
    if data:
        # Lenient to a server that closes without the final blank line.
        yield "\n".join(data)


def _decode(data: str) -> object:
    try:
        return json.loads(data)
    except ValueError:
        raise _Broken(f"a chunk is not JSON: {data[:80]!r}") from None


def _message(error: object) -> str:
    if isinstance(error, dict):
        error = error.get("message") or error.get("detail") or error
    if not isinstance(error, str):
        error = json.dumps(error)
    return " ".join(error.split())[:_DETAIL_CHARS]


def _error_detail(raw: bytes) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message": ...}}`` and its cousins."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            if body.get(key):
                return _message(body[key])
    return " ".join(text.split())[:_DETAIL_CHARS] or "(no body)"


def _message_json(message: ChatMessage) -> dict[str, object]:
    out: dict[str, object] = {"role": message.role}
    if message.tool_calls:
        out["content"] = message.content  # null is allowed beside tool calls
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    else:
        out["content"] = message.content or ""
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _tool_json(tool: FunctionTool) -> dict[str, object]:
    function: dict[str, object] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    # Some servers' chat templates expect a schema even for a function without parameters.
    function["parameters"] = dict(tool.parameters) or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _tool_choice_json(choice: ToolChoice) -> object:
    if choice.function is not None:
        return {"type": "function", "function": {"name": choice.function}}
    return choice.mode.value
