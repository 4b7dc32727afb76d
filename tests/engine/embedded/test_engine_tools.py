"""The embedded engine's offline brain behind the port: tool calls, function outputs, several replies
at once, text replies, token caps and the conversation it keeps. Real models, no language model."""

from __future__ import annotations

import json
from dataclasses import replace

from duplex_gateway.engine import port
from duplex_gateway.engine.embedded import EmbeddedEngine, EmbeddedSession
from duplex_gateway.engine.embedded.conversation import FunctionCall, FunctionOutput, Message, Spoken
from duplex_gateway.engine.embedded.tool_router import ToolCall, reply_from_output
from duplex_gateway.vocabulary.session_config import (
    FunctionTool,
    Modality,
    SessionConfig,
    ToolChoice,
    ToolChoiceMode,
)
from tests.engine.embedded.test_engine import audio_bytes, opened, read_until, reply_text

WEATHER = FunctionTool(
    name="get_current_weather",
    description="Get the current weather in a given city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city, e.g. San Francisco"}},
        "required": ["city"],
    },
)
REPORT = FunctionTool(
    name="send_weather_report",
    description="Send the weather report for a day",
    parameters={
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}},
        "required": ["day"],
    },
)
TOOLS = port.ResponseOptions(tools=(WEATHER,))
TEXT = (Modality.TEXT,)


async def reply_to(
    session: port.EngineSession, text: str, response_id: str, options: port.ResponseOptions | None = None
) -> list[port.EngineEvent]:
    await session.add_item(item_id=f"item_{response_id}", role="user", text=text)
    await session.create_response(response_id=response_id, instructions=None, options=options)
    return await until_done(session, response_id)


async def until_done(session: port.EngineSession, response_id: str) -> list[port.EngineEvent]:
    seen: list[port.EngineEvent] = []
    while not any(isinstance(e, port.EngineResponseDone) and e.response_id == response_id for e in seen):
        seen += await read_until(session.events(), port.EngineResponseDone)
    return seen


def done(events: list[port.EngineEvent], response_id: str) -> port.EngineResponseDone:
    return next(e for e in events if isinstance(e, port.EngineResponseDone) and e.response_id == response_id)


def of(events: list[port.EngineEvent], response_id: str) -> list[port.EngineEvent]:
    return [e for e in events if getattr(e, "response_id", None) == response_id]


def test_capabilities_claim_tools_and_only_the_options_honoured(engine: EmbeddedEngine) -> None:
    caps = engine.capabilities
    assert caps.tools and caps.out_of_band
    # One Piper voice: a reply cannot switch it, so "voice" is not claimed.
    assert caps.response_options == frozenset({"max_output_tokens", "input", "tools"})


async def test_a_matching_request_calls_the_tool_and_its_output_is_read_back(engine: EmbeddedEngine) -> None:
    async with opened(engine, "tool_call") as session:
        seen = await reply_to(session, "What's the weather in Paris?", "resp_call", TOOLS)
        assert [type(e).__name__ for e in seen] == [
            "EngineResponseStarted",
            "EngineFunctionCall",
            "EngineResponseDone",
        ]
        call = seen[1]
        assert isinstance(call, port.EngineFunctionCall)
        assert (call.name, json.loads(call.arguments)) == ("get_current_weather", {"city": "Paris"})
        assert call.call_id.startswith("call_") and seen[2] == port.EngineResponseDone(
            response_id="resp_call"
        )
        # The client runs the function; the next reply reads its output back.
        output = json.dumps({"temperature": 18, "conditions": "sunny"})
        await session.add_function_output(item_id="item_out", call_id=call.call_id, output=output)
        await session.create_response(response_id="resp_said", instructions=None, options=TOOLS)
        said = await until_done(session, "resp_said")
        assert isinstance(session, EmbeddedSession)
        history = session.history.snapshot()
    expected = reply_from_output(ToolCall(name=call.name, arguments={"city": "Paris"}, score=1.0), output)
    assert reply_text(said) == expected == "Get current weather says: temperature 18, conditions sunny."
    assert audio_bytes(said, "resp_said") > 0 and done(said, "resp_said").status == "completed"
    assert not any(isinstance(e, port.EngineFunctionCall) for e in said)
    # The conversation remembers the whole exchange, in order.
    assert [type(e) for e in history] == [Message, FunctionCall, FunctionOutput, Spoken]
    assert isinstance(history[-1], Spoken) and history[-1].text == expected


async def test_an_unrelated_request_calls_nothing_unless_the_choice_forces_it(engine: EmbeddedEngine) -> None:
    async with opened(engine, "no_call") as session:
        plain = await reply_to(session, "Hello there, how are you?", "resp_plain", TOOLS)
        forced = replace(
            TOOLS, tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="get_current_weather")
        )
        await session.create_response(response_id="resp_forced", instructions=None, options=forced)
        made = await until_done(session, "resp_forced")
        off = replace(TOOLS, tool_choice=ToolChoice(mode=ToolChoiceMode.NONE))
        declined = await reply_to(session, "What's the weather in Paris?", "resp_none", off)
    assert reply_text(plain) == "You said: hello there, how are you?"
    assert not any(isinstance(e, port.EngineFunctionCall) for e in plain + declined)
    calls = [e for e in made if isinstance(e, port.EngineFunctionCall)]
    assert [c.name for c in calls] == ["get_current_weather"] and audio_bytes(made) == 0
    assert reply_text(declined) == "You said: what's the weather in Paris?"


async def test_a_spoken_turn_calls_a_tool_the_session_offers(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    # A commit's reply takes its tools from the session's configuration.
    async with opened(engine, "spoken_call") as session:
        await session.update(SessionConfig(tools=(WEATHER, REPORT)))
        await session.append_audio(speech_pcm)  # "Please send me the weather report for Tuesday morning."
        await session.commit(item_id="item_s", response_id="resp_s")
        seen = await until_done(session, "resp_s")
    final = next(i for i, e in enumerate(seen) if isinstance(e, port.EngineInputTranscript) and e.final)
    at, call = next((i, e) for i, e in enumerate(seen) if isinstance(e, port.EngineFunctionCall))
    assert final < at and call.name == "send_weather_report"
    assert json.loads(call.arguments) == {"day": "2025-05-13"}  # said on Tuesday May 6: the coming one


async def test_an_out_of_band_reply_runs_beside_the_conversation_and_stays_out_of_it(
    engine: EmbeddedEngine,
) -> None:
    side = port.ResponseOptions(
        out_of_band=True,
        modalities=TEXT,
        input=(port.ContextItem(id="", role="user", text="What time is it?"),),
    )
    async with opened(engine, "side") as session:
        assert isinstance(session, EmbeddedSession)
        await session.add_item(item_id="item_d", role="user", text="What day is it?")
        await session.create_response(response_id="resp_main", instructions=None)
        await session.create_response(response_id="resp_side", instructions=None, options=side)
        both = await until_done(session, "resp_main")
        both += (
            await until_done(session, "resp_side")
            if not any(isinstance(e, port.EngineResponseDone) and e.response_id == "resp_side" for e in both)
            else []
        )
        history = session.history.snapshot()
        # A barge-in stops the conversation's reply; the one out of band goes on.
        await session.create_response(response_id="resp_main2", instructions=None)
        await session.create_response(response_id="resp_side2", instructions=None, options=side)
        await session.barge_in()
        second = await until_done(session, "resp_side2")
        second += (
            await until_done(session, "resp_main2")
            if not any(
                isinstance(e, port.EngineResponseDone) and e.response_id == "resp_main2" for e in second
            )
            else []
        )
        # Cancelling the one out of band leaves the conversation's alone.
        await session.create_response(response_id="resp_main3", instructions=None)
        await session.create_response(response_id="resp_side3", instructions=None, options=side)
        await session.cancel_response("resp_side3")
        third = await until_done(session, "resp_main3")
    assert done(both, "resp_main").status == done(both, "resp_side").status == "completed"
    assert reply_text(of(both, "resp_main")) == "You said: what day is it? Today is Tuesday, May 6, 2025."
    side_text = "".join(e.delta for e in of(both, "resp_side") if isinstance(e, port.EngineText))
    assert side_text == "You said: what time is it? It's 3:15 PM UTC."
    assert audio_bytes(both, "resp_side") == 0 and not any(
        isinstance(e, port.EngineTranscript) for e in of(both, "resp_side")
    )
    assert [e.response_id for e in history if isinstance(e, Spoken)] == ["resp_main"]
    assert (
        done(second, "resp_main2").status == "cancelled" and done(second, "resp_side2").status == "completed"
    )
    assert done(third, "resp_side3").status == "cancelled" and done(third, "resp_main3").status == "completed"
    assert audio_bytes(third, "resp_main3") > 0


async def test_a_text_session_gets_text_and_a_token_cap_cuts_the_reply(engine: EmbeddedEngine) -> None:
    async with opened(engine, "text_cap") as session:
        await session.update(SessionConfig(output_modalities=TEXT))
        texted = await reply_to(session, "What time is it?", "resp_text")  # the session's settings
        capped = await reply_to(session, "Help", "resp_cap", port.ResponseOptions(max_output_tokens=6))
    assert [e.delta for e in texted if isinstance(e, port.EngineText)] == [
        "You said: what time is it?",
        " It's 3:15 PM UTC.",
    ]
    assert not any(isinstance(e, port.EngineAudio | port.EngineTranscript) for e in texted)
    assert done(texted, "resp_text").status == "completed"
    # The offline responder counts words as tokens.
    assert reply_text(capped) == "You said: help. I'm a voice"
    assert done(capped, "resp_cap") == port.EngineResponseDone(
        response_id="resp_cap", status="incomplete", reason="max_output_tokens"
    )


async def test_a_truncated_reply_is_remembered_as_far_as_it_was_heard(engine: EmbeddedEngine) -> None:
    async with opened(engine, "truncate") as session:
        assert isinstance(session, EmbeddedSession)
        seen = await reply_to(session, "What day is it?", "resp_t")
        whole = session.history.reply("resp_t")
        assert whole is not None and not whole.cut and whole.text == reply_text(seen)
        first_ms = whole.pieces[0][1]  # "You said: what day is it?" ends here in the audio
        await session.truncate_reply(response_id="resp_t", audio_end_ms=int(first_ms / 2))
        cut = session.history.reply("resp_t")
    assert cut is not None and cut.cut
    assert cut.text in ("You said: what", "You said: what day")  # about half of the first sentence's words
