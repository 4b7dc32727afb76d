"""The embedded engine's memory of one conversation: a bounded list of typed, frozen entries.

Caller turns (their final transcripts), text items the client added, the replies the
engine spoke (only what the caller heard of an interrupted one), function calls and
their outputs. The offline brain reads the last thing to answer from it
(:func:`last_input`); the language model gets all of it as chat messages
(:func:`chat_messages`).

The gateway names items the client added and turns it committed; the engine's own
replies are known by their response id and its function calls by their call id.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from duplex_gateway.engine import port
from duplex_gateway.engine.embedded.chat_llm import ChatMessage, ChatRole, ChatToolCall
from duplex_gateway.engine.embedded.responder import clean_transcript

__all__ = [
    "Entry",
    "FunctionCall",
    "FunctionOutput",
    "History",
    "Message",
    "Spoken",
    "chat_messages",
    "from_context",
    "last_input",
    "settled",
]

#: Entries kept; the oldest go first. A phone call rarely has more turns than this, and a
#: small model's context would not hold many more.
MAX_ENTRIES: Final = 64
#: Characters kept of all entries' text together, the oldest entries dropped first.
MAX_TOTAL_CHARS: Final = 32_000
#: Characters kept of one text, output or argument string (a pasted novel stays bounded).
MAX_TEXT_CHARS: Final = 8_000
#: How a reply the caller did not hear to the end is marked for the model.
CUT_MARK: Final = "\u2026"

_ROLES: Final = frozenset({"user", "assistant", "system"})


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "\u2026"


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A caller turn or a text item: ``user``, ``assistant`` or ``system``."""

    item_id: str | None
    role: str = "user"
    text: str = ""
    #: A committed turn still being transcribed (its result is the text); None once known.
    heard: asyncio.Task[str] | None = None
    #: Spoken by the caller (a committed turn) rather than typed.
    audio: bool = False

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            object.__setattr__(self, "role", "user")  # a role the model does not know reads as the user's
        object.__setattr__(self, "text", _bounded(self.text))

    @property
    def known_text(self) -> str:
        """The text, or the transcription's result if it has finished ("" if it failed or is still running)."""
        heard = self.heard
        if heard is None:
            return self.text
        if heard.done() and not heard.cancelled() and heard.exception() is None:
            return _bounded(heard.result())
        return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Spoken:
    """A reply this engine made: its pieces as said, and how much of it the caller heard."""

    response_id: str
    #: (audio start ms, audio end ms, text) per piece; a text-only reply's pieces have no audio (0, 0).
    pieces: tuple[tuple[float, float, str], ...] = ()
    #: Where the caller stopped hearing the reply (None: all of it was heard).
    heard_ms: float | None = None
    #: Stopped before it was all said, or not all heard.
    cut: bool = False
    audio: bool = True

    @property
    def item_id(self) -> str | None:
        return None  # the gateway names the reply's item; the engine never learns that name

    @property
    def text(self) -> str:
        """What the caller heard: whole pieces before ``heard_ms``, and the share of the words of the piece
        playing then (speech runs at a roughly even rate of words)."""
        if self.heard_ms is None or not self.audio:
            return " ".join(text for _, _, text in self.pieces)
        words: list[str] = []
        for start, end, text in self.pieces:
            if self.heard_ms <= start:
                break
            said = text.split()
            if self.heard_ms >= end or end <= start:
                words.extend(said)
                continue
            words.extend(said[: math.ceil(len(said) * (self.heard_ms - start) / (end - start))])
            break
        return " ".join(words)

    def heard_until(self, ms: float) -> Spoken:
        """This reply as heard up to ``ms`` of its audio."""
        end = self.pieces[-1][1] if self.pieces else 0.0
        if not self.audio:
            return self
        if ms >= end:
            return replace(self, heard_ms=None if not self.cut else end)
        return replace(self, heard_ms=max(0.0, ms), cut=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCall:
    """A function call: made by one of this engine's replies, or put into the conversation by the client."""

    item_id: str | None
    call_id: str
    name: str
    #: JSON text, as made or given.
    arguments: str = "{}"

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _bounded(self.arguments))


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionOutput:
    """What the client's function ``call_id`` returned."""

    item_id: str | None
    call_id: str
    output: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", _bounded(self.output))


Entry = Message | Spoken | FunctionCall | FunctionOutput


def _size(entry: Entry) -> int:
    if isinstance(entry, Message):
        return len(entry.known_text) or (200 if entry.heard is not None else 0)  # a turn still being heard
    if isinstance(entry, Spoken):
        return sum(len(text) for _, _, text in entry.pieces)
    if isinstance(entry, FunctionCall):
        return len(entry.name) + len(entry.arguments)
    return len(entry.output)


class History:
    """The conversation's entries in order, bounded by count and by characters."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_TOTAL_CHARS) -> None:
        self._entries: list[Entry] = []
        self._max_entries = max_entries
        self._max_chars = max_chars

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self) -> tuple[Entry, ...]:
        """The entries now (a reply answers the conversation as it was when the reply began)."""
        return tuple(self._entries)

    def add(self, entry: Entry, previous_item_id: str | None = None) -> None:
        """``entry`` last, first (``"root"``), or after the item ``previous_item_id``.

        An item the engine does not know (one the gateway named for a reply's output) puts
        the entry last, which is where such items almost always go.
        """
        if previous_item_id == "root":
            self._entries.insert(0, entry)
        else:
            at = self._index(previous_item_id) if previous_item_id is not None else None
            self._entries.insert(len(self._entries) if at is None else at + 1, entry)
        self._trim()

    def delete(self, item_id: str, *, response_id: str | None = None, call_id: str | None = None) -> bool:
        """Forget the item; whether it was known.

        One of this engine's replies' items (named by the gateway, a name the entries never
        learn) is found by its reply, ``response_id``, or for a call by its ``call_id``.
        """
        at = self._index(item_id)
        if at is None and call_id is not None:
            at = self._made_call_index(call_id)
        elif at is None and response_id is not None:
            at = self._reply_index(response_id)
        if at is None:
            return False
        del self._entries[at]
        return True

    def put_reply(self, spoken: Spoken) -> None:
        """A reply's entry, new (last) or updated in place as more of it is said."""
        at = self._reply_index(spoken.response_id)
        if at is None:
            self.add(spoken)
        else:
            self._entries[at] = spoken
            self._trim()

    def reply(self, response_id: str) -> Spoken | None:
        at = self._reply_index(response_id)
        entry = self._entries[at] if at is not None else None
        return entry if isinstance(entry, Spoken) else None

    def call(self, call_id: str) -> FunctionCall | None:
        """The latest function call with this id."""
        for entry in reversed(self._entries):
            if isinstance(entry, FunctionCall) and entry.call_id == call_id:
                return entry
        return None

    def call_ids(self) -> set[str]:
        return {entry.call_id for entry in self._entries if isinstance(entry, FunctionCall)}

    def _index(self, item_id: str | None) -> int | None:
        if item_id is None:
            return None
        for at in range(len(self._entries) - 1, -1, -1):
            if self._entries[at].item_id == item_id:
                return at
        return None

    def _made_call_index(self, call_id: str) -> int | None:
        """The latest call with this id that a reply of this engine made (the client's have item ids)."""
        for at in range(len(self._entries) - 1, -1, -1):
            entry = self._entries[at]
            if isinstance(entry, FunctionCall) and entry.item_id is None and entry.call_id == call_id:
                return at
        return None

    def _reply_index(self, response_id: str) -> int | None:
        for at in range(len(self._entries) - 1, -1, -1):
            entry = self._entries[at]
            if isinstance(entry, Spoken) and entry.response_id == response_id:
                return at
        return None

    def _trim(self) -> None:
        entries = self._entries
        excess = len(entries) - self._max_entries
        if excess > 0:
            del entries[:excess]
        total = sum(_size(entry) for entry in entries)
        while len(entries) > 1 and total > self._max_chars:
            total -= _size(entries.pop(0))


async def settled(entries: Sequence[Entry], timeout_s: float) -> tuple[Entry, ...]:
    """``entries`` with every caller turn's transcript in place, waiting up to ``timeout_s`` for those
    still being transcribed (a turn not done by then counts as unheard). Cancelling the wait leaves
    the transcriptions running: the caller still gets their final transcripts."""
    pending = {entry.heard for entry in entries if isinstance(entry, Message) and entry.heard is not None}
    running = {task for task in pending if not task.done()}
    if running:
        await asyncio.wait(running, timeout=timeout_s)
    return tuple(
        replace(entry, text=entry.known_text, heard=None)
        if isinstance(entry, Message) and entry.heard is not None
        else entry
        for entry in entries
    )


def from_context(items: Iterable[port.ContextItem]) -> tuple[Entry, ...]:
    """A reply's own context (``response.create`` ``input``) as entries."""
    entries: list[Entry] = []
    for item in items:
        if item.kind == "function_call":
            entries.append(
                FunctionCall(
                    item_id=item.id or None,
                    call_id=item.call_id or "",
                    name=item.name or "",
                    arguments=item.arguments or "{}",
                )
            )
        elif item.kind == "function_call_output":
            entries.append(
                FunctionOutput(item_id=item.id or None, call_id=item.call_id or "", output=item.output or "")
            )
        else:
            entries.append(Message(item_id=item.id or None, role=item.role, text=item.text))
    return tuple(entries[-MAX_ENTRIES:])


def last_input(entries: Sequence[Entry]) -> Message | FunctionOutput | None:
    """What a reply answers: the latest user message (a caller turn or a typed one) or function output."""
    for entry in reversed(entries):
        if isinstance(entry, FunctionOutput) or (isinstance(entry, Message) and entry.role == "user"):
            return entry
    return None


def chat_messages(
    entries: Sequence[Entry], instructions: str, calls: Mapping[str, FunctionCall] | None = None
) -> list[ChatMessage]:
    """``entries`` (settled) as OpenAI chat messages, after ``instructions`` as the system message.

    OpenAI-compatible servers refuse a tool call that is not answered by a ``tool``
    message right after it, and a ``tool`` message without its call. So consecutive calls
    go out as one assistant message followed by their outputs, wherever in the
    history those were added; a call never answered is left out (the model did not
    learn anything from it); an output whose call is not in ``entries`` (dropped from a
    long history, or made out of band; ``calls`` may name it) goes out as a system note.
    """
    messages: list[ChatMessage] = []
    if instructions.strip():
        messages.append(ChatMessage(role="system", content=instructions))
    outputs: dict[str, FunctionOutput] = {}
    for entry in entries:
        if isinstance(entry, FunctionOutput):
            outputs.setdefault(entry.call_id, entry)
    placed: set[str] = set()
    group: list[FunctionCall] = []

    def flush() -> None:
        answered = [call for call in group if call.call_id in outputs and call.call_id not in placed]
        group.clear()
        if not answered:
            return
        messages.append(
            ChatMessage(
                role="assistant",
                tool_calls=tuple(
                    ChatToolCall(id=call.call_id, name=call.name, arguments=call.arguments)
                    for call in answered
                ),
            )
        )
        for call in answered:
            placed.add(call.call_id)
            messages.append(
                ChatMessage(role="tool", tool_call_id=call.call_id, content=outputs[call.call_id].output)
            )

    for entry in entries:
        if isinstance(entry, FunctionCall):
            group.append(entry)
            continue
        flush()
        if isinstance(entry, FunctionOutput):
            if entry.call_id in placed:
                continue
            placed.add(entry.call_id)
            known = (calls or {}).get(entry.call_id)
            what = f"The function {known.name}" if known is not None else "A function"
            messages.append(ChatMessage(role="system", content=f"{what} returned: {entry.output}"))
        elif isinstance(entry, Spoken):
            text = entry.text
            if entry.cut:
                # The caller stopped it here: the model must not assume the rest was heard.
                text = f"{text}{CUT_MARK}" if text else ""
            if text:
                messages.append(ChatMessage(role="assistant", content=text))
        else:
            text = clean_transcript(entry.known_text) if entry.audio else entry.known_text
            if text.strip():
                role: ChatRole = (
                    "assistant"
                    if entry.role == "assistant"
                    else ("system" if entry.role == "system" else "user")
                )
                messages.append(ChatMessage(role=role, content=text))
    flush()
    return messages
