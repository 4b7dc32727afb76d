"""Offline tool use for the embedded engine: pick a function tool and fill its arguments by rule.

There is no language model on this path, so nothing here understands language;
it matches words. That is enough for integrators to exercise their
function-calling plumbing offline: a caller who says "what's the weather in
Paris" to a session offering ``get_current_weather`` gets a call with
``{"city": "Paris"}``, and the function's output comes back as a short
sentence. Everything is pure: the clock arrives as an argument.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from types import MappingProxyType
from typing import Final, TypeVar
from urllib.parse import unquote

from duplex_gateway.engine.embedded.responder import clean_transcript
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice, ToolChoiceMode

__all__ = ["ToolCall", "ToolRouter", "reply_from_output"]

_T = TypeVar("_T")
_Span = tuple[int, int]

# Words that say nothing about which tool is meant: function words, generic
# verbs ("get_weather" is about weather, not getting), and schema boilerplate.
_STOP: Final = frozenset(
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
_UNIT_WORDS: Final = [
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
_UNITS: Final = {w: i for i, w in enumerate(_UNIT_WORDS)}
_TENS: Final = {
    w: 10 * i
    for i, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], 2)
}
_SCALES: Final = {"hundred": 100, "thousand": 1000}
_NUMBER_WORDS: Final = frozenset([*_UNITS, *_TENS, *_SCALES, "point"])
_WEEKDAYS: Final = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_MONTHS: Final = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_ORDINALS: Final = {
    w: i
    for i, w in enumerate(
        [
            "first",
            "second",
            "third",
            "fourth",
            "fifth",
            "sixth",
            "seventh",
            "eighth",
            "ninth",
            "tenth",
            "eleventh",
            "twelfth",
            "thirteenth",
            "fourteenth",
            "fifteenth",
            "sixteenth",
            "seventeenth",
            "eighteenth",
            "nineteenth",
            "twentieth",
        ],
        1,
    )
} | {"thirtieth": 30, "thirty first": 31}
_ORDINALS.update({f"twenty {w}": 20 + i for w, i in list(_ORDINALS.items()) if i < 10})
# What a string parameter is about, from words in its name (or, failing that, its description).
_PLACE: Final = frozenset(
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
_PERSON: Final = frozenset(
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
_TEXT: Final = frozenset(
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
_NEGATIONS: Final = frozenset(["no", "not", "without", "dont", "don't", "never", "disable", "off", "false"])
# Fill order: an enum value, a date or a count claims its words before a free-text field may.
_PRIORITY: Final = {
    "enum": 0,
    "date": 1,
    "time": 1,
    "datetime": 1,
    "number": 2,
    "bool": 3,
    "place": 4,
    "person": 5,
    "generic": 6,
    "text": 7,
    "skip": 8,
}
_NAME_W, _ENUM_W, _PARAM_W, _DESC_W, _PARAM_DESC_W = 3.0, 2.5, 1.5, 1.0, 0.5
_HALF: Final = 2.0  # the raw weight that scores 0.5: one tool-name word alone clears the default threshold


def _alt(words: Sequence[str] | Mapping[str, int]) -> str:
    return "|".join(sorted(map(re.escape, words), key=len, reverse=True))


_WORD_RE: Final = re.compile(r"[^\W_]+(?:'[^\W_]+)?(?:[.:/][0-9]+)*")  # "zürich", "it's", "7:30", "3/14"
_DAY, _YEAR = rf"(?:\d{{1,2}}(?:st|nd|rd|th)?|{_alt(_ORDINALS)})", r"(?:,?\s+(?P<year>\d{4})\b)?"
_MONTH: Final = rf"(?:{_alt([*_MONTHS, *(m[:3] for m in _MONTHS), 'sept'])})"
_DATE_RES: Final = (
    re.compile(rf"\b(?P<mon>{_MONTH})\.?\s+(?:the\s+)?(?P<day>{_DAY})\b{_YEAR}"),
    re.compile(rf"\b(?:the\s+)?(?P<day>{_DAY})\s+(?:of\s+)?(?P<mon>{_MONTH})\b{_YEAR}"),
    re.compile(r"\b(?P<mon>\d{1,2})/(?P<day>\d{1,2})(?:/(?P<year>\d{4}|\d{2}))?\b"),
    re.compile(r"\b(?P<year>\d{4})-(?P<mon>\d{1,2})-(?P<day>\d{1,2})\b"),
)
_RELATIVE_RE: Final = re.compile(
    rf"\b(?:(?P<rel>day after tomorrow|today|tonight|tomorrow|yesterday|next week)"
    rf"|(?:(?:next|this|on|coming)\s+)?(?P<wd>{_alt(_WEEKDAYS)})s?"
    rf"|in\s+(?P<n>\d+|a|an|{_alt(_UNIT_WORDS)})\s+(?P<unit>day|week)s?)\b"
)
_RELATIVE: Final = {
    "day after tomorrow": 2,
    "today": 0,
    "tonight": 0,
    "tomorrow": 1,
    "yesterday": -1,
    "next week": 7,
}
_HOUR, _DIGIT = rf"(?:\d{{1,2}}|{_alt(_UNIT_WORDS[1:13])})", _alt(_UNIT_WORDS[1:10])
_MINUTE: Final = (
    rf"(?:oh\s+(?:{_DIGIT})|(?:twenty|thirty|forty|fifty)(?:\s+(?:{_DIGIT}))?"
    rf"|{_alt(_UNIT_WORDS[10:])})"
)
_CLOCK_RE: Final = re.compile(
    rf"\b(?P<cue>(?:at|by|around|until|till)\s+)?(?P<h>{_HOUR})(?::(?P<m>\d{{2}})|\s+(?P<mw>{_MINUTE}))?"
    r"(?:\s*(?P<ap>am|pm|o'?clock))?\b"
)
_PAST_RE: Final = re.compile(
    rf"\b(?P<q>half|quarter)\s+(?P<dir>past|after|to|before)\s+(?P<h>{_HOUR})\b(?:\s*(?P<ap>am|pm)\b)?"
)
_NOON_RE: Final = re.compile(r"\b(?:at\s+)?(?P<w>noon|midday|midnight)\b")
_SWITCH_RE: Final = re.compile(
    r"\b(?:turn|switch|set)\s+(?:\w+\s+){0,3}?(?P<a>on|off)\b|\b(?P<b>on|off)(?:\s+please)?\W*$"
    r"|\b(?P<c>enable|disable|activate|deactivate|true|false)\b"
)


def _stem(word: str, *, synonyms: bool = True) -> str:
    """A crude stem, so "bookings", "booked" and "book" meet; synonyms fold onto their group's word."""
    w = word.removesuffix("'s").replace("'", "")
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 5 and w.endswith("ing") or len(w) > 4 and w.endswith("ed"):
        w = w[:-3] if w.endswith("ing") else w[:-2]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "aeiouslz":
            w = w[:-1]
    elif len(w) > 3 and (w.endswith(("ches", "shes")) or w.endswith("es") and w[-3] in "sxz"):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 4 and w.endswith("e"):  # "reserve" and "reserved" must meet
        w = w[:-1]
    return _SYNONYMS.get(w, w) if synonyms else w


_SYNONYMS: Final = {
    _stem(v, synonyms=False): _stem(k, synonyms=False) for k, vs in _GROUPS.items() for v in vs
}
_STOP_STEMS: Final = frozenset(_stem(w, synonyms=False) for w in _STOP)


def _split_name(name: str) -> list[str]:
    """``get_currentWeather`` -> get, current, weather."""
    return [w for w in re.split(r"[^a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()) if w]


def _content_stems(text: str, *, synonyms: bool = True) -> set[str]:
    words = _WORD_RE.findall(text.lower())
    return {
        _stem(w, synonyms=synonyms)
        for w in words
        if w not in _STOP and _stem(w, synonyms=False) not in _STOP_STEMS
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A decision to call one function tool, with the arguments read from what the caller said."""

    name: str
    #: JSON-serialisable, only keys of the schema's properties, in the schema's order.
    arguments: Mapping[str, object] = field(hash=False)
    #: How well the utterance matched the tool, 0..1 (for logs and tests; not a probability).
    score: float

    def arguments_json(self) -> str:
        """The arguments as compact JSON in the schema's order (what ``function_call.arguments`` carries)."""
        return json.dumps(dict(self.arguments), separators=(",", ":"), ensure_ascii=False)


class _Heard:
    """One utterance, prepared once: tokens and their places, dates, clock times, and the words spoken for."""

    __slots__ = (
        "dates",
        "guesses",
        "low",
        "now",
        "raw",
        "reserved",
        "said",
        "stems",
        "text",
        "times",
        "tokens",
        "used",
    )

    def __init__(self, said: str, now: datetime) -> None:
        self.said, self.now = said, now
        text = re.sub(r"\b([ap])\.\s?m\b\.?", r"\1m", said.replace("\u2019", "'"), flags=re.IGNORECASE)
        text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # "2,500"
        text = re.sub(r"(?<=\d)(?=[ap]m\b)", " ", text, flags=re.IGNORECASE)
        self.text = re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", " ", text)  # "twenty-five" reads as two words
        self.low = self.text.lower()  # same length: spans found in it cut the original-case text
        self.tokens = [(m.start(), m.end(), m.group()) for m in _WORD_RE.finditer(self.low)]
        self.raw = [_stem(w, synonyms=False) for _, _, w in self.tokens]
        self.stems = _content_stems(self.low)
        self.dates = _find_dates(self.low, now.date())
        self.times = _find_times(self.low)
        # A date or a clock time is never also a count or a city, even when the tool takes no date.
        self.reserved = [span for span, _ in self.dates] + [span for span, _ in self.times]
        self.used: list[_Span] = []
        self.guesses = 0

    def free(self, k: int, *, reserved: bool = True) -> bool:
        start, end, _ = self.tokens[k]
        spans = self.used + self.reserved if reserved else self.used
        return not any(start < b and a < end for a, b in spans)

    def take(self, first: int, end: int) -> str:
        """Marks tokens ``first..end-1`` used and returns their original text."""
        span = (self.tokens[first][0], self.tokens[end - 1][1])
        self.used.append(span)
        return self.text[span[0] : span[1]].strip(".,;:!?")

    def numbers(self) -> Iterator[tuple[float, int, int]]:
        """Numbers not yet spoken for, digits or spelled out: (value, first token, end token)."""
        k = 0
        while k < len(self.tokens):
            end = k
            while end < len(self.tokens) and self.free(end):
                end += 1
            got = _parse_number([w for _, _, w in self.tokens[k:end]])
            if got is not None:
                yield got[0], k, k + got[1]
            k += got[1] if got else 1


def _parse_number(words: Sequence[str]) -> tuple[float, int] | None:
    """The number at the start of ``words`` ("twenty five", "3.5", "a hundred") and how many words it is."""
    if words and re.fullmatch(r"\d+(?:\.\d+)?", words[0]):
        scale = _SCALES.get(words[1], 1) if len(words) > 1 else 1
        return float(words[0]) * scale, 1 if scale == 1 else 2
    total, current, n, last = 0, 0, 0, ""
    if len(words) > 1 and words[0] in ("a", "an") and words[1] in _SCALES:
        current, n, last = 1, 1, "unit"
    while n < len(words):
        w = words[n]
        if w in _UNITS and (last in ("", "scale", "and") or last == "tens" and 0 < _UNITS[w] < 10):
            current, last = current + _UNITS[w], "unit"
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
        while k < len(words) and _UNITS.get(words[k], 10) < 10:
            digits, k = digits + str(_UNITS[words[k]]), k + 1
        if digits:
            value, n = value + float("0." + digits), k
    return value, n


def _first_free(found: list[tuple[_Span, _T]]) -> list[tuple[_Span, _T]]:
    """``found`` in spoken order; of two overlapping finds the earlier, longer one stays."""
    kept: list[tuple[_Span, _T]] = []
    for span, value in sorted(found, key=lambda item: (item[0][0], -item[0][1])):
        if not any(span[0] < b and a < span[1] for (a, b), _ in kept):
            kept.append((span, value))
    return kept


def _find_dates(low: str, today: date) -> list[tuple[_Span, date]]:
    found: list[tuple[_Span, date]] = []
    for m in (m for pattern in _DATE_RES for m in pattern.finditer(low)):
        day = _ORDINALS.get(m["day"]) or int(re.sub(r"\D", "", m["day"]))
        mon = (
            int(m["mon"])
            if m["mon"].isdigit()
            else next(i for i, n in enumerate(_MONTHS, 1) if n.startswith(m["mon"]))
        )
        if mon > 12:  # "14/3" can only be day first
            mon, day = day, mon
        year = int(m["year"] or today.year)
        try:  # no year: the next such day, as someone booking means
            found_day = date(year + 2000 if year < 100 else year, mon, day)
            if not m["year"] and found_day < today:
                found_day = date(year + 1, mon, day)
        except ValueError:
            continue
        found.append((m.span(), found_day))
    for m in _RELATIVE_RE.finditer(low):
        if m["rel"]:
            offset = _RELATIVE[m["rel"]]
        elif m["wd"]:  # "on friday": the coming one; said on a friday, a week on
            offset = (_WEEKDAYS.index(m["wd"]) - today.weekday()) % 7 or 7
        else:
            count = 1 if m["n"] in ("a", "an") else int(m["n"]) if m["n"].isdigit() else _UNITS[m["n"]]
            offset = count * (7 if m["unit"] == "week" else 1)
        found.append((m.span(), today + timedelta(days=offset)))
    return _first_free(found)


def _find_times(low: str) -> list[tuple[_Span, time]]:
    found: list[tuple[_Span, tuple[int, int, str | None]]] = []
    hour_of: Callable[[str], int] = lambda word: int(word) if word.isdigit() else _UNITS[word]
    for m in _NOON_RE.finditer(low):
        found.append((m.span(), (0 if m["w"] == "midnight" else 12, 0, None)))
    for m in _PAST_RE.finditer(low):
        back = m["dir"] in ("to", "before")
        minutes = 30 if m["q"] == "half" else 45 if back else 15
        found.append((m.span(), (hour_of(m["h"]) - back, minutes, m["ap"])))
    for m in _CLOCK_RE.finditer(low):
        if m["cue"] or m["m"] or m["ap"]:  # a bare number is a count, not a time
            spoken = _parse_number(m["mw"].removeprefix("oh").split()) if m["mw"] else None
            minutes = int(spoken[0]) if spoken else int(m["m"] or 0)
            found.append((m.span(), (hour_of(m["h"]), minutes, m["ap"])))
    evening = re.search(r"\b(?:tonight|evening|afternoon)\b", low) is not None
    resolved: list[tuple[_Span, time]] = []
    for span, (hour, minutes, ap) in _first_free(found):
        # "at 7 tonight" is an evening seven; without such a cue, "at 7" is read as said.
        if ap == "pm" and hour < 12 or ap is None and evening and 0 < hour < 12:
            hour += 12
        elif ap == "am" and hour == 12:
            hour = 0
        if 0 <= hour < 24 and 0 <= minutes < 60:
            resolved.append((span, time(hour, minutes)))
    return resolved


_NO_DEFAULT: Final = object()


@dataclass(frozen=True, slots=True)
class _Param:
    """One function parameter, its schema reduced to what filling it needs."""

    name: str
    #: Local ``$ref`` resolved, ``allOf`` merged, a lone non-null ``anyOf``/``oneOf`` branch folded in.
    schema: Mapping[str, object]
    #: null is a valid value (``anyOf`` with ``{"type": "null"}``, ``"type": [..., "null"]``, ...).
    nullable: bool
    #: The schema's ``default``, or :data:`_NO_DEFAULT`.
    default: object


def _parameters(parameters: Mapping[str, object]) -> list[_Param]:
    """The properties of a function's parameter schema, in order, each flattened.

    Strict schemas (what openai-agents' ``@function_tool`` sends) list every
    parameter as required and say what may be left out another way: a default
    on the property, or null among its types; enums of a Python ``Enum`` sit in
    ``$defs`` behind a ``$ref``. Flattening lets the rules below read them all alike.
    """
    props = parameters.get("properties")
    if not isinstance(props, Mapping):
        return []
    found = []
    for name, prop in props.items():
        if isinstance(prop, Mapping):
            schema, nullable = _flatten(prop, parameters, 0)
            found.append(_Param(str(name), schema, nullable, schema.get("default", _NO_DEFAULT)))
    return found


def _flatten(
    schema: Mapping[str, object], root: Mapping[str, object], depth: int
) -> tuple[dict[str, object], bool]:
    """``schema`` with its combinators folded in (its own keywords win) and whether it admits null."""
    out = dict(schema)
    nullable = out.pop("nullable", None) is True  # OpenAPI's spelling
    if depth > 8:  # a reference cycle, or a schema no caller would speak
        return out, nullable
    ref = out.pop("$ref", None)
    target = _pointer(root, ref) if isinstance(ref, str) else None
    if target is not None:
        base, null = _flatten(target, root, depth + 1)
        out, nullable = {**base, **out}, nullable or null
    parts = out.pop("allOf", None)
    for part in parts if isinstance(parts, list) else []:
        if isinstance(part, Mapping):
            out = {**_flatten(part, root, depth + 1)[0], **out}
    for key in ("anyOf", "oneOf"):
        branches = out.pop(key, None)
        if not isinstance(branches, list):
            continue
        flat = [_flatten(b, root, depth + 1) for b in branches if isinstance(b, Mapping)]
        nullable = nullable or any(null or b.get("type") == "null" for b, null in flat)
        rest = [b for b, _ in flat if b.get("type") != "null"]
        if len(rest) == 1:
            out = {**rest[0], **out}
        elif rest and "type" not in out:  # str | int: any of the types; the kinds below pick the likeliest
            out["type"] = sorted({t for b in rest for t in _types(b)})
    types = out.get("type")
    if isinstance(types, list) and "null" in types:
        nullable, rest_types = True, [t for t in types if t != "null"]
        out["type"] = rest_types[0] if len(rest_types) == 1 else rest_types
    if isinstance(enum := out.get("enum"), list) and None in enum:
        nullable, out["enum"] = True, [v for v in enum if v is not None]
    return out, nullable


def _types(schema: Mapping[str, object]) -> list[str]:
    types = schema.get("type")
    return [types] if isinstance(types, str) else [str(t) for t in types] if isinstance(types, list) else []


def _pointer(root: Mapping[str, object], ref: str) -> Mapping[str, object] | None:
    """The schema a local ``$ref`` ("#/$defs/Unit") points at in ``root``, or None."""
    if not ref.startswith("#"):
        return None  # a remote schema: nothing to fetch on this path
    node: object = root
    for token in (t for t in ref[1:].split("/") if t):
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(token)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node if isinstance(node, Mapping) else None


def _kind(name: str, prop: Mapping[str, object]) -> str:
    """What a property takes: enum, number, bool, date, time, datetime, place, person, text, generic, skip."""
    types = prop.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    if isinstance(prop.get("enum"), list):
        return "enum"
    if types & {"integer", "number"} or "boolean" in types:
        return "bool" if "boolean" in types else "number"
    if types and "string" not in types:
        return "skip"  # objects and arrays: nothing a rule could say for sure
    fmt = {"date": "date", "time": "time", "date-time": "datetime"}.get(str(prop.get("format")))
    if fmt:
        return fmt
    # The name is trusted for dates first; a description ("the city to get the time in") only after places.
    described = set(_WORD_RE.findall(str(prop.get("description", "")).lower()))
    for words, dates_first in ((set(_split_name(name)), True), (described, False)):
        when = (
            "datetime"
            if "datetime" in words or words >= {"date", "time"}
            else ("date" if words & {"date", "day"} else "time" if words & {"time", "hour"} else "")
        )
        if when and dates_first:
            return when
        kinds = (("place", _PLACE), ("person", _PERSON), ("text", _TEXT))
        kind = next((k for k, vocabulary in kinds if words & vocabulary), when)
        if kind:
            return kind
    return "generic"


def _find_enum(heard: _Heard, values: list[object]) -> tuple[object, int, int] | None:
    """The enum value heard first (as words, any case; numbers by value): (value, first token, end token)."""

    def said(k: int, w: str) -> bool:
        # A clipped word counts ("tech support" for "technical support"), a short one must be whole.
        return heard.free(k, reserved=False) and (
            heard.raw[k] == w or len(heard.raw[k]) >= 4 and w.startswith(heard.raw[k])
        )

    best: tuple[object, int, int] | None = None
    for value in values:
        if isinstance(value, str):
            words = [_stem(w, synonyms=False) for w in _split_name(value)]
            hits = [
                (k, k + len(words))
                for k in range(len(heard.raw) - len(words) + 1)
                if words and all(said(k + j, w) for j, w in enumerate(words))
            ]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            hits = [(a, b) for number, a, b in heard.numbers() if number == value]
        else:
            continue
        if hits and (best is None or hits[0][0] < best[1]):
            best = (value, *hits[0])
    return best


def _fill_number(heard: _Heard, name: str, prop: Mapping[str, object]) -> int | float | None:
    """The number nearest the words of the parameter's name (then description) that fits its bounds."""
    named = _content_stems(" ".join(_split_name(name)), synonyms=False)
    described = _content_stems(str(prop.get("description", "")), synonyms=False)
    low, high = prop.get("minimum"), prop.get("maximum")
    best: tuple[int, float, int, int] | None = None
    for value, first, end in heard.numbers():
        if (
            "integer" in str(prop.get("type"))
            and not value.is_integer()
            or isinstance(low, int | float)
            and value < low
            or isinstance(high, int | float)
            and value > high
        ):
            continue
        near = set(heard.raw[max(0, first - 3) : first] + heard.raw[end : end + 3])
        cue = 2 * len(near & named) + len(near & described)
        if best is None or cue > best[0]:
            best = (cue, value, first, end)
    if best is None:
        return None
    heard.take(best[2], best[3])
    return int(best[1]) if best[1].is_integer() else best[1]


def _fill_bool(heard: _Heard, name: str, tool_words: set[str], single: bool) -> bool | None:
    """True when the parameter's word is heard with no negation near it; else on/off, for a lone boolean."""
    words = _content_stems(" ".join(_split_name(name)), synonyms=False) - tool_words
    for k, stem in enumerate(heard.raw):
        if stem in words:
            return not {w for _, _, w in heard.tokens[max(0, k - 3) : k + 3]} & _NEGATIONS
    m = _SWITCH_RE.search(heard.low) if single else None
    return None if m is None else (m["a"] or m["b"] or m["c"]) in ("on", "enable", "activate", "true")


def _after_cue(
    heard: _Heard, cues: Sequence[str], allow: Callable[[int], bool], limit: int
) -> Iterator[range]:
    """Runs of allowed tokens right after each cue word ("in Paris", "for Alice"), cue by cue."""
    for cue in cues:
        for k in (k for k, (_, _, word) in enumerate(heard.tokens) if word == cue and heard.free(k)):
            first = k + 1
            while first < len(heard.tokens) and heard.tokens[first][2] in ("the", "a", "an", "my"):
                first += 1
            end = first
            while end < len(heard.tokens) and end - first < limit and allow(end):
                end += 1
            if end > first:
                yield range(first, end)


def _fill_string(
    heard: _Heard, name: str, kind: str, required: bool, name_stems: set[str], exclude: set[str]
) -> str | None:
    """The words after a cue for the parameter, else (when required, or free text) the leftover words."""
    named, tokens = set(_split_name(name)), heard.tokens

    def wordy(k: int) -> bool:
        word = tokens[k][2]
        return (
            heard.free(k)
            and word.replace("'", "").isalpha()
            and word not in _STOP
            and word not in _NUMBER_WORDS
            and heard.raw[k] not in _STOP_STEMS
        )

    if kind == "place":
        cues = (
            ["from"]
            if named & {"from", "origin", "source", "departure"}
            else ["to"]
            if named & {"to", "destination", "arrival"}
            else ["in", "at", "near", "for", "from", "to"]
        )
        runs = _after_cue(heard, cues, wordy, 4)
    elif kind == "person":
        runs = _after_cue(heard, ["for", "named", "called", "under", "to", "with"], wordy, 3)
    elif kind == "text":
        runs = _after_cue(heard, ["about", "for", "regarding", "on", "saying"], heard.free, 40)
    else:
        runs = _after_cue(
            heard,
            [*named, "about", "called", "named", "because"],
            lambda k: heard.free(k) and tokens[k][2] not in _STOP,
            4,
        )
    for run in runs:
        first, end = run.start, run.stop
        # A query ends where the words about the tool begin: "for refund policy in the docs".
        while end > first and (tokens[end - 1][2] in _STOP or _stem(tokens[end - 1][2]) in name_stems):
            end -= 1
        if any(_stem(tokens[k][2]) not in name_stems | _STOP_STEMS for k in range(first, end)):
            return _proper(heard.take(first, end), kind)
    if not (required or kind == "text"):
        return None  # an optional field gets no guess
    rest = [
        k
        for k in range(len(tokens))
        if heard.free(k)
        and tokens[k][2] not in _STOP
        and heard.raw[k] not in _STOP_STEMS
        and _stem(tokens[k][2]) not in exclude
        and (kind == "text" or wordy(k))
    ]
    if rest:
        heard.guesses += kind != "text"  # leftover words as a city or a name are a guess: weaker evidence
        return _proper(" ".join(heard.take(k, k + 1) for k in rest), kind)
    return heard.said.strip() if kind == "text" and heard.said.strip() else None


def _proper(value: str, kind: str) -> str:
    if kind not in ("place", "person"):
        return value
    # Recognisers often write "paris"; a city or a name is capitalised, "McDonald" is left alone.
    return " ".join(w if any(c.isupper() for c in w) else w.capitalize() for w in value.split())


def _consider(tool: FunctionTool, heard: _Heard) -> tuple[ToolCall, bool, int]:
    """``tool``'s call for ``heard``, whether its required arguments were all filled, and how many guessed."""
    heard.used, heard.guesses = [], 0
    params = _parameters(tool.parameters)
    props = [(param.name, param.schema) for param in params]
    weights: dict[str, float] = {}
    sources = [(" ".join(_split_name(tool.name)), _NAME_W), (tool.description, _DESC_W)]
    for name, prop in props:
        sources.append((" ".join(_split_name(name)), _PARAM_W))
        sources.append((str(prop.get("description", "")), _PARAM_DESC_W))
    for text, weight in sources:
        for stem in _content_stems(text):
            weights[stem] = max(weights.get(stem, 0.0), weight)
    enums = sum(
        isinstance(opts := prop.get("enum"), list) and _find_enum(heard, opts) is not None
        for _, prop in props
    )
    raw = sum(weights.get(stem, 0.0) for stem in heard.stems) + _ENUM_W * enums
    name_stems = _content_stems(" ".join(_split_name(tool.name)))
    # What a leftover-word fallback must not hand back as a value; parameter descriptions are left out
    # because their examples ("e.g. San Francisco") are exactly what a caller says.
    tool_words = {stem for stem, weight in weights.items() if weight >= _DESC_W}
    single_bool = sum(_kind(name, prop) == "bool" for name, prop in props) == 1
    req = tool.parameters.get("required")
    required = {str(r) for r in req} if isinstance(req, list | tuple) else set()
    # A required parameter with a default, or one that may be null, has an answer when nothing was
    # heard for it: that answer beats guessing it from leftover words.
    fallback = {
        p.name: copy.deepcopy(p.default) if p.default is not _NO_DEFAULT else None
        for p in params
        if p.name in required and (p.default is not _NO_DEFAULT or p.nullable)
    }
    values: dict[str, object] = {}
    dates, times = [value for _, value in heard.dates], [value for _, value in heard.times]
    for name, prop in sorted(props, key=lambda item: _PRIORITY[_kind(*item)]):
        kind, value = _kind(name, prop), None
        if (
            kind == "enum"
            and isinstance(options := prop["enum"], list)
            and (found := _find_enum(heard, options)) is not None
        ):
            value = found[0]
            heard.take(found[1], found[2])
        elif kind in ("date", "time", "datetime"):
            day = dates.pop(0) if kind != "time" and dates else None
            clock = times.pop(0) if kind != "date" and times else None
            if kind == "date" and day:
                value = day.isoformat()
            elif kind == "time" and clock:
                value = clock.strftime("%H:%M")
            elif kind == "datetime" and clock:  # a day alone has no hour to give; a clock alone is today's
                value = datetime.combine(day or heard.now.date(), clock, heard.now.tzinfo).isoformat()
        elif kind == "number":
            value = _fill_number(heard, name, prop)
        elif kind == "bool":
            value = _fill_bool(
                heard, name, _content_stems(" ".join(_split_name(tool.name)), synonyms=False), single_bool
            )
        elif kind != "skip":
            exclude = name_stems if kind == "text" else tool_words
            value = _fill_string(
                heard, name, kind, name in required and name not in fallback, name_stems, exclude
            )
        if value is not None:
            values[name] = value
        elif name in fallback:
            values[name] = fallback[name]
    ordered = {name: values[name] for name, _ in props if name in values}
    score = raw / (raw + _HALF) * 0.95**heard.guesses
    call = ToolCall(name=tool.name, arguments=MappingProxyType(ordered), score=score)
    return call, required <= set(ordered), heard.guesses


class ToolRouter:
    """Decides, by word matching alone, whether what the caller said calls one of the offered tools.

    A tool scores from the overlap of the utterance with its name's words (the
    strongest evidence), an enum value of one of its parameters, its parameter
    names and its description. A score under ``threshold`` calls nothing unless
    the tool choice forces a call.
    """

    __slots__ = ("_threshold",)

    def __init__(self, *, threshold: float = 0.55) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be between 0 and 1")
        self._threshold = threshold

    @property
    def threshold(self) -> float:
        """The score a tool needs to be called when no call is forced."""
        return self._threshold

    def route(
        self, heard: str, tools: Sequence[FunctionTool], choice: ToolChoice, *, now: datetime
    ) -> ToolCall | None:
        """The call for ``heard`` (a final transcript, non-speech tags and all), or None.

        None: no tool fits (or ``choice.mode`` is NONE). With ``choice.forces_call``
        the best tool is returned even under the threshold (``choice.function``
        names it when set: then always that tool, or None if it is not offered).
        A required parameter the utterance does not give takes the schema's
        ``default``, else null where its schema allows null (how strict schemas
        spell "optional"). Required parameters still unfilled: called only if
        forced, and then left out rather than invented; otherwise that tool is not called.
        """
        if choice.mode is ToolChoiceMode.NONE or not tools:
            return None
        prepared = _Heard(clean_transcript(heard), now)
        if choice.function is not None:
            named = next((tool for tool in tools if tool.name == choice.function), None)
            return None if named is None else _consider(named, prepared)[0]
        best: tuple[tuple[float, bool, int, int], ToolCall] | None = None
        for index, tool in enumerate(tools):
            call, complete, guesses = _consider(tool, prepared)
            if not choice.forces_call and (call.score < self._threshold or not complete):
                continue
            # Ties: the complete call, then the one with fewer guessed words, then the tool offered first.
            key = (call.score, complete, -guesses, -index)
            if best is None or key > best[0]:
                best = (key, call)
        return None if best is None else best[1]


_MARKUP: Final = re.compile(
    r"<[^>]*>|!?\[([^\]]*)\]\([^)]*\)|(https?://\S+)|[*_`#>|~]+|^\s*[-+]\s+", re.MULTILINE
)
_TEXT_KEYS: Final = ("message", "text", "answer", "result", "summary", "output", "content")


def _speak(value: object, depth: int = 0) -> str:
    """``value`` in words: plain text, yes/no, readable numbers, the first few items or fields."""
    if isinstance(value, str):  # markup is for eyes: "[Paris](url)" says Paris, a bare URL "a link"
        return " ".join(_MARKUP.sub(lambda m: m[1] or ("a link" if m[2] else " "), value).split())
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a number" if math.isnan(value) else "infinity"
    if isinstance(value, int | float):
        text = f"{value:,.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"
        return "minus " + text[1:] if text.startswith("-") else text
    if isinstance(value, list):
        # An item that is a record is said by its first text ("title": "Refunds" -> Refunds).
        heads = [
            next((v for v in x.values() if isinstance(v, str)), x) if isinstance(x, dict) else x
            for x in value
        ]
        more = f", and {len(value) - 3} more" if len(value) > 3 else ""
        return ", ".join(s for s in (_speak(item, depth + 1) for item in heads[:3]) if s) + more
    if isinstance(value, dict) and depth < 2:
        fields = [(" ".join(_split_name(str(k))), _speak(v, depth + 1)) for k, v in list(value.items())[:6]]
        return ", ".join(f"{k} {v}" for k, v in fields if v)
    return ""


def reply_from_output(call: ToolCall, output: str) -> str:
    """A short speakable sentence built from the function's ``output`` for ``call``; never empty.

    ``output`` may be JSON (an object says its salient fields, an array its first
    items, a scalar itself) or free text (markup stripped). An object with a
    non-empty "error" key says that the tool failed and why. At most about 40 words.
    """
    who = " ".join(_split_name(call.name)) or "The tool"
    try:
        data: object = json.loads(output)
    except ValueError:
        data = output
    said = ""
    if isinstance(data, dict):
        error = next((v for k, v in data.items() if str(k).lower() == "error"), None)
        if isinstance(error, dict):
            error = next(
                (error[k] for k in ("message", "detail", "reason") if isinstance(error.get(k), str)), error
            )
        if error not in (None, False, "", {}, []):
            reason = "" if error is True else _speak(error)
            said = f"{who} failed: {reason}" if reason else f"{who} failed"
        else:
            text = next(
                (data[k] for k in _TEXT_KEYS if isinstance(data.get(k), str) and _speak(data[k])), data
            )
            said = f"{who} says: {_speak(text)}" if _speak(text) else ""
    elif isinstance(data, list):
        plural = "s" if len(data) != 1 else ""
        said = (
            f"{who} returned {len(data)} result{plural}: {_speak(data)}" if data else (f"{who} found nothing")
        )
    elif _speak(data):
        said = f"{who} says " if isinstance(data, bool | int | float) else f"{who} says: "
        said += _speak(data)
    words = (said or f"{who} finished").split()
    text = " ".join(words[:40]).rstrip(",;:.") + "\u2026" if len(words) > 40 else " ".join(words)
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?", "\u2026")) else text.rstrip(",;:") + "."
