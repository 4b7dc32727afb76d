"""semantic_vad's judge: the real end-of-turn model on a session's latest audio, verdicts handed back."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio.turn_detector import SpeechCandidate
from duplex_gateway.host.turn_judge import TurnJudge
from duplex_gateway.session.engine_calls import AssessTurn
from tests.fixtures import SPEECH_END_MS, load_speech

CALL = AssessTurn(
    item_id="item_1", candidate=SpeechCandidate(audio_end_ms=3600, speech_end_ms=3386), threshold=0.5
)


def _sentence() -> npt.NDArray[np.float32]:
    """The fixture's whole sentence and 200 ms of the silence after it, at 16 kHz."""
    speech = load_speech(16_000)
    return speech[: (SPEECH_END_MS + 200) * 16].astype(np.float32)


class _Verdicts:
    def __init__(self) -> None:
        self.got: list[tuple[AssessTurn, float | None, float]] = []
        self.event = asyncio.Event()

    def __call__(self, call: AssessTurn, probability: float | None, ms: float) -> None:
        self.got.append((call, probability, ms))
        self.event.set()


async def test_a_finished_sentence_is_judged_done_by_the_packaged_model() -> None:
    verdicts = _Verdicts()
    judge = TurnJudge(recent=_sentence, verdict=verdicts, name="s")
    judge.assess(CALL)
    await asyncio.wait_for(verdicts.event.wait(), 30)
    await judge.close()
    ((call, probability, ms),) = verdicts.got
    assert call is CALL
    assert probability is not None and probability > 0.5
    assert ms > 0


async def test_a_model_past_its_deadline_is_no_verdict_and_the_silence_decides() -> None:
    async def stalled(samples: npt.NDArray[np.float32]) -> float:
        await asyncio.sleep(30)
        return 1.0

    verdicts = _Verdicts()
    judge = TurnJudge(recent=_sentence, verdict=verdicts, name="s", judge=stalled, timeout_s=0.05)
    judge.assess(CALL)
    await asyncio.wait_for(verdicts.event.wait(), 5)
    await judge.close()
    assert [p for _, p, _ in verdicts.got] == [None]


async def test_a_model_that_raises_is_no_verdict() -> None:
    async def broken(samples: npt.NDArray[np.float32]) -> float:
        raise RuntimeError("model failed")

    verdicts = _Verdicts()
    judge = TurnJudge(recent=_sentence, verdict=verdicts, name="s", judge=broken)
    judge.assess(CALL)
    await asyncio.wait_for(verdicts.event.wait(), 5)
    await judge.close()
    assert [p for _, p, _ in verdicts.got] == [None]


async def test_a_newer_judgement_replaces_one_running_and_closing_drops_the_last() -> None:
    started: list[int] = []

    async def slow(samples: npt.NDArray[np.float32]) -> float:
        started.append(samples.size)
        await asyncio.sleep(0.2)
        return 0.9

    verdicts = _Verdicts()
    judge = TurnJudge(recent=_sentence, verdict=verdicts, name="s", judge=slow)
    later = AssessTurn(
        item_id="item_1", candidate=SpeechCandidate(audio_end_ms=4600, speech_end_ms=3386), threshold=0.5
    )
    judge.assess(CALL)
    await asyncio.sleep(0.01)
    judge.assess(later)
    await asyncio.wait_for(verdicts.event.wait(), 5)
    assert [call for call, _, _ in verdicts.got] == [later]
    verdicts.event.clear()
    judge.assess(CALL)
    await asyncio.sleep(0.01)
    await judge.close()
    await asyncio.sleep(0.3)
    assert len(verdicts.got) == 1 and len(started) == 3
