"""Responses delegation handed to a backend model: what the voice engine delegates, the backend does.

With a backend configured (an OpenAI-compatible chat endpoint), a Responses-delegation session
gives its voice engine one function, :func:`backend_tool`, described by what the backend can do
(the client's Responses instructions and function tools). When the engine calls it, the dialect
opens a delegation (:meth:`BackendDelegations.delegate`): the client sees
``session.delegation.created``, and the host gets a :class:`BackendRequest`: the conversation so
far as chat messages, with the client's Responses settings. What the backend streams back
(:data:`BackendResult`, the host's reading of its stream) goes to the client as Responses events
in ``response.event`` envelopes, as OpenAI's Responses delegation shows them. A function call of
the backend's is the client's to run: its ``response.item.create`` output and ``response.create``
start the next round with the output in the context. The backend's final words go to the voice
engine as the answer to its call (a ``commentary`` context append for that call), which it
speaks in its own voice while the conversation goes on.

Pure: the host does the HTTP; ids are counters, so a run is reproducible.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice

__all__ = [
    "MAX_ROUNDS",
    "MAX_TRANSCRIPT_MESSAGES",
    "BackendCall",
    "BackendCallMade",
    "BackendDelegations",
    "BackendFailed",
    "BackendFinished",
    "BackendMessage",
    "BackendRequest",
    "BackendResult",
    "BackendText",
    "backend_tool",
]

JsonObject = dict[str, object]

#: The conversation a backend request carries: its most recent messages (older ones drop out).
MAX_TRANSCRIPT_MESSAGES = 64
#: Backend rounds one delegation may take (each function call the client answers is a round): a
#: backend that calls functions forever ends with its delegation failed, not with a loop.
MAX_ROUNDS = 8
#: Delegations one session may have in flight; one more is refused (the engine hears it failed).
MAX_OPEN = 4
#: The name of the backend's function on the voice engine, before the names of the client's tools.
BACKEND_TOOL_NAME = "delegate"
#: The longest function name OpenAI's schema allows.
_MAX_NAME = 64
#: How much of the backend's instructions and tools the engine's function description quotes.
_DESCRIPTION_CHARS = 600
#: What the engine hears when the backend could not answer (it says so in its own words).
_FAILED = "The assistant backend could not complete this request: {why}"
#: Item ids of the context appends carrying the backend's answers (their acknowledgements stay internal).
ITEM_PREFIX = "item_live_backend_"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCall:
    """A function call the backend made, for the client to run."""

    call_id: str
    name: str
    #: The arguments as JSON text, as the backend wrote them.
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendMessage:
    """One chat message of a backend request (OpenAI's chat roles)."""

    role: str
    content: str | None = None
    tool_calls: tuple[BackendCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRequest:
    """One round of a delegation for the host to send to the backend."""

    delegation_id: str
    response_id: str
    messages: tuple[BackendMessage, ...]
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendText:
    """Words of the backend's answer, as they stream."""

    response_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCallMade:
    """A function call of the backend's, complete."""

    response_id: str
    call: BackendCall


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendFinished:
    """The end of one backend round (OpenAI's ``finish_reason``, and token usage when known)."""

    response_id: str
    reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendFailed:
    """A backend round that failed (unreachable, refused, broken stream, timed out)."""

    response_id: str
    message: str


BackendResult = BackendText | BackendCallMade | BackendFinished | BackendFailed


def backend_tool(responses: Mapping[str, object], tools: tuple[FunctionTool, ...]) -> FunctionTool:
    """The engine's one function under a backend: its name and description say what the backend can do.

    An engine picks a function by its name and what it is described to do, so both name the
    backend's functions (``delegate_get_weather``), and the description its instructions too: a
    caller asking for one of them is handed on.
    """
    parts = ["Hand the caller's request to the assistant backend, which"]
    instructions = responses.get("instructions")
    if isinstance(instructions, str) and instructions.strip():
        parts.append(f"works as told: {instructions.strip()}")
    if tools:
        listed = "; ".join(f"{t.name.replace('_', ' ')}: {t.description}".strip(": ") for t in tools)
        parts.append(f"can {listed}")
    if len(parts) == 1:
        parts.append("can answer what needs more knowledge or reasoning than you have")
    description = " ".join(parts)[:_DESCRIPTION_CHARS]
    name = f"{BACKEND_TOOL_NAME}_{'_or_'.join(t.name for t in tools)}" if tools else BACKEND_TOOL_NAME
    return FunctionTool(
        name=name[:_MAX_NAME].rstrip("_-"),
        description=f"{description}. Keep talking meanwhile; its answer comes back to you to say.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )


class Transcript:
    """The conversation as a backend reads it: who said what, most recent last, bounded."""

    __slots__ = ("_messages",)

    def __init__(self) -> None:
        self._messages: deque[BackendMessage] = deque(maxlen=MAX_TRANSCRIPT_MESSAGES)

    def add(self, role: str, text: str) -> None:
        text = text.strip()
        if text:
            self._messages.append(BackendMessage(role=role, content=text))

    def messages(self) -> tuple[BackendMessage, ...]:
        return tuple(self._messages)


@dataclass(slots=True)
class _Round:
    """The backend response in progress: its text and calls so far."""

    response_id: str
    text: str = ""
    text_item: str | None = None
    calls: list[BackendCall] = field(default_factory=list)
    #: Where the next output item goes (output_index).
    outputs: int = 0
    #: Responses event sequence numbers, per response.
    sequence: int = 0


@dataclass(slots=True)
class _Delegation:
    delegation_id: str
    #: The voice engine's call this delegation answers.
    engine_call_id: str
    context: list[BackendMessage]
    round: _Round
    rounds: int = 1
    #: The client's outputs to the last round's calls, by call id (None: not answered yet).
    outputs: dict[str, str | None] = field(default_factory=dict)
    waiting: bool = False


class BackendDelegations:
    """The backend delegations of one Live session, from the engine's call to the engine's answer."""

    def __init__(self) -> None:
        self.transcript = Transcript()
        self._open: dict[str, _Delegation] = {}
        self._by_response: dict[str, str] = {}
        self._by_call: dict[str, str] = {}
        self._requests: list[BackendRequest] = []
        self._commands: list[cmd.Command] = []
        self._counter = 0
        self._responses: Mapping[str, object] = {}
        self._tools: tuple[FunctionTool, ...] = ()
        self._tool_choice: ToolChoice | None = None
        self._engine_tool = BACKEND_TOOL_NAME

    def configure(
        self, responses: Mapping[str, object], tools: tuple[FunctionTool, ...], tool_choice: ToolChoice | None
    ) -> None:
        """The client's Responses settings (from ``session.start``, then each ``session.update``)."""
        self._responses, self._tools, self._tool_choice = responses, tools, tool_choice
        self._engine_tool = backend_tool(responses, tools).name

    def is_delegation(self, name: str | None) -> bool:
        """A call of ``name`` by the engine hands work to the backend (its one function, as named now)."""
        return name == self._engine_tool

    def _next(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}_backend_{self._counter}"

    # -- the engine delegates ------------------------------------------------------------------

    def delegate(
        self,
        engine_call_id: str,
        offset_ms: int,
        system: tuple[str, ...],
        pending: tuple[BackendMessage, ...] = (),
    ) -> list[JsonObject]:
        """The engine called the backend's function: open a delegation and ask the backend.

        ``system``: the session's instructions (the Responses instructions come first); ``pending``:
        what was said and is not in the transcript yet (the caller's words still being recognized,
        the engine's words in the reply that delegates). Returns the
        server events for the client: ``session.delegation.created``, and the first response's
        ``response.created``.
        """
        delegation_id = self._next("deleg")
        response_id = self._next("resp")
        if len(self._open) >= MAX_OPEN:
            self._answer(engine_call_id, _FAILED.format(why="too many requests are in progress already"))
            return []
        instructions = self._responses.get("instructions")
        prompt = [p for p in (instructions if isinstance(instructions, str) else None, *system) if p]
        context = [BackendMessage(role="system", content="\n\n".join(prompt))] if prompt else []
        context.extend(self.transcript.messages())
        context.extend(message for message in pending if message.content)
        delegation = _Delegation(
            delegation_id=delegation_id,
            engine_call_id=engine_call_id,
            context=context,
            round=_Round(response_id),
        )
        self._open[delegation_id] = delegation
        self._by_response[response_id] = delegation_id
        self._request(delegation)
        created: JsonObject = {
            "type": "session.delegation.created",
            "offset_ms": offset_ms,
            "delegation": {
                "id": delegation_id,
                "type": "delegation",
                "target": "responses",
                "response_id": response_id,
            },
        }
        return [created, self._event(delegation, "response.created", response=self._snapshot(delegation))]

    def _request(self, delegation: _Delegation) -> None:
        limit = self._responses.get("max_output_tokens")
        self._requests.append(
            BackendRequest(
                delegation_id=delegation.delegation_id,
                response_id=delegation.round.response_id,
                messages=tuple(delegation.context),
                tools=self._tools,
                tool_choice=self._tool_choice,
                max_output_tokens=limit if isinstance(limit, int) else None,
            )
        )

    # -- the backend answers -------------------------------------------------------------------

    def result(self, result: BackendResult) -> list[JsonObject]:
        """What the backend streamed, as server events for the client (and the engine's answer, at the end)."""
        delegation_id = self._by_response.get(result.response_id)
        delegation = self._open.get(delegation_id) if delegation_id is not None else None
        if delegation is None or delegation.round.response_id != result.response_id:
            return []  # a round that was given up (the session closes)
        if isinstance(result, BackendText):
            return self._text(delegation, result.delta)
        if isinstance(result, BackendCallMade):
            return self._call(delegation, result.call)
        if isinstance(result, BackendFinished):
            return self._finished(delegation, result)
        return self._failed(delegation, result.message)

    def _text(self, delegation: _Delegation, delta: str) -> list[JsonObject]:
        now = delegation.round
        out: list[JsonObject] = []
        if now.text_item is None:
            now.text_item = self._next("msg")
            item = {"id": now.text_item, "type": "message", "status": "in_progress", "role": "assistant"}
            out.append(
                self._event(
                    delegation,
                    "response.output_item.added",
                    output_index=now.outputs,
                    item={**item, "content": []},
                )
            )
        now.text += delta
        out.append(
            self._event(
                delegation,
                "response.output_text.delta",
                item_id=now.text_item,
                output_index=now.outputs,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return out

    def _end_text(self, delegation: _Delegation) -> list[JsonObject]:
        now = delegation.round
        if now.text_item is None:
            return []
        item_id, index = now.text_item, now.outputs
        now.text_item, now.outputs = None, now.outputs + 1
        part = {"type": "output_text", "text": now.text, "annotations": []}
        return [
            self._event(
                delegation,
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=now.text,
                logprobs=[],
            ),
            self._event(
                delegation,
                "response.output_item.done",
                output_index=index,
                item={
                    "id": item_id,
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [part],
                },
            ),
        ]

    def _call(self, delegation: _Delegation, call: BackendCall) -> list[JsonObject]:
        out = self._end_text(delegation)
        now = delegation.round
        now.calls.append(call)
        item = {
            "id": self._next("fc"),
            "type": "function_call",
            "status": "completed",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        }
        out.append(self._event(delegation, "response.output_item.done", output_index=now.outputs, item=item))
        now.outputs += 1
        return out

    def _finished(self, delegation: _Delegation, finished: BackendFinished) -> list[JsonObject]:
        out = self._end_text(delegation)
        now = delegation.round
        incomplete = finished.reason in ("length", "content_filter")
        snapshot = self._snapshot(delegation, "incomplete" if incomplete else "completed")
        if incomplete:
            snapshot["incomplete_details"] = {
                "reason": "max_output_tokens" if finished.reason == "length" else "content_filter"
            }
        if finished.input_tokens is not None or finished.output_tokens is not None:
            tokens_in, tokens_out = finished.input_tokens or 0, finished.output_tokens or 0
            snapshot["usage"] = {
                "input_tokens": tokens_in,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": tokens_out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": tokens_in + tokens_out,
            }
        out.append(self._event(delegation, f"response.{snapshot['status']}", response=snapshot))
        if now.calls and not incomplete:
            # The client runs the calls; its outputs and response.create start the next round.
            delegation.context.append(
                BackendMessage(role="assistant", content=now.text or None, tool_calls=tuple(now.calls))
            )
            delegation.outputs = {call.call_id: None for call in now.calls}
            for call in now.calls:
                self._by_call[call.call_id] = delegation.delegation_id
            delegation.waiting = True
            return out
        self._close(delegation)
        answer = now.text.strip()
        if not answer:
            answer = _FAILED.format(why="it answered nothing" if not incomplete else "its answer was cut off")
        self._answer(delegation.engine_call_id, answer)
        return out

    def _failed(self, delegation: _Delegation, message: str) -> list[JsonObject]:
        out = self._end_text(delegation)
        snapshot = self._snapshot(delegation, "failed")
        snapshot["error"] = {"code": "server_error", "message": message}
        out.append(self._event(delegation, "response.failed", response=snapshot))
        self._close(delegation)
        self._answer(delegation.engine_call_id, _FAILED.format(why=message))
        return out

    # -- the client answers the backend's calls ---------------------------------------------------

    def owns_call(self, call_id: str) -> bool:
        """The call is one of a backend's, waiting for the client's output."""
        delegation_id = self._by_call.get(call_id)
        delegation = self._open.get(delegation_id) if delegation_id is not None else None
        return delegation is not None and delegation.outputs.get(call_id, "") is None

    def output(self, call_id: str, output: str) -> None:
        """The client's output for the backend's call ``call_id`` (see :meth:`owns_call`)."""
        delegation = self._open[self._by_call.pop(call_id)]
        delegation.outputs[call_id] = output

    def unanswered(self) -> tuple[str, ...]:
        """Calls of delegations waiting to go on that still lack an output."""
        return tuple(
            sorted(
                call_id
                for delegation in self._open.values()
                if delegation.waiting
                for call_id, output in delegation.outputs.items()
                if output is None
            )
        )

    def resume(self) -> list[JsonObject]:
        """The client's ``response.create``: every delegation whose calls are all answered goes on."""
        out: list[JsonObject] = []
        for delegation in list(self._open.values()):
            if not delegation.waiting or any(o is None for o in delegation.outputs.values()):
                continue
            delegation.waiting = False
            for call_id, output in delegation.outputs.items():
                delegation.context.append(BackendMessage(role="tool", content=output, tool_call_id=call_id))
            delegation.outputs = {}
            if delegation.rounds >= MAX_ROUNDS:
                out.extend(
                    self._failed(delegation, f"it called functions {MAX_ROUNDS} times without answering")
                )
                continue
            delegation.rounds += 1
            response_id = self._next("resp")
            delegation.round = _Round(response_id)
            self._by_response[response_id] = delegation.delegation_id
            self._request(delegation)
            out.append(self._event(delegation, "response.created", response=self._snapshot(delegation)))
        return out

    @property
    def waiting(self) -> bool:
        """Some delegation waits for the client's ``response.create``."""
        return any(d.waiting for d in self._open.values())

    # -- to the host and the session -----------------------------------------------------------

    def take_requests(self) -> list[BackendRequest]:
        out, self._requests = self._requests, []
        return out

    def take_commands(self) -> list[cmd.Command]:
        out, self._commands = self._commands, []
        return out

    def _answer(self, engine_call_id: str, text: str) -> None:
        # Commentary: for the voice engine to say, as the answer to its own call.
        self._commands.append(
            cmd.ContextAppend(
                channel="commentary",
                content=text,
                delegation_id=engine_call_id,
                item_id=self._next("item_live"),  # ITEM_PREFIX, numbered
            )
        )

    def _close(self, delegation: _Delegation) -> None:
        self._open.pop(delegation.delegation_id, None)
        for key in [k for k, v in self._by_response.items() if v == delegation.delegation_id]:
            del self._by_response[key]

    @staticmethod
    def is_answer_item(item_id: str | None) -> bool:
        """``item_id`` is one of the context appends carrying a backend's answer."""
        return item_id is not None and item_id.startswith(ITEM_PREFIX)

    def _snapshot(self, delegation: _Delegation, status: str = "in_progress") -> JsonObject:
        # Reduced, as the Live API's are: output is always empty; items come in their own events.
        return {"id": delegation.round.response_id, "object": "response", "status": status, "output": []}

    def _event(self, delegation: _Delegation, kind: str, **fields: object) -> JsonObject:
        now = delegation.round
        nested: JsonObject = {"type": kind, "sequence_number": now.sequence, **fields}
        now.sequence += 1
        return {"type": "response.event", "delegation_id": delegation.delegation_id, "event": nested}
