"""What the embedded engine says back: a small, honest, rule-based responder.

There is no language model on this path. The default responder restates what
it heard, so a caller can check the recognition, and answers the few things it
can answer truthfully from the machine it runs on: the time, the date, and
what it can do. Everything here is pure: the clock arrives as an argument.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final, Protocol, runtime_checkable

__all__ = ["DIDNT_CATCH", "HELP", "Responder", "RestatingResponder"]

#: The reply to a turn with nothing intelligible in it.
DIDNT_CATCH: Final = "I didn't catch that. Could you say it again?"

#: The reply to a request for help.
HELP: Final = (
    "I'm a voice demo running entirely on this computer. "
    "I repeat what I heard, and I can tell you the time or today's date. "
    "To interrupt me, just start talking."
)

# Recognizers mark non-speech with bracketed tags ("[BLANK_AUDIO]",
# "(upbeat music)") and music symbols; none of it is something the caller said.
_NON_SPEECH = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|[\u266a\u266b\u266c\u2669]")

_TIME = re.compile(
    r"\bwhat(?:'s| is)? the time\b|\bwhat time\b|\btime is it\b|\bcurrent time\b|\btell me the time\b"
    r"|\bthe time (?:now|please)\b"
)
_DATE = re.compile(
    r"\bwhat(?:'s| is)? the date\b|\btoday'?s date\b|\bwhat day\b|\bwhich day\b|\bdate today\b"
    r"|\bwhat is today\b|\bwhat's today\b|\bcurrent date\b"
)
_HELP = re.compile(
    r"^help\b|\bhelp me\b|\bwhat can you do\b|\bwhat do you do\b|\bhow does this work\b|\bhow do (?:i|you) use\b"
    r"|\bwho are you\b|\bwhat are you\b|\bhow do i (?:interrupt|stop) you\b|^can you help\b"
)


@runtime_checkable
class Responder(Protocol):
    """Turns what the caller said into the text of the reply."""

    def reply(self, heard: str, *, now: datetime) -> str:
        """The reply to ``heard`` (the caller's final transcript, maybe empty) at time ``now``."""
        ...


class RestatingResponder:
    """The default responder: "You said: …", then the answer to a built-in intent if one matches.

    Intents: the current time, today's date, and help. Input with nothing
    intelligible (empty, or only non-speech tags) gets :data:`DIDNT_CATCH`.
    """

    def reply(self, heard: str, *, now: datetime) -> str:
        said = clean_transcript(heard)
        if not said:
            return DIDNT_CATCH
        parts = [restate(said)]
        key = _normalise(said)
        if _HELP.search(key):
            parts.append(HELP)
        else:
            # Someone asking for "the time and the date" gets both.
            if _TIME.search(key):
                parts.append(say_time(now))
            if _DATE.search(key):
                parts.append(say_date(now))
        return " ".join(parts)


def clean_transcript(heard: str) -> str:
    """``heard`` without non-speech tags and extra whitespace; "" if no word is left."""
    text = " ".join(_NON_SPEECH.sub(" ", heard).split())
    if not any(char.isalnum() for char in text):
        return ""
    return text


def restate(said: str) -> str:
    """The restatement sentence: ``You said: <said>.`` keeping a question or exclamation mark."""
    said = said.strip()
    body = said.rstrip(" .,;:-\u2026")
    end = "?" if said.endswith("?") else "!" if said.endswith("!") else "."
    body = body.rstrip("?!")
    if body[:1].isupper() and not body[:2].isupper() and not body.startswith("I "):
        body = body[0].lower() + body[1:]  # "You said: please…" reads as one sentence
    return f"You said: {body}{end}"


def say_time(now: datetime) -> str:
    """The time of ``now`` as a sentence, with its time zone when it has one."""
    hour = now.hour % 12 or 12
    meridiem = "AM" if now.hour < 12 else "PM"
    zone = now.tzname() if now.tzinfo is not None else None
    where = f" {zone}" if zone else ""
    return f"It's {hour}:{now.minute:02d} {meridiem}{where}."


def say_date(now: datetime) -> str:
    """The date of ``now`` as a sentence: ``Today is Tuesday, May 6, 2025.``"""
    return f"Today is {now:%A}, {now:%B} {now.day}, {now.year}."


def _normalise(text: str) -> str:
    text = text.lower().replace("\u2019", "'")
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text).split())
