"""The embedded engine's conversation memory: order, bounds, what was heard, and the chat it becomes."""

from __future__ import annotations

import asyncio

from duplex_gateway.engine import port
from duplex_gateway.engine.embedded.chat_llm import ChatMessage, ChatToolCall
from duplex_gateway.engine.embedded.conversation import (
    CUT_MARK,
    FunctionCall,
    FunctionOutput,
    History,
    Message,
    Spoken,
    chat_messages,
    from_context,
    last_input,
    settled,
)

REPLY = Spoken(
    response_id="resp_1",
    pieces=((0.0, 1000.0, "You said: hello there."), (1000.0, 3000.0, "It is a fine day for a walk.")),
)


def test_items_go_where_they_are_placed_and_deleted_ones_are_forgotten() -> None:
    history = History()
    history.add(Message(item_id="a", text="first"))
    history.add(Message(item_id="c", text="third"))
    history.add(Message(item_id="b", text="second"), previous_item_id="a")
    history.add(Message(item_id="0", role="system", text="zeroth"), previous_item_id="root")
    history.add(Message(item_id="d", text="fourth"), previous_item_id="item_the_engine_never_saw")
    assert [e.item_id for e in history.snapshot()] == ["0", "a", "b", "c", "d"]
    assert history.delete("b") and not history.delete("b")
    assert [e.item_id for e in history.snapshot()] == ["0", "a", "c", "d"]


def test_a_replys_items_are_deleted_by_their_reply_and_call_ids() -> None:
    """The gateway names a reply's items; the engine's entries know them by reply and call id."""
    history = History()
    history.add(Message(item_id="turn", text="weather in Oslo?"))
    history.put_reply(REPLY)
    history.add(FunctionCall(item_id=None, call_id="c1", name="get_weather"))
    history.add(FunctionCall(item_id="client_call", call_id="c1", name="get_weather"))
    assert history.delete("item_gateway_named_call", response_id="resp_1", call_id="c1")
    # The reply's own call went, not the client's call of the same id.
    assert [(type(e).__name__, e.item_id) for e in history.snapshot()] == [
        ("Message", "turn"),
        ("Spoken", None),
        ("FunctionCall", "client_call"),
    ]
    assert history.delete("item_gateway_named_message", response_id="resp_1")
    assert history.reply("resp_1") is None
    assert not history.delete("item_unknown", response_id="resp_2")
    assert [e.item_id for e in history.snapshot()] == ["turn", "client_call"]


def test_history_is_bounded_by_entries_and_by_characters() -> None:
    history = History(max_entries=4, max_chars=100)
    for n in range(10):
        history.add(Message(item_id=f"i{n}", text=f"message {n}"))
    assert [e.item_id for e in history.snapshot()] == ["i6", "i7", "i8", "i9"]
    history.add(Message(item_id="big", text="x" * 90))
    assert [e.item_id for e in history.snapshot()] == ["i9", "big"]


def test_a_reply_cut_short_keeps_only_the_words_heard() -> None:
    assert REPLY.text == "You said: hello there. It is a fine day for a walk." and not REPLY.cut
    half_way = REPLY.heard_until(2000)  # half-way through the second piece
    assert half_way.cut and half_way.text == "You said: hello there. It is a fine"
    assert REPLY.heard_until(500).text == "You said:"
    assert REPLY.heard_until(0).text == ""
    # Heard to the end: nothing is cut; a reply stopped early stays cut even if all it said was heard.
    assert REPLY.heard_until(5000) == REPLY
    stopped = Spoken(response_id="r", pieces=REPLY.pieces, cut=True, heard_ms=1200.0)
    assert stopped.heard_until(9000).text == REPLY.text and stopped.heard_until(9000).cut


async def test_turns_being_transcribed_settle_and_unfinished_ones_count_as_unheard() -> None:
    async def transcribe(text: str, delay: float) -> str:
        await asyncio.sleep(delay)
        return text

    quick = asyncio.create_task(transcribe("what time is it", 0.01))
    slow = asyncio.create_task(transcribe("never mind", 10))
    entries = (Message(item_id="t1", heard=quick, audio=True), Message(item_id="t2", heard=slow, audio=True))
    assert last_input(entries) == entries[1]
    done = await settled(entries, timeout_s=0.2)
    assert [e.text for e in done if isinstance(e, Message)] == ["what time is it", ""]
    assert not slow.done()  # the wait gave up; the transcription goes on for the caller's transcript
    slow.cancel()


def test_chat_messages_pair_every_call_with_its_output_and_mark_a_cut_reply() -> None:
    entries = (
        Message(item_id="u1", text="Weather in Paris and Oslo?"),
        FunctionCall(item_id=None, call_id="c1", name="get_weather", arguments='{"city":"Paris"}'),
        FunctionCall(item_id=None, call_id="c2", name="get_weather", arguments='{"city":"Oslo"}'),
        FunctionCall(
            item_id=None, call_id="c3", name="get_weather", arguments='{"city":"Rome"}'
        ),  # never answered
        Message(item_id="s1", role="system", text="Answer in one sentence."),
        FunctionOutput(item_id="o2", call_id="c2", output="3 C"),
        FunctionOutput(item_id="o1", call_id="c1", output="18 C"),
        FunctionOutput(item_id="o9", call_id="c9", output="42"),  # its call is long gone
        REPLY.heard_until(2000),
        Message(item_id="t", text="[BLANK_AUDIO]", audio=True),  # nothing was heard
    )
    calls = {"c9": FunctionCall(item_id=None, call_id="c9", name="lookup")}
    assert chat_messages(entries, "Be brief.", calls) == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Paris and Oslo?"),
        ChatMessage(
            role="assistant",
            tool_calls=(
                ChatToolCall(id="c1", name="get_weather", arguments='{"city":"Paris"}'),
                ChatToolCall(id="c2", name="get_weather", arguments='{"city":"Oslo"}'),
            ),
        ),
        ChatMessage(role="tool", tool_call_id="c1", content="18 C"),
        ChatMessage(role="tool", tool_call_id="c2", content="3 C"),
        ChatMessage(role="system", content="Answer in one sentence."),
        ChatMessage(role="system", content="The function lookup returned: 42"),
        ChatMessage(role="assistant", content=f"You said: hello there. It is a fine{CUT_MARK}"),
    ]
    assert chat_messages((), "") == []


def test_a_reply_context_of_its_own() -> None:
    items = (
        port.ContextItem(id="x", role="system", text="Classify."),
        port.ContextItem(id="y", kind="function_call", call_id="c", name="f", arguments="{}"),
        port.ContextItem(id="z", kind="function_call_output", call_id="c", output="ok"),
        port.ContextItem(id="w", role="tool", text="odd role"),
    )
    entries = from_context(items)
    assert [type(e).__name__ for e in entries] == ["Message", "FunctionCall", "FunctionOutput", "Message"]
    assert isinstance(entries[3], Message) and entries[3].role == "user"
    assert last_input(entries) == entries[3]
