"""The reply book: a reply's states as a table, the fence behind finished replies, the epoch."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from duplex_gateway.engine import port
from duplex_gateway.session.conversation import Conversation
from duplex_gateway.session.engine_calls import BargeInEngine, CancelResponse
from duplex_gateway.session.replies import (
    MAX_FENCED_IDS,
    MAX_SIDE_RESPONSES,
    REPLY_TRANSITIONS,
    Reply,
    ReplyBook,
    ReplyHappening,
    ReplyState,
    ReplyStateError,
)
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.session_config import Modality

RATE = 24_000
AUDIO = (Modality.AUDIO,)
LIVE = (ReplyState.REQUESTED, ReplyState.STREAMING)
OVER = (ReplyState.DONE, ReplyState.CANCELLED)


def book() -> tuple[ReplyBook, Conversation]:
    counter = itertools.count(1)

    def new_id(prefix: str) -> str:
        return f"{prefix}_{next(counter)}"

    conversation = Conversation(new_id)
    return ReplyBook(conversation, new_id, output_rate=RATE), conversation


def types(outputs: Sequence[object]) -> list[str]:
    return [o.type if isinstance(o, ev.ServerEvent) else type(o).__name__ for o in outputs]


def audio(response_id: str, ms: int = 20) -> port.EngineAudio:
    return port.EngineAudio(response_id=response_id, pcm=bytes(RATE * ms // 1000 * 2))


def start(replies: ReplyBook, response_id: str) -> list[object]:
    return list(replies.engine_started(response_id, modalities=AUDIO, requested_at=0.0, may_call=False))


# -- the table ---------------------------------------------------------------------------------


def test_a_live_reply_can_start_stream_finish_or_be_cancelled() -> None:
    for state in LIVE:
        assert REPLY_TRANSITIONS[state, ReplyHappening.STARTED] is ReplyState.STREAMING
        assert REPLY_TRANSITIONS[state, ReplyHappening.OUTPUT] is ReplyState.STREAMING
        assert REPLY_TRANSITIONS[state, ReplyHappening.FINISHED] is ReplyState.DONE
        assert REPLY_TRANSITIONS[state, ReplyHappening.CANCELLED] is ReplyState.CANCELLED
    assert {before for before, _ in REPLY_TRANSITIONS} == set(LIVE)


@pytest.mark.parametrize(
    ("state", "happening"), list(itertools.product(OVER, ReplyHappening)), ids=lambda value: value.value
)
def test_a_reply_that_is_over_moves_no_more(state: ReplyState, happening: ReplyHappening) -> None:
    reply = Reply(id="resp_1", modalities=AUDIO, state=state)
    with pytest.raises(ReplyStateError):
        reply.move(happening)
    assert reply.state is state


# -- a reply's life in the book ------------------------------------------------------------------


def test_a_requested_reply_streams_once_the_engine_starts_it_and_is_done_when_it_finishes() -> None:
    replies, conversation = book()
    reply = replies.request(AUDIO, requested_at=0.0, may_call=False)
    states = [reply.state]
    assert replies.active is reply
    # Started: a reply that cannot call a function opens its message at once.
    assert types(start(replies, reply.id)) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    states.append(reply.state)
    assert reply.item_id in conversation
    out = replies.output(audio(reply.id), 0.5, latency_event=False)
    assert types(out) == ["ReportLatency", "response.output_audio.delta"]
    assert conversation.items[reply.item_id or ""].produced_ms == 20
    done = replies.finish(reply, "completed", None)
    states.append(reply.state)
    assert types(done)[-1] == "response.done"
    assert states == [ReplyState.REQUESTED, ReplyState.STREAMING, ReplyState.DONE]
    assert replies.active is None and replies.fenced(reply.id) and replies.epoch == 0


def test_a_reply_that_may_call_opens_its_message_with_its_first_output() -> None:
    replies, _ = book()
    reply = replies.request(AUDIO, requested_at=0.0, may_call=True)
    assert replies.engine_started(reply.id, modalities=AUDIO, requested_at=0.0, may_call=True) == []
    assert reply.state is ReplyState.STREAMING and reply.item_id is None
    out = replies.output(port.EngineTranscript(response_id=reply.id, delta="hi"), None, latency_event=False)
    assert "response.content_part.added" in types(out) and reply.item_id is not None


def test_a_cancelled_reply_is_fenced_and_advances_the_epoch() -> None:
    replies, _ = book()
    reply = replies.request(AUDIO, requested_at=0.0, may_call=False)
    out = replies.cancel("client_cancelled")
    assert out[0] == CancelResponse(response_id=reply.id) and types(out)[-1] == "response.done"
    assert reply.state is ReplyState.CANCELLED and replies.epoch == 1 and replies.fenced(reply.id)
    # Nothing the engine still sends for it gets through, a late start included.
    assert replies.output(audio(reply.id), 1.0, latency_event=False) == []
    assert start(replies, reply.id) == [] and replies.active is None
    assert replies.live(reply.id) is None


def test_a_barge_in_cancels_a_reply_not_yet_started_by_name_only() -> None:
    replies, _ = book()
    requested = replies.request(AUDIO, requested_at=0.0, may_call=False)
    out = replies.interrupt()
    assert out[0] == CancelResponse(response_id=requested.id) and out[-1] == BargeInEngine()
    streaming = replies.request(AUDIO, requested_at=0.0, may_call=False)
    start(replies, streaming.id)
    out = replies.interrupt()
    assert not any(isinstance(o, CancelResponse) for o in out) and out[-1] == BargeInEngine()
    assert streaming.state is ReplyState.CANCELLED and replies.epoch == 2
    assert replies.interrupt() == [BargeInEngine()]  # nothing left to stop


def test_a_reply_the_engine_starts_by_itself_supersedes_the_one_it_left() -> None:
    replies, _ = book()
    left = replies.request(AUDIO, requested_at=0.0, may_call=False)
    out = start(replies, "resp_engine")
    done = [o for o in out if isinstance(o, ev.ResponseDone)]
    assert [(d.response_id, d.reason) for d in done] == [(left.id, "superseded")]
    assert replies.active is not None and replies.active.id == "resp_engine"
    assert replies.active.state is ReplyState.STREAMING


def test_out_of_band_replies_leave_the_epoch_and_are_bounded() -> None:
    replies, conversation = book()
    sides = [
        replies.request_out_of_band(AUDIO, requested_at=0.0, metadata=None) for _ in range(MAX_SIDE_RESPONSES)
    ]
    with pytest.raises(ProtocolError) as refused:
        replies.request_out_of_band(AUDIO, requested_at=0.0, metadata=None)
    assert refused.value.code is ErrorCode.RESPONSE_ALREADY_ACTIVE
    start(replies, sides[0].id)
    assert not conversation.items  # nothing of it enters the conversation
    replies.cancel("client_cancelled", reply=sides[0])
    assert replies.epoch == 0 and replies.fenced(sides[0].id)
    closing = replies.cancel_every("client_cancelled")
    assert len([o for o in closing if isinstance(o, ev.ResponseDone)]) == MAX_SIDE_RESPONSES - 1
    assert not any(isinstance(o, CancelResponse) for o in closing)


def test_the_fence_remembers_the_latest_finished_replies() -> None:
    replies, _ = book()
    first = replies.request(AUDIO, requested_at=0.0, may_call=False)
    replies.cancel("client_cancelled")
    for _ in range(MAX_FENCED_IDS):
        replies.request(AUDIO, requested_at=0.0, may_call=False)
        replies.cancel("client_cancelled")
    assert not replies.fenced(first.id)


def test_cancel_asked_names_the_reply_in_progress() -> None:
    replies, _ = book()
    with pytest.raises(ProtocolError) as refused:
        replies.cancel_asked(None)
    assert refused.value.code is ErrorCode.RESPONSE_NOT_ACTIVE
    reply = replies.request(AUDIO, requested_at=0.0, may_call=False)
    with pytest.raises(ProtocolError):
        replies.cancel_asked("resp_other")
    assert types(replies.cancel_asked(reply.id))[-1] == "response.done"
