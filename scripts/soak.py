#!/usr/bin/env python3
"""Soak a REAL gateway process with connect/disconnect cycles and resumes, and check nothing leaks.

    .venv/bin/python scripts/soak.py --cycles 10000 --resumes 1000     # the long run (make soak)
    .venv/bin/python scripts/soak.py --cycles 300 --resumes 50         # what make test runs

It starts ``python -m duplex_gateway serve`` with the echo engine on a free loopback port,
then runs the cycles a few at a time. A cycle is one client's whole life, in one of four
ways: it connects and closes (1000); it asks for a reply and closes in the middle of it;
it vanishes in the middle of a reply (TCP reset, no close frame: the session waits for a
resume, then ends); or it sends ``session.close``. A resume is vLLM-Omni's flow: a duplex
session, a turn, the socket reset, a new socket that sends ``session.resume`` and gets
``session.resumed``, then ``session.close``.

After a warm-up (a tenth of the cycles, at least a third up to 500), and again at the end once every session has had time
to end, it reads the server's resident memory and open files (``/proc``), and the
gateway's own accounting: live sessions and engine sessions (``/readyz``) and asyncio tasks
(``duplex_gateway_tasks`` in ``/metrics``). It passes (exit 0) when no session, engine
session, task or file descriptor is left over, memory grew less than ``--max-rss-growth``
(5 %) since the warm-up, every cycle ended as it should and the server logged no
traceback. ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

REPO = Path(__file__).resolve().parents[1]
#: 200 ms of silence at 24 kHz: enough audio for a turn the echo engine answers.
TURN = base64.b64encode(bytes(24_000 * 2 // 5)).decode()
CONFIG: dict[str, Any] = {
    "server": {"web_demo": False, "log_level": "warning", "drain_grace_s": 2},
    "engine": {"name": "echo", "echo": {"chunk_ms": 100, "pace": 1.0}},
    # A vanished client's session waits this long for a resume before it ends.
    "limits": {"resume_grace_s": 1, "max_sessions": 1024},
}


# -- the gateway process ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    stderr: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


def start_server(workdir: Path) -> Server:
    import yaml

    port = _free_port()
    config = workdir / "soak.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    stderr = workdir / "gateway.stderr.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "duplex_gateway",
                "serve",
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=REPO,
            env={**env, "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server(proc, port, stderr)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}:\n{stderr.read_text()[-3000:]}")
        try:
            if readyz(server)["status"] == "ready":
                return server
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the gateway did not become ready in 30 s")


def stop_server(server: Server) -> int | None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        return None


def readyz(server: Server) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(server.http + "/readyz", timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())  # type: ignore[no-any-return]


def tasks(server: Server) -> int:
    with urllib.request.urlopen(server.http + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("duplex_gateway_tasks "):
                return int(float(line.split()[1]))
    raise RuntimeError("/metrics has no duplex_gateway_tasks")


def snapshot(server: Server) -> dict[str, int]:
    pid = server.proc.pid
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    # Counted before the requests below: the socket of a request just answered may still be
    # open on the server's side for a moment, and would count as a leak.
    open_files = len(os.listdir(f"/proc/{pid}/fd"))
    ready = readyz(server)
    return {
        "rss_kib": rss,
        "fds": open_files,
        "tasks": tasks(server),
        "sessions": int(ready["sessions"]),
        "engine_sessions": int(ready["engine_sessions"]),
    }


async def quiet(server: Server, timeout_s: float) -> dict[str, int]:
    """Wait until no session is left (vanished clients' sessions end after their resume grace)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = await asyncio.to_thread(snapshot, server)
        if (snap["sessions"] == 0 and snap["engine_sessions"] == 0) or time.monotonic() > deadline:
            # A moment more for the last sockets' closes and tasks to finish.
            await asyncio.sleep(0.5)
            return await asyncio.to_thread(snapshot, server)
        await asyncio.sleep(0.2)


#: How long a socket may stay open after its session ended: the server waits this long for a
#: client to answer its close frame (uvicorn's close timeout) before it drops the connection.
CLOSE_HANDSHAKE_S = 10.0


async def open_files_settled(server: Server, target: int) -> int:
    """The server's open files once no more than ``target``, or after the close handshakes' time.

    A session can end while its socket still waits for the client's answer to the close; a
    leaked descriptor stays open for good.
    """
    deadline = time.monotonic() + CLOSE_HANDSHAKE_S + 2
    while True:
        count = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        if count <= target or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.2)


# -- the clients --------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def bad(self, what: str) -> None:
        self.outcomes["problem"] += 1
        if len(self.problems) < 20:
            self.problems.append(what)


def _open(url: str) -> Any:
    return connect(url, open_timeout=10, close_timeout=5, max_size=None, ping_interval=None, compression=None)


async def _event(ws: ClientConnection, timeout: float = 10.0) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))  # type: ignore[no-any-return]


async def _until(ws: ClientConnection, kind: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        event = await _event(ws, max(0.1, deadline - time.monotonic()))
        if event.get("type") == kind:
            return event
        if event.get("type") == "error":
            raise RuntimeError(f"error event: {event['error']}")


def _reset(ws: ClientConnection) -> None:
    """Vanish without a close frame: a TCP reset, as a dropped network or a killed client gives."""
    sock = ws.transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()


async def _ask_reply(ws: ClientConnection) -> None:
    await ws.send(
        json.dumps({"type": "session.update", "session": {"type": "realtime", "turn_detection": None}})
    )
    await _until(ws, "session.updated")
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": TURN}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await ws.send(json.dumps({"type": "response.create"}))
    await _until(ws, "response.output_audio.delta")


async def cycle(server: Server, kind: str, tally: Tally) -> None:
    try:
        async with _open(server.ws + "/v1/realtime") as ws:
            await _until(ws, "session.created")
            if kind == "close":
                await ws.close(1000)
            elif kind == "mid_reply_close":
                await _ask_reply(ws)
                await ws.close(1000)
            elif kind == "vanish":
                await _ask_reply(ws)
                _reset(ws)
            else:  # session_close
                await ws.send(json.dumps({"type": "session.close"}))
                await asyncio.wait_for(ws.wait_closed(), 10)
                if ws.close_code != 1000:
                    tally.bad(f"session.close ended with {ws.close_code}")
                    return
        tally.outcomes[kind] += 1
    except Exception as exc:  # noqa: BLE001 - every failure is counted and reported, none stops the soak
        tally.bad(f"{kind}: {type(exc).__name__}: {exc}")


async def resume(server: Server, tally: Tally) -> None:
    try:
        async with _open(server.ws + "/v1/duplex") as ws:
            await ws.send(
                json.dumps(
                    {"type": "session.update", "session": {"type": "realtime", "turn_detection": None}}
                )
            )
            created = await _until(ws, "session.created")
            session_id, token = created["session_id"], created["resume_token"]
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": TURN}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "response_create": True}))
            delta = await _until(ws, "response.output_audio.delta")
            last_seq = int(delta["server_event_seq"])
            _reset(ws)
        async with _open(server.ws + "/v1/duplex") as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "session.resume",
                        "session_id": session_id,
                        "resume_token": token,
                        "last_received_server_event_seq": last_seq,
                    }
                )
            )
            await _until(ws, "session.resumed")
            await ws.send(json.dumps({"type": "session.close"}))
            await asyncio.wait_for(ws.wait_closed(), 10)
            if ws.close_code != 1000:
                tally.bad(f"resumed session closed with {ws.close_code}")
                return
        tally.outcomes["resumed"] += 1
    except Exception as exc:  # noqa: BLE001 - counted and reported
        tally.bad(f"resume: {type(exc).__name__}: {exc}")


KINDS = ("close",) * 10 + ("mid_reply_close",) * 4 + ("vanish",) * 3 + ("session_close",) * 3


async def run(
    server: Server,
    cycles: int,
    resumes: int,
    concurrency: int,
    tally: Tally,
    seed: int,
    kinds: tuple[str, ...],
) -> None:
    rng = random.Random(seed)
    work = [("resume", None)] * resumes + [("cycle", rng.choice(kinds)) for _ in range(cycles)]
    rng.shuffle(work)
    queue: asyncio.Queue[tuple[str, str | None]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            what, kind = queue.get_nowait()
            if what == "resume":
                await resume(server, tally)
            else:
                assert kind is not None
                await cycle(server, kind, tally)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


# -- the soak -------------------------------------------------------------------------------------


async def soak(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    tally = Tally()
    grace = float(CONFIG["limits"]["resume_grace_s"])
    # The warm-up runs the same mix long enough to reach its peak of live and parked sessions:
    # memory the allocator took for that peak stays with the process, and is not a leak.
    warm_cycles = max(1, args.cycles // 10, min(args.cycles // 3, 500))
    warm_resumes = args.resumes * warm_cycles // max(1, args.cycles)
    started = time.monotonic()
    kinds = tuple(k for k in KINDS if k in args.kinds) if args.kinds else KINDS
    await run(server, warm_cycles, warm_resumes, args.concurrency, tally, args.seed, kinds)
    baseline = await quiet(server, grace + 10)
    measured = time.monotonic()
    # In two halves, with a look in between: a leak grows as much in the second half as in the
    # first; the allocator's high-water mark (the busiest moment so far) mostly in the first.
    cycles, resumes = args.cycles - warm_cycles, args.resumes - warm_resumes
    await run(server, cycles // 2, resumes // 2, args.concurrency, tally, args.seed + 1, kinds)
    middle = await quiet(server, grace + 10)
    await run(
        server, cycles - cycles // 2, resumes - resumes // 2, args.concurrency, tally, args.seed + 2, kinds
    )
    ran_s = time.monotonic() - measured - grace - 0.5
    final = await quiet(server, grace + 10)
    final["fds"] = await open_files_settled(server, baseline["fds"])
    growth = (final["rss_kib"] - baseline["rss_kib"]) / baseline["rss_kib"]
    log = server.stderr.read_text(errors="replace")
    checks = {
        "no_session_left": final["sessions"] == 0,
        "no_engine_session_left": final["engine_sessions"] == 0,
        "no_task_left": final["tasks"] <= baseline["tasks"],
        "no_fd_left": final["fds"] <= baseline["fds"],
        "rss_growth_under_limit": growth < args.max_rss_growth,
        "every_cycle_as_expected": tally.outcomes["problem"] == 0,
        "every_resume_resumed": tally.outcomes["resumed"] == args.resumes,
        "no_traceback_logged": "Traceback" not in log,
    }
    return {
        "cycles": args.cycles,
        "resumes": args.resumes,
        "concurrency": args.concurrency,
        "outcomes": dict(tally.outcomes),
        "problems": tally.problems,
        "baseline_after_warmup": baseline,
        "middle": middle,
        "final": final,
        "rss_growth": round(growth, 4),
        "rss_growth_halves": [
            round((middle["rss_kib"] - baseline["rss_kib"]) / baseline["rss_kib"], 4),
            round((final["rss_kib"] - middle["rss_kib"]) / baseline["rss_kib"], 4),
        ],
        "cycles_per_s": round((args.cycles - warm_cycles + args.resumes - warm_resumes) / ran_s, 1),
        "total_s": round(time.monotonic() - started, 1),
        "checks": checks,
        "passed": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cycles", type=int, default=10_000, help="connect/disconnect cycles (default 10000)"
    )
    parser.add_argument(
        "--resumes", type=int, default=1_000, help="dropped-and-resumed sessions (default 1000)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="clients at a time (default 8)")
    parser.add_argument("--max-rss-growth", type=float, default=0.05, help="after warm-up (default 0.05)")
    parser.add_argument("--seed", type=int, default=1, help="the mix of cycle kinds")
    parser.add_argument(
        "--kinds", nargs="+", choices=sorted(set(KINDS)), help="only these kinds of cycle (default: the mix)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        server = start_server(Path(tmp))
        try:
            result = asyncio.run(soak(args, server))
        finally:
            result_exit = stop_server(server)
        result["exit_code"] = result_exit
        result["checks"]["exits_0_on_sigterm"] = result_exit == 0
        result["passed"] = all(result["checks"].values())
        if not result["passed"]:
            result["log_tail"] = server.stderr.read_text(errors="replace")[-4000:]
    text = json.dumps(result, indent=2)
    if args.json is not None:
        args.json.write_text(text)
    print(text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
