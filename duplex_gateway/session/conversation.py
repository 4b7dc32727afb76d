"""The conversation's items, in order, with how much of each reply the caller heard.

:class:`Conversation` keeps the items clients create, the caller's committed
turns and the replies' output items; it answers the lookups of retrieve, delete,
truncate and playback acks (the played cursor). It decides nothing about replies
or turns: the session puts items in and asks about them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from duplex_gateway.session.engine_calls import (
    AckPlayback,
    AddFunctionCall,
    AddFunctionOutput,
    AddItem,
    DeleteItem,
    EngineCall,
    Output,
    TruncateReply,
)
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError, openai_message

__all__ = ["MAX_ITEMS", "Conversation", "Item", "no_such_item"]

#: Items remembered for truncate/retrieve/ack; older ones are forgotten.
MAX_ITEMS = 256


@dataclass(slots=True)
class Item:
    """One item of the conversation, with what the session knows of it beyond what clients see."""

    item: ev.ConversationItem
    previous_id: str | None = None
    #: The reply that made it (None: the caller's, or created by the client).
    response_id: str | None = None
    #: The audio the item holds: a reply's produced so far, a caller turn's committed.
    produced_ms: float = 0.0
    heard_ms: float | None = None
    #: A reply's transcript deltas, each with the audio produced before it (ms).
    spoken: tuple[tuple[float, str], ...] = ()

    def heard_words(self, heard_ms: float | None) -> str:
        """The reply's transcript up to what the caller heard: the words whose audio had begun."""
        if heard_ms is None:
            return "".join(delta for _, delta in self.spoken)
        return "".join(delta for at_ms, delta in self.spoken if at_ms < heard_ms)


def no_such_item(code: ErrorCode, item_id: str) -> ProtocolError:
    """OpenAI's error for a retrieve, delete or truncate naming an item the conversation lacks."""
    return ProtocolError(
        code, openai_message(code, f"the item with id '{item_id[:64]}' does not exist."), param="item_id"
    )


class Conversation:
    """The items of one session's conversation, the newest :data:`MAX_ITEMS` of them."""

    def __init__(self, new_id: Callable[[str], str]) -> None:
        self._new_id = new_id
        self._items: OrderedDict[str, Item] = OrderedDict()
        self._last_id: str | None = None
        #: The engine's names for caller turns -> the caller's items (engines that find turns).
        self._engine_names: OrderedDict[str, str] = OrderedDict()

    @property
    def items(self) -> Mapping[str, Item]:
        """Every remembered item by id, in conversation order."""
        return self._items

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def get(self, item_id: str) -> Item | None:
        """The item ``item_id``, or None if it is not (or no longer) in the conversation."""
        return self._items.get(item_id)

    def find(self, item_id: str) -> ev.ConversationItem | None:
        """What clients see of item ``item_id``, or None."""
        record = self._items.get(item_id)
        return record.item if record is not None else None

    # -- putting items in -----------------------------------------------------------------

    def append(self, record: Item) -> str | None:
        """Add ``record`` at the end of the conversation; returns the item before it."""
        previous = self._last_id
        record.previous_id = previous
        self._items[record.item.id] = record
        self._last_id = record.item.id
        self._forget_oldest()
        return previous

    def insert(self, record: Item, after: str | None) -> str | None:
        """Add ``record`` right after item ``after`` (None: at the start); returns ``after``."""
        ordered = list(self._items.items())
        position = 0 if after is None else next(i for i, (key, _) in enumerate(ordered) if key == after) + 1
        record.previous_id = after
        ordered.insert(position, (record.item.id, record))
        if position < len(ordered) - 1:
            ordered[position + 1][1].previous_id = record.item.id
        self._items = OrderedDict(ordered)
        self._last_id = ordered[-1][0]
        self._forget_oldest()
        return after

    def enter(self, record: Item, after: str | None) -> str | None:
        """Put a created item in the conversation: last (None), first ("root") or after ``after``.

        Returns the id of the item it now follows.
        """
        if after is None:
            return self.append(record)
        return self.insert(record, None if after == "root" else after)

    def place(self, command: cmd.ConversationItemCreate) -> tuple[str, str | None]:
        """The id a created item takes and the item it goes after; refused when either is wrong."""
        item_id = command.item_id or self._new_id("item")
        if item_id in self._items:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"item {item_id} already exists", param="item.id")
        after = command.previous_item_id
        if after is not None and after != "root" and after not in self._items:
            raise ProtocolError(
                ErrorCode.ITEM_NOT_FOUND, f"no item {after} to insert after", param="previous_item_id"
            )
        return item_id, after

    def add_message(
        self, command: cmd.ConversationItemCreate, item_id: str, after: str | None, images: tuple[str, ...]
    ) -> list[Output]:
        """A message the client created (at :meth:`place`), with the pictures the engine sees."""
        content_type = "input_text" if command.role != "assistant" else "output_text"
        item = ev.ConversationItem(
            id=item_id, role=command.role, content_type=content_type, text=command.text, images=len(images)
        )
        previous = self.enter(Item(item=item), after)
        return [
            AddItem(
                item_id=item_id, role=command.role, text=command.text, previous_item_id=after, images=images
            ),
            ev.ConversationItemAdded(item=item, previous_item_id=previous),
            ev.ConversationItemDone(item=item, previous_item_id=previous),
        ]

    def add_function_item(self, command: cmd.ConversationItemCreate) -> list[Output]:
        """A function call (history) or a function's output enters the conversation."""
        item_id, after = self.place(command)
        call_id = command.call_id or self._new_id("call")
        item = ev.ConversationItem(
            id=item_id,
            role=command.role,
            content_type="",
            kind=command.kind,
            call_id=call_id,
            name=command.name,
            arguments=command.arguments,
            output=command.output,
        )
        previous = self.enter(Item(item=item), after)
        call: EngineCall
        if command.kind == "function_call":
            call = AddFunctionCall(
                item_id=item_id,
                call_id=call_id,
                name=command.name or "",
                arguments=command.arguments or "",
                previous_item_id=after,
            )
        else:
            call = AddFunctionOutput(
                item_id=item_id, call_id=call_id, output=command.output or "", previous_item_id=after
            )
        return [
            call,
            ev.ConversationItemAdded(item=item, previous_item_id=previous),
            ev.ConversationItemDone(item=item, previous_item_id=previous),
        ]

    def _forget_oldest(self) -> None:
        while len(self._items) > MAX_ITEMS:
            self._items.popitem(last=False)

    # -- taking items out -----------------------------------------------------------------

    def require(self, item_id: str, code: ErrorCode) -> Item:
        """The item ``item_id``; OpenAI's ``code`` error if the conversation lacks it."""
        record = self._items.get(item_id)
        if record is None:
            raise no_such_item(code, item_id)
        return record

    def delete(self, item_id: str) -> list[Output]:
        """Take item ``item_id`` out (it must be in): the conversation closes over the gap."""
        record = self._items.pop(item_id)
        for other in self._items.values():
            if other.previous_id == item_id:
                other.previous_id = record.previous_id
        if self._last_id == item_id:
            self._last_id = next(reversed(self._items), None)
        made_by = record.response_id
        call_id = record.item.call_id if made_by is not None and record.item.kind == "function_call" else None
        return [
            DeleteItem(item_id=item_id, response_id=made_by, call_id=call_id),
            ev.ConversationItemDeleted(item_id=item_id),
        ]

    # -- lookups ----------------------------------------------------------------------------

    def last_caller_item(self) -> str | None:
        """The caller's latest spoken turn (a transcript never belongs to an assistant item)."""
        for record in reversed(self._items.values()):
            if record.item.role == "user" and record.item.content_type == "input_audio":
                return record.item.id
        return None

    def assistant_item(self, item_id: str) -> Item:
        """The reply message ``item_id``; refused if it is not one."""
        record = self._items.get(item_id)
        if record is None or record.response_id is None or record.item.kind != "message":
            raise ProtocolError(
                ErrorCode.ITEM_NOT_FOUND, f"no assistant audio item {item_id}", param="item_id"
            )
        return record

    def find_played(self, response_id: str | None, item_id: str | None) -> Item:
        """The reply message a playback ack names (by item, by reply, or the latest one)."""
        if item_id is not None and item_id not in self._items and item_id.startswith("item_"):
            # vLLM-Omni names a reply's item ``item_<response_id>``, and its clients send that
            # name back: it means the item of that reply.
            named = item_id.removeprefix("item_")
            if response_id in (None, named):
                item_id, response_id = None, named
        if item_id is not None:
            return self.assistant_item(item_id)
        for record in reversed(self._items.values()):
            if (
                record.response_id is not None
                and record.item.kind == "message"
                and response_id in (None, record.response_id)
            ):
                return record
        raise ProtocolError(
            ErrorCode.ITEM_NOT_FOUND,
            f"no response {response_id}" if response_id else "no response has been produced yet",
            param="response_id",
        )

    def acknowledge_playback(self, command: cmd.PlaybackAck) -> list[Output]:
        """The client played a reply up to ``played_ms``: that much of it was heard."""
        if command.played_ms < 0:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "played_ms must not be negative", param="played_ms")
        record = self.find_played(command.response_id, command.item_id)
        played = min(float(command.played_ms), record.produced_ms)
        record.heard_ms = played
        assert record.response_id is not None
        return [
            AckPlayback(response_id=record.response_id, played_ms=int(played)),
            ev.PlaybackAcknowledged(
                response_id=record.response_id, played_ms=int(played), produced_ms=int(record.produced_ms)
            ),
        ]

    def truncate(self, command: cmd.ConversationItemTruncate, *, reply_closes_it: bool) -> list[Output]:
        """The caller heard reply message ``command.item_id`` up to ``audio_end_ms`` only.

        ``reply_closes_it``: the reply is still speaking the item, and closing it (a
        cancel, right after this) keeps the words heard; otherwise they are kept here.
        """
        self.require(command.item_id, ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID)
        record = self.assistant_item(command.item_id)
        if command.content_index != 0:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "assistant items have one content part (index 0)",
                param="content_index",
            )
        if command.audio_end_ms < 0:
            raise ProtocolError(
                ErrorCode.AUDIO_END_OUT_OF_RANGE, "audio_end_ms must not be negative", param="audio_end_ms"
            )
        # As OpenAI does: a point past the audio produced means all of it was heard.
        heard = min(float(command.audio_end_ms), record.produced_ms)
        record.heard_ms = heard
        if not reply_closes_it:
            record.item = replace(record.item, transcript=record.heard_words(heard))
        assert record.response_id is not None
        return [
            TruncateReply(response_id=record.response_id, audio_end_ms=int(heard)),
            ev.ConversationItemTruncated(item_id=command.item_id, content_index=0, audio_end_ms=int(heard)),
        ]

    # -- the engine's names for the caller's turns -----------------------------------------------

    def name_for_engine(self, engine_item_id: str, item_id: str) -> None:
        """The engine calls the caller's item ``item_id`` ``engine_item_id``."""
        if not engine_item_id or engine_item_id == item_id:
            return
        self._engine_names[engine_item_id] = item_id
        while len(self._engine_names) > MAX_ITEMS:
            self._engine_names.popitem(last=False)

    def engine_named(self, engine_item_id: str) -> str | None:
        """The caller's item the engine named ``engine_item_id``, whether or not it is still in."""
        return self._engine_names.get(engine_item_id)

    def caller_item(self, engine_item_id: str) -> str:
        """The caller's item an engine's item id names ("" for none known)."""
        if engine_item_id in self._items:
            return engine_item_id
        return self._engine_names.get(engine_item_id, "")
