"""What one reply is asked to do: ``response.create``'s overrides checked against the engine.

A client may ask a single reply for its own tools, voice, token limit, context or
no place in the conversation. Each option reaches the engine only if the engine's
capabilities claim it; otherwise the client gets ``unsupported_by_engine`` naming
the field, instead of an option silently ignored. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from duplex_gateway.engine import port
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.session_config import FunctionTool, SessionConfig, ToolChoice

__all__ = ["check_choice", "check_session_tools", "context_item", "reply_options"]


def check_choice(tools: tuple[FunctionTool, ...], choice: ToolChoice, param: str) -> None:
    """A forced function must be one of the tools offered."""
    if choice.function is not None and all(tool.name != choice.function for tool in tools):
        raise ProtocolError(
            ErrorCode.INVALID_VALUE,
            f"tool_choice names {choice.function!r}, which is not among the tools",
            param=param,
        )


def _unsupported(capabilities: port.EngineCapabilities, what: str, param: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.UNSUPPORTED_BY_ENGINE, f"the {capabilities.name} engine cannot {what}", param=param
    )


def check_session_tools(config: SessionConfig, capabilities: port.EngineCapabilities) -> None:
    """A session that demands tool calls needs an engine that makes them."""
    check_choice(config.tools, config.tool_choice, "session.tool_choice")
    _check_forcing(config.tool_choice, capabilities, "session.tool_choice")


def _check_forcing(choice: ToolChoice, capabilities: port.EngineCapabilities, param: str) -> None:
    if choice.forces_call and not capabilities.tools:
        raise _unsupported(capabilities, "call tools, so it cannot be made to call one", param)


def reply_options(
    command: cmd.ResponseCreate,
    config: SessionConfig,
    capabilities: port.EngineCapabilities,
    find: Callable[[str], ev.ConversationItem | None],
) -> port.ResponseOptions:
    """The options of the reply ``command`` asks for; raises a coded error for one the engine cannot honour.

    ``find`` looks up an item of the conversation (``item_reference`` in ``input``).
    """
    tools = config.tools if command.tools is None else command.tools
    choice = config.tool_choice if command.tool_choice is None else command.tool_choice
    check_choice(tools, choice, "response.tool_choice")
    _check_forcing(choice, capabilities, "response.tool_choice")
    offered = capabilities.response_options
    if capabilities.tools and "tools" not in offered:
        # The engine calls the session's tools only: a reply's own set cannot reach it.
        if tools != config.tools:
            raise _unsupported(
                capabilities, "take tools for one reply (set them with session.update)", "response.tools"
            )
        if choice != config.tool_choice:
            raise _unsupported(
                capabilities,
                "take a tool choice for one reply (set it with session.update)",
                "response.tool_choice",
            )
    if command.voice is not None and command.voice != config.voice and "voice" not in offered:
        raise _unsupported(capabilities, "change the voice for one reply", "response.audio.output.voice")
    if command.max_output_tokens is not None and "max_output_tokens" not in offered:
        raise _unsupported(capabilities, "limit one reply's tokens", "response.max_output_tokens")
    if command.out_of_band and not capabilities.out_of_band:
        raise _unsupported(capabilities, "make a reply outside the conversation", "response.conversation")
    context: tuple[port.ContextItem, ...] | None = None
    if command.input is not None:
        if "input" not in offered:
            raise _unsupported(capabilities, "answer from a context of its own", "response.input")
        context = tuple(
            context_item(spec, find, f"response.input[{index}]") for index, spec in enumerate(command.input)
        )
    return port.ResponseOptions(
        modalities=command.output_modalities or config.output_modalities,
        tools=tools,
        tool_choice=choice,
        voice=command.voice,
        max_output_tokens=command.max_output_tokens
        if command.max_output_tokens is not None
        else config.max_output_tokens,
        out_of_band=command.out_of_band,
        input=context,
    )


def context_item(
    spec: cmd.ItemSpec, find: Callable[[str], ev.ConversationItem | None], param: str
) -> port.ContextItem:
    """``spec`` as context for the engine; an ``item_reference`` becomes the item it names."""
    if spec.kind == "item_reference":
        assert spec.item_id is not None
        item = find(spec.item_id)
        if item is None:
            raise ProtocolError(ErrorCode.ITEM_NOT_FOUND, f"no item {spec.item_id}", param=param)
        return port.ContextItem(
            id=item.id,
            kind=item.kind,
            role=item.role,
            text=item.text or item.transcript or "",
            call_id=item.call_id,
            name=item.name,
            arguments=item.arguments,
            output=item.output,
        )
    return port.ContextItem(
        id=spec.item_id or "",
        kind=spec.kind,
        role=spec.role,
        text=spec.text,
        call_id=spec.call_id,
        name=spec.name,
        arguments=spec.arguments,
        output=spec.output,
    )
