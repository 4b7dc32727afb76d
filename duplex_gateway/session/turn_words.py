"""The caller's words as a cue for ``semantic_vad``: a turn whose last word cannot end a sentence goes on.

The end-of-turn audio model hears how a turn ends; it is misled where the voice falls as at the
end of a sentence while the words are not one ("I'd like to book a table for", spoken by a
synthetic voice, sounds finished to it). Where the engine streams the caller's words as they
are recognized, the last of them is a second cue: an article, a preposition, a conjunction or a
contraction still waiting for its complement cannot end an English sentence, so the turn is not done
whatever the audio says, for a while (:data:`WORDS_VETO_MS`): a caller who really stopped there
is answered by the next judgement, a second later. Where the recognizer says how sure it is of
the last word (the embedded engine's Whisper), an unsure one counts the same: a word reduced
before a pause is the one a recognizer mishears as a sentence's end.
"""

from __future__ import annotations

from typing import Final

__all__ = ["UNFINISHED_ENDINGS", "UNSURE_LAST_WORD", "WORDS_VETO_MS", "sounds_unfinished"]

#: Words an English sentence does not end on (lower case, no punctuation). A question may end on
#: a preposition ("where are you from"); that costs it one later judgement, not its answer.
UNFINISHED_ENDINGS: Final = frozenset(
    [
        "a",
        "an",
        "the",
        "my",
        "your",
        "our",
        "their",
        "its",
        "every",
        "each",
        "to",
        "for",
        "of",
        "in",
        "on",
        "at",
        "by",
        "with",
        "from",
        "into",
        "onto",
        "about",
        "than",
        "as",
        "and",
        "or",
        "but",
        "because",
        "if",
        "when",
        "while",
        "although",
        "though",
        "unless",
        "whether",
        "nor",
        "i'm",
        "it's",
        "that's",
        "there's",
        "what's",
        "here's",
        "gonna",
        "wanna",
        "um",
        "uh",
        "er",
        "erm",
    ]
)
#: How a recognizer that punctuates (Whisper) writes words that stop short of a sentence's end.
_TRAILING_OFF: Final = ("...", "\u2026", ",", "-", "\u2014")
#: The words' veto lasts this long into the silence: past it, only the audio model decides. A
#: thinking pause rarely lasts longer, and a recognizer's wrong last word ("...close to my" for
#: "...close tonight") must not hold a finished caller for long: the judgement after it ends the turn.
WORDS_VETO_MS: Final = 1_000
#: A last word the recognizer is less sure of than this is no evidence that the sentence is over.
#: Whisper hears a sentence cut at a reduced "to", "for" or "in" as a finished one ("...from the
#: station too.", "...pay for it.") and gives that last word 0.3-0.6, where the last words of
#: finished sentences in the test set get 0.6-1.0; the few finished ones below the line wait one
#: more judgement, not their answer.
UNSURE_LAST_WORD: Final = 0.7


def sounds_unfinished(words: str, last_word_confidence: float | None = None) -> bool:
    """The last of ``words`` (the caller's turn so far) is one a sentence cannot end on, or unsure.

    ``last_word_confidence``: the recognizer's, where it gives one (0-1).
    """
    tokens = words.lower().replace("\u2019", "'").split()
    if not tokens:
        return False
    if last_word_confidence is not None and last_word_confidence < UNSURE_LAST_WORD:
        return True
    final = tokens[-1].rstrip('"()')
    if final.endswith(_TRAILING_OFF):
        return True  # Whisper writes a sentence that trails off with an ellipsis, a comma or a dash
    # Punctuation is no cue: Whisper ends a sentence cut at "to" with a full stop or a question
    # mark as often as not ("Can you send the invoice to?").
    return final.strip('.,;:!?"()') in UNFINISHED_ENDINGS
