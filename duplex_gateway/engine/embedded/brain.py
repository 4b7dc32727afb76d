"""What decides a reply of the embedded engine: its "brain".

A brain turns a :class:`ReplyRequest` (the conversation or the reply's own context, the
instructions, the tools it may call) into a stream of :data:`Part`\\ s: sentences to say,
function calls, and one :class:`End`. The engine speaks the sentences with Piper (or
sends them as text) and turns the calls into function-call events; the brain never
touches audio.

:class:`OfflineBrain` is the default and needs nothing but this machine: a function's
output is read back as a sentence, a tool is picked and its arguments filled by word
matching (:class:`~duplex_gateway.engine.embedded.tool_router.ToolRouter`), and
anything else gets the rule-based responder. The language-model brain lives in
:mod:`.llm_brain`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol

from duplex_gateway.engine.embedded.conversation import Entry, FunctionCall, FunctionOutput, last_input
from duplex_gateway.engine.embedded.responder import Responder
from duplex_gateway.engine.embedded.tool_reply import reply_from_output
from duplex_gateway.engine.embedded.tool_router import ToolRouter
from duplex_gateway.engine.embedded.tool_schema import ToolCall
from duplex_gateway.engine.embedded.tts import split_sentences
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice, ToolChoiceMode

__all__ = [
    "Brain",
    "Call",
    "CallDelta",
    "End",
    "OfflineBrain",
    "Part",
    "ReplyRequest",
    "Say",
    "cap_words",
    "new_call_id",
]

#: Status and reason of a reply cut at ``max_output_tokens`` (what OpenAI reports).
INCOMPLETE: Final = "incomplete"
MAX_TOKENS_REASON: Final = "max_output_tokens"


def new_call_id() -> str:
    """A fresh id for a function call, in OpenAI's shape."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Say:
    """One sentence of the reply, to be spoken (or sent as text) in order."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDelta:
    """A piece of a function call's arguments as they are written (the first may be empty: it announces the call)."""

    call_id: str
    name: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """A whole function call; ends it."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class End:
    """How the reply ended, and what it cost where the brain counts tokens."""

    status: str = "completed"  # completed | incomplete | failed
    reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: A failure to report to the client beside the failed status (what broke, no secrets).
    error: str | None = None


Part = Say | CallDelta | Call | End


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplyRequest:
    """Everything a brain may use for one reply."""

    #: The conversation (or the reply's own ``input``), oldest first, transcripts settled.
    context: tuple[Entry, ...]
    #: The system prompt: the reply's own instructions, else the session's.
    instructions: str = ""
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    #: None: no limit.
    max_output_tokens: int | None = None
    now: datetime
    #: Function calls of this session by call id, for an output whose call is not in ``context``.
    calls: Mapping[str, FunctionCall] = field(default_factory=dict)

    @property
    def may_call(self) -> bool:
        return bool(self.tools) and self.tool_choice.mode is not ToolChoiceMode.NONE


class Brain(Protocol):
    """Decides replies; shared by every session of an engine."""

    def reply(self, request: ReplyRequest) -> AsyncGenerator[Part, None]:
        """The reply's parts in order, ending with one :class:`End`. Iterate it under
        ``contextlib.aclosing``: a cancelled reply must release what the brain holds at once."""
        ...


def cap_words(text: str, limit: int | None) -> tuple[str, bool]:
    """``text`` cut to ``limit`` words, and whether it was cut.

    The offline responder has no tokenizer: it counts words as tokens, which is close
    enough for English (a token is about three quarters of a word) and never says more
    than the client allowed.
    """
    if limit is None:
        return text, False
    words = text.split()
    if len(words) <= limit:
        return text, False
    return " ".join(words[:limit]), True


class OfflineBrain:
    """Replies with no language model: function outputs read back, tools routed by rule, else the responder.

    Instructions are not read: rules have no prompt to follow. Only the last input counts
    (the responder and the router are stateless); the rest of the history is for a model.
    """

    def __init__(self, responder: Responder, router: ToolRouter | None = None) -> None:
        self.responder = responder
        self.router = router or ToolRouter()

    async def reply(self, request: ReplyRequest) -> AsyncGenerator[Part, None]:
        for part in self.decide(request):
            yield part

    def decide(self, request: ReplyRequest) -> list[Part]:
        """The whole reply at once (nothing here waits)."""
        answered = last_input(request.context)
        if isinstance(answered, FunctionOutput):
            text = reply_from_output(self._call_for(answered, request), answered.output)
        else:
            heard = answered.known_text if answered is not None else ""
            if request.may_call:
                call = self.router.route(heard, request.tools, request.tool_choice, now=request.now)
                if call is not None:
                    return [
                        Call(call_id=new_call_id(), name=call.name, arguments=call.arguments_json()),
                        End(),
                    ]
            text = self.responder.reply(heard, now=request.now)
        text, cut = cap_words(text, request.max_output_tokens)
        parts: list[Part] = [Say(text=sentence) for sentence in split_sentences(text)]
        parts.append(End(status=INCOMPLETE, reason=MAX_TOKENS_REASON) if cut else End())
        return parts

    @staticmethod
    def _call_for(output: FunctionOutput, request: ReplyRequest) -> ToolCall:
        """The call ``output`` answers, as the router's value (a call it did not make, too)."""
        made: FunctionCall | None = next(
            (
                entry
                for entry in reversed(request.context)
                if isinstance(entry, FunctionCall) and entry.call_id == output.call_id
            ),
            None,
        ) or request.calls.get(output.call_id)
        if made is None:
            return ToolCall(name="", arguments={}, score=1.0)  # read back as "The tool says: ..."
        try:
            arguments = json.loads(made.arguments)
        except ValueError:
            arguments = {}
        return ToolCall(name=made.name, arguments=arguments if isinstance(arguments, dict) else {}, score=1.0)
