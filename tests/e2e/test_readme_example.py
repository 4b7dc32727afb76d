"""The README's ``openai`` example, run as printed against a real gateway on a clip like espeak-ng's.

The snippet is taken from README.md as it stands (the first Python block of "Trying a client
against the echo engine") and run by this interpreter, whose ``openai`` is the test extra's; the
only change is the port, 8000 in the README (``make run``'s), here the test gateway's. The clip
is the speech fixture at espeak-ng's 22,050 Hz ending in espeak-ng's 0.31 s of silence: less
than server VAD's 500 ms, on which the README's earlier example waited for ever.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from tests.e2e.helpers import REPO, SPEECH_WAV, GatewayFactory, gateway_env

pytestmark = pytest.mark.e2e

README = REPO / "README.md"
SECTION = "### Trying a client against the `echo` engine"
README_URL = "ws://127.0.0.1:8000/v1"


def readme_section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def readme_snippet() -> str:
    return readme_section().split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


def espeak_like_clip(path: Path, rate: int = 22_050, trailing_silence_s: float = 0.31) -> float:
    """The fixture's speech, cut to end ``trailing_silence_s`` after its last loud sample; its silence at the end."""
    pcm, source_rate = sf.read(SPEECH_WAV, dtype="float32")
    loud = np.flatnonzero(np.abs(pcm) > 0.02)
    speech = pcm[max(0, int(loud[0]) - source_rate // 20) : int(loud[-1]) + 1]
    clip = np.concatenate([speech, np.zeros(int(trailing_silence_s * source_rate), np.float32)])
    sf.write(path, soxr.resample(clip, source_rate, rate), rate, subtype="PCM_16")
    written, _ = sf.read(path, dtype="float32")
    return float((len(written) - 1 - np.flatnonzero(np.abs(written) > 0.02)[-1]) / rate)


def test_the_readme_says_what_to_install_and_where_the_gateway_listens() -> None:
    section = readme_section()
    assert "pip install 'openai[realtime]'" in section
    assert readme_snippet().count(README_URL) == 1
    assert "port 8000" in section and "`make run`" in section


async def test_the_readme_openai_example_runs_as_printed(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory.start({"engine": {"name": "echo"}}, name="readme")
    silence_s = espeak_like_clip(tmp_path / "hello.wav")
    assert silence_s < 0.5, silence_s  # shorter than server VAD's silence_duration_ms
    snippet = readme_snippet()
    (tmp_path / "example.py").write_text(snippet.replace(README_URL, f"{gw.ws_url}/v1"), encoding="utf-8")
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = proc.stdout.split()
    assert events[0] == "session.created" and events[-1] == "response.done", events
    assert "session.updated" in events and "input_audio_buffer.committed" in events
    assert events.count("response.output_audio.delta") > 0, events
    assert "error" not in events, events
    await gw.wait_sessions(0)
