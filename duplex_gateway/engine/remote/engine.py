"""The ``remote`` engine: a pool of vLLM-Omni servers behind one gateway.

Each vLLM-Omni duplex server allows one API worker and a few sessions, so one
gateway fronts many of them: every gateway session is placed on the
least-loaded healthy, non-draining backend with room (ties round-robin) and
lives on one backend WebSocket for its whole life
(:class:`~duplex_gateway.engine.remote.session.RemoteSession`). Backends are
health-checked every ``health_interval_s``; a failed open counts as a failure
and the placement tries one other backend. ``drain(url)`` stops new sessions
going to a backend while its sessions finish; ``undrain(url)`` takes it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from duplex_gateway.engine import port
from duplex_gateway.engine.remote.pool import Backend, BackendPool, BackendSpec, probe
from duplex_gateway.engine.remote.session import (
    BackendFull,
    BackendRefused,
    RemoteSession,
    SessionOptions,
    open_backend_session,
)
from duplex_gateway.vocabulary.session_config import SessionConfig

if TYPE_CHECKING:
    from starlette.routing import Route

__all__ = ["RemoteEngine"]

logger = logging.getLogger(__name__)

DEFAULT_INPUT_RATE = 16_000
DEFAULT_OUTPUT_RATE = 24_000


class RemoteEngine(port.Engine):
    """Sessions on a pool of remote vLLM-Omni duplex servers (``WS /v1/realtime?duplex=1``).

    ``backends``: the servers, each with its session cap and health path.
    ``health_interval_s`` / ``health_timeout_s``: how often and how patiently they are
    probed; ``unhealthy_after`` failures in a row mark one down, ``healthy_after``
    successes bring it back. ``connect_timeout_s`` / ``handshake_timeout_s`` bound a
    session open. ``resume``: re-attach a session whose socket dropped (within
    ``resume_timeout_s``) instead of failing it. A session quiet for
    ``heartbeat_interval_s`` sends ``session.heartbeat`` (checked every health round).
    Sessions on a backend whose health probe fails are pinged on their own socket; one
    without a pong within ``unresponsive_after_s`` fails (``backend_lost``).
    ``ping_interval_s`` / ``ping_timeout_s``: the keepalive of every backend socket
    (``None``: none), for a hang the health check cannot see.
    ``admin_api_keys``: keys the admin routes require (empty: none).
    """

    name = "remote"

    def __init__(
        self,
        backends: Sequence[BackendSpec],
        *,
        input_rate: int = DEFAULT_INPUT_RATE,
        output_rate: int = DEFAULT_OUTPUT_RATE,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 2.0,
        unhealthy_after: int = 2,
        healthy_after: int = 1,
        connect_timeout_s: float = 3.0,
        handshake_timeout_s: float = 5.0,
        resume: bool = True,
        resume_timeout_s: float = 5.0,
        ping_interval_s: float | None = 20.0,
        ping_timeout_s: float | None = 20.0,
        heartbeat_interval_s: float = 30.0,
        unresponsive_after_s: float = 5.0,
        admin_api_keys: Sequence[str] = (),
    ) -> None:
        self.pool = BackendPool(backends, unhealthy_after=unhealthy_after, healthy_after=healthy_after)
        self.options = SessionOptions(
            input_rate=input_rate,
            output_rate=output_rate,
            connect_timeout_s=connect_timeout_s,
            handshake_timeout_s=handshake_timeout_s,
            resume=resume,
            resume_timeout_s=resume_timeout_s,
            ping_interval_s=ping_interval_s,
            ping_timeout_s=ping_timeout_s,
            heartbeat_interval_s=heartbeat_interval_s,
        )
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.unresponsive_after_s = unresponsive_after_s
        self.admin_api_keys = tuple(admin_api_keys)
        self._caps = port.EngineCapabilities(
            name=self.name,
            input_rate=input_rate,
            output_rate=output_rate,
            detects_turns=False,
            max_sessions=self.pool.capacity,
            # Backends speak vLLM-Omni's duplex protocol: its turn-taking passes through.
            native_turns=True,
            # Session tools go to the backend and its calls come back; vLLM-Omni's
            # response.create takes no per-reply voice or token limit, so none is claimed.
            tools=True,
            # Camera frames and pictures go to the backend, whose model takes them or says not.
            video_input=True,
            image_input=True,
        )
        self._sessions: dict[str, RemoteSession] = {}
        self._health_task: asyncio.Task[None] | None = None
        self._started = False

    # -- port.Engine -----------------------------------------------------------------------

    @property
    def capabilities(self) -> port.EngineCapabilities:
        return self._caps

    @property
    def ready(self) -> bool:
        return self._started and self.pool.accepting

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def backends(self) -> list[Backend]:
        return list(self.pool.backends)

    async def start(self) -> None:
        await self.check_health()
        self._started = True
        self._health_task = asyncio.create_task(self._health_loop(), name="remote-health")
        for backend in self.pool.backends:
            state = "healthy" if backend.healthy else f"down ({backend.last_error})"
            logger.info("remote backend %s: %s, cap %d", backend.url, state, backend.cap)

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        if not self._started:
            raise port.EngineUnavailable("the remote engine is not started")
        tried: list[Backend] = []
        full: list[str] = []
        failed: list[str] = []
        for _ in range(2):  # the best backend, then one other if that one fails
            try:
                backend = self.pool.place(exclude=tried)
            except (port.EngineSessionLimit, port.EngineUnavailable) as exc:
                if not tried:
                    raise
                if full and not failed:
                    raise port.EngineSessionLimit("; ".join(full)) from exc
                raise port.EngineUnavailable("; ".join(failed + full)) from exc
            tried.append(backend)
            try:
                session = await open_backend_session(
                    backend, session_id, config, self.options, on_end=self._session_ended
                )
            except BackendFull as exc:
                self.pool.release(backend)
                full.append(str(exc))
                logger.info("remote session %s: %s", session_id, exc)
                continue
            except BackendRefused as exc:
                self.pool.release(backend)
                backend.record_failure(str(exc))
                failed.append(str(exc))
                logger.warning("remote session %s: %s", session_id, exc)
                continue
            except BaseException:
                self.pool.release(backend)
                raise
            self._sessions[session_id] = session
            logger.info(
                "remote session %s on %s (backend session %s, %s)",
                session_id,
                backend.url,
                session.backend_session_id,
                session.kind,
            )
            return session
        if full and not failed:
            raise port.EngineSessionLimit("; ".join(full))
        raise port.EngineUnavailable("; ".join(failed + full))

    def _session_ended(self, session: RemoteSession) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
        self.pool.release(session.backend)

    async def shutdown(self) -> None:
        task, self._health_task = self._health_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        sessions = list(self._sessions.values())
        if sessions:
            await asyncio.gather(*(s.close("shutdown") for s in sessions), return_exceptions=True)
        self._started = False

    # -- health ----------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Probe every backend once (concurrently) and record the results."""
        results = await asyncio.gather(*(probe(b.spec, self.health_timeout_s) for b in self.pool.backends))
        for backend, problem in zip(self.pool.backends, results, strict=True):
            was = backend.healthy
            if problem is None:
                backend.record_success()
            else:
                backend.record_failure(problem)
            if backend.healthy != was:
                logger.log(
                    logging.INFO if backend.healthy else logging.WARNING,
                    "remote backend %s is %s",
                    backend.url,
                    "up" if backend.healthy else f"down: {backend.last_error}",
                )

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_health()
                sessions = list(self._sessions.values())
                # Sessions on a backend whose probe failed must show their socket is alive.
                for session in sessions:
                    if session.backend.failing:
                        session.watch_liveness(self.unresponsive_after_s)
                # Quiet sessions tell their backend they are still there.
                await asyncio.gather(
                    *(asyncio.wait_for(s.keep_alive(), self.health_timeout_s) for s in sessions),
                    return_exceptions=True,
                )
            except Exception:  # the loop must outlive one bad round
                logger.exception("remote backend health check failed")

    # -- drain -----------------------------------------------------------------------------

    def drain(self, url: str) -> Backend:
        """Place no new session on ``url``; its sessions go on until they end. ``KeyError`` if unknown."""
        backend = self.pool.get(url)
        if not backend.draining:
            backend.draining = True
            logger.info("remote backend %s draining (%d sessions left)", backend.url, backend.sessions)
        return backend

    def undrain(self, url: str) -> Backend:
        """Place sessions on ``url`` again. ``KeyError`` if unknown."""
        backend = self.pool.get(url)
        if backend.draining:
            backend.draining = False
            logger.info("remote backend %s takes sessions again", backend.url)
        return backend

    def snapshot(self) -> list[dict[str, object]]:
        """The backends as the admin endpoint shows them."""
        return [b.snapshot() for b in self.pool.backends]

    def admin_routes(self, api_keys: Sequence[str] | None = None) -> list[Route]:
        """``GET /admin/backends``, ``POST /admin/backends/drain`` and ``/undrain``.

        Protected by ``api_keys`` (default: the keys this engine was built with).
        """
        from duplex_gateway.engine.remote.admin import backend_routes

        return backend_routes(self, self.admin_api_keys if api_keys is None else tuple(api_keys))
