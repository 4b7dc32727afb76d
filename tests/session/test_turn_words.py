"""The words cue of ``semantic_vad``: which last words keep a turn going."""

from __future__ import annotations

import pytest

from duplex_gateway.session.turn_words import sounds_unfinished


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
