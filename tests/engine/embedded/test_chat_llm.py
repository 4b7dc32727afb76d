"""The chat-completions client against a real OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from duplex_gateway.engine.embedded.chat_llm import (
    MAX_TEXT_CHARS,
    ChatClient,
    ChatEvent,
    ChatMessage,
    ChatSettings,
    ChatStreamError,
    ChatToolCall,
    ChatUnavailable,
    Finished,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    _sse_data,
    sentences,
)
from duplex_gateway.engine.embedded.tts import split_sentences
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice, ToolChoiceMode
from tests.engine.embedded.chat_server import (
    MODEL_ID,
    ChatServer,
    Reply,
    ScriptedToolCall,
    running_chat_server,
)

API_KEY = "sk-test-0123456789abcdef"
HELLO = [ChatMessage(role="user", content="hello")]
WEATHER = FunctionTool(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with running_chat_server() as running:
        yield running


def settings_for(server: ChatServer, **more: Any) -> ChatSettings:
    options: dict[str, Any] = {"url": server.url, "model": MODEL_ID, "timeout_s": 5.0} | more
    return ChatSettings(**options)


@pytest.fixture
async def client(server: ChatServer) -> AsyncIterator[ChatClient]:
    chat = ChatClient(settings_for(server))
    yield chat
    await chat.aclose()


async def collect(
    client: ChatClient, messages: Sequence[ChatMessage] = HELLO, **kwargs: Any
) -> list[ChatEvent]:
    async with contextlib.aclosing(client.stream(messages, **kwargs)) as stream:
        return [item async for item in stream]


def text_of(items: list[ChatEvent]) -> str:
    return "".join(item.text for item in items if isinstance(item, TextDelta))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- streaming text -------------------------------------------------------------------------


async def test_text_streams_in_pieces_and_reassembles(server: ChatServer, client: ChatClient) -> None:
    reply = "Hello there! The forecast says 3.5 degrees. Dr. Who agrees."
    server.script(Reply(text=reply, chunk_chars=3))
    items = await collect(client)
    deltas = [item for item in items if isinstance(item, TextDelta)]
    assert len(deltas) == -(-len(reply) // 3)
    assert text_of(items) == reply
    assert items[-1] == Finished(reason="stop", input_tokens=17, output_tokens=9)
    assert sum(isinstance(item, Finished) for item in items) == 1


async def test_events_split_across_network_chunks_and_multibyte_text(
    server: ChatServer, client: ChatClient
) -> None:
    reply = "Café — naïve ☕ costs €3.50. Ça va?"
    server.script(Reply(text=reply, chunk_chars=6, fragment_bytes=7, keepalive=True))
    items = await collect(client)
    assert text_of(items) == reply
    assert isinstance(items[-1], Finished) and items[-1].reason == "stop"


async def test_usage_absent_leaves_counts_unknown(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(text="Hi.", usage=None, finish_reason="length"))
    items = await collect(client)
    assert items[-1] == Finished(reason="length", input_tokens=None, output_tokens=None)


async def test_text_is_capped(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(text="word " * 4000, chunk_chars=1000, delay_s=0))
    items = await collect(client)
    assert len(text_of(items)) == MAX_TEXT_CHARS
    assert isinstance(items[-1], Finished) and items[-1].reason == "length"


async def test_default_reply_echoes_the_last_user_message(client: ChatClient) -> None:
    items = await collect(client, [ChatMessage(role="user", content="what time is it")])
    assert text_of(items) == "The model heard: what time is it."


# -- tool calls -----------------------------------------------------------------------------


async def test_tool_call_streams_in_fragments_then_completes(server: ChatServer, client: ChatClient) -> None:
    arguments = json.dumps({"city": "Paris", "unit": "celsius"})
    server.script(
        Reply(
            tool_calls=(
                ScriptedToolCall(name="get_weather", arguments=arguments, id="call_abc", fragments=4),
            )
        )
    )
    items = await collect(client, tools=[WEATHER])
    deltas = [item for item in items if isinstance(item, ToolCallDelta)]
    assert len(deltas) == 5  # the announcement, then four argument fragments
    assert deltas[0] == ToolCallDelta(index=0, call_id="call_abc", name="get_weather", arguments_delta="")
    assert all(d.call_id == "call_abc" and d.name == "get_weather" for d in deltas)
    assert "".join(d.arguments_delta for d in deltas) == arguments
    done = [item for item in items if isinstance(item, ToolCallDone)]
    assert done == [ToolCallDone(call=ChatToolCall(id="call_abc", name="get_weather", arguments=arguments))]
    assert json.loads(done[0].call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert items.index(done[0]) == len(items) - 2
    assert items[-1] == Finished(reason="tool_calls", input_tokens=17, output_tokens=9)
    assert text_of(items) == ""


async def test_two_parallel_tool_calls(server: ChatServer, client: ChatClient) -> None:
    paris, tokyo = '{"city": "Paris"}', '{"city": "Tokyo"}'
    server.script(
        Reply(
            text="Let me check.",
            tool_calls=(
                ScriptedToolCall(name="get_weather", arguments=paris, id="call_1"),
                ScriptedToolCall(name="get_time", arguments=tokyo, id="call_2", fragments=2),
            ),
        )
    )
    items = await collect(client, tools=[WEATHER, FunctionTool(name="get_time")])
    assert text_of(items) == "Let me check."
    done = [item for item in items if isinstance(item, ToolCallDone)]
    assert [d.call for d in done] == [
        ChatToolCall(id="call_1", name="get_weather", arguments=paris),
        ChatToolCall(id="call_2", name="get_time", arguments=tokyo),
    ]
    # The first call is done as soon as the second starts, before the second's arguments.
    first_done = items.index(done[0])
    second_announced = next(i for i, x in enumerate(items) if isinstance(x, ToolCallDelta) and x.index == 1)
    assert first_done == second_announced - 1
    assert {d.index for d in items if isinstance(d, ToolCallDelta)} == {0, 1}


async def test_tool_call_arguments_are_capped(server: ChatServer, client: ChatClient) -> None:
    huge = json.dumps({"text": "x" * 70_000})
    server.script(Reply(tool_calls=(ScriptedToolCall(name="get_weather", arguments=huge, fragments=8),)))
    with pytest.raises(ChatStreamError, match="arguments exceed"):
        await collect(client, tools=[WEATHER])


async def test_tool_calls_without_index_and_with_object_arguments(
    server: ChatServer, client: ChatClient
) -> None:
    # Ollama-style: each call whole in one fragment; some servers leave out the index.
    calls = [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": ""}},
    ]
    raw = json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
    server.script(Reply(raw=(raw,), finish_reason="tool_calls"))
    items = await collect(client, tools=[WEATHER])
    assert [item.call for item in items if isinstance(item, ToolCallDone)] == [
        ChatToolCall(id="a", name="get_weather", arguments='{"city": "Oslo"}'),
        ChatToolCall(id="b", name="get_time", arguments="{}"),
    ]
    assert [(d.index, d.call_id) for d in items if isinstance(d, ToolCallDelta)] == [(0, "a"), (1, "b")]


# -- what is sent ---------------------------------------------------------------------------


async def test_request_body_carries_messages_tools_and_options(server: ChatServer) -> None:
    chat = ChatClient(settings_for(server, max_tokens=200, temperature=0.3))
    conversation = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant",
            content=None,
            tool_calls=(ChatToolCall(id="call_9", name="get_weather", arguments='{"city":"Paris"}'),),
        ),
        ChatMessage(role="tool", content='{"temp_c": 21}', tool_call_id="call_9"),
    ]
    try:
        await collect(chat, conversation, tools=[WEATHER, FunctionTool(name="hang_up")])
        await collect(chat, HELLO, max_tokens=12)
    finally:
        await chat.aclose()
    first, second = (request.body for request in server.chat_requests)
    assert first["model"] == MODEL_ID
    assert first["stream"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert first["max_tokens"] == 200 and first["temperature"] == 0.3
    assert first["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_9"},
    ]
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": dict(WEATHER.parameters),
            },
        },
        {
            "type": "function",
            "function": {"name": "hang_up", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert "tool_choice" not in first
    assert second["max_tokens"] == 12
    assert "tools" not in second and "tool_choice" not in second


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        (ToolChoice(), "auto"),
        (ToolChoice(mode=ToolChoiceMode.NONE), "none"),
        (ToolChoice(mode=ToolChoiceMode.REQUIRED), "required"),
        (
            ToolChoice(mode=ToolChoiceMode.REQUIRED, function="get_weather"),
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
async def test_tool_choice_shapes(
    server: ChatServer, client: ChatClient, choice: ToolChoice, sent: object
) -> None:
    await collect(client, tools=[WEATHER], tool_choice=choice)
    assert server.chat_requests[0].body["tool_choice"] == sent


async def test_tool_choice_is_left_out_without_tools(server: ChatServer, client: ChatClient) -> None:
    await collect(client, tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED))
    assert "tool_choice" not in server.chat_requests[0].body


async def test_authorization_only_with_a_key(server: ChatServer, client: ChatClient) -> None:
    await collect(client)
    keyed = ChatClient(settings_for(server, api_key=API_KEY))
    try:
        await collect(keyed)
        assert await keyed.probe()
    finally:
        await keyed.aclose()
    without, with_key, probe = server.requests
    assert "authorization" not in without.headers
    assert with_key.headers["authorization"] == f"Bearer {API_KEY}"
    assert (probe.method, probe.path, probe.headers["authorization"]) == (
        "GET",
        "/v1/models",
        f"Bearer {API_KEY}",
    )
    assert API_KEY not in repr(keyed.settings)


# -- failures -------------------------------------------------------------------------------


async def test_unreachable_endpoint_is_unavailable_quickly() -> None:
    chat = ChatClient(ChatSettings(url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout_s=3.0))
    started = time.monotonic()
    try:
        with pytest.raises(ChatUnavailable, match="unreachable"):
            await collect(chat)
        assert not await chat.probe()
    finally:
        await chat.aclose()
    assert time.monotonic() - started < 5


async def test_probe_answers_true_for_a_live_server(client: ChatClient) -> None:
    assert await client.probe()


async def test_401_is_unavailable_with_the_server_message_and_never_the_key(server: ChatServer) -> None:
    server.script(Reply(status=401, error=f"Incorrect API key provided: {API_KEY}. Check your key."))
    chat = ChatClient(settings_for(server, api_key=API_KEY))
    try:
        with pytest.raises(ChatUnavailable) as caught:
            await collect(chat)
    finally:
        await chat.aclose()
    message = str(caught.value)
    assert "HTTP 401" in message and "Incorrect API key provided" in message
    assert API_KEY not in message and API_KEY not in repr(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_500_is_unavailable_with_the_server_message(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(status=500, error="The model is overloaded"))
    with pytest.raises(ChatUnavailable, match="HTTP 500: The model is overloaded"):
        await collect(client)


async def test_no_first_byte_in_time_is_unavailable(server: ChatServer) -> None:
    server.script(Reply(text="too late", delay_first_s=30))
    chat = ChatClient(settings_for(server, timeout_s=0.5))
    started = time.monotonic()
    try:
        with pytest.raises(ChatUnavailable, match="did not answer within 0.5 s"):
            await collect(chat)
    finally:
        await chat.aclose()
    assert time.monotonic() - started < 5
    assert await server.wait_disconnected()


async def test_stall_mid_stream_is_a_stream_error(server: ChatServer) -> None:
    server.script(Reply(text="Hello there.", stall_s=30))
    chat = ChatClient(settings_for(server, idle_timeout_s=0.5))
    items: list[ChatEvent] = []
    try:
        with pytest.raises(ChatStreamError, match="no data for 0.5 s"):
            async with contextlib.aclosing(chat.stream(HELLO)) as stream:
                async for item in stream:
                    items.append(item)  # noqa: PERF401 - kept as they come: the stream fails midway
    finally:
        await chat.aclose()
    assert text_of(items) == "Hello there."
    assert await server.wait_disconnected()


async def test_cancelling_a_stalled_reply_closes_the_connection(
    server: ChatServer, client: ChatClient
) -> None:
    server.script(Reply(text="I will now think for a very long", stall_s=60))
    first = asyncio.Event()

    async def consume() -> None:
        async with contextlib.aclosing(client.stream(HELLO)) as stream:
            async for item in stream:
                if isinstance(item, TextDelta):
                    first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    assert await server.wait_stalling()
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert time.monotonic() - started < 5
    assert await server.wait_disconnected()
    assert server.completed == 0
    # The client stays usable after a cancelled reply.
    server.script(Reply(text="Fine."))
    assert text_of(await collect(client)) == "Fine."


async def test_leaving_a_reply_early_closes_the_connection(server: ChatServer, client: ChatClient) -> None:
    # A barge-in seen between two items: the consumer stops iterating rather than being cancelled.
    server.script(Reply(text="A long answer that the caller interrupts", stall_s=60))
    async with contextlib.aclosing(client.stream(HELLO)) as stream:
        async for item in stream:
            if isinstance(item, TextDelta):
                break
    assert await server.wait_disconnected()
    assert server.completed == 0


async def test_malformed_chunk_mid_stream_is_a_stream_error(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(text="Hello.", raw=('{"choices": [{"index": 0, "delta": {"content": "x"}',)))
    items: list[ChatEvent] = []
    with pytest.raises(ChatStreamError, match="not JSON"):
        async with contextlib.aclosing(client.stream(HELLO)) as stream:
            async for item in stream:
                items.append(item)  # noqa: PERF401 - kept as they come: the stream fails midway
    assert text_of(items) == "Hello."


async def test_malformed_first_chunk_is_unavailable(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(raw=('{"choices": "nope"}',)))
    with pytest.raises(ChatUnavailable, match="malformed chunk: choices is str"):
        await collect(client)


async def test_error_event_mid_stream_is_a_stream_error(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(text="Sure,", raw=('{"error": {"message": "CUDA out of memory", "code": 500}}',)))
    with pytest.raises(ChatStreamError, match="CUDA out of memory"):
        await collect(client)


async def test_stream_cut_short_is_a_stream_error(server: ChatServer, client: ChatClient) -> None:
    server.script(Reply(text="Hello.", finish=False, done=False), Reply(finish=False, done=False))
    with pytest.raises(ChatStreamError, match="ended before the reply was finished"):
        await collect(client)
    with pytest.raises(ChatUnavailable, match="ended before the reply was finished"):
        await collect(client)


async def test_a_missing_done_is_forgiven_after_a_finish_reason(
    server: ChatServer, client: ChatClient
) -> None:
    server.script(Reply(text="Hello.", done=False))
    items = await collect(client)
    assert text_of(items) == "Hello." and items[-1] == Finished(
        reason="stop", input_tokens=17, output_tokens=9
    )


async def test_a_json_answer_instead_of_a_stream_is_unavailable(
    server: ChatServer, client: ChatClient
) -> None:
    server.script(Reply(text="Hello.", stream=False))
    with pytest.raises(ChatUnavailable, match="application/json, not an event stream"):
        await collect(client)


async def test_event_parsing_survives_any_split() -> None:
    wire = (
        ": comment\r\n"
        'event: message\r\ndata: {"a": "caf\u00e9 \u2615"}\r\n\r\n'
        "data: first line\ndata: second line\nid: 7\n\n"
        "retry: 10\rdata:no-space\r\r"
        "data: [DONE]"
    ).encode()
    expected = ['{"a": "caf\u00e9 \u2615"}', "first line\nsecond line", "no-space", "[DONE]"]

    async def pieces(*cuts: int) -> AsyncIterator[bytes]:
        bounds = [0, *cuts, len(wire)]
        for start, end in itertools.pairwise(bounds):
            yield wire[start:end]

    assert [data async for data in _sse_data(pieces())] == expected
    for cut in range(1, len(wire)):
        assert [data async for data in _sse_data(pieces(cut))] == expected, cut
    assert [data async for data in _sse_data(pieces(*range(1, len(wire))))] == expected


async def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="http"):
        ChatSettings(url="127.0.0.1:8080/v1", model="m")
    with pytest.raises(ValueError, match="tool_call_id"):
        ChatMessage(role="tool", content="{}")
    with pytest.raises(ValueError, match="tool calls"):
        ChatMessage(role="user", content="x", tool_calls=(ChatToolCall(id="a", name="b", arguments="{}"),))


# -- sentences ------------------------------------------------------------------------------


async def _deltas(*pieces: str) -> AsyncIterator[str]:
    for piece in pieces:
        await asyncio.sleep(0)
        yield piece


async def _sentences_of(*pieces: str) -> list[str]:
    return [sentence async for sentence in sentences(_deltas(*pieces))]


async def test_sentences_split_at_ends_but_not_numbers_or_abbreviations() -> None:
    text = "It's 3.5 degrees, e.g. quite cold. Dr. Smith said so! Really? Yes\nNew line here"
    expected = ["It's 3.5 degrees, e.g. quite cold.", "Dr. Smith said so!", "Really?", "Yes", "New line here"]
    assert await _sentences_of(text) == expected
    assert await _sentences_of(*text) == expected  # one character at a time
    assert await _sentences_of(*(text[i : i + 5] for i in range(0, len(text), 5))) == expected


async def test_sentences_match_the_batch_splitter_however_the_text_streams() -> None:
    text = (
        'He said "stop." Then he left... Prices rose 2.5% in the U.S. on Monday. '
        "Mr. and Mrs. Jones arrived at 5 p.m. today, i.e. late.\n\n- a list item\n"
        + "a long run without any punctuation at all " * 12
        + "and then it ends."
    )
    batch = split_sentences(text, max_chars=200)
    for size in (1, 2, 7, 31, len(text)):
        assert await _sentences_of(*(text[i : i + size] for i in range(0, len(text), size))) == batch


async def test_a_long_run_is_cut_so_speech_can_start() -> None:
    text = "word, " * 30 + "more words " * 40
    out = await _sentences_of(*(text[i : i + 9] for i in range(0, len(text), 9)))
    assert len(out) > 1
    assert all(len(sentence) <= 200 for sentence in out)
    assert out[0].endswith(",")
    assert " ".join(out) == " ".join(text.split())


async def test_each_sentence_comes_out_before_the_rest_of_the_stream() -> None:
    release = asyncio.Event()

    async def slow() -> AsyncIterator[str]:
        yield "Hello there. "
        yield "How"
        await release.wait()  # the model is still thinking
        yield " are you?"

    out = sentences(slow())
    assert await asyncio.wait_for(anext(out), 5) == "Hello there."
    release.set()
    assert [s async for s in out] == ["How are you?"]


async def test_sentences_of_nothing() -> None:
    assert await _sentences_of() == []
    assert await _sentences_of("", "  ", "\n") == []
