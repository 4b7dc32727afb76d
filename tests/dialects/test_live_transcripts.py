"""The caller's words on the Live wire when the recognizer's final words revise its partial ones."""

from __future__ import annotations

import pytest

from duplex_gateway.dialects.live import _revision


@pytest.mark.parametrize(
    ("shown", "final", "delta"),
    [
        # The partial words were wrong from "whether": the final words from there on.
        ("what is the whether", "what is the weather report", " weather report"),
        # Nothing shown yet: the whole final transcript.
        ("", "hello there", "hello there"),
        # Only a stray partial word was shown: every final word still reaches the client.
        ("please", "what is the weather please", " what is the weather please"),
    ],
)
def test_a_revised_final_transcript_sends_the_words_from_the_first_that_differs(
    shown: str, final: str, delta: str
) -> None:
    assert _revision(shown, final) == delta
