"""Word error rate for accuracy assertions that hold on any CPU.

A recognizer's exact words shift with the CPU its kernels run on (int8 GEMM
rounding differs between instruction sets), so tests bound the error rate over
several phrases instead of asserting a verbatim transcript. Before comparing,
both sides are normalised the way Whisper-style scorers do: case, punctuation
and the spelling of numbers ("4", "four"; "$200", "two hundred dollars";
"7:30", "seven thirty") do not count as errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

__all__ = ["corpus_wer", "normalize", "wer", "word_errors"]

_ONES: Final = [
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
_TENS: Final = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})\b")
_MONEY = re.compile(r"\$(\d+)")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
_NUMBER = re.compile(r"\d+")
#: Apostrophes vanish ("o'clock" and "oclock" are one word); other marks split words.
_APOSTROPHE = re.compile(r"['\u2019]")
_NOT_WORD = re.compile(r"[^a-z0-9]+")


def _number_words(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + ("" if rest == 0 else " " + _number_words(rest))
    if n < 1_000_000:
        thousands, rest = divmod(n, 1000)
        return _number_words(thousands) + " thousand" + ("" if rest == 0 else " " + _number_words(rest))
    return " ".join(_ONES[int(d)] for d in str(n))  # long digit strings are read out digit by digit


def _time_words(match: re.Match[str]) -> str:
    hour, minute = int(match.group(1)), int(match.group(2))
    if minute == 0:
        return f"{_number_words(hour)} oclock"
    if minute < 10:
        return f"{_number_words(hour)} oh {_number_words(minute)}"
    return f"{_number_words(hour)} {_number_words(minute)}"


def normalize(text: str) -> list[str]:
    """``text`` as lower-case words with numbers spelled out and punctuation gone."""
    text = _THOUSANDS.sub("", text.lower())
    text = _TIME.sub(_time_words, text)
    text = _MONEY.sub(lambda m: f"{m.group(1)} dollars", text)
    text = _ORDINAL.sub(lambda m: m.group(1), text)  # rare in test phrases; "3rd" counts as "three"
    text = _APOSTROPHE.sub("", text)
    text = _NOT_WORD.sub(" ", text)
    text = _NUMBER.sub(lambda m: " " + _number_words(int(m.group(0))) + " ", text)
    return text.split()


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference word count) after :func:`normalize`."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    previous = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, 1):
        current = [i]
        for j, hyp_word in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1], len(ref)


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one transcript (0.0 is perfect; can exceed 1.0 with insertions)."""
    errors, words = word_errors(reference, hypothesis)
    return errors / max(words, 1)


def corpus_wer(pairs: Iterable[tuple[str, str]]) -> float:
    """Word error rate over (reference, hypothesis) pairs: all errors over all reference words."""
    errors = words = 0
    for reference, hypothesis in pairs:
        e, n = word_errors(reference, hypothesis)
        errors += e
        words += n
    return errors / max(words, 1)
