"""The words cue of ``semantic_vad``: which last words keep a turn going."""

from __future__ import annotations

import pytest

from duplex_gateway.session.turn_words import UNSURE_LAST_WORD, sounds_unfinished


@pytest.mark.parametrize(
    "words",
    [
        "I would like to book a table for",
        "can you tell me the",
        "my number is one two and",
        "so I'm",
        "um",
        # Whisper punctuates a sentence cut at its pause as if it had ended there.
        "Can you send the invoice to?",
        "Please transfer the money into.",
        # ... or as trailing off.
        "I would like to book a room with...",
        "I would like to\u2026",
        "my card number is,",
        "I was going to -",
    ],
)
def test_a_turn_ending_on_a_word_no_sentence_ends_on_is_unfinished(words: str) -> None:
    assert sounds_unfinished(words)


@pytest.mark.parametrize(
    "words",
    [
        "",
        "book a table for four",
        "thank you",
        "what time is it",
        "I think so",
        "yes I can",
        "go to the shop.",
        "Could you repeat the last number?",
        "Thanks!",
    ],
)
def test_a_turn_ending_as_a_sentence_can_is_left_to_the_audio(words: str) -> None:
    assert not sounds_unfinished(words)


def test_an_unsure_last_word_is_no_evidence_of_a_finished_sentence() -> None:
    # Whisper's "...from the station too." for a caller who paused after "to", at 0.4.
    assert sounds_unfinished("I need a taxi from the station too.", last_word_confidence=0.4)
    assert not sounds_unfinished("I need a taxi from the station too.", last_word_confidence=0.95)
    # A recognizer that gives no confidence leaves the words alone.
    assert not sounds_unfinished("I need a taxi from the station too.", last_word_confidence=None)
    # Nothing heard is nothing to doubt.
    assert not sounds_unfinished("", last_word_confidence=0.1)
    # A sure word no sentence ends on is still unfinished.
    assert sounds_unfinished("book a table for", last_word_confidence=0.99)


def test_the_unsure_line_sits_between_the_test_sets_cut_and_finished_last_words() -> None:
    # Measured on the turn-taking set: cut sentences' misheard last words 0.3-0.6, finished 0.6-1.0.
    assert 0.6 < UNSURE_LAST_WORD <= 0.75
