"""Responses delegation handed to a backend model, driven through the Live dialect as the host would.

The host's part is played here by hand: it renders the session's events, runs each
:class:`~duplex_gateway.dialects.live_backend.BackendRequest` (here: answers it with the
:data:`~duplex_gateway.dialects.live_backend.BackendResult` s a backend would stream), and sends the
dialect's own frames and the backend's answers for the engine on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from duplex_gateway.dialects.live import LiveDialect
from duplex_gateway.dialects.live_backend import (
    BACKEND_TOOL_NAME,
    ITEM_PREFIX,
    MAX_OPEN,
    MAX_ROUNDS,
    BackendCall,
    BackendCallMade,
    BackendFailed,
    BackendFinished,
    BackendMessage,
    BackendRequest,
    BackendText,
)
from duplex_gateway.dialects.live_pacing import PacedLiveDialect
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import ContextAppend, SessionUpdate
from duplex_gateway.vocabulary.session_config import UNSET, FunctionTool, SessionConfig
from tests.dialects.test_live import EXPIRES_AT, _call, _refused, _send, _wire

BACKEND = "local-model"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_TOOL = FunctionTool(
    name="get_weather",
    description="The weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
#: The engine's one function for a session offering WEATHER.
ENGINE_TOOL = "delegate_get_weather"
RESPONSES: dict[str, Any] = {
    "model": "gpt-5.4-mini",
    "instructions": "Answer with facts only.",
    "tools": [WEATHER],
    "max_output_tokens": 300,
}


def _dialect(backend: str | None = BACKEND, *, paced: bool = False) -> LiveDialect:
    kind = PacedLiveDialect if paced else LiveDialect
    return kind(session_id="live_test", expires_at=EXPIRES_AT, max_message_bytes=1 << 20, backend=backend)


def _start(dialect: LiveDialect, responses: dict[str, Any] | None = None) -> SessionUpdate:
    commands = _send(
        dialect,
        {
            "type": "session.start",
            "event_id": "evt_start",
            "session": {
                "model": "gpt-live-1",
                "instructions": "Be brief.",
                "delegation": {
                    "type": "responses",
                    "responses": RESPONSES if responses is None else responses,
                },
            },
        },
    )
    update = commands[0]
    assert isinstance(update, SessionUpdate)
    return update


def _started(dialect: LiveDialect, responses: dict[str, Any] | None = None) -> SessionConfig:
    config = SessionConfig().apply(_start(dialect, responses).session)
    assert _wire(dialect, ev.SessionCreated(session_id="internal", config=config)) is not None
    return config


def _own(dialect: LiveDialect) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in dialect.own_frames()]


def _nested(frames: list[dict[str, Any]]) -> list[str]:
    assert all(f["type"] == "response.event" for f in frames), frames
    return [f["event"]["type"] for f in frames]


def _delegate(
    dialect: LiveDialect, call_id: str = "call_1", response_id: str = "r1", name: str = ENGINE_TOOL
) -> BackendRequest:
    """The engine's reply ``response_id`` calls the backend's function ``name``: the one request it makes."""
    call = _call(response_id, call_id, name)
    assert _wire(dialect, ev.OutputItemAdded(response_id=response_id, output_index=1, item=call)) is None
    created = _wire(dialect, ev.OutputItemDone(response_id=response_id, output_index=1, item=call))
    assert created is not None and created["type"] == "session.delegation.created"
    (request,) = dialect.take_backend_requests()
    assert created["delegation"]["id"] == request.delegation_id
    assert _nested(_own(dialect)) == ["response.created"]
    return request


def _answer(dialect: LiveDialect) -> ContextAppend:
    (answer,) = dialect.take_backend_commands()
    assert isinstance(answer, ContextAppend)
    return answer


# -- the engine's one function ---------------------------------------------------------------------


def test_the_engine_gets_one_function_that_describes_the_backends_work() -> None:
    update = _start(_dialect(), {**RESPONSES, "tool_choice": "required"})
    tools = update.session.tools
    assert isinstance(tools, tuple)
    (tool,) = tools
    # Named after the backend's functions too: an engine picks a function by its name's words.
    assert tool.name == ENGINE_TOOL == f"{BACKEND_TOOL_NAME}_get_weather"
    assert "Answer with facts only." in tool.description
    assert "get weather: The weather in a city" in tool.description
    # The client's tool_choice is the backend's: forcing it on the engine would force every reply to delegate.
    assert update.session.tool_choice is UNSET


def test_without_a_backend_the_engine_calls_the_clients_functions_itself() -> None:
    dialect = _dialect(None)
    update = _start(dialect)
    assert update.session.tools == (WEATHER_TOOL,)
    _wire(dialect, ev.SessionCreated(session_id="internal", config=SessionConfig().apply(update.session)))
    call = _call("r1", "call_1", "get_weather")
    created = _wire(dialect, ev.OutputItemAdded(response_id="r1", output_index=0, item=call))
    assert created is not None and created["delegation"]["id"] == "deleg_r1"
    done = _wire(dialect, ev.OutputItemDone(response_id="r1", output_index=0, item=call))
    assert done is not None and done["event"]["item"]["call_id"] == "call_1"
    assert dialect.take_backend_requests() == [] and dialect.take_backend_commands() == []
    assert dialect.own_frames() == []


def test_a_session_update_describes_the_engines_function_anew() -> None:
    dialect = _dialect()
    _started(dialect)
    booking = {"type": "function", "name": "book_table", "description": "Books a table"}
    (update,) = _send(
        dialect,
        {
            "type": "session.update",
            "event_id": "u1",
            "session": {"delegation": {"type": "responses", "responses": {"tools": [booking]}}},
        },
    )
    assert isinstance(update, SessionUpdate)
    tools = update.session.tools
    assert isinstance(tools, tuple)
    (tool,) = tools
    assert tool.name == f"{BACKEND_TOOL_NAME}_book_table"
    assert "book table: Books a table" in tool.description and "get weather" not in tool.description
    # The backend gets the new tools with its next request.
    request = _delegate(dialect, name=tool.name)
    assert [t.name for t in request.tools] == ["book_table"]
    # A change that leaves the backend's work as it was leaves the engine's function alone.
    (choice,) = _send(
        dialect,
        {
            "type": "session.update",
            "session": {"delegation": {"type": "responses", "responses": {"tool_choice": "auto"}}},
        },
    )
    assert isinstance(choice, SessionUpdate)
    assert choice.session.tools is UNSET and choice.session.tool_choice is UNSET


@pytest.mark.parametrize(
    ("backend", "code"),
    [(BACKEND, "responses_delegation_backend"), (None, "responses_delegation_local")],
)
def test_session_started_is_followed_by_a_notice_of_who_does_the_delegated_work(
    backend: str | None, code: str
) -> None:
    dialect = _dialect(backend, paced=True)
    assert isinstance(dialect, PacedLiveDialect)
    _started(dialect)
    frames, _wake = dialect.pump(0.0)
    (notice,) = [json.loads(f) for f in frames]
    assert (notice["type"], notice["code"]) == ("info", code)
    assert (BACKEND in notice["message"]) is (backend is not None)


# -- a delegation, from the engine's call to the engine's answer -------------------------------------


def test_the_engines_call_opens_a_delegation_whose_request_carries_the_conversation() -> None:
    dialect = _dialect()
    _started(dialect)
    _wire(dialect, ev.TranscriptDelta(response_id="r0", item_id="i0", delta="Hello! "))
    _wire(dialect, ev.TranscriptDelta(response_id="r0", item_id="i0", delta="How can I help?"))
    _wire(dialect, ev.ResponseDone(response_id="r0", status="completed"))
    _wire(dialect, ev.InputTranscriptionDelta(item_id="u1", delta="Weather in"))
    _wire(dialect, ev.InputTranscriptionCompleted(item_id="u1", transcript="Weather in Paris?"))
    call = _call("r1", "call_1", ENGINE_TOOL)
    # The engine's call is no Responses output of the client's: the delegation opens when it is complete.
    assert _wire(dialect, ev.OutputItemAdded(response_id="r1", output_index=0, item=call)) is None
    created = _wire(dialect, ev.OutputItemDone(response_id="r1", output_index=0, item=call))
    (request,) = dialect.take_backend_requests()
    assert created == {
        "type": "session.delegation.created",
        "event_id": "event_1",
        "offset_ms": 0,
        "delegation": {
            "id": request.delegation_id,
            "type": "delegation",
            "target": "responses",
            "response_id": request.response_id,
        },
    }
    (opened,) = _own(dialect)
    assert (opened["delegation_id"], opened["event"]["type"]) == (request.delegation_id, "response.created")
    assert opened["event"]["response"] == {
        "id": request.response_id,
        "object": "response",
        "status": "in_progress",
        "output": [],
    }
    assert request.messages == (
        BackendMessage(role="system", content="Answer with facts only.\n\nBe brief."),
        BackendMessage(role="assistant", content="Hello! How can I help?"),
        BackendMessage(role="user", content="Weather in Paris?"),
    )
    assert request.tools == (WEATHER_TOOL,) and request.max_output_tokens == 300
    # The engine's own reply is no delegated response: its end tells the client nothing.
    assert _wire(dialect, ev.ResponseDone(response_id="r1", status="completed")) is None
    assert dialect.take_backend_requests() == [] and dialect.take_backend_commands() == []


def test_the_backends_words_stream_to_the_client_and_its_answer_goes_to_the_engine() -> None:
    dialect = _dialect()
    _started(dialect)
    request = _delegate(dialect)
    rid = request.response_id
    dialect.backend_result(BackendText(response_id=rid, delta="It is "))
    dialect.backend_result(BackendText(response_id=rid, delta="sunny."))
    streamed = _own(dialect)
    assert _nested(streamed) == [
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.delta",
    ]
    item_id = streamed[0]["event"]["item"]["id"]
    assert streamed[0]["event"]["item"] == {
        "id": item_id,
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    assert [(f["event"]["item_id"], f["event"]["delta"]) for f in streamed[1:]] == [
        (item_id, "It is "),
        (item_id, "sunny."),
    ]
    assert dialect.take_backend_commands() == []  # the engine hears the answer once it is whole
    dialect.backend_result(BackendFinished(response_id=rid, reason="stop", input_tokens=12, output_tokens=4))
    finished = _own(dialect)
    assert _nested(finished) == [
        "response.output_text.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert finished[0]["event"]["text"] == "It is sunny."
    assert finished[1]["event"]["item"] == {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
    }
    completed = finished[2]["event"]["response"]
    assert (completed["id"], completed["status"]) == (rid, "completed")
    assert completed["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 16,
    }
    # One delegation, one response: every nested event in order, and all under the delegation.
    events = streamed + finished
    assert {f["delegation_id"] for f in events} == {request.delegation_id}
    assert [f["event"]["sequence_number"] for f in events] == list(range(1, 7))
    answer = _answer(dialect)
    assert (answer.channel, answer.content, answer.delegation_id) == ("commentary", "It is sunny.", "call_1")
    assert answer.item_id is not None and answer.item_id.startswith(ITEM_PREFIX)
    # The session's acknowledgement of the gateway's own append is not the client's to see...
    appended = ctx.ContextAppended(channel="commentary", item_id=answer.item_id, delegation_id="call_1")
    assert _wire(dialect, appended) is None
    # ...while the client's own appends are still acknowledged.
    (own,) = _send(
        dialect, {"type": "session.thinking.append", "event_id": "t1", "delegation_id": None, "content": "x"}
    )
    assert isinstance(own, ContextAppend) and own.item_id is not None
    ack = _wire(dialect, ctx.ContextAppended(channel="thinking", item_id=own.item_id, event_id="t1"))
    assert ack is not None and ack["type"] == "session.thinking.appended"
    # A delegation answered is over: anything more for its response is dropped.
    dialect.backend_result(BackendText(response_id=rid, delta="late"))
    assert dialect.own_frames() == [] and dialect.take_backend_commands() == []


def test_a_backend_function_call_is_the_clients_to_run_and_its_output_starts_the_next_round() -> None:
    dialect = _dialect()
    _started(dialect)
    first = _delegate(dialect)
    call = BackendCall(call_id="fc_1", name="get_weather", arguments='{"city":"Paris"}')
    dialect.backend_result(BackendText(response_id=first.response_id, delta="Checking."))
    dialect.backend_result(BackendCallMade(response_id=first.response_id, call=call))
    dialect.backend_result(BackendFinished(response_id=first.response_id, reason="tool_calls"))
    frames = _own(dialect)
    assert _nested(frames) == [
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",  # the words
        "response.output_item.done",  # the call
        "response.completed",
    ]
    function_call = frames[4]["event"]
    assert function_call["output_index"] == 1
    assert {k: v for k, v in function_call["item"].items() if k != "id"} == {
        "type": "function_call",
        "status": "completed",
        "call_id": "fc_1",
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }
    assert "usage" not in frames[5]["event"]["response"]  # the backend counted nothing
    assert dialect.take_backend_commands() == []  # the engine's call waits for the backend's answer
    early = _refused(dialect, {"type": "response.create", "event_id": "rc0"})
    assert early["error"]["code"] == "function_call_outputs_required"
    assert "fc_1" in early["error"]["message"]
    stranger = _refused(
        dialect,
        {
            "type": "response.item.create",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": "x"},
        },
    )
    # The engine's own call is the backend's to answer, not the client's.
    assert (stranger["error"]["code"], stranger["error"]["param"]) == ("invalid_value", "item.call_id")
    output = {"type": "function_call_output", "call_id": "fc_1", "output": "Sunny, 21 C"}
    assert _send(dialect, {"type": "response.item.create", "item": output}) == ()
    again = _refused(dialect, {"type": "response.item.create", "item": output})
    assert again["error"]["param"] == "item.call_id"  # answered once
    assert dialect.take_backend_requests() == []  # the client says when the round goes on
    assert _send(dialect, {"type": "response.create", "event_id": "rc1"}) == ()
    (resumed,) = _own(dialect)
    (second,) = dialect.take_backend_requests()
    assert resumed["delegation_id"] == first.delegation_id == second.delegation_id
    assert resumed["event"]["type"] == "response.created"
    assert resumed["event"]["response"]["id"] == second.response_id != first.response_id
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[len(first.messages) :] == (
        BackendMessage(role="assistant", content="Checking.", tool_calls=(call,)),
        BackendMessage(role="tool", content="Sunny, 21 C", tool_call_id="fc_1"),
    )
    # The first round is over: what still comes for it is dropped.
    dialect.backend_result(BackendText(response_id=first.response_id, delta="stale"))
    assert dialect.own_frames() == []
    dialect.backend_result(BackendText(response_id=second.response_id, delta="Sunny in Paris."))
    dialect.backend_result(BackendFinished(response_id=second.response_id, reason="stop"))
    assert _nested(_own(dialect))[-1] == "response.completed"
    assert _answer(dialect).content == "Sunny in Paris."
    # With nothing waiting, response.create is the engine's again.
    (create,) = _send(dialect, {"type": "response.create"})
    assert create.type == "response.create"


def test_a_failed_round_fails_the_response_and_the_engine_hears_why() -> None:
    dialect = _dialect()
    _started(dialect)
    request = _delegate(dialect)
    dialect.backend_result(BackendText(response_id=request.response_id, delta="Let me"))
    dialect.backend_result(BackendFailed(response_id=request.response_id, message="connection refused"))
    frames = _own(dialect)
    assert _nested(frames) == [
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
        "response.failed",
    ]
    failed = frames[-1]["event"]["response"]
    assert (failed["id"], failed["status"]) == (request.response_id, "failed")
    assert failed["error"] == {"code": "server_error", "message": "connection refused"}
    answer = _answer(dialect)
    assert (answer.channel, answer.delegation_id) == ("commentary", "call_1")
    assert "could not complete" in answer.content and "connection refused" in answer.content


def test_an_answer_cut_off_is_incomplete_and_an_empty_one_is_a_failure_to_the_engine() -> None:
    dialect = _dialect()
    _started(dialect)
    cut = _delegate(dialect, "call_1", "r1")
    dialect.backend_result(BackendText(response_id=cut.response_id, delta="Partly"))
    dialect.backend_result(BackendFinished(response_id=cut.response_id, reason="length"))
    incomplete = _own(dialect)[-1]["event"]
    assert incomplete["type"] == "response.incomplete"
    assert incomplete["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert _answer(dialect).content == "Partly"
    empty = _delegate(dialect, "call_2", "r2")
    dialect.backend_result(BackendFinished(response_id=empty.response_id, reason="stop"))
    assert _nested(_own(dialect)) == ["response.completed"]
    answer = _answer(dialect)
    assert answer.delegation_id == "call_2" and "could not complete" in answer.content


def test_a_backend_that_keeps_calling_functions_is_stopped_after_max_rounds() -> None:
    dialect = _dialect()
    _started(dialect)
    request = _delegate(dialect)
    for n in range(MAX_ROUNDS):
        call = BackendCall(call_id=f"fc_{n}", name="get_weather", arguments="{}")
        dialect.backend_result(BackendCallMade(response_id=request.response_id, call=call))
        dialect.backend_result(BackendFinished(response_id=request.response_id, reason="tool_calls"))
        assert dialect.take_backend_commands() == []
        _send(
            dialect,
            {
                "type": "response.item.create",
                "item": {"type": "function_call_output", "call_id": f"fc_{n}", "output": "again"},
            },
        )
        _send(dialect, {"type": "response.create"})
        requests = dialect.take_backend_requests()
        if n < MAX_ROUNDS - 1:
            (request,) = requests
    assert requests == []  # no round past the limit
    assert _nested(_own(dialect))[-1] == "response.failed"  # the client hears the delegation ended
    answer = _answer(dialect)
    assert answer.delegation_id == "call_1"
    assert "could not complete" in answer.content and f"{MAX_ROUNDS} times" in answer.content


def test_delegations_past_the_open_limit_are_refused_to_the_engine() -> None:
    dialect = _dialect()
    _started(dialect)
    for n in range(MAX_OPEN):
        _delegate(dialect, f"call_{n}", f"r{n}")
    call = _call("rx", "call_x", ENGINE_TOOL)
    assert _wire(dialect, ev.OutputItemDone(response_id="rx", output_index=0, item=call)) is None
    assert dialect.take_backend_requests() == [] and dialect.own_frames() == []
    answer = _answer(dialect)
    assert answer.delegation_id == "call_x" and "too many" in answer.content


def test_the_engines_other_calls_open_no_delegation() -> None:
    dialect = _dialect()
    _started(dialect)
    call = _call("r1", "call_1", "get_weather")  # not the engine's to call: it has only the backend's
    assert _wire(dialect, ev.OutputItemAdded(response_id="r1", output_index=0, item=call)) is None
    assert _wire(dialect, ev.OutputItemDone(response_id="r1", output_index=0, item=call)) is None
    assert dialect.take_backend_requests() == [] and dialect.own_frames() == []


def test_results_for_a_response_never_asked_for_are_dropped() -> None:
    dialect = _dialect()
    _started(dialect)
    dialect.backend_result(BackendText(response_id="resp_nobody", delta="x"))
    dialect.backend_result(BackendFinished(response_id="resp_nobody"))
    assert dialect.own_frames() == [] and dialect.take_backend_commands() == []


# -- the paced dialect, as the gateway serves it -------------------------------------------------------


def test_the_paced_dialect_sends_the_backends_frames_with_its_next_pump() -> None:
    dialect = _dialect(paced=True)
    assert isinstance(dialect, PacedLiveDialect)
    _started(dialect)
    dialect.pump(0.0)  # the notice
    assert not dialect.wants_pump
    call = _call("r1", "call_1", ENGINE_TOOL)
    assert dialect.render(ev.OutputItemDone(response_id="r1", output_index=0, item=call), seq=2) is not None
    assert dialect.wants_pump  # the delegation's response.created waits for a pump
    frames, _wake = dialect.pump(0.1)
    assert _nested([json.loads(f) for f in frames]) == ["response.created"]
    assert not dialect.wants_pump
    (request,) = dialect.take_backend_requests()
    call_made = BackendCall(call_id="fc_1", name="get_weather", arguments="{}")
    dialect.backend_result(BackendCallMade(response_id=request.response_id, call=call_made))
    dialect.backend_result(BackendFinished(response_id=request.response_id))
    assert dialect.wants_pump
    frames, _wake = dialect.pump(0.2)
    assert _nested([json.loads(f) for f in frames]) == ["response.output_item.done", "response.completed"]
    _send(
        dialect,
        {
            "type": "response.item.create",
            "item": {"type": "function_call_output", "call_id": "fc_1", "output": "ok"},
        },
    )
    assert not dialect.wants_pump
    _send(dialect, {"type": "response.create"})
    assert dialect.wants_pump  # a client event made frames of the dialect's own
    frames, _wake = dialect.pump(0.3)
    assert _nested([json.loads(f) for f in frames]) == ["response.created"]
    (second,) = dialect.take_backend_requests()
    dialect.backend_result(BackendText(response_id=second.response_id, delta="Done."))
    dialect.backend_result(BackendFinished(response_id=second.response_id))
    dialect.pump(0.4)
    # The engine's answer goes out with the pacing's own commands.
    answers = [c for c in dialect.take_commands() if isinstance(c, ContextAppend)]
    assert [(a.content, a.delegation_id) for a in answers] == [("Done.", "call_1")]


def test_the_request_carries_what_was_said_but_not_yet_in_the_transcript() -> None:
    dialect = _dialect()
    _started(dialect)
    # The caller goes on talking (words still being recognized) while the engine's reply delegates.
    _wire(dialect, ev.SpeechStarted(item_id="item_caller", audio_start_ms=0))
    _wire(dialect, ev.InputTranscriptionDelta(item_id="item_caller", delta="and in Rome"))
    _wire(dialect, ev.TranscriptDelta(response_id="r1", item_id="item_reply", delta="Let me check."))
    request = _delegate(dialect)
    said = [(m.role, m.content) for m in request.messages[1:]]
    assert said == [("user", "and in Rome"), ("assistant", "Let me check.")]
