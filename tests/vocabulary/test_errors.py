"""The error catalogue: every error OpenAI defines is sent with OpenAI's code and OpenAI's words.

Each entry of :data:`~duplex_gateway.vocabulary.errors.OPENAI_MESSAGES` is driven here through a
real :class:`~duplex_gateway.session.machine.Session`, every way the session raises it; the
wire check is in ``tests/e2e/test_raw_websocket.py`` and, for LiveKit's filter, in
``tests/peers/test_livekit.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from duplex_gateway.engine import port
from duplex_gateway.session.machine import MAX_SIDE_RESPONSES, Handshake, Session
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import OPENAI_MESSAGES, CloseCode, ErrorCode, openai_message
from duplex_gateway.vocabulary.session_config import SessionConfig

RATE = 24_000
#: An engine that makes replies outside the conversation too (``conversation: "none"``).
CAPS = port.EngineCapabilities(name="test", input_rate=RATE, output_rate=RATE, out_of_band=True)


def _session() -> Session:
    session = Session(
        session_id="sess_1",
        capabilities=CAPS,
        defaults=SessionConfig(turn_detection=None),
        handshake=Handshake.REALTIME,
    )
    session.start()
    return session


def _error(outputs: list[object]) -> ev.ErrorEvent:
    (error,) = [o for o in outputs if isinstance(o, ev.ErrorEvent)]
    return error


def _replying() -> tuple[Session, str]:
    session = _session()
    created = [o for o in session.receive(cmd.ResponseCreate(), now=0) if isinstance(o, ev.ResponseCreated)]
    return session, created[0].response_id


def commit_of_nothing() -> ev.ErrorEvent:
    return _error(_session().receive(cmd.InputAudioCommit(), now=0))


def create_during_a_reply() -> ev.ErrorEvent:
    session, _ = _replying()
    return _error(session.receive(cmd.ResponseCreate(), now=0))


def commit_asking_a_reply_during_one() -> ev.ErrorEvent:
    session, _ = _replying()
    session.input_processed(bytes(RATE // 10 * 2), 100.0, (), now=0)
    return _error(session.receive(cmd.InputAudioCommit(create_response=True), now=0))


def one_out_of_band_reply_too_many() -> ev.ErrorEvent:
    session = _session()
    for _ in range(MAX_SIDE_RESPONSES):
        session.receive(cmd.ResponseCreate(out_of_band=True), now=0)
    return _error(session.receive(cmd.ResponseCreate(out_of_band=True), now=0))


def cancel_with_no_reply() -> ev.ErrorEvent:
    return _error(_session().receive(cmd.ResponseCancel(), now=0))


def cancel_of_another_reply() -> ev.ErrorEvent:
    session, _ = _replying()
    return _error(session.receive(cmd.ResponseCancel(response_id="resp_other"), now=0))


def retrieve_unknown_item() -> ev.ErrorEvent:
    return _error(_session().receive(cmd.ConversationItemRetrieve(item_id="item_nope"), now=0))


def delete_unknown_item() -> ev.ErrorEvent:
    return _error(_session().receive(cmd.ConversationItemDelete(item_id="item_nope"), now=0))


def truncate_unknown_item() -> ev.ErrorEvent:
    command = cmd.ConversationItemTruncate(item_id="item_nope", content_index=0, audio_end_ms=0)
    return _error(_session().receive(command, now=0))


def session_past_its_maximum_duration() -> ev.ErrorEvent:
    return _error(_session().expire("max_duration", CloseCode.MAX_DURATION, "of 60 minutes."))


#: Every way the session raises an error OpenAI defines, and the code it must carry.
WAYS: dict[Callable[[], ev.ErrorEvent], ErrorCode] = {
    commit_of_nothing: ErrorCode.INPUT_AUDIO_BUFFER_EMPTY,
    create_during_a_reply: ErrorCode.RESPONSE_ALREADY_ACTIVE,
    commit_asking_a_reply_during_one: ErrorCode.RESPONSE_ALREADY_ACTIVE,
    one_out_of_band_reply_too_many: ErrorCode.RESPONSE_ALREADY_ACTIVE,
    cancel_with_no_reply: ErrorCode.RESPONSE_NOT_ACTIVE,
    cancel_of_another_reply: ErrorCode.RESPONSE_NOT_ACTIVE,
    retrieve_unknown_item: ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID,
    delete_unknown_item: ErrorCode.ITEM_DELETE_INVALID_ITEM_ID,
    truncate_unknown_item: ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID,
    session_past_its_maximum_duration: ErrorCode.SESSION_EXPIRED,
}


def test_every_openai_error_in_the_catalogue_is_driven_here() -> None:
    assert set(WAYS.values()) == set(OPENAI_MESSAGES)


@pytest.mark.parametrize("way", list(WAYS), ids=lambda way: way.__name__)
def test_an_openai_error_carries_openais_code_and_words(way: Callable[[], ev.ErrorEvent]) -> None:
    error = way()
    assert error.code is WAYS[way]
    assert error.message.startswith(OPENAI_MESSAGES[error.code])


def test_openais_words_for_the_errors_clients_match_on() -> None:
    # The exact text clients test for: LiveKit ignores a cancel that raced the server's own only
    # when the message starts "Cancellation failed"; others match the rest.
    session, active = _replying()
    assert _error(session.receive(cmd.ResponseCreate(), now=0)).message == (
        f"Conversation already has an active response in progress: {active}. "
        "Wait until the response is finished before creating a new one."
    )
    assert cancel_with_no_reply().message == "Cancellation failed: no active response found"
    assert (
        retrieve_unknown_item().message
        == "Error retrieving item: the item with id 'item_nope' does not exist."
    )
    assert commit_of_nothing().message.startswith("Error committing input audio buffer")
    assert (
        session_past_its_maximum_duration().message == "Your session hit the maximum duration of 60 minutes."
    )


def test_openai_message_puts_the_detail_after_openais_words() -> None:
    assert openai_message(ErrorCode.RESPONSE_NOT_ACTIVE) == "Cancellation failed: no active response found"
    assert openai_message(ErrorCode.ITEM_DELETE_INVALID_ITEM_ID, "x.") == "Error deleting item: x."
    with pytest.raises(KeyError):
        openai_message(ErrorCode.INVALID_VALUE)  # not OpenAI's to word
