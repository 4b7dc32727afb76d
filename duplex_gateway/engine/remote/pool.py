"""The backends of the ``remote`` engine: their state, health and where a new session goes.

A :class:`Backend` is one vLLM-Omni (or duplex-gateway) server with a session
cap; :class:`BackendPool` places each new session on the least-loaded healthy,
non-draining backend with room (ties go round-robin) and keeps health from two
sources: periodic ``GET health_path`` probes (:func:`probe`) and what sessions
see (a failed WebSocket open, a socket that drops).

Placement and health bookkeeping are plain state changes, no I/O; :func:`probe`
is the one network call here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from duplex_gateway.engine import port

__all__ = ["Backend", "BackendPool", "BackendSpec", "normalize_url", "probe", "realtime_url"]


def normalize_url(url: str) -> str:
    """``ws://host:port`` without a trailing slash (how backends are named)."""
    return url.strip().rstrip("/")


def realtime_url(url: str) -> str:
    """The duplex endpoint of a backend: ``/v1/realtime?duplex=1`` unless the URL names a path."""
    parts = urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else "/v1/realtime"
    query = parts.query
    if "duplex=" not in query:
        query = f"{query}&duplex=1" if query else "duplex=1"
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendSpec:
    """How a backend is configured."""

    url: str
    max_sessions: int = 4
    #: ``GET`` this for health (vLLM serves ``/health``); ``None``: a TCP connect is the probe.
    health_path: str | None = "/health"
    #: Sent as ``Authorization: Bearer`` (vLLM's ``--api-key``).
    api_key: str | None = None

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("ws", "wss"):
            raise ValueError(f"backend url {self.url!r} must start with ws:// or wss://")
        if self.max_sessions < 1:
            raise ValueError(f"backend {self.url}: max_sessions must be >= 1")


class Backend:
    """One backend server and what the pool knows about it."""

    def __init__(self, spec: BackendSpec, index: int, *, unhealthy_after: int, healthy_after: int) -> None:
        self.spec = spec
        self.url = normalize_url(spec.url)
        self.index = index
        self.healthy = False
        self.draining = False
        #: Sessions placed here and not yet ended (including ones still opening).
        self.sessions = 0
        self.last_error: str | None = None
        self._failures = 0
        self._successes = 0
        self._unhealthy_after = unhealthy_after
        self._healthy_after = healthy_after

    @property
    def cap(self) -> int:
        return self.spec.max_sessions

    @property
    def has_room(self) -> bool:
        return self.sessions < self.cap

    @property
    def load(self) -> float:
        return self.sessions / self.cap

    @property
    def failing(self) -> bool:
        """Its last probe (or session open) failed: down already, or maybe on the way."""
        return self._failures > 0

    def record_success(self) -> None:
        self._failures = 0
        self._successes += 1
        if not self.healthy and self._successes >= self._healthy_after:
            self.healthy = True
            self.last_error = None

    def record_failure(self, error: str) -> None:
        self._successes = 0
        self._failures += 1
        self.last_error = error
        if self._failures >= self._unhealthy_after:
            self.healthy = False

    def mark_down(self, error: str) -> None:
        """Evidence the server is gone (its socket dropped and it refuses connections)."""
        self._successes = 0
        self._failures = max(self._failures, self._unhealthy_after)
        self.healthy = False
        self.last_error = error

    def snapshot(self) -> dict[str, object]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "draining": self.draining,
            "sessions": self.sessions,
            "cap": self.cap,
            "last_error": self.last_error,
        }


class BackendPool:
    """The backends and the placement rule."""

    def __init__(
        self, specs: Sequence[BackendSpec], *, unhealthy_after: int = 2, healthy_after: int = 1
    ) -> None:
        if not specs:
            raise ValueError("the remote engine needs at least one backend")
        self.backends = [
            Backend(spec, index, unhealthy_after=unhealthy_after, healthy_after=healthy_after)
            for index, spec in enumerate(specs)
        ]
        urls = [b.url for b in self.backends]
        if len(set(urls)) != len(urls):
            raise ValueError(f"backend urls must be unique: {urls}")
        self._next = 0  # round-robin start for ties

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.backends)

    def get(self, url: str) -> Backend:
        wanted = normalize_url(url)
        for backend in self.backends:
            if backend.url == wanted:
                return backend
        raise KeyError(url)

    @property
    def capacity(self) -> int:
        return sum(b.cap for b in self.backends)

    @property
    def accepting(self) -> bool:
        """Some backend could take a session if it had room (``/readyz``)."""
        return any(b.healthy and not b.draining for b in self.backends)

    def place(self, exclude: Iterable[Backend] = ()) -> Backend:
        """Reserve a slot on the best backend; raise if there is none.

        :class:`port.EngineSessionLimit` when every usable backend is full,
        :class:`port.EngineUnavailable` when none is healthy and undrained.
        """
        excluded = {id(b) for b in exclude}
        usable = [b for b in self.backends if b.healthy and not b.draining and id(b) not in excluded]
        candidates = [b for b in usable if b.has_room]
        if not candidates:
            if usable:
                raise port.EngineSessionLimit(f"all {len(usable)} usable backends are full")
            raise port.EngineUnavailable(self._why_unavailable())
        count = len(self.backends)
        best = min(candidates, key=lambda b: (b.load, (b.index - self._next) % count))
        self._next = (best.index + 1) % count
        best.sessions += 1
        return best

    def release(self, backend: Backend) -> None:
        backend.sessions = max(0, backend.sessions - 1)

    def _why_unavailable(self) -> str:
        states = []
        for b in self.backends:
            state = (
                "draining"
                if b.draining
                else ("healthy" if b.healthy else f"down ({b.last_error or 'unknown'})")
            )
            states.append(f"{b.url}: {state}")
        return "no healthy backend: " + "; ".join(states)


async def probe(spec: BackendSpec, timeout_s: float) -> str | None:
    """Check one backend: ``None`` when healthy, else why not.

    ``GET health_path`` over HTTP/1.1 (HTTPS for ``wss://``) must answer 2xx; with no
    ``health_path`` a TCP connect is enough. Everything is bounded by ``timeout_s``.
    """
    parts = urlsplit(spec.url)
    secure = parts.scheme == "wss"
    host = parts.hostname or "127.0.0.1"
    port_number = parts.port or (443 if secure else 80)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                host, port_number, ssl=ssl.create_default_context() if secure else None
            )
            if spec.health_path is None:
                return None
            path = spec.health_path if spec.health_path.startswith("/") else "/" + spec.health_path
            netloc = parts.netloc.rpartition("@")[2]
            auth = f"Authorization: Bearer {spec.api_key}\r\n" if spec.api_key else ""
            request = f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\n{auth}Connection: close\r\n\r\n"
            writer.write(request.encode("latin-1"))
            await writer.drain()
            status_line = await reader.readline()
    except TimeoutError:
        return f"health check timed out after {timeout_s:g} s"
    except (OSError, ssl.SSLError, UnicodeError) as exc:
        return f"health check failed: {exc or type(exc).__name__}"
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
    fields = status_line.decode("latin-1", "replace").split()
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        return "health check got no HTTP answer"
    status = int(fields[1])
    return None if 200 <= status < 300 else f"health check answered {status}"
