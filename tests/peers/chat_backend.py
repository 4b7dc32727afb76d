"""The fake chat-completions server (:mod:`tests.engine.embedded.chat_server`) in its own process.

The peers' virtualenv has no uvicorn, so a peers test runs the server with the gateway's
interpreter: ``python -m tests.peers.chat_backend`` reads the scripted replies as JSON on its
first stdin line and prints the server's URL; then, for each further line, it prints every
request received so far as one JSON line; it stops when stdin closes.
:func:`running_chat_backend` is that process, for a ``with`` block.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from tests.e2e.helpers import REPO, gateway_env

__all__ = ["ChatBackend", "running_chat_backend"]


@dataclass
class ChatBackend:
    """The running server: its URL, and what it has received."""

    url: str
    proc: subprocess.Popen[str]

    def requests(self) -> list[dict[str, Any]]:
        """Each request so far as ``{"method", "path", "headers", "body"}``, oldest first."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("requests\n")
        self.proc.stdin.flush()
        answer: list[dict[str, Any]] = json.loads(self.proc.stdout.readline())
        return answer

    def chat_bodies(self) -> list[Any]:
        """The bodies of the chat-completions requests so far, oldest first."""
        return [r["body"] for r in self.requests() if r["path"] == "/v1/chat/completions"]


@contextlib.contextmanager
def running_chat_backend(python: str, replies: list[dict[str, Any]]) -> Iterator[ChatBackend]:
    """The server, run by ``python``, answering ``replies`` (:class:`Reply` fields) in order.

    ``ScriptedToolCall`` fields go as a list of objects under ``tool_calls``.
    """
    proc = subprocess.Popen(
        [python, "-m", "tests.peers.chat_backend"],
        cwd=REPO,
        env=gateway_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(replies) + "\n")
        proc.stdin.flush()
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the chat backend did not start (it printed {url!r})")
        yield ChatBackend(url=url, proc=proc)
        proc.stdin.close()
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _serve() -> None:
    from tests.engine.embedded.chat_server import Reply, ScriptedToolCall, running_chat_server

    scripted = json.loads(sys.stdin.readline())
    replies = [
        Reply(**{**r, "tool_calls": tuple(ScriptedToolCall(**c) for c in r.get("tool_calls", ()))})
        for r in scripted
    ]
    with running_chat_server() as server:
        server.script(*replies)
        _say(server.url)
        for _ in sys.stdin:  # until the test closes stdin
            requests = [asdict(r) | {"headers": dict(r.headers)} for r in server.requests]
            _say(json.dumps(requests))


if __name__ == "__main__":
    _serve()
