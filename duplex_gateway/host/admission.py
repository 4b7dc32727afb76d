"""Admission control: how many sessions the gateway holds, and none once it drains."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from duplex_gateway.host.connection import Connection

__all__ = ["SessionRegistry"]


class SessionRegistry:
    """Counts live sessions against ``max_sessions`` (admission control), and admits none once draining."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._live: dict[str, Connection | None] = {}
        #: Set when the gateway starts draining for shutdown: every new session is refused.
        self.draining = False

    def try_admit(self, session_id: str, host: Connection | None = None) -> bool:
        if self.draining or len(self._live) >= self.max_sessions:
            return False
        self._live[session_id] = host
        return True

    def release(self, session_id: str) -> None:
        self._live.pop(session_id, None)

    @property
    def count(self) -> int:
        return len(self._live)

    def hosts(self) -> list[Connection]:
        """The admitted sessions' hosts (attached, detached and resumed alike)."""
        return [host for host in self._live.values() if host is not None]
