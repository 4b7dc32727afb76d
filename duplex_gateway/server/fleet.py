"""The gateway's place in a fleet: its state store, and how it reports on it."""

from __future__ import annotations

import logging
import secrets
from urllib.parse import urlsplit, urlunsplit

from duplex_gateway.config import GatewaySettings
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.state.redis_store import RedisStateStore
from duplex_gateway.state.writer import StoreWriter

__all__ = ["Fleet"]

logger = logging.getLogger(__name__)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (
        f"{parts.username + ':' if parts.username else ''}***@{host}{f':{parts.port}' if parts.port else ''}"
    )
    return urlunsplit(parts._replace(netloc=netloc))


class Fleet:
    """``server.state_store``: the store, and the writer that copies this gateway's sessions into it."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        server, limits = settings.server, settings.limits
        assert server.state_store is not None
        #: This gateway's name in the store: ``server.node_id``, or one made up for this process.
        self.owner = server.node_id or f"gw-{secrets.token_hex(4)}"
        self.where = _without_password(server.state_store)
        self.store = RedisStateStore(server.state_store, timeout_s=server.state_store_timeout_s)
        #: How long this gateway's claim on a session lasts unrenewed.
        self.lease_ms = int(server.state_lease_s * 1000)
        self.writer = StoreWriter(
            self.store,
            owner=self.owner,
            lease_ms=self.lease_ms,
            grace_ms=int(limits.resume_grace_s * 1000),
            max_events=limits.resume_journal_events,
        )
        metrics.watch_state_store(lambda: self.writer.healthy)

    @classmethod
    def from_settings(cls, settings: GatewaySettings, metrics: GatewayMetrics) -> Fleet | None:
        """The fleet part of ``settings`` (None: no state store configured)."""
        return cls(settings, metrics) if settings.server.state_store else None

    async def start(self) -> None:
        """Start writing; a store that is down is the writer's to find and report, not fatal."""
        logger.info("state store %s: sessions are shared as gateway %s", self.where, self.owner)
        self.writer.start()

    async def close(self) -> None:
        await self.writer.close()
        await self.store.close()

    def status(self) -> dict[str, object]:
        """For ``/readyz``: whether sessions are being shared now, and why not."""
        status: dict[str, object] = {
            "status": "ok" if self.writer.healthy else "unavailable",
            "url": self.where,
            "node": self.owner,
        }
        if self.writer.problem:
            status["problem"] = self.writer.problem
        return status
