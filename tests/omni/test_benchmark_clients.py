"""vLLM-Omni 0.30's own duplex benchmark tools, run as they are against real gateways.

``vllm-omni bench omni-duplex-eval --omni generate`` (Omni-DuplexEval) and ``vllm-omni bench
serve --omni --backend openai-realtime-duplex --dataset-name omniinteract`` (OmniInteract)
are the command-line tools vLLM-Omni measures its duplex server with. Their datasets live on
a model hub this suite cannot reach, so each test makes a small one in the layout the tool
reads (a JSONL manifest, or OmniInteract's ``video_json_map.json`` tree; a WAV of the speech
fixture and an MP4 carrying it), and OmniInteract gets a small local tokenizer. Only the
``generate`` phase runs: scoring needs a judge model.

Both stream caller audio in real time with a camera frame (JPEG) riding an append each
second, commit once, acknowledge what they played with ``playback.ack`` naming the reply's
item ``item_<response_id>`` as vLLM-Omni does, and close with ``session.close``. OmniInteract
fails a session on any ``error`` event and warns when an audio delta leaves out its format.
The gateways run the in-process ``vllm-omni`` engine over the fake model stage (which, like
MiniCPM-o 4.5, takes camera frames with its audio), the ``remote`` engine in front of
vLLM-Omni's own server over the same stage, and the ``echo`` engine (which sees nothing, and
says so once). What the gateway sent is read from its own session recording.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm_omni", reason="vLLM-Omni's tools run in .venv-omni (make test runs them there)")

import av
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.e2e.helpers import GatewayFactory, gateway_env, load_speech
from tests.omni.conftest import (
    Backend,
    read_calls,
    start_backend,
    start_omni_gateway,
    stop_backends,
    wait_healthy,
)

pytestmark = pytest.mark.e2e

MODEL = "fake-echo"
RATE = 16_000
CLIP_S = 3
#: The tools' own time for one session is a few seconds (real-time streaming); starting one
#: imports vLLM (≈30 s on two cores).
TOOL_TIMEOUT_S = 300
ENGINES = ["echo", "vllm-omni", "remote"]
TOOLS = ["omni-duplex-eval", "omniinteract"]
VLLM_OMNI = Path(sys.executable).parent / "vllm-omni"


# -- the data the tools read -------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    root: Path
    question_wav: Path
    clip_mp4: Path
    manifest: Path
    omniinteract: Path
    tokenizer: Path


def _write_wav(path: Path, pcm: bytes) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm)


def _write_mp4(path: Path, pcm: bytes) -> None:
    """A CLIP_S clip: 10 frames a second of a changing grey, and the speech as its sound track."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=10)
        video.width, video.height, video.pix_fmt = 160, 120, "yuv420p"
        audio = out.add_stream("aac", rate=RATE)
        audio.layout = "mono"
        for index in range(CLIP_S * 10):
            picture = np.full((120, 160, 3), index * 8 % 256, dtype=np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        for offset in range(0, samples.size, 1024):
            frame = av.AudioFrame.from_ndarray(
                samples[offset : offset + 1024].reshape(1, -1), format="flt", layout="mono"
            )
            frame.sample_rate, frame.pts = RATE, offset
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode():
            out.mux(packet)


def _write_tokenizer(root: Path) -> None:
    """A word-level tokenizer saved the way ``transformers`` loads one offline (the tool asks for one)."""
    root.mkdir()
    vocab = {"[UNK]": 0, "[PAD]": 1, "<s>": 2, "</s>": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(root / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 4096,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp("benchmark-data")
    speech = load_speech(RATE)
    pcm = speech[int(0.5 * RATE) * 2 :][: CLIP_S * RATE * 2]  # the fixture's speech starts ≈0.5 s in
    question, clip = root / "question.wav", root / "clip.mp4"
    _write_wav(question, pcm)
    _write_mp4(clip, pcm)
    # Omni-DuplexEval: one row of a manifest, in one of its real-time splits.
    manifest = root / "duplex_eval.jsonl"
    row = {
        "id": "clip1",
        "split": "RTD_OCR",
        "video": str(clip),
        "question_audio": str(question),
        "question_text": "What is on the screen?",
        "video_duration": float(CLIP_S),
    }
    manifest.write_text(json.dumps(row) + "\n", encoding="utf-8")
    # OmniInteract: one session of its 1q1a subset (a mapping, the video, its annotation).
    subset = root / "omniinteract" / "1q1a"
    (subset / "videos").mkdir(parents=True)
    (subset / "annotations").mkdir()
    shutil.copy(clip, subset / "videos" / "clip1.mp4")
    annotation = {"conversations": [{"question_type": "realtime", "question": "What is on the screen?"}]}
    (subset / "annotations" / "clip1.json").write_text(json.dumps(annotation), encoding="utf-8")
    mapping = {
        "entries": [
            {"video": "videos/clip1.mp4", "annotation": "annotations/clip1.json", "scene_type": "multi_turn"}
        ]
    }
    (subset / "video_json_map.json").write_text(json.dumps(mapping), encoding="utf-8")
    tokenizer = root / "tokenizer"
    _write_tokenizer(tokenizer)
    return Dataset(root, question, clip, manifest, root / "omniinteract", tokenizer)


# -- the gateways ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    engine: str
    url: str
    recordings: Path
    calls: Path | None


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
    return {}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """vLLM-Omni's own server over the fake stage, for the remote engine."""
    backend = start_backend(tmp_path_factory.mktemp("backend"), "backend", chunks=8, chunk_delay_ms=60)
    try:
        wait_healthy([backend])
        yield backend
    finally:
        stop_backends([backend])


@pytest.fixture(params=ENGINES)
def target(
    request: pytest.FixtureRequest, targets: dict[str, Target], tmp_path_factory: pytest.TempPathFactory
) -> Target:
    """A gateway with engine ``request.param``, recording every session (started once per module)."""
    engine: str = request.param
    if engine not in targets:
        factory: GatewayFactory = request.getfixturevalue("module_gateway_factory")
        recordings = tmp_path_factory.mktemp(f"recordings-{engine}")
        settings: dict[str, Any] = {
            "server": {"web_demo": False},
            "recording": {"enabled": True, "directory": str(recordings)},
        }
        calls: Path | None = None
        if engine == "echo":
            gateway = factory.start({**settings, "engine": {"name": "echo"}}, name="echo")
        elif engine == "remote":
            upstream: Backend = request.getfixturevalue("backend")
            calls = upstream.calls
            gateway = factory.start(
                {**settings, "engine": {"name": "remote", "remote": {"backends": [{"url": upstream.url}]}}},
                name="remote",
            )
        else:
            calls = request.getfixturevalue("calls_path")
            gateway = start_omni_gateway(
                factory,
                engine="vllm-omni",
                omni_factory="tests.omni.fake_stage:duplex_omni",
                calls=calls,
                name="vllm-omni",
                config=settings,
            )
        targets[engine] = Target(engine, f"127.0.0.1:{gateway.port}", recordings, calls)
    return targets[engine]


# -- running a tool ----------------------------------------------------------------------------


def _tool_command(tool: str, target: Target, data: Dataset, out: Path) -> list[str]:
    if tool == "omni-duplex-eval":
        return [
            str(VLLM_OMNI),
            "bench",
            "omni-duplex-eval",
            "--omni",
            "generate",
            "--url",
            f"ws://{target.url}/v1/realtime?duplex=1",
            "--dataset",
            str(data.manifest),
            "--model",
            MODEL,
            "--ref-audio",
            str(data.question_wav),
            "--response-root",
            str(out),
        ]
    return [
        str(VLLM_OMNI),
        "bench",
        "serve",
        "--omni",
        "--backend",
        "openai-realtime-duplex",
        "--dataset-name",
        "omniinteract",
        "--dataset-path",
        str(data.omniinteract),
        "--omniinteract-subsets",
        "1q1a",
        "--base-url",
        f"http://{target.url}",
        "--endpoint",
        "/v1/realtime",
        "--model",
        MODEL,
        "--tokenizer",
        str(data.tokenizer),
        "--omniinteract-ref-audio",
        str(data.question_wav),
        "--omniinteract-output-dir",
        str(out),
        "--num-prompts",
        "1",
    ]


def _run_tool(command: list[str], log: Path) -> None:
    env = gateway_env()
    with open(log, "wb") as output:
        proc = subprocess.run(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{command[2]} exited {proc.returncode}:\n{log.read_text(errors='replace')[-6000:]}",
            pytrace=False,
        )


def _recorded_session(recordings: Path, before: set[Path]) -> list[dict[str, Any]]:
    """The log of the one session recorded since ``before``, once its recording is complete."""
    new = [path for path in recordings.iterdir() if path not in before]
    assert len(new) == 1, f"expected one recorded session, found {new}"
    log = new[0] / "events.jsonl"
    deadline = time.monotonic() + 20
    while True:  # the recording's writer thread ends the log a moment after the session
        lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        if any(line.get("kind") == "end" for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def _check_tool_result(tool: str, out: Path) -> None:
    """The tool's own verdict on the session, from the artifacts it wrote."""
    if tool == "omni-duplex-eval":
        meta = json.loads((out / "RTD_OCR" / "clip1.meta.json").read_text(encoding="utf-8"))
        assert meta["response_done"] is True, meta
        assert meta["drain_timeout"] is None and meta["close_timeout"] is None, meta
        assert (out / "RTD_OCR" / "clip1.json").is_file()
        return
    summary = json.loads((out / "batch_summary.json").read_text(encoding="utf-8"))
    (result,) = summary["results"]
    # OmniInteract fails a session on any error event (an unknown playback.ack item included).
    assert (summary["success"], result["error"]) == (1, ""), result
    assert result["responses"] >= 1 and result["input_video_frames"] >= CLIP_S, result
    # Nothing the tool had to guess: every audio delta named its format and rate.
    assert result["artifact_warnings"] == [], result["artifact_warnings"]


def _require_media_tools() -> None:
    # OmniInteract cuts its input from the video with ffmpeg and ffprobe (CI installs them).
    missing = [name for name in ("ffmpeg", "ffprobe") if shutil.which(name) is None]
    if missing and os.environ.get("DUPLEX_GATEWAY_REQUIRE_OMNI") == "1":
        pytest.fail(
            f"OmniInteract needs {' and '.join(missing)} on PATH (Debian's ffmpeg package)", pytrace=False
        )
    if missing:
        pytest.skip(f"OmniInteract needs {' and '.join(missing)}")


@pytest.mark.parametrize("tool", TOOLS)
def test_benchmark_tool_completes_every_turn_without_an_error(
    tool: str, target: Target, dataset: Dataset, tmp_path: Path
) -> None:
    if tool == "omniinteract":
        _require_media_tools()
    before = set(target.recordings.iterdir())
    calls_before = len(read_calls(target.calls)) if target.calls is not None else 0
    out = tmp_path / "out"
    _run_tool(_tool_command(tool, target, dataset, out), tmp_path / f"{tool}.log")
    _check_tool_result(tool, out)

    events = _recorded_session(target.recordings, before)
    sent = [line for line in events if line.get("kind") == "server"]
    received = [line for line in events if line.get("kind") == "client"]
    kinds = [line["type"] for line in sent]
    assert "error" not in kinds, [line["event"] for line in sent if line["type"] == "error"]
    # The caller's audio all counted (none refused for the frames beside it), and the turn was answered.
    appends = [line["frame"] for line in received if line["frame"].get("type") == "input_audio_buffer.append"]
    with_frames = [frame for frame in appends if frame.get("video_frames")]
    assert len(appends) >= CLIP_S and len(with_frames) >= CLIP_S
    assert kinds.count("input_audio_buffer.committed") == 1
    done = [line["event"] for line in sent if line["type"] == "response.done"]
    assert [reply["status"] for reply in done][-1:] == ["completed"], done
    # What the client played came back acknowledged, under vLLM-Omni's name for the reply's item.
    acks = [line["frame"] for line in received if line["frame"].get("type") == "playback.ack"]
    assert acks and all(frame["item_id"] == f"item_{frame['response_id']}" for frame in acks)
    assert kinds.count("playback.acknowledged") == len(acks)
    # The camera frames: to the engine that sees them, or one word that they are not used.
    ignored = [line["event"] for line in sent if line["type"] == "input.ignored"]
    if target.engine == "echo":
        assert [notice["input"] for notice in ignored] == ["video_frames"]
    else:
        assert ignored == []
        assert target.calls is not None
        seen = [call for call in read_calls(target.calls)[calls_before:] if call["call"] == "video_frames"]
        assert sum(call["frames"] for call in seen) == sum(
            len(frame["video_frames"]) for frame in with_frames
        )
        assert all(call["audio_bytes"] > 0 for call in seen)  # each rode audio, as MiniCPM-o takes them
