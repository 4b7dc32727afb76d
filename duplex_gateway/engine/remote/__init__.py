"""The ``remote`` engine: a pool of vLLM-Omni duplex servers (``WS /v1/realtime?duplex=1``).

- :mod:`.protocol` -- pure translation between port calls / events and the backend wire;
- :mod:`.pool` -- backends, health state, placement, the health probe;
- :mod:`.session` -- one gateway session on one backend WebSocket (resume, failure);
- :mod:`.engine` -- :class:`RemoteEngine`, health loop, drain;
- :mod:`.admin` -- ``/admin/backends`` routes;
- :mod:`.spec` -- the engine's spec and settings (``engine.remote``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from duplex_gateway.engine.spec import lazy_exports

if TYPE_CHECKING:
    from duplex_gateway.engine.remote.engine import RemoteEngine
    from duplex_gateway.engine.remote.pool import Backend, BackendPool, BackendSpec
    from duplex_gateway.engine.remote.protocol import BackendKind
    from duplex_gateway.engine.remote.session import RemoteSession

#: Where each exported name lives, imported on first use (PEP 562): the configuration
#: reads :mod:`.spec` without loading the engine.
_EXPORTS = {
    "Backend": "pool",
    "BackendKind": "protocol",
    "BackendPool": "pool",
    "BackendSpec": "pool",
    "RemoteEngine": "engine",
    "RemoteSession": "session",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["Backend", "BackendKind", "BackendPool", "BackendSpec", "RemoteEngine", "RemoteSession"]
