"""Conformance: every Live server event the gateway renders parses with Pipecat's own Live models.

The frames are the exact text the dialect renders over a whole conversation of each delegation mode,
refusals included (:func:`tests.dialects.test_live.whole_conversation`). Each is parsed as Pipecat's
``OpenAILiveLLMService`` parses what it receives (``events.parse_server_event`` on the text, nothing
added first), must come out as the event class Pipecat has for its type (not its catch-all for
unknown types), and may carry no field Pipecat's model lacks but the ones OpenAI's schema has.
OpenAI's own generated Live types (the ``openai`` package LiveKit installs) then hold each frame to
the fields OpenAI requires, which Pipecat leaves optional.

The dialect is pure, so it is imported here in .venv-peers as it is: no gateway process is needed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip(
    "pipecat", reason="Pipecat runs in .venv-peers (make test runs it there, where it must be installed)"
)

from pipecat.services.openai.live import events as pipecat_live
from pydantic import BaseModel, TypeAdapter

from tests.dialects.test_live import whole_conversation

#: Fields OpenAI's Live schema defines that Pipecat's models do not: allowed as Pipecat's extras.
OPENAI_ONLY_FIELDS = {"store"}

FRAMES = whole_conversation()


def _extras(model: BaseModel, path: str = "") -> list[str]:
    """Every field, at any depth, that the parsed Pipecat model kept as an unmodelled extra."""
    found = [f"{path}{name}" for name in (model.model_extra or {}) if name not in OPENAI_ONLY_FIELDS]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found += _extras(value, f"{path}{name}.")
    return found


@pytest.mark.parametrize("frame", FRAMES, ids=[f"{i}-{json.loads(f)['type']}" for i, f in enumerate(FRAMES)])
def test_pipecat_parses_the_frame_as_its_own_event(frame: str) -> None:
    parsed = pipecat_live.parse_server_event(frame)
    assert not isinstance(parsed, pipecat_live.UnknownServerEvent), parsed.type
    assert type(parsed) is pipecat_live._server_event_types[parsed.type]
    assert _extras(parsed) == []
    # What Pipecat reads from it round-trips to the very text: nothing was lost or reshaped.
    assert parsed.model_dump(exclude_unset=True) == json.loads(frame)


@pytest.mark.parametrize("frame", [f for f in FRAMES if json.loads(f)["type"] == "response.event"])
def test_pipecat_reads_the_nested_responses_events(frame: str) -> None:
    envelope = pipecat_live.parse_server_event(frame)
    assert isinstance(envelope, pipecat_live.ResponseEventEnvelope)
    assert envelope.inner_type in (
        "response.created",
        "response.output_item.added",  # a backend's words, streamed
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
        "response.completed",
        "response.failed",  # a backend's round that failed
    )
    assert envelope.delegation_id
    if envelope.inner_type == "response.output_item.done":
        item = pipecat_live.ResponseOutputItem.model_validate(envelope.event["item"])
        # Pipecat runs the function calls and passes over the backend's words (a message item).
        assert (item.type, item.status) in (("function_call", "completed"), ("message", "completed"))
        if item.type == "function_call":
            assert item.call_id and item.name and item.arguments is not None


def test_the_conversation_covers_every_event_pipecat_handles() -> None:
    handled = set(pipecat_live._server_event_types) - {
        "session.instructions.appended"  # same model as the two appends the conversation has
    }
    assert {json.loads(frame)["type"] for frame in FRAMES} == handled


def test_an_error_before_session_started_is_a_startup_failure_to_pipecat() -> None:
    first = pipecat_live.parse_server_event(FRAMES[0])
    assert isinstance(first, pipecat_live.ErrorEvent)
    assert (first.error.type, first.error.code) == ("invalid_request_error", "session_not_started")


def _openai_server_event() -> TypeAdapter[Any]:
    live_types = pytest.importorskip(
        "openai.types.live", reason="OpenAI's Live types come with LiveKit's plugin"
    )
    return TypeAdapter(live_types.ServerEvent)


@pytest.mark.parametrize("frame", FRAMES, ids=[f"{i}-{json.loads(f)['type']}" for i, f in enumerate(FRAMES)])
def test_openais_types_find_every_field_they_require(frame: str) -> None:
    parsed = _openai_server_event().validate_json(frame)
    assert parsed.type == json.loads(frame)["type"]


# -- the other direction: what the two clients send, the dialect takes ---------------------------------


def _pipecat_events() -> list[Any]:
    """Every client event Pipecat's service sends, built with its own models, in a session's order."""
    e = pipecat_live
    history = [
        e.InputItem(role="developer", content=[e.InputTextContent(text="Rules.")]),
        e.InputItem(role="user", content=[e.InputTextContent(text="Hello")]),
        e.InputItem(role="assistant", content=[e.OutputTextContent(text="Hi!")]),
    ]
    responses = {"model": "gpt-5.4-mini", "instructions": "Be exact.", "max_output_tokens": 200}
    tools = [
        {"type": "function", "name": "get_time", "description": "The time", "parameters": {"type": "object"}}
    ]
    return [
        e.SessionStartEvent(
            session=e.SessionConfig(
                model="gpt-live-1",
                instructions="Be brief.",
                audio=e.AudioConfig(output=e.AudioOutputConfig(voice="marin")),
                delegation=e.ResponsesDelegationConfig(responses={**responses, "tools": tools}),
                input=history,
                store=False,
            )
        ),
        e.SessionUpdateEvent(
            session=e.SessionUpdateConfig(delegation=e.ResponsesDelegationConfig(responses={"tools": tools}))
        ),
        e.InputAudioAppendEvent(audio="AAAAAA=="),
        e.SessionCommentaryAppendEvent(delegation_id=None, content="Greet the caller."),
        e.SessionThinkingAppendEvent(delegation_id=None, content="The caller is in a hurry."),
        e.SessionInstructionsAppendEvent(delegation_id=None, content="Speak slowly."),
        e.ResponseItemCreateEvent(item=e.FunctionCallOutputItem(call_id="call_1", output='"12:00"')),
        e.ResponseCreateEvent(),
        e.SessionCloseEvent(),
    ]


def test_the_dialect_takes_every_event_pipecat_sends() -> None:
    from tests.dialects.test_live import _dialect

    dialect = _dialect()
    for event in _pipecat_events():
        commands = dialect.parse(json.dumps(event.to_payload()))
        assert commands, event.type
        assert all(command.event_id == event.event_id for command in commands), event.type


def test_the_dialect_takes_livekits_session_start_and_its_context_events() -> None:
    from livekit.agents.llm._realtime import gpt_live_types as lk

    from tests.dialects.test_live import _dialect

    start = lk.SessionStartEvent(
        event_id="session_start_1",
        session=lk.SessionConfig(
            model="gpt-live-1",
            instructions="Be brief.",
            input=[lk.InputItem(role="assistant", content=[lk.OutputTextPart(text="Hi!")])],
            audio=lk.AudioConfig(
                format=lk.AudioFormat(type="audio/pcm", rate=24000), output=lk.AudioOutput(voice="marin")
            ),
            # LiveKit's default: Responses delegation to a cloud model the gateway does not have.
            delegation=lk.Delegation(
                type="responses",
                responses=lk.ResponsesConfig(
                    model="gpt-5.6-luna",
                    tools=[
                        {
                            "type": "function",
                            "name": "f",
                            "description": "d",
                            "parameters": {"type": "object"},
                        }
                    ],
                    reasoning={"effort": "low"},
                ),
            ),
        ),
    )
    dialect = _dialect()
    assert dialect.parse(json.dumps(start.model_dump(exclude_none=True)))
    for event in (
        lk.InputAudioAppendEvent(audio="AAAAAA=="),
        lk.ThinkingAppendEvent(event_id="a1", delegation_id=None, content="Context."),
        lk.ResponseCreateEvent(event_id="rc1"),
        lk.SessionCloseEvent(),
    ):
        assert dialect.parse(json.dumps(event.model_dump(exclude_none=True)))
    # Mute and unmute: tests/peers/test_live_models_context.py.
