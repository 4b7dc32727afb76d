"""A Realtime watcher of a Live session (``/v1/realtime?call_id=``) is not sent the Live API's own events.

Context appends, mute and notices have no Realtime form: the observers' Realtime renderer skips
them on purpose, the events around them still arrive, numbered without a gap, and the recorder
keeps them as it keeps every event.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from duplex_gateway.dialects.realtime import render_server_event
from duplex_gateway.host.observers import Observers
from duplex_gateway.ops.recording import jsonable
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode
from tests.host.test_outbox import Socket

LIVE_EVENTS: list[ev.ServerEvent] = [
    ctx.ContextAppended(channel="commentary", item_id="item_1", event_id="c1"),
    ctx.ContextAppended(channel="commentary", item_id="item_2", delegation_id="call_1"),
    ctx.InputAudioMuted(muted=True),
    ctx.InputAudioMuted(muted=False),
    ctx.Notice(code="responses_delegation_local", message="answers by itself"),
]


@pytest.mark.parametrize("event", LIVE_EVENTS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("duplex", [False, True])
def test_the_realtime_renderer_has_no_form_for_live_events(
    event: ev.ServerEvent, beta: bool, duplex: bool
) -> None:
    assert render_server_event(event, seq=1, event_id="e", beta=beta, session_id="s", duplex=duplex) is None


def test_live_only_names_every_live_event() -> None:
    assert {event.type for event in LIVE_EVENTS} == ctx.LIVE_ONLY


async def test_an_observer_of_a_live_session_skips_live_events_and_gets_the_rest() -> None:
    observers = Observers("sess_1", max_message_bytes=1 << 20, send_queue_size=100, send_timeout_s=1.0)
    watcher = Socket()
    watching = observers.attach(watcher, ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="hello"))
    assert watching is not None
    for event in LIVE_EVENTS:
        observers.send(event)
    observers.send(ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="after"))
    await asyncio.sleep(0)
    await observers.finish(watching, "observer_left")
    sent = [json.loads(frame) for frame in watcher.sent]
    assert [(m["type"], m["server_event_seq"]) for m in sent] == [("error", 1), ("error", 2)]
    assert sent[1]["error"]["message"] == "after"


@pytest.mark.parametrize("event", LIVE_EVENTS, ids=lambda e: type(e).__name__)
def test_the_recorder_keeps_live_events(event: ev.ServerEvent) -> None:
    body = jsonable(event)
    assert json.loads(json.dumps(body)) == body
