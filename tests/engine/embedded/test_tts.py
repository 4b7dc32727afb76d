"""Piper synthesis with the wheel-shipped voice, the sentence splitter, and a round trip through Whisper."""

from __future__ import annotations

import time

import numpy as np
import pytest
import soxr

from duplex_gateway.engine.embedded.asr import FinalRecognizer
from duplex_gateway.engine.embedded.tts import (
    PiperSynthesizer,
    default_voice_paths,
    quick_start,
    split_sentences,
    voice_sample_rate,
)


def seconds(pcm: bytes, rate: int) -> float:
    return len(pcm) / 2 / rate


# -- the splitter (pure) ------------------------------------------------------------------


def test_splits_at_sentence_ends() -> None:
    text = "You said: what time is it? It's 3:07 PM UTC. Great!"
    assert split_sentences(text) == ["You said: what time is it?", "It's 3:07 PM UTC.", "Great!"]


def test_keeps_abbreviations_initials_and_decimals_together() -> None:
    text = "Dr. Smith met J. Doe at 3.5 p.m. today. Then he left."
    assert split_sentences(text) == ["Dr. Smith met J. Doe at 3.5 p.m. today.", "Then he left."]


def test_closing_quotes_stay_with_their_sentence() -> None:
    assert split_sentences('He said "stop." Then silence.') == ['He said "stop."', "Then silence."]


def test_lines_are_separate_and_whitespace_collapses() -> None:
    assert split_sentences("First line\n\n  second   line  ") == ["First line", "second line"]


def test_long_sentences_are_cut_at_clause_breaks() -> None:
    clause = "one two three four five six seven eight nine ten"
    text = ", ".join([clause] * 8) + "."
    pieces = split_sentences(text, max_chars=120)
    assert all(len(piece) <= 120 for piece in pieces)
    assert all(piece.endswith((",", ".")) for piece in pieces)
    assert " ".join(pieces) == text


def test_a_word_longer_than_the_limit_is_cut_anyway() -> None:
    pieces = split_sentences("x" * 250, max_chars=100)
    assert [len(piece) for piece in pieces] == [100, 100, 50]


@pytest.mark.parametrize("text", ["", "   ", "\n\n"])
def test_empty_text_has_no_sentences(text: str) -> None:
    assert split_sentences(text) == []


# -- the voice -----------------------------------------------------------------------------


def test_voice_ships_in_its_wheel() -> None:
    model, config = default_voice_paths()
    assert model.suffix == ".onnx" and model.is_file()
    assert config.name.endswith(".onnx.json") and config.is_file()
    assert voice_sample_rate(config) == 22_050


def test_synthesize_gives_pcm16_speech(synthesizer: PiperSynthesizer) -> None:
    assert synthesizer.sample_rate == 22_050
    started = time.perf_counter()
    pcm = synthesizer.synthesize("You said: please send me the weather report for Tuesday morning.")
    elapsed = time.perf_counter() - started
    assert len(pcm) % 2 == 0
    duration = seconds(pcm, synthesizer.sample_rate)
    assert 2.0 < duration < 6.0
    samples = np.frombuffer(pcm, dtype="<i2")
    assert 10_000 < int(np.abs(samples).max()) < 32_000  # loud, with head-room
    print(f"\npiper: {duration:.2f} s of audio in {elapsed:.3f} s (RTF {elapsed / duration:.3f})")


def test_empty_or_unspeakable_text_is_silence(synthesizer: PiperSynthesizer) -> None:
    assert synthesizer.synthesize("") == b""
    assert synthesizer.synthesize("   ") == b""
    assert synthesizer.synthesize("...") == b""


def test_unusual_text_does_not_fail(synthesizer: PiperSynthesizer) -> None:
    assert len(synthesizer.synthesize("Caf\u00e9 \U0001f600 \u2603 100% <b>&amp;</b>")) > 0


def test_speed_changes_the_length(synthesizer: PiperSynthesizer) -> None:
    normal = synthesizer.synthesize("This sentence is spoken at two speeds.")
    fast = synthesizer.synthesize("This sentence is spoken at two speeds.", speed=2.0)
    assert len(fast) < 0.7 * len(normal)


def test_shared_voice_is_loaded_once(synthesizer: PiperSynthesizer) -> None:
    assert PiperSynthesizer.shared(threads=2) is synthesizer


def test_first_sentence_comes_before_the_whole_reply(synthesizer: PiperSynthesizer) -> None:
    reply = (
        "You said: tell me a long story. I'm a small demo, so my stories are short. "
        "Once there was a gateway. It listened, and it spoke. The end."
    )
    sentences = split_sentences(reply)
    started = time.perf_counter()
    first = synthesizer.synthesize(sentences[0])
    first_at = time.perf_counter() - started
    rest = [synthesizer.synthesize(sentence) for sentence in sentences[1:]]
    total = time.perf_counter() - started
    audio = seconds(first + b"".join(rest), synthesizer.sample_rate)
    assert len(sentences) == 5 and first_at < total
    print(
        f"\npiper: first sentence after {first_at:.3f} s; {audio:.2f} s of reply in {total:.3f} s "
        f"(RTF {total / audio:.3f})"
    )


def test_round_trip_through_whisper(synthesizer: PiperSynthesizer, final_recognizer: FinalRecognizer) -> None:
    pcm = synthesizer.synthesize("What time is it?")
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    at_16k = soxr.resample(samples, synthesizer.sample_rate, 16_000).astype(np.float32)
    heard = final_recognizer.transcribe(at_16k)
    assert "time" in heard.lower()


def test_quick_start_splits_a_short_opening_clause() -> None:
    assert quick_start(["You said: please send me the weather report for Tuesday.", "Bye."]) == [
        "You said:",
        "please send me the weather report for Tuesday.",
        "Bye.",
    ]
    long_opening = "This opening clause runs on for far too many characters, then stops."
    assert quick_start([long_opening]) == [long_opening]
    assert quick_start(["You said: help."]) == ["You said: help."]  # short: left whole
    no_break = "There is no clause break anywhere in this longer sentence."
    assert quick_start([no_break]) == [no_break]
    assert quick_start([]) == []


def test_short_phrases_are_spoken_once(
    synthesizer: PiperSynthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    spoken: list[str] = []
    real = synthesizer._speak

    def counting(sentence: str, speed: float) -> bytes:
        spoken.append(sentence)
        return real(sentence, speed)

    monkeypatch.setattr(synthesizer, "_speak", counting)
    first = synthesizer.synthesize("Cache me, please.")
    assert synthesizer.synthesize("Cache me, please.") == first
    synthesizer.synthesize("Cache me, please.", speed=1.5)  # another speed is another entry
    long_sentence = "This sentence is far too long to be worth keeping in the cache."
    synthesizer.synthesize(long_sentence)
    synthesizer.synthesize(long_sentence)
    assert spoken == ["Cache me, please.", "Cache me, please.", long_sentence, long_sentence]
