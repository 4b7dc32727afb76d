"""The words offline tool use reads by: stop words, stems, number words and what a parameter is about.

Tables, not understanding: :mod:`.tool_router` matches a caller's words against a
tool's name, parameters and description through these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

__all__ = [
    "NEGATIONS",
    "NUMBER_WORDS",
    "PERSON_WORDS",
    "PLACE_WORDS",
    "STOP_STEMS",
    "STOP_WORDS",
    "TEXT_WORDS",
    "UNITS",
    "UNIT_WORDS",
    "WORD_RE",
    "alternation",
    "content_stems",
    "parse_number",
    "split_name",
    "stem_of",
]

# Words that say nothing about which tool is meant: function words, generic
# verbs ("get_weather" is about weather, not getting), and schema boilerplate.
STOP_WORDS: Final = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "if",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "from",
        "with",
        "about",
        "into",
        "up",
        "out",
        "over",
        "under",
        "as",
        "than",
        "then",
        "so",
        "i",
        "me",
        "my",
        "mine",
        "im",
        "i'm",
        "i'd",
        "i'll",
        "we",
        "us",
        "our",
        "you",
        "your",
        "it",
        "its",
        "it's",
        "he",
        "she",
        "they",
        "them",
        "their",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "am",
        "do",
        "does",
        "did",
        "doing",
        "have",
        "has",
        "had",
        "can",
        "could",
        "would",
        "will",
        "should",
        "may",
        "might",
        "must",
        "what",
        "what's",
        "whats",
        "which",
        "who",
        "when",
        "where",
        "why",
        "how",
        "get",
        "set",
        "make",
        "tell",
        "give",
        "show",
        "let",
        "know",
        "want",
        "wanna",
        "need",
        "like",
        "please",
        "just",
        "also",
        "again",
        "really",
        "very",
        "some",
        "any",
        "all",
        "more",
        "most",
        "much",
        "many",
        "hi",
        "hello",
        "hey",
        "thanks",
        "thank",
        "ok",
        "okay",
        "yes",
        "no",
        "yeah",
        "sure",
        "well",
        "oh",
        "um",
        "uh",
        "now",
        "right",
        "current",
        "currently",
        "someone",
        "something",
        "function",
        "tool",
        "return",
        "returns",
        "given",
        "specified",
        "specific",
        "provided",
        "use",
        "using",
        "user",
        "optional",
        "required",
        "default",
        "e",
        "g",
        "eg",
        "etc",
        "format",
        "string",
        "value",
        "info",
        "information",
        "data",
        "iso",
        "yyyy",
        "mm",
        "dd",
        "hh",
    ]
)
# Words a caller uses for the words tool names are made of; each group reads as its key.
_GROUPS: Final = {
    "book": ["reserve", "reservation"],
    "search": ["find", "look", "lookup"],
    "doc": ["document", "documentation"],
    "transfer": ["connect", "forward"],
    "call": ["phone", "ring"],
    "delete": ["remove", "erase"],
    "weather": ["forecast", "temperature", "rain", "snow", "sunny", "hot", "cold", "warm"],
}
UNIT_WORDS: Final = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
UNITS: Final = {w: i for i, w in enumerate(UNIT_WORDS)}
_TENS: Final = {
    w: 10 * i
    for i, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], 2)
}
_SCALES: Final = {"hundred": 100, "thousand": 1000}
NUMBER_WORDS: Final = frozenset([*UNITS, *_TENS, *_SCALES, "point"])
# What a string parameter is about, from words in its name (or, failing that, its description).
PLACE_WORDS: Final = frozenset(
    [
        "city",
        "location",
        "place",
        "town",
        "country",
        "destination",
        "address",
        "region",
        "area",
        "where",
        "origin",
        "venue",
    ]
)
PERSON_WORDS: Final = frozenset(
    [
        "name",
        "person",
        "contact",
        "recipient",
        "guest",
        "who",
        "attendee",
        "customer",
        "username",
        "callee",
        "agent",
    ]
)
TEXT_WORDS: Final = frozenset(
    [
        "query",
        "text",
        "message",
        "question",
        "q",
        "prompt",
        "search",
        "term",
        "keyword",
        "keywords",
        "topic",
        "subject",
        "input",
        "content",
        "body",
        "note",
    ]
)
NEGATIONS: Final = frozenset(["no", "not", "without", "dont", "don't", "never", "disable", "off", "false"])


def alternation(words: Sequence[str] | Mapping[str, int]) -> str:
    """A regex alternative of ``words``, longest first, so "september" wins over "sep"."""
    return "|".join(sorted(map(re.escape, words), key=len, reverse=True))


WORD_RE: Final = re.compile(r"[^\W_]+(?:'[^\W_]+)?(?:[.:/][0-9]+)*")  # "zürich", "it's", "7:30", "3/14"


def stem_of(word: str, *, synonyms: bool = True) -> str:
    """A crude stem, so "bookings", "booked" and "book" meet; synonyms fold onto their group's word."""
    w = word.removesuffix("'s").replace("'", "")
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif (len(w) > 5 and w.endswith("ing")) or (len(w) > 4 and w.endswith("ed")):
        w = w[:-3] if w.endswith("ing") else w[:-2]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "aeiouslz":
            w = w[:-1]
    elif len(w) > 3 and (w.endswith(("ches", "shes")) or (w.endswith("es") and w[-3] in "sxz")):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 4 and w.endswith("e"):  # "reserve" and "reserved" must meet
        w = w[:-1]
    return _SYNONYMS.get(w, w) if synonyms else w


_SYNONYMS: Final = {
    stem_of(v, synonyms=False): stem_of(k, synonyms=False) for k, vs in _GROUPS.items() for v in vs
}
STOP_STEMS: Final = frozenset(stem_of(w, synonyms=False) for w in STOP_WORDS)


def split_name(name: str) -> list[str]:
    """``get_currentWeather`` -> get, current, weather."""
    return [w for w in re.split(r"[^a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()) if w]


def content_stems(text: str, *, synonyms: bool = True) -> set[str]:
    """The stems of ``text``'s words that say something: stop words and their stems left out."""
    words = WORD_RE.findall(text.lower())
    return {
        stem_of(w, synonyms=synonyms)
        for w in words
        if w not in STOP_WORDS and stem_of(w, synonyms=False) not in STOP_STEMS
    }


def parse_number(words: Sequence[str]) -> tuple[float, int] | None:
    """The number at the start of ``words`` ("twenty five", "3.5", "a hundred") and how many words it is."""
    if words and re.fullmatch(r"\d+(?:\.\d+)?", words[0]):
        scale = _SCALES.get(words[1], 1) if len(words) > 1 else 1
        return float(words[0]) * scale, 1 if scale == 1 else 2
    total, current, n, last = 0, 0, 0, ""
    if len(words) > 1 and words[0] in ("a", "an") and words[1] in _SCALES:
        current, n, last = 1, 1, "unit"
    while n < len(words):
        w = words[n]
        if w in UNITS and (last in ("", "scale", "and") or (last == "tens" and 0 < UNITS[w] < 10)):
            current, last = current + UNITS[w], "unit"
        elif w in _TENS and last in ("", "scale", "and"):
            current, last = current + _TENS[w], "tens"
        elif w == "hundred" and last in ("unit", "tens"):
            current, last = current * 100, "scale"
        elif w == "thousand" and last in ("unit", "tens", "scale"):
            total, current, last = total + current * 1000, 0, "scale"
        elif w == "and" and last == "scale":
            last = "and"
        else:
            break
        n += 1
    if not last:
        return None
    n -= last == "and"
    value = float(total + current)
    if n < len(words) and words[n] == "point":  # "three point five": digits after "point" one by one
        k, digits = n + 1, ""
        while k < len(words) and UNITS.get(words[k], 10) < 10:
            digits, k = digits + str(UNITS[words[k]]), k + 1
        if digits:
            value, n = value + float("0." + digits), k
    return value, n
