"""Function tools on the Realtime wire: ``tools`` / ``tool_choice`` in and out, and ``include``.

The same shapes serve ``session.update`` and ``response.create``, GA and beta:
a tool is ``{"type": "function", "name", "description", "parameters"}``, a tool
choice ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "name"}``.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from duplex_gateway.dialects.fields import JsonObject, as_object, as_str, get_field, invalid, join
from duplex_gateway.vocabulary.errors import ErrorCode
from duplex_gateway.vocabulary.session_config import (
    INCLUDABLE,
    FunctionTool,
    ToolChoice,
    ToolChoiceMode,
)

__all__ = [
    "parse_include",
    "parse_metadata",
    "parse_tool_choice",
    "parse_tools",
    "tool_choice_object",
    "tool_object",
]

#: OpenAI's limit on a function name: letters, digits, underscores and dashes, up to 64.
_MAX_NAME = 64
_MAX_TOOLS = 128
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def parse_tools(value: object, param: str) -> tuple[FunctionTool, ...]:
    """A ``tools`` list; only function tools (an MCP server is not something the gateway can call)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid(param, f"'{param}' must be a list of tools")
    if len(value) > _MAX_TOOLS:
        raise invalid(param, f"at most {_MAX_TOOLS} tools")
    tools: list[FunctionTool] = []
    seen: set[str] = set()
    for index, raw in enumerate(value):
        path = f"{param}[{index}]"
        spec = as_object(raw, path)
        kind = spec.get("type", "function")
        if kind != "function":
            raise invalid(
                join(path, "type"),
                f"tool type {str(kind)[:32]!r} is not supported: only 'function' tools",
                ErrorCode.UNSUPPORTED_BY_ENGINE,
            )
        # Chat-completions nests the function; accept that shape too.
        body = as_object(spec["function"], join(path, "function")) if "function" in spec else spec
        name = as_str(get_field(body, "name", path, required=True), join(path, "name"), nonempty=True)
        if len(name) > _MAX_NAME or not set(name) <= _NAME_CHARS:
            raise invalid(join(path, "name"), "a function name is 1-64 letters, digits, '_' or '-'")
        if name in seen:
            raise invalid(join(path, "name"), f"two tools are named {name!r}")
        seen.add(name)
        description = body.get("description")
        parameters = body.get("parameters")
        tools.append(
            FunctionTool(
                name=name,
                description="" if description is None else as_str(description, join(path, "description")),
                parameters={}
                if parameters is None
                else dict(as_object(parameters, join(path, "parameters"))),
            )
        )
    return tuple(tools)


def parse_tool_choice(value: object, param: str) -> ToolChoice:
    """A ``tool_choice``: a mode name, or the one function the reply must call."""
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        try:
            return ToolChoice(mode=ToolChoiceMode(value))
        except ValueError:
            raise invalid(param, f"'{param}' must be 'auto', 'none', 'required' or a function") from None
    choice = as_object(value, param)
    if choice.get("type") != "function":
        raise invalid(
            join(param, "type"),
            "only a function can be forced ({'type': 'function', 'name': ...})",
            ErrorCode.UNSUPPORTED_BY_ENGINE if choice.get("type") == "mcp" else ErrorCode.INVALID_VALUE,
        )
    body = as_object(choice["function"], join(param, "function")) if "function" in choice else choice
    name = as_str(get_field(body, "name", param, required=True), join(param, "name"), nonempty=True)
    return ToolChoice(mode=ToolChoiceMode.REQUIRED, function=name)


def parse_include(value: object, param: str) -> tuple[str, ...]:
    """``session.include``: extra things the client wants reported."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid(param, f"'{param}' must be a list")
    names = tuple(as_str(item, f"{param}[{index}]") for index, item in enumerate(value))
    for index, name in enumerate(names):
        if name not in INCLUDABLE:
            raise invalid(
                f"{param}[{index}]", f"cannot include {name[:64]!r}; one of {', '.join(INCLUDABLE)}"
            )
    return tuple(dict.fromkeys(names))


def tool_object(tool: FunctionTool) -> JsonObject:
    """A tool as the session object shows it."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": dict(tool.parameters) if isinstance(tool.parameters, Mapping) else tool.parameters,
    }


def tool_choice_object(choice: ToolChoice) -> object:
    """A tool choice as the session object shows it."""
    if choice.function is not None:
        return {"type": "function", "name": choice.function}
    return choice.mode.value


#: OpenAI's bounds on ``metadata``: 16 pairs, keys up to 64 characters, values up to 512.
_MAX_METADATA = 16


def parse_metadata(value: object, param: str) -> dict[str, str]:
    """A reply's ``metadata``: string pairs the gateway echoes back."""
    pairs = as_object(value, param)
    if len(pairs) > _MAX_METADATA:
        raise invalid(param, f"'{param}' holds at most {_MAX_METADATA} pairs")
    out: dict[str, str] = {}
    for key, item in pairs.items():
        if len(key) > 64:
            raise invalid(param, f"metadata keys are at most 64 characters ({key[:16]!r}...)")
        text = as_str(item, join(param, key))
        if len(text) > 512:
            raise invalid(join(param, key), "metadata values are at most 512 characters")
        out[key] = text
    return out
