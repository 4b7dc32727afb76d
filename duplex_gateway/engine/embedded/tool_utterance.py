"""One caller utterance as offline tool use reads it: tokens, dates, clock times, numbers, words spoken for.

Pure: "today" and "next friday" are read against the clock the caller passes in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from typing import Final, TypeVar

from duplex_gateway.engine.embedded.tool_words import (
    UNIT_WORDS,
    UNITS,
    WORD_RE,
    alternation,
    content_stems,
    parse_number,
    stem_of,
)

__all__ = ["Utterance"]

_T = TypeVar("_T")
_Span = tuple[int, int]
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
_DAY, _YEAR = rf"(?:\d{{1,2}}(?:st|nd|rd|th)?|{alternation(_ORDINALS)})", r"(?:,?\s+(?P<year>\d{4})\b)?"
_MONTH: Final = rf"(?:{alternation([*_MONTHS, *(m[:3] for m in _MONTHS), 'sept'])})"
_DATE_RES: Final = (
    re.compile(rf"\b(?P<mon>{_MONTH})\.?\s+(?:the\s+)?(?P<day>{_DAY})\b{_YEAR}"),
    re.compile(rf"\b(?:the\s+)?(?P<day>{_DAY})\s+(?:of\s+)?(?P<mon>{_MONTH})\b{_YEAR}"),
    re.compile(r"\b(?P<mon>\d{1,2})/(?P<day>\d{1,2})(?:/(?P<year>\d{4}|\d{2}))?\b"),
    re.compile(r"\b(?P<year>\d{4})-(?P<mon>\d{1,2})-(?P<day>\d{1,2})\b"),
)
_RELATIVE_RE: Final = re.compile(
    rf"\b(?:(?P<rel>day after tomorrow|today|tonight|tomorrow|yesterday|next week)"
    rf"|(?:(?:next|this|on|coming)\s+)?(?P<wd>{alternation(_WEEKDAYS)})s?"
    rf"|in\s+(?P<n>\d+|a|an|{alternation(UNIT_WORDS)})\s+(?P<unit>day|week)s?)\b"
)
_RELATIVE: Final = {
    "day after tomorrow": 2,
    "today": 0,
    "tonight": 0,
    "tomorrow": 1,
    "yesterday": -1,
    "next week": 7,
}
_HOUR, _DIGIT = rf"(?:\d{{1,2}}|{alternation(UNIT_WORDS[1:13])})", alternation(UNIT_WORDS[1:10])
_MINUTE: Final = (
    rf"(?:oh\s+(?:{_DIGIT})|(?:twenty|thirty|forty|fifty)(?:\s+(?:{_DIGIT}))?"
    rf"|{alternation(UNIT_WORDS[10:])})"
)
_CLOCK_RE: Final = re.compile(
    rf"\b(?P<cue>(?:at|by|around|until|till)\s+)?(?P<h>{_HOUR})(?::(?P<m>\d{{2}})|\s+(?P<mw>{_MINUTE}))?"
    r"(?:\s*(?P<ap>am|pm|o'?clock))?\b"
)
_PAST_RE: Final = re.compile(
    rf"\b(?P<q>half|quarter)\s+(?P<dir>past|after|to|before)\s+(?P<h>{_HOUR})\b(?:\s*(?P<ap>am|pm)\b)?"
)
_NOON_RE: Final = re.compile(r"\b(?:at\s+)?(?P<w>noon|midday|midnight)\b")


class Utterance:
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
        self.tokens = [(m.start(), m.end(), m.group()) for m in WORD_RE.finditer(self.low)]
        self.raw = [stem_of(w, synonyms=False) for _, _, w in self.tokens]
        self.stems = content_stems(self.low)
        self.dates = _find_dates(self.low, now.date())
        self.times = _find_times(self.low)
        # A date or a clock time is never also a count or a city, even when the tool takes no date.
        self.reserved = [span for span, _ in self.dates] + [span for span, _ in self.times]
        self.used: list[_Span] = []
        self.guesses = 0

    def free(self, k: int, *, reserved: bool = True) -> bool:
        """Whether token ``k`` is not yet used (nor, with ``reserved``, part of a date or a clock time)."""
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
            got = parse_number([w for _, _, w in self.tokens[k:end]])
            if got is not None:
                yield got[0], k, k + got[1]
            k += got[1] if got else 1


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
            count = 1 if m["n"] in ("a", "an") else int(m["n"]) if m["n"].isdigit() else UNITS[m["n"]]
            offset = count * (7 if m["unit"] == "week" else 1)
        found.append((m.span(), today + timedelta(days=offset)))
    return _first_free(found)


def _find_times(low: str) -> list[tuple[_Span, time]]:
    found: list[tuple[_Span, tuple[int, int, str | None]]] = []

    def hour_of(word: str) -> int:
        return int(word) if word.isdigit() else UNITS[word]

    found.extend((m.span(), (0 if m["w"] == "midnight" else 12, 0, None)) for m in _NOON_RE.finditer(low))
    for m in _PAST_RE.finditer(low):
        back = m["dir"] in ("to", "before")
        minutes = 30 if m["q"] == "half" else 45 if back else 15
        found.append((m.span(), (hour_of(m["h"]) - back, minutes, m["ap"])))
    for m in _CLOCK_RE.finditer(low):
        if m["cue"] or m["m"] or m["ap"]:  # a bare number is a count, not a time
            spoken = parse_number(m["mw"].removeprefix("oh").split()) if m["mw"] else None
            minutes = int(spoken[0]) if spoken else int(m["m"] or 0)
            found.append((m.span(), (hour_of(m["h"]), minutes, m["ap"])))
    evening = re.search(r"\b(?:tonight|evening|afternoon)\b", low) is not None
    resolved: list[tuple[_Span, time]] = []
    for span, (hour, minutes, ap) in _first_free(found):
        # "at 7 tonight" is an evening seven; without such a cue, "at 7" is read as said.
        if (ap == "pm" and hour < 12) or (ap is None and evening and 0 < hour < 12):
            hour += 12
        elif ap == "am" and hour == 12:
            hour = 0
        if 0 <= hour < 24 and 0 <= minutes < 60:
            resolved.append((span, time(hour, minutes)))
    return resolved
