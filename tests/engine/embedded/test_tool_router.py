"""Offline tool use: which tool an utterance calls, the arguments read from it, and the spoken result."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from duplex_gateway.engine.embedded.tool_router import ToolCall, ToolRouter, reply_from_output
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice, ToolChoiceMode

NOW = datetime(2025, 5, 6, 15, 7, tzinfo=UTC)  # a Tuesday afternoon

WEATHER = FunctionTool(
    name="get_current_weather",
    description="Get the current weather in a given city",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, e.g. San Francisco"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
BOOK_TABLE = FunctionTool(
    name="book_table",
    description="Reserve a table at the restaurant for a given date, time and party size",
    parameters={
        "type": "object",
        "properties": {
            "date": {"type": "string", "format": "date"},
            "time": {"type": "string", "description": "Time of the reservation, HH:MM"},
            "party_size": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Number of people"},
            "name": {"type": "string", "description": "Name for the reservation"},
        },
        "required": ["date", "time", "party_size"],
    },
)
TIME_IN_CITY = FunctionTool(
    name="timeInCity",
    description="Get the current local time in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TRANSFER = FunctionTool(
    name="transfer_call",
    description="Transfer the caller to a department",
    parameters={
        "type": "object",
        "properties": {
            "department": {"type": "string", "enum": ["sales", "billing", "technical support"]},
            "reason": {"type": "string"},
        },
        "required": ["department"],
    },
)
SEARCH = FunctionTool(
    name="search_docs",
    description="Search the help center documentation",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to search for"}},
        "required": ["query"],
    },
)
TOOLS = (WEATHER, BOOK_TABLE, TIME_IN_CITY, TRANSFER, SEARCH)
AUTO = ToolChoice()
REQUIRED = ToolChoice(mode=ToolChoiceMode.REQUIRED)


def route(heard: str, tools: tuple[FunctionTool, ...] = TOOLS, choice: ToolChoice = AUTO) -> ToolCall | None:
    return ToolRouter().route(heard, tools, choice, now=NOW)


def args(heard: str, tools: tuple[FunctionTool, ...] = TOOLS, choice: ToolChoice = AUTO) -> dict[str, object]:
    call = route(heard, tools, choice)
    assert call is not None, heard
    return dict(call.arguments)


@pytest.mark.parametrize(
    ("heard", "expected"),
    [
        ("What's the weather like in Paris?", {"city": "Paris"}),
        ("Is it going to rain in London?", {"city": "London"}),
        ("How hot is it in Madrid in Fahrenheit", {"city": "Madrid", "unit": "fahrenheit"}),
        ("what's the weather in new york in celsius", {"city": "New York", "unit": "celsius"}),
        ("weather San Francisco", {"city": "San Francisco"}),
        ("[BLANK_AUDIO] What's the forecast for Rome?", {"city": "Rome"}),
    ],
)
def test_weather(heard: str, expected: dict[str, object]) -> None:
    call = route(heard)
    assert call is not None and call.name == "get_current_weather"
    assert dict(call.arguments) == expected


@pytest.mark.parametrize(
    ("heard", "expected"),
    [
        ("Book a table for four tomorrow at 7 pm", {"date": "2025-05-07", "time": "19:00", "party_size": 4}),
        (
            "I'd like to reserve a table for two on Friday at 8",
            {"date": "2025-05-09", "time": "08:00", "party_size": 2},
        ),
        (
            "Can I get a reservation for six people tonight at half past seven",
            {"date": "2025-05-06", "time": "19:30", "party_size": 6},
        ),
        (
            "Book a table for twelve people on March 3rd at noon under Alice",
            {"date": "2026-03-03", "time": "12:00", "party_size": 12, "name": "Alice"},
        ),
        (
            "reserve a table for 2 on 3/14 at 7:30 p.m.",
            {"date": "2026-03-14", "time": "19:30", "party_size": 2},
        ),
        (
            "book a table for Bob for 3 people on the 5th of June at quarter to eight in the evening",
            {"date": "2025-06-05", "time": "19:45", "party_size": 3, "name": "Bob"},
        ),
        (
            "table for two next tuesday at seven thirty pm please book it",
            {"date": "2025-05-13", "time": "19:30", "party_size": 2},
        ),
        (
            "book a table for four on May 9, 2026 at 9am",
            {"date": "2026-05-09", "time": "09:00", "party_size": 4},
        ),
    ],
)
def test_book_table(heard: str, expected: dict[str, object]) -> None:
    call = route(heard)
    assert call is not None and call.name == "book_table"
    assert dict(call.arguments) == expected


def test_arguments_json_is_compact_in_schema_order() -> None:
    call = route("Book a table for Alice for 4 people at 7:30 pm tomorrow")
    assert call is not None
    assert call.arguments_json() == '{"date":"2025-05-07","time":"19:30","party_size":4,"name":"Alice"}'
    assert json.loads(call.arguments_json()) == dict(call.arguments)


@pytest.mark.parametrize(
    ("heard", "city"),
    [
        ("What time is it in Tokyo?", "Tokyo"),
        ("What's the local time in New York", "New York"),
        ("tokyo time please", "Tokyo"),
    ],
)
def test_time_in_city(heard: str, city: str) -> None:
    call = route(heard)
    assert call is not None and call.name == "timeInCity"
    assert dict(call.arguments) == {"city": city}


@pytest.mark.parametrize(
    ("heard", "department"),
    [
        ("Put me through to billing", "billing"),
        ("Can I talk to someone in Sales?", "sales"),
        ("Transfer me to technical support please", "technical support"),
        ("connect me to tech support", "technical support"),
    ],
)
def test_transfer_call_hears_the_enum_value(heard: str, department: str) -> None:
    call = route(heard)
    assert call is not None and call.name == "transfer_call"
    assert dict(call.arguments) == {"department": department}  # no reason was given: none is invented


@pytest.mark.parametrize(
    ("heard", "query"),
    [
        ("Search the docs for refund policy", "refund policy"),
        ("search for how to reset my password", "how to reset my password"),
        ("How do I reset my password? Look it up in the documentation", "reset password"),
        ("find articles about billing errors in the docs", "billing errors"),
        ("look up shipping times", "shipping times"),
    ],
)
def test_search_docs(heard: str, query: str) -> None:
    call = route(heard)
    assert call is not None and call.name == "search_docs"
    assert dict(call.arguments) == {"query": query}


@pytest.mark.parametrize(
    "heard",
    [
        "Hello, how are you?",
        "Thanks, that's all",
        "Tell me a joke",
        "What's your name?",
        "Good morning",
        "",
        "[BLANK_AUDIO]",
        "I like turtles",
    ],
)
def test_unrelated_utterances_call_nothing(heard: str) -> None:
    assert route(heard) is None


def test_missing_required_argument_calls_nothing_unless_forced() -> None:
    assert route("Book a table for four") is None  # no date, no time
    assert route("What time is it?") is None  # the local time is the responder's, not timeInCity's
    forced = route("Book a table for four", choice=REQUIRED)
    assert forced is not None and forced.name == "book_table"
    assert dict(forced.arguments) == {"party_size": 4}  # the missing date and time are left out, not invented


def test_maximum_is_respected() -> None:
    assert route("Book a table for twenty five people tomorrow at 8 pm") is None
    forced = route("Book a table for twenty five people tomorrow at 8 pm", choice=REQUIRED)
    assert forced is not None
    assert dict(forced.arguments) == {"date": "2025-05-07", "time": "20:00"}


def test_tool_choice_none_calls_nothing() -> None:
    assert route("What's the weather in Paris?", choice=ToolChoice(mode=ToolChoiceMode.NONE)) is None


def test_tool_choice_required_calls_the_best_tool_even_under_the_threshold() -> None:
    call = route("hello there", choice=REQUIRED)
    assert call is not None and call.score < ToolRouter().threshold
    assert call.name == "search_docs"  # the only tool whose required argument the words could fill
    assert dict(call.arguments) == {"query": "hello there"}
    call = route("How do I reset my password", choice=REQUIRED)
    assert call is not None and call.name == "search_docs"  # rather than a city named "Reset Password"
    assert route("anything", tools=(), choice=REQUIRED) is None


def test_tool_choice_named_function_is_always_that_tool() -> None:
    named = ToolChoice(mode=ToolChoiceMode.REQUIRED, function="book_table")
    call = route("What's the weather in Paris?", choice=named)
    assert call is not None and call.name == "book_table"
    assert dict(call.arguments) == {}
    call = route(
        "the weather in Paris", choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="search_docs")
    )
    assert (
        call is not None and call.name == "search_docs" and dict(call.arguments) == {"query": "weather Paris"}
    )
    assert route("Paris", choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="not_offered")) is None


def test_threshold_is_configurable() -> None:
    assert ToolRouter(threshold=0.9).route("What's the weather in Paris?", TOOLS, AUTO, now=NOW) is None
    with pytest.raises(ValueError, match="threshold"):
        ToolRouter(threshold=1.5)


NUMBERS = FunctionTool(
    name="set_volume",
    description="Set the speaker volume",
    parameters={
        "type": "object",
        "properties": {"level": {"type": "number", "minimum": 0, "maximum": 10000}},
    },
)


@pytest.mark.parametrize(
    ("heard", "level"),
    [
        ("set the volume to twenty five", 25),
        ("volume three point five", 3.5),
        ("volume to a hundred and five", 105),
        ("volume one thousand two hundred thirty four", 1234),
        ("volume 7.25", 7.25),
        ("volume to twenty-one", 21),
        ("volume 2,500", 2500),
        ("volume ninety nine point nine", 99.9),
    ],
)
def test_spelled_and_digit_numbers(heard: str, level: float) -> None:
    call = route(heard, tools=(NUMBERS,))
    assert call is not None and call.arguments["level"] == level


def test_integer_takes_the_number_near_its_words() -> None:
    tool = FunctionTool(
        name="order_pizza",
        parameters={
            "type": "object",
            "properties": {
                "size_inches": {"type": "integer", "description": "diameter in inches"},
                "quantity": {"type": "integer", "description": "how many pizzas"},
            },
        },
    )
    call = route("order 3 pizzas of 12 inches", tools=(tool,))
    assert call is not None and dict(call.arguments) == {"size_inches": 12, "quantity": 3}


@pytest.mark.parametrize(
    ("said", "day"),
    [
        ("today", "2025-05-06"),
        ("tomorrow", "2025-05-07"),
        ("yesterday", "2025-05-05"),
        ("the day after tomorrow", "2025-05-08"),
        ("on friday", "2025-05-09"),
        ("on Tuesday", "2025-05-13"),  # said on a Tuesday: the next one
        ("next monday", "2025-05-12"),
        ("March 3rd", "2026-03-03"),  # already past this year: the next one
        ("December 25th", "2025-12-25"),
        ("the third of march", "2026-03-03"),
        ("june twenty first", "2025-06-21"),
        ("3/14", "2026-03-14"),
        ("25/12", "2025-12-25"),
        ("in three days", "2025-05-09"),
        ("in a week", "2025-05-13"),
        ("2025-07-04", "2025-07-04"),
        ("July 4, 2027", "2027-07-04"),
    ],
)
def test_dates_relative_to_now(said: str, day: str) -> None:
    tool = FunctionTool(
        name="check_calendar",
        parameters={"type": "object", "properties": {"day": {"type": "string", "description": "Which date"}}},
    )
    assert args(f"check my calendar {said}", tools=(tool,)) == {"day": day}


@pytest.mark.parametrize(
    ("said", "clock"),
    [
        ("at 7 pm", "19:00"),
        ("at 7", "07:00"),
        ("at 7 tonight", "19:00"),
        ("7:30", "07:30"),
        ("at noon", "12:00"),
        ("at midnight", "00:00"),
        ("half past six", "06:30"),
        ("quarter to nine pm", "20:45"),
        ("at seven thirty", "07:30"),
        ("12 am", "00:00"),
        ("at 9 o'clock", "09:00"),
    ],
)
def test_times(said: str, clock: str) -> None:
    tool = FunctionTool(
        name="set_alarm",
        parameters={"type": "object", "properties": {"time": {"type": "string", "format": "time"}}},
    )
    assert args(f"set an alarm {said}", tools=(tool,)) == {"time": clock}


def test_date_time_format_combines_both() -> None:
    tool = FunctionTool(
        name="schedule_meeting",
        parameters={
            "type": "object",
            "properties": {
                "start": {"type": "string", "format": "date-time"},
                "title": {"type": "string"},
            },
        },
    )
    assert args("schedule a meeting called budget review on friday at 3 pm", tools=(tool,)) == {
        "start": "2025-05-09T15:00:00+00:00",
        "title": "budget review",
    }


@pytest.mark.parametrize(
    ("heard", "expected"),
    [
        ("turn the lights on", True),
        ("switch the lights off", False),
        ("lights on please", True),
    ],
)
def test_boolean(heard: str, expected: bool) -> None:
    tool = FunctionTool(
        name="set_lights",
        parameters={"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
    )
    assert args(heard, tools=(tool,)) == {"on": expected}


def test_boolean_named_by_its_parameter() -> None:
    tool = FunctionTool(
        name="get_weather_report",
        parameters={
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "include_forecast": {"type": "boolean"},
            },
        },
    )
    assert args("weather report for Oslo with the forecast", tools=(tool,)) == {
        "city": "Oslo",
        "include_forecast": True,
    }
    assert args("weather report for Oslo, no forecast", tools=(tool,)) == {
        "city": "Oslo",
        "include_forecast": False,
    }
    assert args("weather report for Oslo", tools=(tool,)) == {"city": "Oslo"}


def test_origin_and_destination_take_their_own_prepositions() -> None:
    tool = FunctionTool(
        name="find_flights",
        parameters={
            "type": "object",
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "date": {"type": "string"},
            },
            "required": ["origin", "destination"],
        },
    )
    assert args("find flights to berlin from new york on sunday", tools=(tool,)) == {
        "origin": "New York",
        "destination": "Berlin",
        "date": "2025-05-11",
    }


ACCURACY = [
    ("What's the weather like in Paris?", "get_current_weather"),
    ("Is it going to snow in Denver tomorrow?", "get_current_weather"),
    ("how cold is it in Oslo in celsius", "get_current_weather"),
    ("Book a table for four tomorrow at 7 pm", "book_table"),
    ("I'd like to reserve a table for two on Friday at eight", "book_table"),
    ("can I make a reservation for 6 people on Saturday at 6:30 pm", "book_table"),
    ("What time is it in Tokyo?", "timeInCity"),
    ("what's the local time in Sydney", "timeInCity"),
    ("Put me through to billing", "transfer_call"),
    ("I need to speak with someone in sales", "transfer_call"),
    ("transfer me to technical support", "transfer_call"),
    ("Search the docs for refund policy", "search_docs"),
    ("look up how to change my password in the documentation", "search_docs"),
    ("Hello, how are you?", None),
    ("Thanks, that's all for today", None),
]


def test_accuracy_on_a_small_table() -> None:
    routed = [(heard, getattr(route(heard), "name", None), expected) for heard, expected in ACCURACY]
    wrong = [(heard, got, expected) for heard, got, expected in routed if got != expected]
    assert len(ACCURACY) - len(wrong) >= 14, wrong


def test_score_is_between_zero_and_one_and_stronger_with_more_evidence() -> None:
    plain = route("What's the weather in Paris?")
    stronger = route("What's the weather in Paris in celsius?")
    assert plain is not None and stronger is not None
    assert 0.0 < plain.score < stronger.score <= 1.0


CALL = ToolCall(name="get_weather", arguments={"city": "Paris"}, score=0.6)


@pytest.mark.parametrize(
    ("output", "reply"),
    [
        (
            '{"temperature": 21.0, "conditions": "sunny", "humidity": 0.456, "windy": false, "alerts": null}',
            "Get weather says: temperature 21, conditions sunny, humidity 0.46, windy no.",
        ),
        ('{"message": "Booked for **4** at 7pm"}', "Get weather says: Booked for 4 at 7pm."),
        (
            '[{"title": "Refunds"}, {"title": "Returns"}, "Shipping", 4]',
            "Get weather returned 4 results: Refunds, Returns, Shipping, and 1 more.",
        ),
        ("[]", "Get weather found nothing."),
        ("42", "Get weather says 42."),
        ("-3.5", "Get weather says minus 3.5."),
        ("true", "Get weather says yes."),
        ('"Paris is sunny."', "Get weather says: Paris is sunny."),
        (
            "<p>It is <b>sunny</b> in [Paris](https://example.org)</p>",
            "Get weather says: It is sunny in Paris.",
        ),
        ("It is sunny", "Get weather says: It is sunny."),
        ("", "Get weather finished."),
        ("   ", "Get weather finished."),
        ("null", "Get weather finished."),
        ("{}", "Get weather finished."),
        ('{"error": "City not found"}', "Get weather failed: City not found."),
        ('{"error": {"message": "Rate limited", "code": 429}}', "Get weather failed: Rate limited."),
        ('{"error": true}', "Get weather failed."),
        ('{"error": null, "result": "ok"}', "Get weather says: ok."),
        ('{"population": 2148000}', "Get weather says: population 2,148,000."),
    ],
)
def test_reply_from_output(output: str, reply: str) -> None:
    assert reply_from_output(CALL, output) == reply


def test_reply_is_capped() -> None:
    reply = reply_from_output(CALL, " ".join(["word"] * 200))
    assert len(reply.split()) <= 42 and reply.endswith("\u2026")


def test_accented_city_names_survive() -> None:
    assert args("weather in Zürich") == {"city": "Zürich"}
    assert args("what time is it in são paulo") == {"city": "São Paulo"}


def test_tool_call_is_hashable_and_compares_by_value() -> None:
    first, second = route("weather in Paris"), route("weather in Paris")
    assert first is not None and first == second
    assert len({first, second}) == 1
