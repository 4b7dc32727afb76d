"""Several gateways behind a load balancer: node-tagged session ids, and resumes routed back to their node.

The first test needs only the gateway. The others run the load-balancer configs shipped in
``configs/`` (``haproxy.cfg``, ``nginx.conf``) for real, in front of two real gateway processes, with
only their ports and file locations rewritten; each is skipped where its program is not installed.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duplex_gateway.host.resumption import new_session_id, node_of
from tests.e2e.helpers import (
    REPO,
    EventLog,
    Gateway,
    GatewayFactory,
    free_port,
    send_json,
    wait_closed,
    ws_connect,
)

pytestmark = pytest.mark.e2e

CONFIGS = REPO / "configs"
SESSIONS = 4


def _gateway(factory: GatewayFactory, node: str, *, via_flag: bool = False) -> Gateway:
    server: dict[str, Any] = {"web_demo": False}
    if not via_flag:
        server["node_id"] = node
    return factory.start(
        {"server": server, "limits": {"resume_grace_s": 20}},
        args=["--node-id", node] if via_flag else None,
        name=node,
    )


async def test_node_id_tags_session_ids_and_names_the_owner_of_a_stray_resume(
    gateway_factory: GatewayFactory,
) -> None:
    gw = _gateway(gateway_factory, "gw1", via_flag=True)
    assert gw.readyz()["node"] == "gw1"
    async with ws_connect(gw) as ws:
        log = EventLog(ws.recv)
        _, created = await log.wait_for("session.created")
        assert node_of(created["session_id"]) == "gw1" and created["session"]["id"] == created["session_id"]
        await log.aclose()
    async with ws_connect(gw, "/v1/duplex") as ws:
        log = EventLog(ws.recv)
        stray = new_session_id("gw2")
        await send_json(
            ws, {"type": "session.resume", "session_id": stray, "resume_token": "t", "event_id": "r"}
        )
        _, error = await log.wait_for("error")
        assert error["error"]["code"] == "invalid_resume_token"
        assert "'gw2'" in error["error"]["message"] and "gw1" in error["error"]["message"]
        await log.aclose()


# -- the shipped load-balancer configs, run for real ----------------------------------------


def _wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer 200 within {timeout} s")


def _point_at(text: str, gateways: dict[str, Gateway]) -> str:
    """The shipped config with its gateway addresses replaced by the test gateways' ports."""
    for node, port in (("gw1", 8001), ("gw2", 8002)):
        assert f"127.0.0.1:{port}" in text
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{gateways[node].port}")
    return text


class Balancer:
    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, log: Path, admin: Path | None = None
    ) -> None:
        self.proc, self.port, self.log, self.admin = proc, port, log, admin

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def command(self, line: str) -> str:
        """A command on HAProxy's runtime API."""
        assert self.admin is not None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin))
            sock.sendall(line.encode() + b"\n")
            return sock.recv(65536).decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _start(cmd: list[str], port: int, log: Path, admin: Path | None = None) -> Balancer:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    balancer = Balancer(proc, port, log, admin)
    try:
        _wait_http(f"http://127.0.0.1:{port}/readyz")
    except AssertionError:
        balancer.stop()
        raise AssertionError(
            f"{cmd[0]} did not come up:\n{log.read_text(errors='replace')[-4000:]}"
        ) from None
    return balancer


@pytest.fixture
def two_gateways(gateway_factory: GatewayFactory) -> dict[str, Gateway]:
    return {node: _gateway(gateway_factory, node) for node in ("gw1", "gw2")}


def start_haproxy(tmp_path: Path, gateways: dict[str, Gateway]) -> Balancer:
    """The shipped HAProxy config in front of ``gateways`` (``gw1`` and ``gw2``), its runtime API in ``tmp_path``."""
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed")
    port, admin = free_port(), tmp_path / "admin.sock"
    text = _point_at((CONFIGS / "haproxy.cfg").read_text(encoding="utf-8"), gateways)
    text = text.replace("bind :8000", f"bind 127.0.0.1:{port}")
    text = re.sub(r"stats socket \S+", f"stats socket {admin}", text)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text, encoding="utf-8")
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    return _start(["haproxy", "-db", "-f", str(cfg)], port, tmp_path / "haproxy.log", admin)


@pytest.fixture
def haproxy(tmp_path: Path, two_gateways: dict[str, Gateway]) -> Iterator[Balancer]:
    balancer = start_haproxy(tmp_path, two_gateways)
    yield balancer
    balancer.stop()


@pytest.fixture
def nginx(tmp_path: Path, two_gateways: dict[str, Gateway]) -> Iterator[Balancer]:
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed")
    port = free_port()
    text = _point_at((CONFIGS / "nginx.conf").read_text(encoding="utf-8"), two_gateways)
    text = text.replace("listen 8000;", f"listen 127.0.0.1:{port};")
    # Logs and buffers in the test's directory rather than the packaged nginx's.
    temp = "".join(
        f"    {kind}_temp_path {tmp_path / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = text.replace("http {\n", "http {\n    access_log off;\n" + temp, 1)
    cfg = tmp_path / "nginx.conf"
    cfg.write_text(text, encoding="utf-8")
    globals_ = f"daemon off; pid {tmp_path / 'nginx.pid'}; error_log {tmp_path / 'error.log'} warn;"
    base = ["nginx", "-p", str(tmp_path), "-c", str(cfg), "-g", globals_]
    check = subprocess.run([*base, "-t"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    balancer = _start(base, port, tmp_path / "nginx.log")
    yield balancer
    balancer.stop()


async def _open_sessions(balancer: Balancer, count: int) -> tuple[list[Any], list[dict[str, Any]]]:
    """``count`` sessions through the balancer, held open so that it spreads them."""
    from websockets.asyncio.client import connect

    sockets, created = [], []
    for _ in range(count):
        ws = await connect(f"{balancer.ws_url}/v1/realtime", open_timeout=5, ping_interval=None)
        sockets.append(ws)
        created.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        assert created[-1]["type"] == "session.created"
    return sockets, created


async def _resume(balancer: Balancer, created: dict[str, Any]) -> None:
    """Resume a dropped session through the balancer, the way the web demo does, and end it."""
    from websockets.asyncio.client import connect

    session_id = created["session_id"]
    url = f"{balancer.ws_url}/v1/realtime?resume=1&session_id={session_id}"
    async with connect(url, open_timeout=5, ping_interval=None) as ws:
        log = EventLog(ws.recv)
        await send_json(
            ws,
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": created["server_event_seq"],
            },
        )
        _, resumed = await log.wait_for(lambda e: e["type"] in ("session.resumed", "error"))
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["session_id"] == session_id
        await send_json(ws, {"type": "session.close"})
        assert await wait_closed(ws) == 1000
        await log.aclose()


async def _drop_and_resume_all(
    balancer: Balancer, two_gateways: dict[str, Gateway], drained: str | None
) -> None:
    sockets, created = await _open_sessions(balancer, SESSIONS)
    nodes = [node_of(c["session_id"]) for c in created]
    assert set(nodes) == {"gw1", "gw2"}, nodes  # least connections spread them over both processes
    for ws in sockets:
        ws.transport.abort()  # a network drop: no close frame, so each session waits for its client
    for node, gw in two_gateways.items():
        await gw.wait_sessions(nodes.count(node))
    if drained is not None:
        assert balancer.command(f"set server gateways/{drained} state drain").strip() == ""
    # Every resume reaches the process that holds its session (a draining one included);
    # by chance alone all four would have one chance in sixteen.
    for c in created:
        await _resume(balancer, c)
    for gw in two_gateways.values():
        await gw.wait_sessions(0)
    if drained is not None:
        # A draining process takes no new calls.
        sockets, created = await _open_sessions(balancer, 2)
        assert {node_of(c["session_id"]) for c in created} == {"gw1", "gw2"} - {drained}
        for ws in sockets:
            await ws.close()


async def test_haproxy_sends_each_resume_to_the_node_that_holds_it(
    haproxy: Balancer, two_gateways: dict[str, Gateway]
) -> None:
    await _drop_and_resume_all(haproxy, two_gateways, drained="gw1")
    # A node that is out of service gets no resume: it lands on another, which says whose session it was.
    assert haproxy.command("set server gateways/gw1 state maint").strip() == ""
    from websockets.asyncio.client import connect

    stray = new_session_id("gw1")
    async with connect(f"{haproxy.ws_url}/v1/realtime?resume=1&session_id={stray}", open_timeout=5) as ws:
        log = EventLog(ws.recv)
        await send_json(ws, {"type": "session.resume", "session_id": stray, "resume_token": "t"})
        _, error = await log.wait_for("error")
        assert error["error"]["code"] == "invalid_resume_token" and "'gw1'" in error["error"]["message"]
        assert "(gw2)" in error["error"]["message"]
        await log.aclose()


async def test_nginx_sends_each_resume_to_the_node_that_holds_it(
    nginx: Balancer, two_gateways: dict[str, Gateway]
) -> None:
    await _drop_and_resume_all(nginx, two_gateways, drained=None)
