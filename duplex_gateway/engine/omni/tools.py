"""Function calling with vLLM-Omni, shared by the ``vllm-omni`` and ``remote`` engines.

What vLLM-Omni 0.30 does with tools, and so what these engines send and expect:

* The session's ``tools`` / ``tool_choice`` go in its Realtime ``session`` object (open
  and ``session.update``); vLLM-Omni keeps them as ``extra_body.realtime_tools`` /
  ``realtime_tool_choice``, where a model's duplex plugin reads them (a ``null`` drops them).
* ``response.create`` takes no ``tools`` / ``tool_choice`` in a duplex session: it refuses
  them (``unsupported_native_response_options``, like instructions, voice, temperature
  and token limits). A reply can only use the session's tools.
* A model's call reaches its Realtime translator as ``function_call.done`` (name, call id,
  whole arguments), which it turns into a complete response *of its own*:
  ``response.created`` -> ``response.output_item.added`` (the ``function_call`` item)
  -> ``response.function_call_arguments.delta`` (all the arguments) -> ``...done`` (no
  name) -> ``response.output_item.done`` -> ``response.done``. It arrives while the reply
  the call belongs to (the one answering the turn) is in progress; that reply's own
  ``response.done`` follows. :class:`FunctionCalls` puts the call back on that reply.
* The client's function output is a ``function_call_output`` item
  (``conversation.item.create``); vLLM-Omni refuses one whose ``call_id`` is not a
  ``function_call`` item it knows, so replayed calls go in as ``function_call`` items.
  Taking an output it announces the item and then continues the reply in progress,
  which for a turn-commit model means ending it: a reply asked for before that ran
  would be ended at once, so the engines ask for the next reply only once vLLM-Omni has
  announced the output. vLLM-Omni makes that reply (``response.create``) only from input
  still committed (or text items, for models that answer text): whether a model keeps
  the turn that called a function for it is the model plugin's business.
* Its ``response.done`` reports no token usage; a duplex-gateway backend's does
  (``response.usage``), and :func:`token_usage` reads it where present.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from duplex_gateway.engine import port
from duplex_gateway.vocabulary.session_config import FunctionTool, SessionConfig, ToolChoice

__all__ = [
    "FunctionCalls",
    "function_call_item",
    "function_output_item",
    "own_tools",
    "reply_tools_refusal",
    "session_tools",
    "token_usage",
    "tool_choice_object",
    "tool_object",
]

#: Call-only responses and call names remembered (a reply makes a few calls at most).
_REMEMBERED = 64


def _plain(value: object) -> object:
    """``value`` as plain JSON data (a tool's schema may hold read-only mappings and tuples)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def tool_object(tool: FunctionTool) -> dict[str, object]:
    """A Realtime function tool, as vLLM-Omni's session takes it."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": _plain(tool.parameters),
    }


def tool_choice_object(choice: ToolChoice) -> object:
    """A Realtime ``tool_choice``: a mode name, or the one function a reply must call."""
    if choice.function is not None:
        return {"type": "function", "name": choice.function}
    return choice.mode.value


def session_tools(tools: tuple[FunctionTool, ...], choice: ToolChoice) -> dict[str, object]:
    """The ``tools`` / ``tool_choice`` keys of a vLLM-Omni session object (none without tools,
    so an update that drops the tools sends both as null and vLLM-Omni forgets them)."""
    if not tools:
        return {}
    return {"tools": [tool_object(tool) for tool in tools], "tool_choice": tool_choice_object(choice)}


def own_tools(options: port.ResponseOptions | None, config: SessionConfig) -> bool:
    """The reply asks for tools (or a tool choice) other than the session's."""
    if options is None:
        return False
    return session_tools(options.tools, options.tool_choice) != session_tools(
        config.tools, config.tool_choice
    )


def reply_tools_refusal(options: port.ResponseOptions | None, config: SessionConfig) -> str | None:
    """Why vLLM-Omni cannot make this reply: tools of its own (None: it can).

    Its ``response.create`` refuses ``tools`` / ``tool_choice``, so a reply can only use the
    session's; asking for others must fail the reply, not silently use the session's.
    """
    if not own_tools(options, config):
        return None
    return "vLLM-Omni takes tools and tool_choice only with the session (session.update), not for one reply"


def function_call_item(*, item_id: str, call_id: str, name: str, arguments: str) -> dict[str, object]:
    """A completed ``function_call`` item (a call the client replays into the conversation)."""
    return {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def function_output_item(*, item_id: str, call_id: str, output: str) -> dict[str, object]:
    """A ``function_call_output`` item: what the client's function returned."""
    return {"id": item_id, "type": "function_call_output", "call_id": call_id, "output": output}


def token_usage(response: object) -> tuple[int | None, int | None]:
    """``(input_tokens, output_tokens)`` of a ``response.done``'s ``response`` (None: not reported)."""
    usage = response.get("usage") if isinstance(response, Mapping) else None
    if not isinstance(usage, Mapping):
        return None, None

    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    return count("input_tokens"), count("output_tokens")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _response_id(event: Mapping[str, Any]) -> str | None:
    value = _text(event.get("response_id"))
    if value is not None:
        return value
    response = event.get("response")
    return _text(response.get("id")) if isinstance(response, Mapping) else None


class FunctionCalls:
    """Which reply each function call vLLM-Omni reports belongs to; port events for the calls.

    An engine consults it for every ``response.created`` that names no reply it knows
    (:meth:`created`), and hands it every Realtime event (as wire JSON) that may be about
    a call (:meth:`translate`). A response vLLM-Omni starts while another reply is in
    progress is *held*: if it turns out to carry a function call it is that call's
    wrapper and the call goes on the reply in progress; anything else in it makes it a
    reply of its own (:meth:`release`, by the engine). Engine reply ids are mapped to
    the gateway's by the engine (``gateway_id``; None: the reply was dropped).
    """

    def __init__(self) -> None:
        #: Held response -> the engine id of the reply that was in progress when it started.
        self._held: OrderedDict[str, str] = OrderedDict()
        #: Function names by call id, from the call's item (``...arguments.done`` names none).
        self._names: OrderedDict[str, str] = OrderedDict()

    def created(self, response_id: str, in_progress: str | None) -> bool:
        """A ``response.created`` for no known reply; True: held (``in_progress`` is under way)."""
        if in_progress is None or response_id == in_progress:
            return False
        self._held[response_id] = in_progress
        while len(self._held) > _REMEMBERED:
            self._held.popitem(last=False)
        return True

    def held(self, response_id: str | None) -> bool:
        return response_id is not None and response_id in self._held

    def release(self, response_id: str) -> None:
        """A held response is a reply after all (it carries more than a call)."""
        self._held.pop(response_id, None)

    def translate(
        self, event: Mapping[str, Any], gateway_id: Callable[[str], str | None]
    ) -> list[port.EngineEvent] | None:
        """Port events for ``event`` if it is about a function call (None: it is not)."""
        kind = event.get("type")
        response_id = _response_id(event)
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if not isinstance(item, Mapping) or item.get("type") != "function_call":
                return None
            call_id, name = _text(item.get("call_id")), _text(item.get("name"))
            if call_id is not None and name is not None:
                self._names[call_id] = name
                while len(self._names) > _REMEMBERED:
                    self._names.popitem(last=False)
            return []  # the call is announced by its arguments
        if kind == "response.function_call_arguments.delta":
            call = self._call(event, response_id, gateway_id)
            delta = event.get("delta")
            if call is None or not isinstance(delta, str) or not delta:
                return []
            owner, call_id, name = call
            return [port.EngineFunctionCallDelta(response_id=owner, call_id=call_id, name=name, delta=delta)]
        if kind == "response.function_call_arguments.done":
            call = self._call(event, response_id, gateway_id)
            if call is None:
                return []
            owner, call_id, name = call
            arguments = event.get("arguments")
            self._names.pop(call_id, None)
            return [
                port.EngineFunctionCall(
                    response_id=owner,
                    call_id=call_id,
                    name=name,
                    arguments=arguments if isinstance(arguments, str) else "",
                )
            ]
        if kind == "response.done" and response_id is not None and response_id in self._held:
            # The wrapper of a call ends; the reply the call belongs to goes on.
            del self._held[response_id]
            return []
        return None

    def _call(
        self, event: Mapping[str, Any], response_id: str | None, gateway_id: Callable[[str], str | None]
    ) -> tuple[str, str, str] | None:
        """(the gateway's reply, call id, function name) of an arguments event; None: dropped."""
        call_id = _text(event.get("call_id"))
        if response_id is None or call_id is None:
            return None
        owner = gateway_id(self._held.get(response_id, response_id))
        if owner is None:
            return None  # its reply was cancelled: nothing of it reaches the client
        name = _text(event.get("name")) or self._names.get(call_id, "")
        return owner, call_id, name
