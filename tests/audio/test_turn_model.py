"""Smart Turn: the packaged model, its input, and how well it hears finished and unfinished sentences."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import soxr

from duplex_gateway.audio.mel import SAMPLE_RATE, log_mel
from duplex_gateway.audio.turn_model import FRAMES, WINDOW_SAMPLES, SmartTurn, default_model_path
from duplex_gateway.audio.vad import default_model_path as vad_model_path
from tests.fixtures import load_speech

MODELS = Path(__file__).resolve().parents[2] / "duplex_gateway" / "models"


def test_packaged_model_is_the_file_its_readme_describes() -> None:
    path = default_model_path()
    assert path.name == "smart_turn_v3.2.onnx" and path.is_file()
    row = next(line for line in (MODELS / "README.md").read_text().splitlines() if path.name in line)
    stated = re.search(r"sha256 `([0-9a-f]{64})`", row)
    assert stated is not None, row
    assert hashlib.sha256(path.read_bytes()).hexdigest() == stated.group(1)
    licence = (MODELS / "smart_turn.LICENSE").read_text()
    assert licence.startswith("BSD 2-Clause License") and "Daily" in licence


def test_shared_model_is_one_instance() -> None:
    assert SmartTurn.shared() is SmartTurn.shared()


def test_prepare_keeps_the_last_eight_seconds_and_pads_a_short_turn_in_front() -> None:
    speech = load_speech()
    short = SmartTurn.prepare(speech)
    assert short.shape == (80, FRAMES) and short.dtype == np.float32
    padded = np.concatenate([np.zeros(WINDOW_SAMPLES - speech.size, dtype=np.float32), speech])
    np.testing.assert_array_equal(short, log_mel(padded))
    long = np.concatenate([np.random.default_rng(0).standard_normal(3 * SAMPLE_RATE) * 0.1, speech, speech])
    np.testing.assert_array_equal(SmartTurn.prepare(long), log_mel(long[-WINDOW_SAMPLES:]))
    assert SmartTurn.prepare(np.zeros(WINDOW_SAMPLES, dtype=np.float32)).shape == (80, FRAMES)


def test_a_batch_gives_each_turn_its_own_probability() -> None:
    model = SmartTurn.shared()
    speech = load_speech()
    turns = [speech, speech[: speech.size // 2], np.zeros(4000, dtype=np.float32)]
    features = np.stack([model.prepare(turn) for turn in turns])
    batched = model.predict(features)
    alone = [model.completion(turn) for turn in turns]
    assert len(batched) == 3 and all(0.0 <= p <= 1.0 for p in batched)
    # int8 kernels may order their sums differently per batch size.
    np.testing.assert_allclose(batched, alone, atol=1e-3)
    assert model.predict(features[:0]) == []


def test_rejects_inputs_and_models_it_does_not_know() -> None:
    model = SmartTurn.shared()
    with pytest.raises(ValueError, match="batch, 80, 800"):
        model.predict(np.zeros((80, FRAMES), dtype=np.float32))
    with pytest.raises(ValueError, match="batch, 80, 800"):
        model.predict(np.zeros((1, 80, 400), dtype=np.float32))
    with pytest.raises(ValueError, match="mono"):
        model.prepare(np.zeros((2, 1000), dtype=np.float32))
    with pytest.raises(ValueError, match="not a Smart Turn"):
        SmartTurn.load(vad_model_path())


# --- accuracy on synthesized speech -----------------------------------------------------

#: Whole sentences, statements and questions: the caller is done.
COMPLETE = (
    "What time does the pharmacy close tonight?",
    "I need to change my delivery address.",
    "Can you book a table for four at eight?",
    "Thank you, that is all I needed.",
)
#: Sentences stopped at a word no sentence ends on: the caller is not done.
CUT = (
    "I would like to book a table for",
    "Can you tell me the",
    "My account number is",
    "The reason I am calling is because",
)
#: Piper's length scale: faster, normal and slower speech.
RATES = (0.8, 1.0, 1.25)
#: What voice activity leaves after the last word before the model is asked.
TRAILING_SILENCE_S = 0.2


@pytest.fixture(scope="module")
def probabilities() -> dict[tuple[str, float], float]:
    """Smart Turn's probability of completion for every sentence at every rate.

    Spoken by the embedded engine's Piper voice with its noise switched off, so the
    audio (and the figures in failure messages) is the same run after run.
    """
    piper = pytest.importorskip("piper", reason="the speech comes from the embedded extra's Piper voice")
    from duplex_gateway.engine.embedded.tts import default_voice_paths

    voice = piper.PiperVoice.load(*default_voice_paths())
    model = SmartTurn.shared()
    lead = np.zeros(SAMPLE_RATE // 4, dtype=np.float32)
    tail = np.zeros(int(TRAILING_SILENCE_S * SAMPLE_RATE), dtype=np.float32)
    results: dict[tuple[str, float], float] = {}
    for text in COMPLETE + CUT:
        for rate in RATES:
            config = piper.SynthesisConfig(length_scale=rate, noise_scale=0.0, noise_w_scale=0.0, volume=0.9)
            audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
            audio = soxr.resample(audio, voice.config.sample_rate, SAMPLE_RATE, quality="HQ")
            # Piper pads its own silence; the turn is measured from the last sound.
            loud = np.flatnonzero(np.abs(audio) > 0.01)
            spoken = audio[loud[0] : loud[-1] + 1].astype(np.float32)
            results[text, rate] = model.completion(np.concatenate([lead, spoken, tail]))
    return results


def _table(probabilities: dict[tuple[str, float], float], texts: tuple[str, ...]) -> str:
    return "; ".join(
        f"{text!r}: " + "/".join(f"{probabilities[text, rate]:.2f}" for rate in RATES) for text in texts
    )


def test_complete_sentences_are_heard_complete(probabilities: dict[tuple[str, float], float]) -> None:
    wrong = [key for key in probabilities if key[0] in COMPLETE and probabilities[key] <= 0.5]
    assert len(wrong) <= 1, _table(probabilities, COMPLETE)


@pytest.mark.xfail(
    strict=True,
    reason="Smart Turn v3.2 hears half of Piper's cut sentences as complete (Piper speaks a cut text "
    "as a whole utterance, and audio cut out of a whole sentence fared no better); at rates "
    "0.8/1.0/1.25: 'book a table for' 0.93/0.73/0.19, "
    "'tell me the' 0.83/0.30/0.06, 'account number is' 0.88/0.79/0.53, 'calling is because' 0.01",
)
def test_sentences_cut_mid_way_are_heard_incomplete(probabilities: dict[tuple[str, float], float]) -> None:
    wrong = [key for key in probabilities if key[0] in CUT and probabilities[key] > 0.5]
    assert len(wrong) <= 1, _table(probabilities, CUT)


def test_cut_sentences_score_far_below_complete_ones(probabilities: dict[tuple[str, float], float]) -> None:
    complete = np.mean([probabilities[text, rate] for text in COMPLETE for rate in RATES])
    cut = np.mean([probabilities[text, rate] for text in CUT for rate in RATES])
    assert complete - cut >= 0.3, (
        f"complete {_table(probabilities, COMPLETE)}; cut {_table(probabilities, CUT)}"
    )
