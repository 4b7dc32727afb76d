"""The OpenAI Live dialect: Live client JSON -> commands, server events -> Live wire JSON.

:func:`whole_conversation` plays one session of each delegation mode through a dialect, the way the
host would (errors included), and returns every frame the client got; the peers conformance test
(tests/peers/test_live_models.py) parses those with Pipecat's own models.
"""

from __future__ import annotations

import ast
import base64
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from duplex_gateway.dialects import live, live_backend, live_commands, live_errors, live_pacing, live_session
from duplex_gateway.dialects.live import LiveDialect
from duplex_gateway.dialects.live_session import DELEGATE_TOOL, MAX_INPUT_ITEMS
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import (
    Command,
    ContextAppend,
    ConversationItemCreate,
    InputAudioAppend,
    InputAudioMute,
    ResponseCreate,
    SessionClose,
    SessionUpdate,
)
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import (
    UNSET,
    FunctionTool,
    InputTranscription,
    Modality,
    SessionConfig,
    ToolChoiceMode,
)

EXPIRES_AT = 1_900_000_000


def _dialect() -> LiveDialect:
    return LiveDialect(session_id="live_test", expires_at=EXPIRES_AT, max_message_bytes=1 << 20)


def _send(dialect: LiveDialect, event: dict[str, Any]) -> tuple[Command, ...]:
    return dialect.parse(json.dumps(event))


def _refused(dialect: LiveDialect, frame: str | bytes | dict[str, Any]) -> dict[str, Any]:
    """The ``error`` frame the client gets for ``frame``, rendered as the host renders a refusal."""
    text = json.dumps(frame) if isinstance(frame, dict) else frame
    with pytest.raises(ProtocolError) as caught:
        dialect.parse(text)
    exc = caught.value
    rendered = dialect.render(
        ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param), seq=99
    )
    assert rendered is not None
    wire: dict[str, Any] = json.loads(rendered)
    assert wire["type"] == "error"
    return wire


def _wire(dialect: LiveDialect, event: ev.ServerEvent, seq: int = 1) -> dict[str, Any] | None:
    rendered = dialect.render(event, seq=seq)
    return None if rendered is None else json.loads(rendered)


def _start(dialect: LiveDialect, **session: Any) -> tuple[Command, ...]:
    return _send(
        dialect,
        {"type": "session.start", "event_id": "evt_start", "session": {"model": "gpt-live-1", **session}},
    )


def _started(dialect: LiveDialect, **session: Any) -> SessionConfig:
    """Start the session and render ``session.started``, as the engine opening would."""
    commands = _start(dialect, **session)
    update = commands[0]
    assert isinstance(update, SessionUpdate)
    config = SessionConfig().apply(update.session)
    assert _wire(dialect, ev.SessionCreated(session_id="sess_internal", config=config)) is not None
    return config


def _audio(ms: int, rate: int = 24_000) -> str:
    return base64.b64encode(b"\x00\x00" * (rate * ms // 1000)).decode("ascii")


def _call(response_id: str, call_id: str, name: str, arguments: str = "{}") -> ev.ConversationItem:
    return ev.ConversationItem(
        id=f"item_{call_id}",
        role="assistant",
        content_type="",
        kind="function_call",
        call_id=call_id,
        name=name,
        arguments=arguments,
    )


# -- session.start ---------------------------------------------------------------------------------


def test_pipecat_start_becomes_the_session_configuration_and_its_history() -> None:
    dialect = _dialect()
    commands = _start(
        dialect,
        instructions="Be brief.",
        audio={"output": {"voice": "marin"}},
        delegation={"type": "client"},
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]},
        ],
        store=True,
    )
    update, *history = commands
    assert isinstance(update, SessionUpdate) and update.event_id == "evt_start"
    patch = update.session
    assert patch.model == "gpt-live-1"
    assert patch.instructions == "Be brief."
    assert patch.voice == "marin"
    pcm24 = AudioFormat(encoding=Encoding.PCM16, rate=24_000)
    assert patch.input_format == pcm24 and patch.output_format == pcm24
    assert patch.output_modalities == (Modality.AUDIO,)
    assert patch.input_transcription == InputTranscription()
    assert patch.tools == (DELEGATE_TOOL,)
    assert [(c.role, c.text) for c in history if isinstance(c, ConversationItemCreate)] == [
        ("system", "Rules."),
        ("user", "Hello"),
        ("assistant", "Hi!"),
    ]


def test_a_bare_start_takes_the_live_defaults() -> None:
    (update,) = _start(_dialect())
    assert isinstance(update, SessionUpdate)
    assert update.session.instructions is UNSET and update.session.voice is UNSET
    assert update.session.input_format == AudioFormat(encoding=Encoding.PCM16, rate=24_000)


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "audio/pcm", "rate": 16000}, AudioFormat(encoding=Encoding.PCM16, rate=16_000)),
        ({"type": "audio/pcm"}, AudioFormat(encoding=Encoding.PCM16, rate=24_000)),
        ({"type": "audio/pcmu", "rate": 8000}, AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)),
        ({"type": "audio/pcma"}, AudioFormat(encoding=Encoding.G711_ALAW, rate=8_000)),
    ],
)
def test_one_audio_format_serves_both_directions(fmt: dict[str, Any], expected: AudioFormat) -> None:
    (update,) = _start(_dialect(), audio={"format": fmt})
    assert isinstance(update, SessionUpdate)
    assert update.session.input_format == expected == update.session.output_format


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "audio/opus", "rate": 48000}, "session.audio.format.type"),
        ({"type": "audio/pcm", "rate": 44100}, "session.audio.format.rate"),
        ({"type": "audio/pcmu", "rate": 16000}, "session.audio.format.rate"),
    ],
)
def test_an_audio_format_the_live_api_lacks_is_refused(fmt: dict[str, Any], param: str) -> None:
    wire = _refused(
        _dialect(), {"type": "session.start", "session": {"model": "m", "audio": {"format": fmt}}}
    )
    assert wire["error"]["code"] == "invalid_value"
    assert wire["error"]["param"] == param
    assert wire["error"]["message"].startswith("Invalid value: ")


def test_the_model_is_required() -> None:
    wire = _refused(_dialect(), {"type": "session.start", "event_id": "e1", "session": {}})
    assert wire["error"] == {
        "type": "invalid_request_error",
        "code": "missing_required_parameter",
        "message": "Missing required parameter: 'session.model'.",
        "param": "session.model",
        "client_event_id": "e1",
    }
    assert wire["client_event_id"] == "e1"


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "session.start", "session": {"model": "m"}, "extra": 1}, "extra"),
        ({"type": "session.start", "session": {"model": "m", "voice": "marin"}}, "session.voice"),
        ({"type": "session.start", "session": {"model": "m", "audio": {"input": {}}}}, "session.audio.input"),
        (
            {
                "type": "session.start",
                "session": {"model": "m", "audio": {"format": {"type": "audio/pcm", "x": 1}}},
            },
            "session.audio.format.x",
        ),
        (
            {
                "type": "session.start",
                "session": {"model": "m", "delegation": {"type": "client", "responses": {}}},
            },
            "session.delegation.responses",
        ),
        (
            {
                "type": "session.start",
                "session": {
                    "model": "m",
                    "delegation": {"type": "responses", "responses": {"temperature": 1}},
                },
            },
            "session.delegation.responses.temperature",
        ),
    ],
)
def test_unknown_fields_are_refused_as_the_strict_schema_does(event: dict[str, Any], param: str) -> None:
    wire = _refused(_dialect(), event)
    assert wire["error"]["code"] == "unknown_parameter"
    assert wire["error"]["param"] == param
    assert wire["error"]["message"] == f"Unknown parameter: '{param}'."


def test_the_startup_history_is_held_to_its_limits() -> None:
    message: dict[str, Any] = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "x"}],
    }
    too_many = _refused(
        _dialect(),
        {"type": "session.start", "session": {"model": "m", "input": [message] * (MAX_INPUT_ITEMS + 1)}},
    )
    assert too_many["error"]["param"] == "session.input"
    system = {**message, "role": "system"}
    assert (
        _refused(_dialect(), {"type": "session.start", "session": {"model": "m", "input": [system]}})[
            "error"
        ]["param"]
        == "session.input[0].role"
    )
    two_parts = {**message, "content": message["content"] * 2}
    assert (
        _refused(_dialect(), {"type": "session.start", "session": {"model": "m", "input": [two_parts]}})[
            "error"
        ]["param"]
        == "session.input[0].content"
    )
    (_update, *history) = _start(_dialect(), input=[message] * MAX_INPUT_ITEMS)
    assert len(history) == MAX_INPUT_ITEMS


def test_decisions_delegation_is_refused_saying_so() -> None:
    wire = _refused(
        _dialect(),
        {
            "type": "session.start",
            "session": {"model": "m", "delegation": {"type": "decisions", "decisions": {}}},
        },
    )
    assert wire["error"]["code"] == "not_supported"
    assert "Decisions" in wire["error"]["message"]


def test_a_session_starts_once_and_first() -> None:
    dialect = _dialect()
    before = _refused(dialect, {"type": "session.input_audio.append", "event_id": "a1", "audio": _audio(20)})
    assert before["error"]["code"] == "session_not_started"
    assert before["error"]["client_event_id"] == "a1"
    _start(dialect)
    again = _refused(dialect, {"type": "session.start", "session": {"model": "m"}})
    assert again["error"]["code"] == "session_already_started"


def test_session_started_echoes_the_resolved_session() -> None:
    dialect = _dialect()
    commands = _start(
        dialect, instructions="Be brief.", audio={"format": {"type": "audio/pcm", "rate": 16000}}, store=True
    )
    update = commands[0]
    assert isinstance(update, SessionUpdate)
    wire = _wire(
        dialect, ev.SessionCreated(session_id="internal", config=SessionConfig().apply(update.session))
    )
    assert wire == {
        "type": "session.started",
        "event_id": "event_1",
        "session": {
            "id": "live_test",
            "expires_at": EXPIRES_AT,
            "model": "gpt-live-1",
            "status": "active",
            "audio": {"format": {"type": "audio/pcm", "rate": 16000}, "output": {"voice": "default"}},
            "delegation": {"type": "client"},
            "store": False,  # the gateway keeps no session, whatever was asked
            "instructions": "Be brief.",
        },
        "client_event_id": "evt_start",
    }


# -- session.update --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["model", "instructions", "audio", "input", "store"])
def test_startup_only_fields_are_refused_after_start(field: str) -> None:
    dialect = _dialect()
    _started(dialect)
    wire = _refused(dialect, {"type": "session.update", "event_id": "u1", "session": {field: None}})
    assert wire["error"]["code"] == "unknown_parameter"
    assert wire["error"]["param"] == f"session.{field}"
    assert (
        wire["error"]["message"]
        == f"Unknown parameter: 'session.{field}'. It can only be set by session.start."
    )
    assert wire["error"]["client_event_id"] == "u1"


def test_the_delegation_mode_cannot_change() -> None:
    dialect = _dialect()
    _started(dialect)
    wire = _refused(
        dialect, {"type": "session.update", "session": {"delegation": {"type": "responses", "responses": {}}}}
    )
    assert wire["error"]["code"] == "delegation_mode_mismatch"
    assert wire["error"]["param"] == "session.delegation.type"


def test_a_responses_update_changes_the_engine_tools_and_is_answered() -> None:
    dialect = _dialect()
    config = _started(dialect, delegation={"type": "responses", "responses": {"model": "gpt-5.4-mini"}})
    tool = {"type": "function", "name": "lookup", "description": "Find it", "parameters": {"type": "object"}}
    (update,) = _send(
        dialect,
        {
            "type": "session.update",
            "event_id": "u1",
            "session": {
                "delegation": {
                    "type": "responses",
                    "responses": {"tools": [tool, {"type": "web_search"}], "tool_choice": "auto"},
                }
            },
        },
    )
    assert isinstance(update, SessionUpdate)
    assert update.session.tools == (
        FunctionTool(name="lookup", description="Find it", parameters={"type": "object"}),
    )
    assert update.session.tool_choice.mode is ToolChoiceMode.AUTO  # type: ignore[union-attr]
    wire = _wire(dialect, ev.SessionUpdated(session_id="internal", config=config.apply(update.session)))
    assert wire is not None and wire["client_event_id"] == "u1"
    # The hosted tool cannot run here, so the resolved session does not list it.
    assert wire["session"]["delegation"] == {
        "type": "responses",
        "responses": {"model": "gpt-5.4-mini", "tools": [tool], "tool_choice": "auto"},
    }
    assert _wire(dialect, ev.SessionUpdated(session_id="internal", config=config)) is None  # nothing pending


# -- audio, words ----------------------------------------------------------------------------------


def test_audio_appends_are_decoded_and_advance_the_timeline() -> None:
    dialect = _dialect()
    _started(dialect)
    (append,) = _send(dialect, {"type": "session.input_audio.append", "audio": _audio(200)})
    assert isinstance(append, InputAudioAppend) and len(append.audio) == 9600
    assert dialect.state.now_ms() == 200
    assert (
        _refused(dialect, {"type": "session.input_audio.append", "audio": "@@@"})["error"]["param"] == "audio"
    )
    odd = base64.b64encode(b"\x00").decode()
    assert (
        _refused(dialect, {"type": "session.input_audio.append", "audio": odd})["error"]["code"]
        == "invalid_value"
    )


def test_reply_audio_and_words_are_live_deltas_on_the_timeline() -> None:
    dialect = _dialect()
    _started(dialect)
    _send(dialect, {"type": "session.input_audio.append", "audio": _audio(1000)})
    audio = _wire(
        dialect, ev.AudioDelta(response_id="r1", item_id="i1", audio=b"\x01\x00" * 4800, rate=24_000)
    )
    assert audio == {
        "type": "session.output_audio.delta",
        "event_id": "event_1",
        "delta": base64.b64encode(b"\x01\x00" * 4800).decode(),
    }
    first = _wire(dialect, ev.TranscriptDelta(response_id="r1", item_id="i1", delta="Hello"))
    _wire(dialect, ev.AudioDelta(response_id="r1", item_id="i1", audio=b"\x00\x00" * 4800, rate=24_000))
    second = _wire(dialect, ev.TranscriptDelta(response_id="r1", item_id="i1", delta=" there"))
    assert first is not None and second is not None
    assert first["type"] == "session.output_transcript.delta"
    assert (first["start_ms"], first["end_ms"]) == (1000, 1200)
    assert (second["start_ms"], second["end_ms"]) == (1200, 1400)


def test_the_callers_words_are_deltas_and_a_completion_adds_only_what_is_new() -> None:
    dialect = _dialect()
    _started(dialect)
    _send(dialect, {"type": "session.input_audio.append", "audio": _audio(2000)})
    assert _wire(dialect, ev.SpeechStarted(audio_start_ms=300, item_id="u1")) is None
    first = _wire(dialect, ev.InputTranscriptionDelta(item_id="u1", delta="What time"))
    assert _wire(dialect, ev.SpeechStopped(audio_end_ms=1800, item_id="u1")) is None
    rest = _wire(dialect, ev.InputTranscriptionCompleted(item_id="u1", transcript="What time is it?"))
    assert first == {
        "type": "session.input_transcript.delta",
        "event_id": "event_1",
        "delta": "What time",
        "start_ms": 300,
        "end_ms": 2000,
    }
    assert rest is not None and rest["delta"] == " is it?"
    whole = _wire(dialect, ev.InputTranscriptionCompleted(item_id="u2", transcript="Thanks."))
    assert whole is not None and whole["delta"] == "Thanks."


@pytest.mark.parametrize(
    "event",
    [
        ev.SpeechStarted(audio_start_ms=0, item_id="x"),
        ev.InputAudioCommitted(item_id="x", previous_item_id=None),
        ev.ResponseCreated(response_id="r"),
        ev.ResponseDone(response_id="r", status="completed"),
        ev.AudioDone(response_id="r", item_id="i"),
        ev.TranscriptDone(response_id="r", item_id="i", transcript="t"),
        ev.OutputAudioCleared(response_id="r"),
        ev.PlaybackAcknowledged(response_id="r", played_ms=1, produced_ms=1),
        ev.ConversationItemAdded(item=ev.ConversationItem(id="i", role="user"), previous_item_id=None),
        ev.HeartbeatAck(session_id="s"),
    ],
    ids=lambda e: e.type,
)
def test_events_the_live_api_has_no_form_for_render_as_nothing(event: ev.ServerEvent) -> None:
    dialect = _dialect()
    _started(dialect)
    assert dialect.render(event, seq=5) is None


# -- context appends, delegation -------------------------------------------------------------------


@pytest.mark.parametrize("channel", ["instructions", "thinking", "commentary"])
def test_general_context_is_a_context_append_whose_appended_event_is_the_acknowledgement(
    channel: str,
) -> None:
    dialect = _dialect()
    _started(dialect)
    _send(dialect, {"type": "session.input_audio.append", "audio": _audio(500)})
    commands = _send(
        dialect,
        {"type": f"session.{channel}.append", "event_id": "c1", "delegation_id": None, "content": "Note."},
    )
    # One command, no reply request: when the model speaks (commentary) is the session's to decide.
    (append,) = commands
    assert isinstance(append, ContextAppend)
    assert (append.channel, append.content, append.delegation_id) == (channel, "Note.", None)
    assert append.item_id is not None
    # The conversation item alone is no acknowledgement; the session's ContextAppended is.
    added = ev.ConversationItemAdded(
        item=ev.ConversationItem(id=append.item_id, role="system"), previous_item_id=None
    )
    assert _wire(dialect, added) is None
    ack = _wire(dialect, ctx.ContextAppended(channel=channel, item_id=append.item_id, event_id="c1"))
    assert ack == {
        "type": f"session.{channel}.appended",
        "event_id": "event_1",
        "start_ms": 500,
        "end_ms": 500,
        "client_event_id": "c1",
    }


def test_a_context_append_must_name_its_delegation_even_as_null() -> None:
    dialect = _dialect()
    _started(dialect)
    wire = _refused(dialect, {"type": "session.thinking.append", "content": "x"})
    assert wire["error"]["code"] == "missing_required_parameter" and wire["error"]["param"] == "delegation_id"


def test_client_delegation_round_trip() -> None:
    dialect = _dialect()
    _started(dialect)
    created = _wire(
        dialect,
        ev.OutputItemDone(response_id="r1", output_index=1, item=_call("r1", "call_1", DELEGATE_TOOL.name)),
    )
    assert created == {
        "type": "session.delegation.created",
        "event_id": "event_1",
        "offset_ms": 0,
        "delegation": {"id": "call_1", "type": "delegation", "target": "client"},
    }
    (answer,) = _send(
        dialect,
        {
            "type": "session.commentary.append",
            "event_id": "c1",
            "delegation_id": "call_1",
            "content": "It is 3 pm.",
        },
    )
    # The session makes it the output of the engine's call, and has the engine speak of it.
    assert isinstance(answer, ContextAppend)
    assert (answer.channel, answer.delegation_id, answer.content) == ("commentary", "call_1", "It is 3 pm.")
    # A delegation is answered once; later words for it are refused rather than taken for another.
    again = _refused(
        dialect, {"type": "session.commentary.append", "delegation_id": "call_1", "content": "More."}
    )
    assert again["error"]["param"] == "delegation_id"
    assert _refused(dialect, {"type": "response.create"})["error"]["code"] == "delegation_mode_mismatch"


def test_responses_delegation_round_trip() -> None:
    dialect = _dialect()
    _started(
        dialect,
        delegation={
            "type": "responses",
            "responses": {
                "model": "gpt-5.4-mini",
                "tools": [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
            },
        },
    )
    call = _call("r1", "call_1", "get_time", '{"zone":"UTC"}')
    frames = [
        _wire(dialect, ev.OutputItemAdded(response_id="r1", output_index=0, item=call)),
        _wire(
            dialect,
            ev.FunctionCallArgumentsDone(
                response_id="r1",
                item_id=call.id,
                output_index=0,
                call_id="call_1",
                name="get_time",
                arguments=call.arguments or "",
            ),
        ),
        _wire(dialect, ev.OutputItemDone(response_id="r1", output_index=0, item=call)),
        _wire(dialect, ev.ResponseDone(response_id="r1", status="completed")),
    ]
    assert [f["type"] if f else None for f in frames] == [
        "session.delegation.created",
        "response.event",
        "response.event",
        "response.event",
    ]
    assert frames[0] is not None and frames[0]["delegation"] == {
        "id": "deleg_r1",
        "type": "delegation",
        "target": "responses",
        "response_id": "r1",
    }
    assert [f["event"]["type"] for f in frames[1:] if f] == [
        "response.created",
        "response.output_item.done",
        "response.completed",
    ]
    assert frames[2] is not None and frames[2]["event"]["item"] == {
        "id": call.id,
        "type": "function_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "get_time",
        "arguments": '{"zone":"UTC"}',
    }
    early = _refused(dialect, {"type": "response.create", "event_id": "rc0"})
    assert early["error"]["code"] == "function_call_outputs_required"
    (item,) = _send(
        dialect,
        {
            "type": "response.item.create",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
        },
    )
    assert isinstance(item, ConversationItemCreate) and (item.kind, item.call_id, item.output) == (
        "function_call_output",
        "call_1",
        "12:00",
    )
    (create,) = _send(dialect, {"type": "response.create", "event_id": "rc1"})
    assert isinstance(create, ResponseCreate)
    # The continuation's next call is part of the same delegation.
    follow = _wire(
        dialect, ev.OutputItemAdded(response_id="r2", output_index=0, item=_call("r2", "call_2", "get_time"))
    )
    assert follow is not None and (follow["type"], follow["delegation_id"], follow["event"]["type"]) == (
        "response.event",
        "deleg_r1",
        "response.created",
    )
    general = _refused(
        dialect, {"type": "session.commentary.append", "delegation_id": "deleg_r1", "content": "x"}
    )
    assert general["error"]["code"] == "delegation_mode_mismatch"
    message = _refused(
        dialect, {"type": "response.item.create", "item": {"type": "message", "role": "user", "content": []}}
    )
    assert message["error"]["code"] == "not_supported"


def test_a_delegated_reply_cut_short_is_incomplete() -> None:
    dialect = _dialect()
    _started(
        dialect, delegation={"type": "responses", "responses": {"tools": [{"type": "function", "name": "f"}]}}
    )
    _wire(dialect, ev.OutputItemAdded(response_id="r1", output_index=0, item=_call("r1", "c1", "f")))
    done = _wire(dialect, ev.ResponseDone(response_id="r1", status="cancelled", reason="turn_detected"))
    assert done is not None and done["event"]["type"] == "response.incomplete"
    assert done["event"]["response"]["incomplete_details"] == {"reason": "turn_detected"}


# -- close, usage, errors --------------------------------------------------------------------------


def test_close_is_answered_with_session_closed() -> None:
    dialect = _dialect()
    _started(dialect)
    _send(dialect, {"type": "session.input_audio.append", "audio": _audio(3000)})
    (close,) = _send(dialect, {"type": "session.close", "event_id": "bye"})
    assert isinstance(close, SessionClose) and close.reason == "close_requested"
    usage = _wire(dialect, ev.RateLimitsUpdated())
    assert usage == {"type": "session.usage.updated", "event_id": "event_1", "usage": {"seconds": 3}}
    closed = _wire(dialect, ev.SessionClosed(session_id="internal", reason="close_requested"))
    assert closed is not None
    assert (closed["reason"], closed["usage"], closed["client_event_id"]) == (
        "close_requested",
        {"seconds": 3},
        "bye",
    )
    assert closed["session"]["status"] == "active"


@pytest.mark.parametrize(
    ("reason", "live_reason"),
    [
        ("session_expired", "expired"),
        ("server_shutdown", "remote_hangup"),
        ("engine_error", "connection_lost"),
    ],
)
def test_close_reasons_are_the_live_apis(reason: str, live_reason: str) -> None:
    dialect = _dialect()
    _started(dialect)
    closed = _wire(dialect, ev.SessionClosed(session_id="internal", reason=reason))
    assert closed is not None and closed["reason"] == live_reason


def test_errors_the_session_raises_carry_live_codes() -> None:
    dialect = _dialect()
    _started(dialect)
    wire = _wire(
        dialect, ev.ErrorEvent(code=ErrorCode.SESSION_NOT_CONFIGURED, message="not yet", event_id="x1")
    )
    assert wire is not None
    assert wire["error"] == {
        "type": "invalid_request_error",
        "code": "session_not_started",
        "message": "not yet",
        "client_event_id": "x1",
    }
    engine = _wire(dialect, ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message="boom"))
    assert (
        engine is not None and engine["error"]["type"] == "server_error" and "client_event_id" not in engine
    )


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_type"),
        (b"\x00\x01", "binary_not_supported"),
        ('{"event_id": "e"}', "missing_required_parameter"),
        ('{"type": "conversation.item.create"}', "invalid_value"),
        ('{"type": "session.input_audio.mute", "muted": true}', "unknown_parameter"),
        ('{"type": "session.close", "event_id": 5}', "invalid_type"),
    ],
)
def test_malformed_frames_are_refused_with_live_codes(frame: str | bytes, code: str) -> None:
    assert _refused(_dialect(), frame)["error"]["code"] == code


def test_client_event_types_are_the_live_apis() -> None:
    assert {
        "session.start",
        "session.update",
        "session.input_audio.append",
        "session.instructions.append",
        "session.thinking.append",
        "session.commentary.append",
        "response.item.create",
        "response.create",
        "session.close",
    } <= live.CLIENT_EVENT_TYPES


# -- purity ----------------------------------------------------------------------------------------

_ALLOWED = {
    "__future__",
    "base64",
    "binascii",
    "json",
    "collections",
    "dataclasses",
    "typing",
    "duplex_gateway",
}


@pytest.mark.parametrize(
    "module",
    [live, live_backend, live_commands, live_errors, live_pacing, live_session],
    ids=lambda m: m.__name__,
)
def test_live_modules_are_pure(module: ModuleType) -> None:
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            imported.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("__import__", "open", "exec", "eval")
    assert imported <= _ALLOWED


# -- a whole conversation, for the conformance test ------------------------------------------------


def whole_conversation() -> list[str]:
    """Every frame a client gets over one session of each delegation mode, refusals included."""
    frames: list[str] = []

    def out(dialect: LiveDialect, event: ev.ServerEvent) -> None:
        rendered = dialect.render(event, seq=len(frames) + 1)
        if rendered is not None:
            frames.append(rendered)

    def refused(dialect: LiveDialect, frame: str | bytes) -> None:
        try:
            dialect.parse(frame)
        except ProtocolError as exc:
            out(
                dialect,
                ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param),
            )
        else:
            raise AssertionError(f"not refused: {frame!r}")

    for delegation in (
        {"type": "client"},
        {
            "type": "responses",
            "responses": {"model": "gpt-5.4-mini", "tools": [{"type": "function", "name": "get_time"}]},
        },
    ):
        dialect = _dialect()
        refused(dialect, json.dumps({"type": "session.input_audio.append", "audio": _audio(20)}))
        (update, *_) = _send(
            dialect,
            {
                "type": "session.start",
                "event_id": "start",
                "session": {
                    "model": "gpt-live-1",
                    "instructions": "Be brief.",
                    "audio": {"output": {"voice": "marin"}},
                    "delegation": delegation,
                    "input": [
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
                    ],
                },
            },
        )
        assert isinstance(update, SessionUpdate)
        config = SessionConfig().apply(update.session)
        out(dialect, ev.SessionCreated(session_id="internal", config=config))
        refused(
            dialect,
            json.dumps({"type": "session.update", "event_id": "u0", "session": {"instructions": "x"}}),
        )
        refused(dialect, json.dumps({"type": "session.start", "session": {"model": "m"}}))
        refused(dialect, "{oops")
        refused(dialect, b"\x00")
        (upd,) = _send(
            dialect, {"type": "session.update", "event_id": "u1", "session": {"delegation": delegation}}
        )
        assert isinstance(upd, SessionUpdate)
        out(dialect, ev.SessionUpdated(session_id="internal", config=config.apply(upd.session)))
        _send(dialect, {"type": "session.input_audio.append", "audio": _audio(1200)})
        out(dialect, ev.SpeechStarted(audio_start_ms=200, item_id="u1"))
        out(dialect, ev.InputTranscriptionDelta(item_id="u1", delta="What time"))
        out(dialect, ev.SpeechStopped(audio_end_ms=1100, item_id="u1"))
        out(dialect, ev.InputTranscriptionCompleted(item_id="u1", transcript="What time is it?"))
        out(dialect, ev.ResponseCreated(response_id="r1"))
        out(dialect, ev.AudioDelta(response_id="r1", item_id="i1", audio=b"\x00\x01" * 2400, rate=24_000))
        out(dialect, ev.TranscriptDelta(response_id="r1", item_id="i1", delta="Let me check."))
        name = DELEGATE_TOOL.name if delegation["type"] == "client" else "get_time"
        call = _call("r1", "call_1", name)
        out(dialect, ev.OutputItemAdded(response_id="r1", output_index=1, item=call))
        out(
            dialect,
            ev.FunctionCallArgumentsDone(
                response_id="r1", item_id=call.id, output_index=1, call_id="call_1", name=name, arguments="{}"
            ),
        )
        out(dialect, ev.OutputItemDone(response_id="r1", output_index=1, item=call))
        out(dialect, ev.ResponseDone(response_id="r1", status="completed"))
        out(dialect, ev.RateLimitsUpdated())
        if delegation["type"] == "client":
            commands = _send(
                dialect,
                {
                    "type": "session.commentary.append",
                    "event_id": "c1",
                    "delegation_id": "call_1",
                    "content": "3 pm.",
                },
            )
        else:
            refused(dialect, json.dumps({"type": "response.create", "event_id": "rc0"}))
            commands = _send(
                dialect,
                {
                    "type": "response.item.create",
                    "item": {"type": "function_call_output", "call_id": "call_1", "output": "3 pm"},
                },
            )
            commands += _send(dialect, {"type": "response.create", "event_id": "rc1"})
        for command in commands:
            if isinstance(command, ContextAppend) and command.item_id is not None:
                appended = ctx.ContextAppended(
                    channel=command.channel,
                    item_id=command.item_id,
                    delegation_id=command.delegation_id,
                    event_id=command.event_id,
                )
                out(dialect, appended)
            if isinstance(command, ConversationItemCreate) and command.item_id is not None:
                item = ev.ConversationItem(
                    id=command.item_id,
                    role=command.role,
                    kind=command.kind,
                    call_id=command.call_id,
                    output=command.output,
                )
                out(dialect, ev.ConversationItemAdded(item=item, previous_item_id=None))
        (note, *_) = _send(
            dialect,
            {
                "type": "session.thinking.append",
                "event_id": "t1",
                "delegation_id": None,
                "content": "The caller is in a hurry.",
            },
        )
        assert isinstance(note, ContextAppend) and note.item_id is not None
        out(dialect, ctx.ContextAppended(channel="thinking", item_id=note.item_id, event_id="t1"))
        out(dialect, ev.ErrorEvent(code=ErrorCode.ENGINE_ERROR, message="the engine hiccupped"))
        _send(dialect, {"type": "session.close", "event_id": "bye"})
        out(dialect, ev.SessionClosed(session_id="internal", reason="close_requested"))

    def own(dialect: LiveDialect) -> None:
        for frame in dialect.own_frames():
            assert isinstance(frame, str)  # JSON text, as every Live server event
            frames.append(frame)

    # Responses delegation handed to a backend model: its stream, its call, its failure, as the client sees them.
    dialect = LiveDialect(
        session_id="live_test", expires_at=EXPIRES_AT, max_message_bytes=1 << 20, backend="local-model"
    )
    responses = {"model": "gpt-5.4-mini", "tools": [{"type": "function", "name": "get_time"}]}
    (update, *_) = _send(
        dialect,
        {
            "type": "session.start",
            "event_id": "start",
            "session": {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": responses}},
        },
    )
    assert isinstance(update, SessionUpdate)
    out(dialect, ev.SessionCreated(session_id="internal", config=SessionConfig().apply(update.session)))
    _send(dialect, {"type": "session.input_audio.append", "audio": _audio(1200)})
    out(dialect, ev.InputTranscriptionCompleted(item_id="u1", transcript="What time is it?"))
    for n, result in enumerate(("answer", "failure"), start=1):
        call = _call(f"r{n}", f"call_{n}", f"{live_backend.BACKEND_TOOL_NAME}_get_time")
        out(dialect, ev.OutputItemAdded(response_id=f"r{n}", output_index=0, item=call))
        out(dialect, ev.OutputItemDone(response_id=f"r{n}", output_index=0, item=call))
        out(dialect, ev.ResponseDone(response_id=f"r{n}", status="completed"))
        own(dialect)
        (request,) = dialect.take_backend_requests()
        rid = request.response_id
        if result == "failure":
            dialect.backend_result(live_backend.BackendFailed(response_id=rid, message="backend unreachable"))
        else:
            dialect.backend_result(live_backend.BackendText(response_id=rid, delta="Checking."))
            backend_call = live_backend.BackendCall(call_id="fc_1", name="get_time", arguments="{}")
            dialect.backend_result(live_backend.BackendCallMade(response_id=rid, call=backend_call))
            dialect.backend_result(live_backend.BackendFinished(response_id=rid, reason="tool_calls"))
            own(dialect)
            refused(dialect, json.dumps({"type": "response.create", "event_id": "rc0"}))
            output = {"type": "function_call_output", "call_id": "fc_1", "output": "3 pm"}
            _send(dialect, {"type": "response.item.create", "item": output})
            _send(dialect, {"type": "response.create", "event_id": "rc1"})
            own(dialect)
            (request,) = dialect.take_backend_requests()
            rid = request.response_id
            dialect.backend_result(live_backend.BackendText(response_id=rid, delta="It is 3 pm."))
            dialect.backend_result(
                live_backend.BackendFinished(response_id=rid, input_tokens=40, output_tokens=6)
            )
        own(dialect)
        # The backend's answer, for the engine: the session's acknowledgement is not the client's to see.
        for answer in dialect.take_backend_commands():
            assert isinstance(answer, ContextAppend) and answer.item_id is not None
            out(dialect, ctx.ContextAppended(channel=answer.channel, item_id=answer.item_id))
    _send(dialect, {"type": "session.close", "event_id": "bye"})
    out(dialect, ev.SessionClosed(session_id="internal", reason="close_requested"))
    return frames


def test_a_whole_conversation_renders_every_kind_of_server_event() -> None:
    kinds = {json.loads(frame)["type"] for frame in whole_conversation()}
    assert kinds == {
        "error",
        "session.started",
        "session.updated",
        "session.input_transcript.delta",
        "session.output_audio.delta",
        "session.output_transcript.delta",
        "session.delegation.created",
        "response.event",
        "session.usage.updated",
        "session.commentary.appended",
        "session.thinking.appended",
        "session.closed",
    }


def test_a_whole_conversation_shows_the_backends_responses_events() -> None:
    nested = [f["event"] for f in map(json.loads, whole_conversation()) if f["type"] == "response.event"]
    assert {e["type"] for e in nested} == {
        "response.created",
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
        "response.completed",
        "response.failed",
    }
    assert {e["item"]["type"] for e in nested if e["type"] == "response.output_item.done"} == {
        "function_call",
        "message",
    }


def test_an_oversized_frame_is_refused() -> None:
    dialect = LiveDialect(session_id="s", expires_at=EXPIRES_AT, max_message_bytes=64)
    assert _refused(dialect, json.dumps({"type": "session.close", "event_id": "é" * 40}))["error"][
        "code"
    ] == ("message_too_large")


def test_refusals_keep_their_live_codes_when_rendered_late() -> None:
    dialect = _dialect()
    raised: list[ProtocolError] = []
    for frame in (
        '{"type": "session.start", "session": {}}',
        '{"type": "session.start", "session": {"model": "m", "x": 1}}',
    ):
        with pytest.raises(ProtocolError) as caught:
            dialect.parse(frame)
        raised.append(caught.value)
    codes = []
    for exc in raised:
        wire = _wire(
            dialect, ev.ErrorEvent(code=exc.code, message=exc.message, event_id=exc.event_id, param=exc.param)
        )
        assert wire is not None
        codes.append(wire["error"]["code"])
    assert codes == ["missing_required_parameter", "unknown_parameter"]


def test_a_refused_append_is_not_acknowledged() -> None:
    dialect = _dialect()
    _started(dialect)
    (item,) = _send(
        dialect, {"type": "session.thinking.append", "event_id": "t1", "delegation_id": None, "content": "x"}
    )
    assert isinstance(item, ContextAppend) and item.item_id is not None
    # The session answers a refused append with an error and no ContextAppended; its item is no ack.
    wire = _wire(dialect, ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="no", event_id="t1"))
    assert wire is not None and wire["error"]["client_event_id"] == "t1"
    added = ev.ConversationItemAdded(
        item=ev.ConversationItem(id=item.item_id, role="system"), previous_item_id=None
    )
    assert _wire(dialect, added) is None


@pytest.mark.parametrize(("kind", "muted"), [("mute", True), ("unmute", False)])
def test_mute_and_unmute_are_input_audio_mute_acknowledged_by_the_session(kind: str, muted: bool) -> None:
    dialect = _dialect()
    assert _refused(dialect, {"type": f"session.input_audio.{kind}"})["error"]["code"] == (
        "session_not_started"
    )
    _started(dialect)
    (command,) = _send(dialect, {"type": f"session.input_audio.{kind}", "event_id": "m1"})
    assert isinstance(command, InputAudioMute) and command.muted is muted and command.event_id == "m1"
    wire = _wire(dialect, ctx.InputAudioMuted(muted=muted))
    assert wire == {"type": f"session.input_audio.{kind}d", "event_id": "event_1"}
