"""The ``remote`` engine's spec and settings (``engine.remote``): a pool of vLLM-Omni servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from duplex_gateway.config_error import ConfigError
from duplex_gateway.engine.spec import EngineSpec, SettingsSection

if TYPE_CHECKING:
    from duplex_gateway.config import GatewaySettings
    from duplex_gateway.engine.port import Engine

__all__ = ["SPEC", "RemoteBackendSettings", "RemoteSettings"]


class RemoteBackendSettings(SettingsSection):
    """One backend of the ``remote`` engine: a vLLM-Omni server's ``/v1/realtime?duplex=1``."""

    #: ``ws://host:port`` (or ``wss://``); the duplex endpoint is ``/v1/realtime?duplex=1`` unless a path is given.
    url: str = Field(pattern=r"^wss?://[^\s/]+(/\S*)?$")
    #: Sessions this backend may hold (vLLM-Omni's ``duplex_session.max_sessions``).
    max_sessions: int = Field(4, ge=1, le=10_000)
    #: ``GET`` path probed for health; null: ``engine.remote.health_path``; "": a TCP connect is the probe.
    health_path: str | None = None
    #: Sent as ``Authorization: Bearer`` to the backend (vLLM's ``--api-key``).
    api_key: str | None = None


class RemoteSettings(SettingsSection):
    """The ``remote`` engine: sessions spread over a pool of vLLM-Omni duplex servers."""

    backends: tuple[RemoteBackendSettings, ...] = ()
    #: Health path of backends that name none (vLLM serves ``GET /health``); null: a TCP connect is the probe.
    health_path: str | None = "/health"
    #: Seconds between two health probes of each backend, and how long one may take.
    health_interval_s: float = Field(2.0, gt=0)
    health_timeout_s: float = Field(2.0, gt=0)
    #: Failures in a row (probes or session opens) that mark a backend down; successes that bring it back.
    unhealthy_after: int = Field(2, ge=1)
    healthy_after: int = Field(1, ge=1)
    #: Longest wait for a backend's WebSocket to open, and then for its ``session.created``
    #: (an open, with one retry elsewhere, should fit in ``limits.engine_timeout_s``).
    connect_timeout_s: float = Field(3.0, gt=0)
    handshake_timeout_s: float = Field(5.0, gt=0)
    #: Rate caller audio is sent to the backends at, and reply audio is handed to the gateway at.
    input_rate: int = Field(16_000, ge=8_000, le=48_000)
    output_rate: int = Field(24_000, ge=8_000, le=48_000)
    #: Re-attach (``session.resume``) a session whose backend socket dropped, within ``resume_timeout_s``.
    resume: bool = True
    resume_timeout_s: float = Field(5.0, gt=0)
    #: Keepalive of each backend socket: a ping every ``ping_interval_s``, the socket counted
    #: lost without a pong within ``ping_timeout_s`` (null: no keepalive).
    ping_interval_s: float | None = Field(20.0, gt=0)
    ping_timeout_s: float | None = Field(20.0, gt=0)
    #: A backend whose health probe fails has its sessions pinged at once, whatever the
    #: keepalive says: a session whose socket gives no pong within this long is ended
    #: (``engine_error``, close 4003). A backend that only stalls for less keeps its calls.
    unresponsive_after_s: float = Field(5.0, gt=0)


def _build(settings: GatewaySettings) -> Engine:
    """Engine ``remote``: a pool of vLLM-Omni servers (see ``engine.remote``)."""
    from duplex_gateway.engine.remote import BackendSpec, RemoteEngine

    remote = SPEC.settings_of(settings)
    if not remote.backends:
        raise ConfigError("engine remote needs engine.remote.backends (or --backend ws://host:port)")
    try:
        specs = [
            BackendSpec(
                url=b.url,
                max_sessions=b.max_sessions,
                health_path=(remote.health_path if b.health_path is None else b.health_path) or None,
                api_key=b.api_key,
            )
            for b in remote.backends
        ]
        return RemoteEngine(
            specs,
            input_rate=remote.input_rate,
            output_rate=remote.output_rate,
            health_interval_s=remote.health_interval_s,
            health_timeout_s=remote.health_timeout_s,
            unhealthy_after=remote.unhealthy_after,
            healthy_after=remote.healthy_after,
            connect_timeout_s=remote.connect_timeout_s,
            handshake_timeout_s=remote.handshake_timeout_s,
            resume=remote.resume,
            resume_timeout_s=remote.resume_timeout_s,
            ping_interval_s=remote.ping_interval_s,
            ping_timeout_s=remote.ping_timeout_s,
            unresponsive_after_s=remote.unresponsive_after_s,
            admin_api_keys=settings.auth.api_keys,
        )
    except ValueError as exc:
        raise ConfigError(f"engine.remote.backends: {exc}") from None


SPEC = EngineSpec(
    name="remote",
    section="remote",
    settings=RemoteSettings,
    build=_build,
    summary="a pool of vLLM-Omni servers over their duplex WebSocket",
    records_turns=True,
)
