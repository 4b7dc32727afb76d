"""The tool router on the parameter schemas real clients generate, not hand-written ones.

openai-agents' ``@function_tool`` sends strict schemas: every parameter listed as
required, what may be left out said by a ``default`` on the property or by null
among its types (``anyOf``), a Python ``Enum`` behind a ``$ref`` into ``$defs``.
Its schemas are made here by the library itself. Pipecat's direct functions list
only the parameters without a default as required and put no default in the
schema; those are literals of what its code generates.
"""

from __future__ import annotations

import asyncio
import enum
import json
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from agents import FunctionTool as AgentsTool
from agents import function_tool
from agents.tool_context import ToolContext

from duplex_gateway.dialects.realtime_tools import parse_tools
from duplex_gateway.engine.embedded.tool_router import ToolCall, ToolRouter
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice, ToolChoiceMode

NOW = datetime(2025, 5, 6, 15, 7, tzinfo=UTC)  # a Tuesday afternoon


class Unit(enum.StrEnum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Department(enum.StrEnum):
    SALES = "sales"
    BILLING = "billing"


@function_tool
def get_weather(city: str = "here") -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


@function_tool
def get_forecast(
    city: str, unit: Unit = Unit.CELSIUS, days: int | None = None, detailed: bool = False
) -> str:
    """Get the weather forecast for a city.

    Args:
        city: The city.
        unit: The temperature unit.
        days: How many days ahead.
        detailed: Whether to give the hourly detail.
    """
    return json.dumps({"city": city, "unit": unit, "days": days, "detailed": detailed})


@function_tool
def transfer_call(department: Department, reason: str | None = None) -> str:
    """Transfer the caller to a department."""
    return f"{department}:{reason}"


@function_tool
def set_alarm(time: str | None, label: Literal["wake", "nap"] = "wake") -> str:
    """Set an alarm.

    Args:
        time: When the alarm rings, HH:MM.
    """
    return f"{time}:{label}"


def wire(tool: AgentsTool) -> FunctionTool:
    """The tool as openai-agents' realtime model sends it in ``session.update``, parsed as the gateway does."""
    sent = {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.params_json_schema,
    }
    return parse_tools([json.loads(json.dumps(sent))], "session.tools")[0]


def route(heard: str, *tools: FunctionTool, choice: ToolChoice | None = None) -> ToolCall | None:
    return ToolRouter().route(heard, tools, choice or ToolChoice(), now=NOW)


def invoke(tool: AgentsTool, call: ToolCall) -> Any:
    """What openai-agents' own argument validation and the function make of the router's arguments."""
    context = ToolContext(
        context=None, tool_name=tool.name, tool_call_id="call_1", tool_arguments=call.arguments_json()
    )
    return asyncio.run(tool.on_invoke_tool(context, call.arguments_json()))


def test_the_schemas_are_strict() -> None:
    # What the rest of this file relies on: every parameter required, optional ones said otherwise.
    schema = get_weather.params_json_schema
    assert schema["required"] == ["city"] and schema["additionalProperties"] is False
    assert schema["properties"]["city"] == {"default": "here", "title": "City", "type": "string"}
    forecast = get_forecast.params_json_schema
    assert forecast["required"] == ["city", "unit", "days", "detailed"]
    assert forecast["properties"]["days"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert transfer_call.params_json_schema["properties"]["department"] == {"$ref": "#/$defs/Department"}


def test_a_required_parameter_with_a_default_takes_it_when_not_said() -> None:
    call = route("What is the weather like today?", wire(get_weather))
    assert call is not None and call.name == "get_weather"
    assert dict(call.arguments) == {"city": "here"}
    assert invoke(get_weather, call) == "sunny in here"


def test_a_required_parameter_with_a_default_still_takes_what_was_said() -> None:
    call = route("What's the weather like in Paris?", wire(get_weather))
    assert call is not None and dict(call.arguments) == {"city": "Paris"}
    assert invoke(get_weather, call) == "sunny in Paris"


def test_a_default_is_not_a_reason_to_call_an_unrelated_tool() -> None:
    assert route("Tell me a joke about cats.", wire(get_weather)) is None


@pytest.mark.parametrize(
    ("heard", "expected"),
    [
        (
            "What's the forecast for Paris?",
            {"city": "Paris", "unit": "celsius", "days": None, "detailed": False},
        ),
        (
            "What's the forecast in Boston for the next three days in fahrenheit?",
            {"city": "Boston", "unit": "fahrenheit", "days": 3, "detailed": False},
        ),
    ],
)
def test_defaults_nulls_and_enums_of_a_strict_schema(heard: str, expected: dict[str, object]) -> None:
    call = route(heard, wire(get_forecast))
    assert call is not None and dict(call.arguments) == expected
    assert json.loads(invoke(get_forecast, call)) == expected


def test_a_required_parameter_without_a_default_is_still_needed() -> None:
    # city has neither a default nor null: nothing heard for it, so the tool is not called...
    assert route("What's the forecast like?", wire(get_forecast)) is None
    # ...unless the call is forced, and then it is left out rather than invented.
    call = route(
        "What's the forecast like?", wire(get_forecast), choice=ToolChoice(mode=ToolChoiceMode.REQUIRED)
    )
    assert call is not None and dict(call.arguments) == {"unit": "celsius", "days": None, "detailed": False}


def test_an_enum_behind_a_ref_is_read_from_its_defs() -> None:
    call = route("Please transfer me to billing.", wire(transfer_call))
    assert call is not None and dict(call.arguments) == {"department": "billing", "reason": None}
    assert invoke(transfer_call, call) == "billing:None"


def test_a_nullable_parameter_is_null_rather_than_guessed() -> None:
    call = route("Set an alarm, please.", wire(set_alarm))
    assert call is not None and dict(call.arguments) == {"time": None, "label": "wake"}
    call = route("Set a nap alarm for 7:30 am.", wire(set_alarm))
    assert call is not None and dict(call.arguments) == {"time": "07:30", "label": "nap"}
    assert invoke(set_alarm, call) == "07:30:nap"


# Pipecat 1.14.0 (pipecat.adapters.llm.schemas.direct_function and the OpenAI Realtime adapter's
# _to_openai_realtime_function_format) makes these from
#   async def get_weather(params: FunctionCallParams, city: str = "here"):
#       """Get the weather for a city."""
#   async def get_time(params: FunctionCallParams, city: Optional[str]):
#       """Get the local time in a city."""
PIPECAT_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": []},
}
PIPECAT_TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the local time in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["city"],
    },
}


def test_pipecat_leaves_a_defaulted_parameter_out_of_required() -> None:
    (tool,) = parse_tools([PIPECAT_WEATHER], "session.tools")
    call = route("What is the weather like today?", tool)
    # Nothing said for it: left out, so Pipecat calls the function with its own default.
    assert call is not None and dict(call.arguments) == {}
    call = route("What is the weather like in Rome?", tool)
    assert call is not None and dict(call.arguments) == {"city": "Rome"}


def test_pipecat_optional_parameter_is_null_when_not_said() -> None:
    (tool,) = parse_tools([PIPECAT_TIME], "session.tools")
    call = route("What time is it?", tool)
    assert call is not None and dict(call.arguments) == {"city": None}
    call = route("What time is it in Tokyo?", tool)
    assert call is not None and dict(call.arguments) == {"city": "Tokyo"}


def test_type_lists_with_null_and_reference_cycles() -> None:
    # OpenAI's own strict-mode examples spell an optional field as a type list with "null".
    tool = FunctionTool(
        name="get_weather",
        description="Get the weather for a city.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": ["string", "null"]}, "loop": {"$ref": "#/$defs/Loop"}},
            "$defs": {"Loop": {"$ref": "#/$defs/Loop"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    )
    call = route("What's the weather like?", tool)
    assert call is not None and dict(call.arguments) == {"city": None}
