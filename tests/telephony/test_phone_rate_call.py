"""A Twilio call to the embedded engine: the caller's answer reaches the engine as they said it.

A caller on a handset (no echo on the line) starts the next turn while the engine's
reply is still playing, as callers do. The gateway's recording of the caller track is
what the engine was given; the second turn in it must be the caller's μ-law resampled
offline, not the caller with pieces of the reply subtracted from it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf
import soxr

from tests.e2e.helpers import Gateway, GatewayFactory, decode, encode, ws_connect
from tests.fixtures import PHRASES
from tests.telephony.phone import Phone
from tests.telephony.twilio_wire import TwilioWire

pytestmark = pytest.mark.e2e

PHONE_RATE = 8_000
ENGINE_RATE = 16_000


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("phone-rate") / "recordings"


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory, recordings: Path) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "embedded"},
            "recording": {"enabled": True, "directory": str(recordings)},
        },
        name="twilio-embedded",
    )


def _line(samples: npt.NDArray[np.float32], before_s: float, after_s: float) -> bytes:
    pad = np.zeros(int(PHONE_RATE * before_s), np.float32), np.zeros(int(PHONE_RATE * after_s), np.float32)
    return encode(np.concatenate([pad[0], samples, pad[1]]), "g711_ulaw")


def _caller_track(recordings: Path, timeout: float = 20.0) -> npt.NDArray[np.float32]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folders = [p for p in recordings.iterdir() if p.is_dir()] if recordings.is_dir() else []
        if folders and '"kind":"end"' in (folders[0] / "events.jsonl").read_text(encoding="utf-8"):
            track, rate = sf.read(str(folders[0] / "caller.flac"), dtype="float32")
            assert rate == ENGINE_RATE
            return np.asarray(track, np.float32)
        time.sleep(0.1)
    raise AssertionError(f"no finished recording in {recordings}")


async def test_an_answer_over_the_replys_end_reaches_the_engine_as_spoken(
    gateway: Gateway, recordings: Path
) -> None:
    first = _line(PHRASES[5].load(PHONE_RATE), 0.5, 0.8)
    answer = _line(PHRASES[1].load(PHONE_RATE), 0.0, 1.2)
    async with ws_connect(gateway, "/telephony/twilio") as ws, Phone(ws, TwilioWire()) as phone:
        await phone.say(first)
        # The reply starts playing; the caller answers over it, a second into it.
        await phone.wait(lambda p: len(p.played) > PHONE_RATE, timeout=30)
        await phone.say(answer)
        await phone.hang_up()
    track = _caller_track(recordings)
    spoken = soxr.resample(decode(answer, "g711_ulaw"), PHONE_RATE, ENGINE_RATE, quality="HQ")
    speech = spoken[: int(ENGINE_RATE * 2.0)]  # the words, not the silence after them
    score = np.correlate(track, speech, "valid")
    start = int(np.argmax(score))
    heard = track[start : start + speech.size]
    error = heard - speech
    snr_db = 10 * np.log10(float(np.sum(speech**2)) / max(float(np.sum(error**2)), 1e-12))
    print(f"\nthe answer as the engine got it: {snr_db:.1f} dB from what was said")
    assert snr_db >= 30.0, f"the caller's answer reached the engine {snr_db:.1f} dB from what they said"
