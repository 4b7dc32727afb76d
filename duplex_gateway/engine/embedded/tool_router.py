"""Offline tool use for the embedded engine: pick a function tool and fill its arguments by rule.

There is no language model on this path, so nothing here understands language;
it matches words. That is enough for integrators to exercise their
function-calling plumbing offline: a caller who says "what's the weather in
Paris" to a session offering ``get_current_weather`` gets a call with
``{"city": "Paris"}``, and the function's output comes back as a short
sentence. Everything is pure: the clock arrives as an argument.

The word tables live in :mod:`.tool_words`, the utterance's reading (dates,
times, numbers) in :mod:`.tool_utterance`, the schema's in :mod:`.tool_schema`,
and the spoken reply to a function's output in :mod:`.tool_reply`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Final

from duplex_gateway.engine.embedded.responder import clean_transcript
from duplex_gateway.engine.embedded.tool_reply import reply_from_output
from duplex_gateway.engine.embedded.tool_schema import NO_DEFAULT, ToolCall, flat_parameters, parameter_kind
from duplex_gateway.engine.embedded.tool_utterance import Utterance
from duplex_gateway.engine.embedded.tool_words import (
    NEGATIONS,
    NUMBER_WORDS,
    STOP_STEMS,
    STOP_WORDS,
    content_stems,
    split_name,
    stem_of,
)
from duplex_gateway.vocabulary.session_config import FunctionTool, ToolChoice, ToolChoiceMode

#: ``ToolCall`` and ``reply_from_output`` live in :mod:`.tool_schema` and :mod:`.tool_reply`;
#: they are named here too, as the one door to offline tool use.
__all__ = ["ToolCall", "ToolRouter", "reply_from_output"]

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
# A lone boolean said as a switch: "turn the lights on", "disable it".
_SWITCH_RE: Final = re.compile(
    r"\b(?:turn|switch|set)\s+(?:\w+\s+){0,3}?(?P<a>on|off)\b|\b(?P<b>on|off)(?:\s+please)?\W*$"
    r"|\b(?P<c>enable|disable|activate|deactivate|true|false)\b"
)


def _find_enum(heard: Utterance, values: list[object]) -> tuple[object, int, int] | None:
    """The enum value heard first (as words, any case; numbers by value): (value, first token, end token)."""

    def said(k: int, w: str) -> bool:
        # A clipped word counts ("tech support" for "technical support"), a short one must be whole.
        return heard.free(k, reserved=False) and (
            heard.raw[k] == w or (len(heard.raw[k]) >= 4 and w.startswith(heard.raw[k]))
        )

    best: tuple[object, int, int] | None = None
    for value in values:
        if isinstance(value, str):
            words = [stem_of(w, synonyms=False) for w in split_name(value)]
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


def _fill_number(heard: Utterance, name: str, prop: Mapping[str, object]) -> int | float | None:
    """The number nearest the words of the parameter's name (then description) that fits its bounds."""
    named = content_stems(" ".join(split_name(name)), synonyms=False)
    described = content_stems(str(prop.get("description", "")), synonyms=False)
    low, high = prop.get("minimum"), prop.get("maximum")
    best: tuple[int, float, int, int] | None = None
    for value, first, end in heard.numbers():
        if (
            ("integer" in str(prop.get("type")) and not value.is_integer())
            or (isinstance(low, int | float) and value < low)
            or (isinstance(high, int | float) and value > high)
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


def _fill_bool(heard: Utterance, name: str, tool_words: set[str], single: bool) -> bool | None:
    """True when the parameter's word is heard with no negation near it; else on/off, for a lone boolean."""
    words = content_stems(" ".join(split_name(name)), synonyms=False) - tool_words
    for k, stem in enumerate(heard.raw):
        if stem in words:
            return not {w for _, _, w in heard.tokens[max(0, k - 3) : k + 3]} & NEGATIONS
    m = _SWITCH_RE.search(heard.low) if single else None
    return None if m is None else (m["a"] or m["b"] or m["c"]) in ("on", "enable", "activate", "true")


def _after_cue(
    heard: Utterance, cues: Sequence[str], allow: Callable[[int], bool], limit: int
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
    heard: Utterance, name: str, kind: str, required: bool, name_stems: set[str], exclude: set[str]
) -> str | None:
    """The words after a cue for the parameter, else (when required, or free text) the leftover words."""
    named, tokens = set(split_name(name)), heard.tokens

    def wordy(k: int) -> bool:
        word = tokens[k][2]
        return (
            heard.free(k)
            and word.replace("'", "").isalpha()
            and word not in STOP_WORDS
            and word not in NUMBER_WORDS
            and heard.raw[k] not in STOP_STEMS
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
            lambda k: heard.free(k) and tokens[k][2] not in STOP_WORDS,
            4,
        )
    for run in runs:
        first, end = run.start, run.stop
        # A query ends where the words about the tool begin: "for refund policy in the docs".
        while end > first and (tokens[end - 1][2] in STOP_WORDS or stem_of(tokens[end - 1][2]) in name_stems):
            end -= 1
        if any(stem_of(tokens[k][2]) not in name_stems | STOP_STEMS for k in range(first, end)):
            return _proper(heard.take(first, end), kind)
    if not (required or kind == "text"):
        return None  # an optional field gets no guess
    rest = [
        k
        for k in range(len(tokens))
        if heard.free(k)
        and tokens[k][2] not in STOP_WORDS
        and heard.raw[k] not in STOP_STEMS
        and stem_of(tokens[k][2]) not in exclude
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


def _consider(tool: FunctionTool, heard: Utterance) -> tuple[ToolCall, bool, int]:
    """``tool``'s call for ``heard``, whether its required arguments were all filled, and how many guessed."""
    heard.used, heard.guesses = [], 0
    params = flat_parameters(tool.parameters)
    props = [(param.name, param.schema) for param in params]
    weights: dict[str, float] = {}
    sources = [(" ".join(split_name(tool.name)), _NAME_W), (tool.description, _DESC_W)]
    for name, prop in props:
        sources.append((" ".join(split_name(name)), _PARAM_W))
        sources.append((str(prop.get("description", "")), _PARAM_DESC_W))
    for text, weight in sources:
        for stem in content_stems(text):
            weights[stem] = max(weights.get(stem, 0.0), weight)
    enums = sum(
        isinstance(opts := prop.get("enum"), list) and _find_enum(heard, opts) is not None
        for _, prop in props
    )
    raw = sum(weights.get(stem, 0.0) for stem in heard.stems) + _ENUM_W * enums
    name_stems = content_stems(" ".join(split_name(tool.name)))
    # What a leftover-word fallback must not hand back as a value; parameter descriptions are left out
    # because their examples ("e.g. San Francisco") are exactly what a caller says.
    tool_words = {stem for stem, weight in weights.items() if weight >= _DESC_W}
    single_bool = sum(parameter_kind(name, prop) == "bool" for name, prop in props) == 1
    req = tool.parameters.get("required")
    required = {str(r) for r in req} if isinstance(req, list | tuple) else set()
    # A required parameter with a default, or one that may be null, has an answer when nothing was
    # heard for it: that answer beats guessing it from leftover words.
    fallback = {
        p.name: copy.deepcopy(p.default) if p.default is not NO_DEFAULT else None
        for p in params
        if p.name in required and (p.default is not NO_DEFAULT or p.nullable)
    }
    values: dict[str, object] = {}
    dates, times = [value for _, value in heard.dates], [value for _, value in heard.times]
    for name, prop in sorted(props, key=lambda item: _PRIORITY[parameter_kind(*item)]):
        kind, value = parameter_kind(name, prop), None
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
                heard, name, content_stems(" ".join(split_name(tool.name)), synonyms=False), single_bool
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
        prepared = Utterance(clean_transcript(heard), now)
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
