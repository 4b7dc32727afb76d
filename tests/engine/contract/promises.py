"""The promises every engine makes through the engine port, one test each.

A test module runs them over its engines by importing them and defining an ``case``
fixture (:class:`~tests.engine.contract.harness.EngineCase`):
``tests/engine/contract/test_contract.py`` for the engines of the main virtualenv,
``tests/omni/test_engine_contract.py`` for the vLLM-Omni ones. The promises are what
the gateway's session relies on; each says which port call it is about.
"""

from __future__ import annotations

import pytest

from duplex_gateway.engine import port
from duplex_gateway.engine.registry import SPECS
from duplex_gateway.vocabulary.session_config import FunctionTool, SessionConfig, ToolChoice, ToolChoiceMode
from tests.engine.contract.harness import EngineCase, Events, opened, require, speak, started, turn

__all__ = [
    "test_append_takes_audio_in_any_pieces_with_the_client_hints",
    "test_barge_in_stops_the_reply_and_the_next_turn_is_answered",
    "test_cancel_before_the_first_event_leaves_nothing_but_a_cancelled_done",
    "test_cancel_part_way_stops_the_reply_with_nothing_after_but_a_cancelled_done",
    "test_close_ends_the_stream_with_closed_and_frees_the_slot",
    "test_commit_reports_the_turn_it_was_given",
    "test_create_response_replies_with_the_id_the_gateway_gave",
    "test_open_only_once_started_and_the_capabilities_name_the_engine",
    "test_playback_ack_and_truncate_are_taken_and_the_session_goes_on",
    "test_shutdown_ends_every_open_session_and_refuses_new_ones",
    "test_the_reply_comes_in_order_started_audio_and_transcript_done",
    "test_tools_a_forced_call_then_its_output_gets_a_reply",
]

WEATHER = FunctionTool(
    name="get_current_weather",
    description="Get the current weather in a given city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _rate(engine: port.Engine) -> int:
    return engine.capabilities.input_rate


def _assert_reply(events: Events, response_id: str) -> None:
    """The reply's events: started first, audio (whole PCM16 samples) and transcript, done last."""
    mine = events.of(response_id)
    assert isinstance(mine[0], port.EngineResponseStarted), mine[:3]
    assert isinstance(mine[-1], port.EngineResponseDone) and mine[-1].status == "completed", mine[-1]
    assert sum(isinstance(e, (port.EngineResponseStarted, port.EngineResponseDone)) for e in mine) == 2
    audio = [e.pcm for e in mine if isinstance(e, port.EngineAudio)]
    assert audio and all(len(pcm) % 2 == 0 for pcm in audio) and sum(map(len, audio)) > 0
    assert "".join(e.delta for e in mine if isinstance(e, port.EngineTranscript)).strip()


# -- open ----------------------------------------------------------------------------------------


async def test_open_only_once_started_and_the_capabilities_name_the_engine(case: EngineCase) -> None:
    engine = case.build()
    with pytest.raises(port.EngineUnavailable):
        await engine.open_session("too_early", SessionConfig())
    await engine.start()
    try:
        caps = engine.capabilities
        assert caps.name == case.name and caps.input_rate > 0 and caps.output_rate > 0
        assert engine.ready and engine.active_sessions == 0
        async with opened(engine):
            assert engine.active_sessions == 1
    finally:
        await engine.shutdown()


# -- append and commit ---------------------------------------------------------------------------


async def test_append_takes_audio_in_any_pieces_with_the_client_hints(case: EngineCase) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        pcm = case.turn(_rate(engine))
        # Odd piece sizes in whole samples, each with what a client says about it.
        await speak(session, pcm, chunk=2 * 331, is_speech=True, hints={"rms": 0.1})
        await session.commit(item_id="item_1", response_id="resp_1")
        await events.done("resp_1")
        _assert_reply(events, "resp_1")


async def test_commit_reports_the_turn_it_was_given(case: EngineCase) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        await turn(session, case.turn(_rate(engine)), item_id="item_1", response_id="resp_1")
        await events.done("resp_1")
        committed = events.kinds(port.EngineTurnCommitted)
        if SPECS[case.name].records_turns:
            # The gateway's id for the turn, or "" from an engine that cannot carry it (port docs).
            assert [c.item_id for c in committed] in (["item_1"], [""]), committed
        else:
            # The spec says the gateway's commit is the record: the engine must not announce one.
            assert committed == [], committed


# -- reply ---------------------------------------------------------------------------------------


async def test_the_reply_comes_in_order_started_audio_and_transcript_done(case: EngineCase) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        await turn(session, case.turn(_rate(engine)), item_id="item_1", response_id="resp_1")
        await events.done("resp_1")
        _assert_reply(events, "resp_1")
        # A second turn is a second reply, after the first one's done.
        await turn(session, case.turn(_rate(engine)), item_id="item_2", response_id="resp_2")
        await events.done("resp_2")
        _assert_reply(events, "resp_2")
        first_done = events.items.index(events.of("resp_1")[-1])
        assert all(events.items.index(e) > first_done for e in events.of("resp_2"))


async def test_create_response_replies_with_the_id_the_gateway_gave(case: EngineCase) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        # A client that answers turns itself: commit without a reply, then response.create.
        await turn(session, case.turn(_rate(engine)), item_id="item_1", response_id=None)
        await session.create_response(response_id="resp_gw", instructions=None)
        await events.done("resp_gw")
        _assert_reply(events, "resp_gw")


# -- cancel and barge-in -------------------------------------------------------------------------


async def _answered_after(events: Events, session: port.EngineSession, case: EngineCase, rate: int) -> None:
    await turn(session, case.turn(rate), item_id="item_next", response_id="resp_next")
    await events.done("resp_next")
    _assert_reply(events, "resp_next")


def _nothing_after_but_done(events: Events, response_id: str, mark: int) -> None:
    """After the stop returned, the reply sends at most its done, cancelled, and nothing after that.

    "Emit nothing more for it" (``cancel_response``): some engines still close the reply
    with a cancelled ``response.done`` (echo, embedded, vllm-omni), others send nothing
    (remote drops what its backend still says of it); the gateway takes both.
    """
    later = [e for e in events.items[mark:] if getattr(e, "response_id", None) == response_id]
    assert all(isinstance(e, port.EngineResponseDone) for e in later), later
    assert all(e.status == "cancelled" for e in later if isinstance(e, port.EngineResponseDone)), later
    assert len(later) <= 1


async def test_cancel_before_the_first_event_leaves_nothing_but_a_cancelled_done(case: EngineCase) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        await turn(session, case.turn(_rate(engine)), item_id="item_1", response_id=None)
        await session.create_response(response_id="resp_1", instructions=None)
        mark = len(events.items)
        await session.cancel_response("resp_1")
        # The next turn's reply is the barrier: whatever the cancelled one had left came before it.
        await _answered_after(events, session, case, _rate(engine))
        _nothing_after_but_done(events, "resp_1", mark)


async def test_cancel_part_way_stops_the_reply_with_nothing_after_but_a_cancelled_done(
    case: EngineCase,
) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        await turn(session, case.long_turn(_rate(engine)), item_id="item_1", response_id="resp_1")
        await events.first(port.EngineAudio, "resp_1")
        mark = len(events.items)
        await session.cancel_response("resp_1")
        await _answered_after(events, session, case, _rate(engine))
        _nothing_after_but_done(events, "resp_1", mark)


async def test_barge_in_stops_the_reply_and_the_next_turn_is_answered(case: EngineCase) -> None:
    async with started(case) as engine:
        require("barge-in", "barge_in", engine)
        async with opened(engine) as (session, events):
            await turn(session, case.long_turn(_rate(engine)), item_id="item_1", response_id="resp_1")
            await events.first(port.EngineAudio, "resp_1")
            mark = len(events.items)
            await session.barge_in()
            await _answered_after(events, session, case, _rate(engine))
            _nothing_after_but_done(events, "resp_1", mark)


# -- playback ack and truncate -------------------------------------------------------------------


async def test_playback_ack_and_truncate_are_taken_and_the_session_goes_on(case: EngineCase) -> None:
    async with started(case) as engine, opened(engine) as (session, events):
        await turn(session, case.turn(_rate(engine)), item_id="item_1", response_id="resp_1")
        await events.done("resp_1")
        await session.ack_playback(response_id="resp_1", played_ms=100)
        # The caller heard only part of it (conversation.item.truncate).
        await session.truncate_reply(response_id="resp_1", audio_end_ms=200)
        assert not any(isinstance(e, port.EngineError) for e in events.items), events.kinds(port.EngineError)
        await _answered_after(events, session, case, _rate(engine))


# -- tools ---------------------------------------------------------------------------------------


async def test_tools_a_forced_call_then_its_output_gets_a_reply(case: EngineCase) -> None:
    async with started(case) as engine:
        require("tools", "tools", engine)
        forced = SessionConfig(
            tools=(WEATHER,), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function=WEATHER.name)
        )
        async with opened(engine, config=forced) as (session, events):
            await session.update(forced)
            await turn(session, case.turn(_rate(engine)), item_id="item_1", response_id="resp_1")
            await events.done("resp_1")
            calls = [e for e in events.of("resp_1") if isinstance(e, port.EngineFunctionCall)]
            assert [c.name for c in calls] == [WEATHER.name] and calls[0].call_id
            await session.add_function_output(
                item_id="item_out", call_id=calls[0].call_id, output='{"sky": "clear"}'
            )
            await session.update(
                SessionConfig(tools=(WEATHER,), tool_choice=ToolChoice(mode=ToolChoiceMode.NONE))
            )
            await session.create_response(response_id="resp_2", instructions=None)
            await events.done("resp_2")
            _assert_reply(events, "resp_2")


# -- close and failure ---------------------------------------------------------------------------


async def test_close_ends_the_stream_with_closed_and_frees_the_slot(case: EngineCase) -> None:
    async with started(case) as engine:
        session = await engine.open_session("closing", SessionConfig())
        events = Events(session)
        await turn(session, case.long_turn(_rate(engine)), item_id="item_1", response_id="resp_1")
        await events.first(port.EngineResponseStarted, "resp_1")
        await session.close("client_close")
        await session.close("again")  # idempotent
        await events.end()
        closed = [i for i, e in enumerate(events.items) if isinstance(e, port.EngineClosed)]
        assert closed == [len(events.items) - 1], events.items[-3:]
        assert engine.active_sessions == 0


async def test_shutdown_ends_every_open_session_and_refuses_new_ones(case: EngineCase) -> None:
    # What the gateway sees when its engine goes away under live calls.
    engine = case.build()
    await engine.start()
    sessions = [await engine.open_session(f"s{i}", SessionConfig()) for i in range(2)]
    streams = [Events(s) for s in sessions]
    await turn(sessions[0], case.long_turn(_rate(engine)), item_id="item_1", response_id="resp_1")
    await streams[0].first(port.EngineResponseStarted, "resp_1")
    await engine.shutdown()
    for events in streams:
        await events.end()
        assert isinstance(events.items[-1], port.EngineClosed), events.items[-3:]
    assert engine.active_sessions == 0 and not engine.ready
    with pytest.raises(port.EngineUnavailable):
        await engine.open_session("after", SessionConfig())
