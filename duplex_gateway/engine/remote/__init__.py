"""The ``remote`` engine: a pool of vLLM-Omni duplex servers (``WS /v1/realtime?duplex=1``).

- :mod:`.protocol` -- pure translation between port calls / events and the backend wire;
- :mod:`.pool` -- backends, health state, placement, the health probe;
- :mod:`.session` -- one gateway session on one backend WebSocket (resume, failure);
- :mod:`.engine` -- :class:`RemoteEngine`, health loop, drain;
- :mod:`.admin` -- ``/admin/backends`` routes.
"""

from __future__ import annotations

from duplex_gateway.engine.remote.engine import RemoteEngine
from duplex_gateway.engine.remote.pool import Backend, BackendPool, BackendSpec
from duplex_gateway.engine.remote.protocol import BackendKind
from duplex_gateway.engine.remote.session import RemoteSession

__all__ = ["Backend", "BackendKind", "BackendPool", "BackendSpec", "RemoteEngine", "RemoteSession"]
