"""Pipecat's and LiveKit's own Live client events for context appends and mute, as the dialect takes them.

An append is a :class:`~duplex_gateway.vocabulary.commands.ContextAppend` (a delegation's answer
carrying its ``delegation_id``) and its acknowledgement parses with Pipecat's model; LiveKit's mute
and unmute are :class:`~duplex_gateway.vocabulary.commands.InputAudioMute` (Pipecat sends none).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "pipecat", reason="Pipecat runs in .venv-peers (make test runs it there, where it must be installed)"
)

from pipecat.services.openai.live import events as pipecat_live

from duplex_gateway.dialects.live_session import DELEGATE_TOOL
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from tests.dialects.test_live import _call, _dialect


def test_pipecats_answer_to_a_delegation_is_a_context_append_for_its_call() -> None:
    dialect = _dialect()
    start = pipecat_live.SessionStartEvent(session=pipecat_live.SessionConfig(model="gpt-live-1"))
    dialect.parse(json.dumps(start.to_payload()))
    created = dialect.render(
        ev.OutputItemDone(response_id="r1", output_index=0, item=_call("r1", "call_9", DELEGATE_TOOL.name)),
        seq=1,
    )
    assert created is not None
    delegation = pipecat_live.parse_server_event(created)
    assert isinstance(delegation, pipecat_live.SessionDelegationCreatedEvent)
    answer = pipecat_live.SessionCommentaryAppendEvent(
        event_id="c1", delegation_id=delegation.delegation.id, content="It is noon."
    )
    (append,) = dialect.parse(json.dumps(answer.to_payload()))
    assert isinstance(append, cmd.ContextAppend) and append.item_id is not None
    assert (append.channel, append.delegation_id, append.content) == ("commentary", "call_9", "It is noon.")
    ack = dialect.render(
        ctx.ContextAppended(
            channel="commentary", item_id=append.item_id, delegation_id="call_9", event_id="c1"
        ),
        seq=2,
    )
    assert ack is not None
    parsed = pipecat_live.parse_server_event(ack)
    assert type(parsed).__name__ != "UnknownServerEvent", ack
    assert json.loads(ack)["client_event_id"] == "c1"


@pytest.mark.parametrize(("name", "muted"), [("InputAudioMuteEvent", True), ("InputAudioUnmuteEvent", False)])
def test_livekits_mute_and_unmute_are_input_audio_mute(name: str, muted: bool) -> None:
    from livekit.agents.llm._realtime import gpt_live_types as lk

    dialect = _dialect()
    start = lk.SessionStartEvent(event_id="s1", session=lk.SessionConfig(model="gpt-live-1"))
    assert dialect.parse(json.dumps(start.model_dump(exclude_none=True)))
    event = getattr(lk, name)(event_id="m1")
    (command,) = dialect.parse(json.dumps(event.model_dump(exclude_none=True)))
    assert isinstance(command, cmd.InputAudioMute) and command.muted is muted
    wire = dialect.render(ctx.InputAudioMuted(muted=muted), seq=1)
    assert wire is not None
    assert json.loads(wire)["type"] == f"session.input_audio.{'muted' if muted else 'unmuted'}"
