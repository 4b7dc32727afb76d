"""The word error rate helper the accuracy tests rely on."""

from __future__ import annotations

import pytest

from tests.wer import corpus_wer, normalize, wer


def test_case_punctuation_and_number_spelling_are_not_errors() -> None:
    assert (
        wer(
            "Can you book a table for four people at eight tonight?",
            "can you book a table for 4 people at 8 tonight",
        )
        == 0
    )
    assert wer("Transfer two hundred dollars, please.", "Transfer $200, please.") == 0
    assert wer("Call me after three o'clock.", "Call me after 3:00") == 0
    assert wer("at seven thirty", "at 7:30.") == 0
    assert normalize("It's 2,500 steps!") == ["its", "two", "thousand", "five", "hundred", "steps"]


@pytest.mark.parametrize(
    ("hypothesis", "errors"),
    [
        ("please send me the weather report for tuesday morning", 0),
        ("please send me the winner report for tuesday morning", 1),  # substitution
        ("please send me the report for tuesday morning", 1),  # deletion
        ("please please send me the weather report for tuesday morning", 1),  # insertion
        ("", 9),
    ],
)
def test_errors_are_levenshtein_over_words(hypothesis: str, errors: int) -> None:
    assert wer("Please send me the weather report for Tuesday morning.", hypothesis) == pytest.approx(
        errors / 9
    )


def test_corpus_rate_weighs_phrases_by_their_words() -> None:
    pairs = [("one two three four", "one two three four"), ("five six", "five")]
    assert corpus_wer(pairs) == pytest.approx(1 / 6)
    assert corpus_wer([]) == 0.0
