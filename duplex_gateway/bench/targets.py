"""The servers the bench measures, each a subprocess on loopback that it starts and always stops.

Seven targets, in groups that answer the same question:

* ``floor`` and ``floor-picows`` (:mod:`duplex_gateway.bench.floor`) and
  ``gateway-echo``: what the gateway's connection layer costs above a bare
  ``websockets`` server, and where a Python server's own work stops (the same
  echo on picows, orjson and pybase64);
* ``gateway-echo-webrtc`` against ``gateway-echo``: what a call costs on WebRTC
  (Opus both ways, SRTP, the data channel) against the same engine on a WebSocket;
* ``omni-server`` (vLLM-Omni 0.30's own realtime handler) and
  ``gateway-vllm-omni`` (the gateway's in-process ``vllm-omni`` engine), both over
  the fake model stage the omni tests use, in the ``.venv-omni`` virtualenv;
* ``gateway-embedded``: the CPU speech engine, talked to with real speech and
  server VAD (no peer: its ratios are against its own single caller).

A target that cannot run here (no ``.venv-omni``) says why and is skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from duplex_gateway.bench.callers import TurnEnd, Wire

__all__ = ["REPO", "RunningServer", "Target", "TargetUnavailable", "default_targets", "start"]

REPO = Path(__file__).resolve().parents[2]
#: Chunks of each fake answer and the pause between two (as the omni tests run the fake stage).
FAKE_OMNI_CHUNKS = 8
#: Levels of the state store's pair of targets (issue 26 asks its cost at 100 and 300 callers).
STORE_LEVELS = (100, 300)
FAKE_OMNI_CHUNK_DELAY_MS = 60
_STOP_TIMEOUT_S = 20.0


class TargetUnavailable(RuntimeError):
    """The target cannot run on this machine (the message says why)."""


@dataclass(frozen=True)
class Target:
    """One server under test and how its callers talk to it."""

    name: str
    title: str
    wire: Wire
    turn_end: TurnEnd
    input_rate: int
    levels: tuple[int, ...]
    duration_s: float
    peer: str | None = None
    ready_path: str = "/readyz"
    ready_timeout_s: float = 60.0
    engine: str | None = None  # the gateway's engine; None for a server that is not the gateway
    omni: bool = False  # runs in the vLLM-Omni virtualenv
    webrtc: bool = False  # needs the webrtc extra (aiortc), on both sides
    config: dict[str, Any] = field(default_factory=dict)
    resumable: bool = False  # sessions journaled for a resume (limits.resume_grace_s > 0)
    state_store: bool = False  # sessions copied to a Redis the bench starts (server.state_store)


def default_targets() -> list[Target]:
    """The full side-by-side comparison, sized to finish in a few minutes on two cores."""
    # Issue 25's levels: the knee was between 100 and 150 callers, the goal is 300.
    many = (1, 50, 100, 150, 300)
    omni_levels = (1, 8, 32)

    def committed(name: str, title: str, **options: Any) -> Target:
        """Realtime callers committing their turns at 24 kHz, at every capacity level."""
        return Target(name, title, "realtime", "commit", 24_000, many, 8.0, **options)

    return [
        committed("floor", "bare websockets server (floor)", ready_path="/healthz"),
        committed(
            "floor-picows",
            "bare picows server, orjson and pybase64 (fast floor)",
            peer="floor",
            ready_path="/healthz",
        ),
        committed("gateway-echo", "gateway, engine echo", peer="floor", engine="echo"),
        # Issue 26: what copying every session to the fleet's state store costs, against the same
        # resumable sessions kept in the process alone (and those against sessions kept nowhere).
        Target(
            "gateway-echo-resumable",
            "gateway, engine echo, sessions resumable",
            "realtime",
            "commit",
            24_000,
            STORE_LEVELS,
            8.0,
            peer="gateway-echo",
            engine="echo",
            resumable=True,
        ),
        Target(
            "gateway-echo-store",
            "gateway, engine echo, sessions resumable and copied to Redis",
            "realtime",
            "commit",
            24_000,
            STORE_LEVELS,
            8.0,
            peer="gateway-echo-resumable",
            engine="echo",
            resumable=True,
            state_store=True,
        ),
        Target(
            "gateway-echo-webrtc",
            "gateway, engine echo, WebRTC callers",
            "webrtc",
            "commit",
            48_000,
            (1, 50),
            8.0,
            peer="gateway-echo",
            engine="echo",
            webrtc=True,
            config={"webrtc": {"host_addresses": ["127.0.0.1"]}},
        ),
        Target(
            "omni-server",
            "vLLM-Omni 0.30 server, fake stage",
            "vllm-omni",
            "commit",
            16_000,
            omni_levels,
            8.0,
            ready_path="/health",
            ready_timeout_s=240.0,
            omni=True,
        ),
        Target(
            "gateway-vllm-omni",
            "gateway, engine vllm-omni, fake stage",
            "realtime",
            "commit",
            16_000,
            omni_levels,
            8.0,
            peer="omni-server",
            ready_timeout_s=240.0,
            engine="vllm-omni",
            omni=True,
        ),
        Target(
            "gateway-embedded",
            "gateway, engine embedded",
            "realtime",
            "vad",
            24_000,
            (1, 4),
            20.0,
            ready_timeout_s=180.0,
            engine="embedded",
        ),
    ]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def omni_python() -> Path:
    """The vLLM-Omni virtualenv's interpreter (``make test`` / ``make omni-venv`` builds it)."""
    return Path(os.environ.get("OMNI_VENV", REPO / ".venv-omni")) / "bin" / "python"


@dataclass
class RunningServer:
    """A started target: its port, process and log."""

    target: Target
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def ws_url(self) -> str:
        """Where its callers connect."""
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def log_tail(self, chars: int = 2000) -> str:
        """The end of what the server wrote to stderr/stdout."""
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        """The process has not exited."""
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it lingers; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _command(
    target: Target, port: int, workdir: Path, max_callers: int, store_url: str | None = None
) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    env["HF_HUB_OFFLINE"] = "1"  # nothing is fetched at run time
    env["PYTHONUNBUFFERED"] = "1"
    python = sys.executable
    if target.omni:
        path = omni_python()
        if not path.exists():
            raise TargetUnavailable("no vLLM-Omni virtualenv (.venv-omni; `make omni-venv` builds it)")
        if not (REPO / "tests" / "omni" / "fake_stage").is_dir():
            raise TargetUnavailable("the fake model stage (tests/omni/fake_stage) is not in this checkout")
        python = str(path)
        env.update(
            FAKE_OMNI_CHUNKS=str(FAKE_OMNI_CHUNKS),
            FAKE_OMNI_CHUNK_DELAY_MS=str(FAKE_OMNI_CHUNK_DELAY_MS),
            FAKE_OMNI_MAX_SESSIONS=str(max_callers),
        )
        env.pop("FAKE_OMNI_CALL_LOG", None)
    if target.webrtc and not _has_webrtc():
        raise TargetUnavailable("the webrtc extra is not installed (pip install 'duplex-gateway[webrtc]')")
    if target.engine is None and target.name in _FLOORS:
        if target.name == "floor-picows" and not _has_picows():
            raise TargetUnavailable("picows is not installed (pip install 'duplex-gateway[bench]')")
        server = _FLOORS[target.name]
        return [python, "-m", "duplex_gateway.bench.floor", "--port", str(port), "--server", server], env
    if target.engine is None:
        return [python, "-m", "tests.omni.backend_server", "--port", str(port)], env
    engine: dict[str, Any] = {"name": target.engine}
    if target.engine == "embedded":
        engine["embedded"] = {"max_sessions": max_callers}
    config = {
        "server": {"web_demo": False, "log_level": "warning"},
        "limits": {"max_sessions": max(64, max_callers * 2), "resume_grace_s": 30 if target.resumable else 0},
        "engine": engine,
        **target.config,
    }
    if store_url is not None:
        config["server"]["state_store"] = store_url
    path = workdir / f"{target.name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    cmd = [
        python,
        "-m",
        "duplex_gateway",
        "serve",
        "--config",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if target.engine == "vllm-omni":
        cmd += ["--omni-factory", "tests.omni.fake_stage:duplex_omni"]
    return cmd, env


#: The floor targets and the server each runs.
_FLOORS = {"floor": "websockets", "floor-picows": "picows"}


def _has_picows() -> bool:
    import importlib.util

    return importlib.util.find_spec("picows") is not None


def _has_webrtc() -> bool:
    from duplex_gateway.server.webrtc import webrtc_available

    return webrtc_available()


def _ready(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


@contextlib.contextmanager
def start(target: Target, workdir: Path, *, max_callers: int) -> Iterator[RunningServer]:
    """Start ``target``, wait until it is ready, yield it, and stop it whatever happens."""
    with contextlib.ExitStack() as stack:
        store_url = stack.enter_context(_redis(workdir)) if target.state_store else None
        yield stack.enter_context(_serve(target, workdir, max_callers=max_callers, store_url=store_url))


@contextlib.contextmanager
def _redis(workdir: Path) -> Iterator[str]:
    """A Redis for the gateway's state store (Debian's redis-server, no persistence); its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise TargetUnavailable("redis-server is not installed (the state store's target needs it)")
    port = _free_port()
    with open(workdir / "redis.log", "wb") as out:
        proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise TargetUnavailable("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def _serve(
    target: Target, workdir: Path, *, max_callers: int, store_url: str | None
) -> Iterator[RunningServer]:
    port = _free_port()
    cmd, env = _command(target, port, workdir, max_callers, store_url)
    log = workdir / f"{target.name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    server = RunningServer(target, port, proc, log)
    try:
        deadline = time.monotonic() + target.ready_timeout_s
        while not _ready(port, target.ready_path):
            if not server.alive():
                raise TargetUnavailable(
                    f"exited with {proc.returncode} before it was ready:\n{server.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TargetUnavailable(
                    f"not ready after {target.ready_timeout_s:.0f} s:\n{server.log_tail()}"
                )
            time.sleep(0.1)
        yield server
    finally:
        server.stop()
