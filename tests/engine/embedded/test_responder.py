"""The default responder: restatement, built-in intents, and what it says to nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from duplex_gateway.engine.embedded.responder import (
    DIDNT_CATCH,
    HELP,
    Responder,
    RestatingResponder,
    clean_transcript,
    restate,
    say_date,
    say_time,
)

NOW = datetime(2025, 5, 6, 15, 7, tzinfo=UTC)  # a Tuesday


@pytest.fixture
def responder() -> RestatingResponder:
    return RestatingResponder()


def test_is_a_responder(responder: RestatingResponder) -> None:
    assert isinstance(responder, Responder)


def test_restates_what_it_heard(responder: RestatingResponder) -> None:
    reply = responder.reply("Please send me the weather report for Tuesday morning.", now=NOW)
    assert reply == "You said: please send me the weather report for Tuesday morning."


@pytest.mark.parametrize(
    "heard",
    [
        "What time is it?",
        "what's the time",
        "Tell me the time please.",
        "Could you tell me the current time?",
    ],
)
def test_answers_the_time(responder: RestatingResponder, heard: str) -> None:
    reply = responder.reply(heard, now=NOW)
    assert reply.startswith("You said: ")
    assert reply.endswith("It's 3:07 PM UTC.")


@pytest.mark.parametrize("heard", ["What's the date today?", "What day is it?", "Tell me today's date."])
def test_answers_the_date(responder: RestatingResponder, heard: str) -> None:
    reply = responder.reply(heard, now=NOW)
    assert reply.startswith("You said: ")
    assert reply.endswith("Today is Tuesday, May 6, 2025.")


def test_time_and_date_together(responder: RestatingResponder) -> None:
    reply = responder.reply("What time is it and what's the date?", now=NOW)
    assert "It's 3:07 PM UTC." in reply and "Today is Tuesday, May 6, 2025." in reply


@pytest.mark.parametrize("heard", ["Help.", "help me", "What can you do?", "How do I interrupt you?"])
def test_answers_help(responder: RestatingResponder, heard: str) -> None:
    reply = responder.reply(heard, now=NOW)
    assert reply.startswith("You said: ")
    assert reply.endswith(HELP)
    assert "interrupt" in HELP and "time" in HELP and "date" in HELP


@pytest.mark.parametrize(
    "heard", ["", "   ", "...", "[BLANK_AUDIO]", "(upbeat music)", "\u266a \u266a", "*coughs*"]
)
def test_nothing_intelligible_gets_didnt_catch(responder: RestatingResponder, heard: str) -> None:
    assert responder.reply(heard, now=NOW) == DIDNT_CATCH
    assert DIDNT_CATCH.startswith("I didn't catch that")


def test_non_speech_tags_are_dropped_from_the_restatement(responder: RestatingResponder) -> None:
    assert responder.reply("[MUSIC] hello there", now=NOW) == "You said: hello there."


def test_no_intent_when_words_only_look_alike(responder: RestatingResponder) -> None:
    reply = responder.reply("I had a good time yesterday.", now=NOW)
    assert reply == "You said: I had a good time yesterday."


def test_is_pure(responder: RestatingResponder) -> None:
    assert responder.reply("what time is it", now=NOW) == responder.reply("what time is it", now=NOW)
    later = responder.reply("what time is it", now=NOW + timedelta(hours=10))
    assert later.endswith("It's 1:07 AM UTC.")


@pytest.mark.parametrize(
    ("said", "sentence"),
    [
        ("Hello", "You said: hello."),
        ("What time is it?", "You said: what time is it?"),
        ("Stop!", "You said: stop!"),
        ("I think so...", "You said: I think so."),
        ("NASA launched", "You said: NASA launched."),
    ],
)
def test_restate(said: str, sentence: str) -> None:
    assert restate(said) == sentence


def test_time_and_date_sentences() -> None:
    assert say_time(datetime(2025, 1, 1, 0, 5)) == "It's 12:05 AM."  # naive: no zone to name
    assert say_time(datetime(2025, 1, 1, 12, 0, tzinfo=UTC)) == "It's 12:00 PM UTC."
    plus_two = timezone(timedelta(hours=2))
    assert say_time(datetime(2025, 1, 1, 23, 59, tzinfo=plus_two)) == "It's 11:59 PM UTC+02:00."
    assert say_date(datetime(2024, 2, 29)) == "Today is Thursday, February 29, 2024."


def test_clean_transcript() -> None:
    assert clean_transcript("  hello   world ") == "hello world"
    assert clean_transcript("[BLANK_AUDIO]") == ""
