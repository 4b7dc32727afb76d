"""The embedded engine's optional language model: replies streamed from an OpenAI-compatible endpoint.

Each reply sends the conversation (instructions as the system message, the history,
the tools and tool choice, the token limit) and speaks the streamed text sentence by
sentence as soon as each sentence is known to have ended, so the caller hears the
first sentence while the model still writes the rest. Tool calls stream through as
argument deltas, then the whole call.

The model is a nicety, not a dependency: when it gives no output (unreachable, an
error status, a bad key) the turn is answered by the offline brain instead, so the
caller is never left in silence. A stream that breaks after some output ends the reply
as failed; what was said stays said.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

from duplex_gateway.engine.embedded.brain import (
    INCOMPLETE,
    MAX_TOKENS_REASON,
    Call,
    CallDelta,
    End,
    OfflineBrain,
    Part,
    ReplyRequest,
    Say,
)
from duplex_gateway.engine.embedded.chat_llm import (
    ChatClient,
    ChatEvent,
    ChatStreamError,
    ChatUnavailable,
    Finished,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    sentences,
)
from duplex_gateway.engine.embedded.conversation import Message, chat_messages, last_input
from duplex_gateway.engine.embedded.responder import clean_transcript
from duplex_gateway.engine.embedded.tts import DEFAULT_MAX_SENTENCE_CHARS

__all__ = ["LlmBrain"]

logger = logging.getLogger(__name__)

#: OpenAI's finish reasons that mean the reply was cut short, as the reply's (status, reason).
_CUT_SHORT: Final = {
    "length": (INCOMPLETE, MAX_TOKENS_REASON),
    "content_filter": (INCOMPLETE, "content_filter"),
}


class _Runs:
    """Splits a chat stream into runs of text, each ended by the first item that is not text."""

    def __init__(self, events: AsyncIterator[ChatEvent]) -> None:
        self._events = events
        #: What ended the last run (None: the stream ended).
        self.stopped_at: ChatEvent | None = None

    async def text(self) -> AsyncGenerator[str, None]:
        self.stopped_at = None
        while (item := await anext(self._events, None)) is not None:
            if not isinstance(item, TextDelta):
                self.stopped_at = item
                return
            yield item.text


class LlmBrain:
    """Streams replies from ``client``; falls back to ``offline`` for a turn the model gives nothing for."""

    def __init__(self, client: ChatClient, offline: OfflineBrain) -> None:
        self.client = client
        self.offline = offline

    async def reply(self, request: ReplyRequest) -> AsyncGenerator[Part, None]:
        answered = last_input(request.context)
        if isinstance(answered, Message) and answered.audio and not clean_transcript(answered.known_text):
            # Nothing intelligible was heard: asking the model would only make it guess.
            async for part in self.offline.reply(request):
                yield part
            return
        messages = chat_messages(request.context, request.instructions, request.calls)
        stream = self.client.stream(
            messages,
            tools=request.tools,
            tool_choice=request.tool_choice,
            max_tokens=request.max_output_tokens,
        )
        finished: Finished | None = None
        try:
            # Closing the stream (a barge-in cancels the reply) drops the HTTP connection,
            # which is what tells the server to stop generating.
            async with contextlib.aclosing(stream) as events:
                runs = _Runs(events)
                while finished is None:
                    # Sentences as short as the offline ones: a long one would hold back the
                    # first audio, or outlast a paced reply's lead while it is synthesized.
                    said_so_far = sentences(runs.text(), max_chars=DEFAULT_MAX_SENTENCE_CHARS)
                    async with contextlib.aclosing(said_so_far) as said:
                        async for sentence in said:
                            yield Say(text=sentence)
                    item = runs.stopped_at
                    if item is None:
                        break  # the client always ends with Finished; a stream without one ends here
                    if isinstance(item, ToolCallDelta):
                        yield CallDelta(call_id=item.call_id, name=item.name, delta=item.arguments_delta)
                    elif isinstance(item, ToolCallDone):
                        call = item.call
                        yield Call(call_id=call.id, name=call.name, arguments=call.arguments)
                    elif isinstance(item, Finished):
                        finished = item
        except ChatUnavailable as exc:
            # Raised only before any output, so the offline reply is the turn's whole answer.
            logger.warning("LLM reply failed (%s); answering this turn with the offline responder", exc)
            async for part in self.offline.reply(request):
                yield part
            return
        except ChatStreamError as exc:
            logger.warning("LLM reply broke off: %s", exc)
            yield End(status="failed", reason="engine_error", error=str(exc))
            return
        if finished is None:
            yield End()
            return
        status, reason = _CUT_SHORT.get(finished.reason or "", ("completed", None))
        yield End(
            status=status,
            reason=reason,
            input_tokens=finished.input_tokens,
            output_tokens=finished.output_tokens,
        )
