"""The conversation's items: order, the gaps a delete leaves, the lookups of acks and truncates."""

from __future__ import annotations

import itertools

import pytest

from duplex_gateway.session.conversation import MAX_ITEMS, Conversation, Item
from duplex_gateway.session.engine_calls import AckPlayback, DeleteItem, TruncateReply
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError


def conversation() -> Conversation:
    counter = itertools.count(1)
    return Conversation(lambda prefix: f"{prefix}_{next(counter)}")


def user(item_id: str) -> Item:
    return Item(item=ev.ConversationItem(id=item_id, role="user", content_type="input_audio"))


def reply(item_id: str, response_id: str, produced_ms: float = 1_000.0) -> Item:
    item = ev.ConversationItem(id=item_id, role="assistant", content_type="audio")
    return Item(
        item=item, response_id=response_id, produced_ms=produced_ms, spoken=((0.0, "one "), (600.0, "two"))
    )


def test_items_keep_their_order_and_a_delete_closes_the_gap() -> None:
    c = conversation()
    assert c.append(user("a")) is None and c.append(user("c")) == "a"
    assert c.enter(user("b"), "a") == "a" and c.enter(user("first"), "root") is None
    assert list(c.items) == ["first", "a", "b", "c"] and c.items["c"].previous_id == "b"
    assert c.delete("b") == [DeleteItem(item_id="b"), ev.ConversationItemDeleted(item_id="b")]
    assert c.items["c"].previous_id == "a" and c.append(user("d")) == "c"


def test_a_created_item_needs_a_free_id_and_an_item_to_follow() -> None:
    c = conversation()
    c.append(user("a"))
    with pytest.raises(ProtocolError):
        c.place(cmd.ConversationItemCreate(item_id="a", role="user", text="x"))
    with pytest.raises(ProtocolError) as missing:
        c.place(cmd.ConversationItemCreate(item_id=None, role="user", text="x", previous_item_id="zz"))
    assert missing.value.code is ErrorCode.ITEM_NOT_FOUND
    # The refused item had taken an id already; the next one takes the next.
    assert c.place(cmd.ConversationItemCreate(item_id=None, role="user", text="x")) == ("item_2", None)


def test_only_the_newest_items_are_remembered() -> None:
    c = conversation()
    for i in range(MAX_ITEMS + 1):
        c.append(user(f"i{i}"))
    assert "i0" not in c and f"i{MAX_ITEMS}" in c and len(c.items) == MAX_ITEMS


def test_a_playback_ack_finds_the_reply_by_item_by_reply_or_by_vllm_omnis_name() -> None:
    c = conversation()
    c.append(user("a"))
    c.append(reply("m1", "resp_1"))
    c.append(reply("m2", "resp_2"))
    assert c.find_played(None, None).item.id == "m2"
    assert c.find_played("resp_1", None).item.id == "m1"
    assert c.find_played(None, "item_resp_1").item.id == "m1"
    with pytest.raises(ProtocolError):
        c.find_played(None, "a")  # the caller's turn is not a reply
    out = c.acknowledge_playback(cmd.PlaybackAck(response_id="resp_1", item_id=None, played_ms=5_000))
    assert out[0] == AckPlayback(response_id="resp_1", played_ms=1_000) and c.items["m1"].heard_ms == 1_000


def test_a_truncate_keeps_the_words_the_caller_heard() -> None:
    c = conversation()
    c.append(reply("m1", "resp_1"))
    out = c.truncate(
        cmd.ConversationItemTruncate(item_id="m1", content_index=0, audio_end_ms=500), reply_closes_it=False
    )
    assert out[0] == TruncateReply(response_id="resp_1", audio_end_ms=500)
    assert c.items["m1"].item.transcript == "one "
    with pytest.raises(ProtocolError) as missing:
        c.truncate(
            cmd.ConversationItemTruncate(item_id="zz", content_index=0, audio_end_ms=0), reply_closes_it=False
        )
    assert missing.value.code is ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID
