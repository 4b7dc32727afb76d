"""A REAL vLLM-Omni duplex server over the fake model stage, for the ``remote`` engine's tests.

``python -m tests.omni.backend_server --port N`` (in ``.venv-omni``) serves what
``vllm serve MODEL --omni`` serves for a duplex model, minus the model:

- ``WS /v1/realtime`` (and ``/v1/duplex``): vLLM-Omni's own
  ``OmniDuplexSessionHandler.handle_realtime_session``, the handler its API server
  mounts, over a ``DuplexOmni`` built by ``tests.omni.fake_stage:duplex_omni``
  (vLLM-Omni's session manager, runner, orchestrator and output processor; a fake
  stage that echoes each committed turn in chunks -- see :mod:`tests.omni.fake_stage`);
- ``GET /health``: 200 while the engine runs, 503 once it has died (as vLLM's).

One uvicorn worker, like vLLM-Omni's duplex server (which refuses more). The fake
stage reads ``FAKE_OMNI_*`` from the environment (chunks, delay, call log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["create_app", "main"]

logger = logging.getLogger("backend_server")


def create_app() -> Any:
    """The ASGI app; the engine starts in its lifespan (before the port answers)."""
    import numpy as np
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket
    from vllm_omni.entrypoints.duplex.audio_encoding import encode_audio
    from vllm_omni.entrypoints.duplex.serving import OmniDuplexSessionHandler

    from tests.omni.fake_stage import duplex_omni

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        omni = await asyncio.to_thread(duplex_omni)
        # The first encode pays about a second of lazy imports: pay it before the first caller.
        await asyncio.to_thread(encode_audio, np.zeros(2400, dtype=np.float32), 24_000, "pcm", None)
        app.state.omni = omni
        app.state.handler = OmniDuplexSessionHandler(duplex_omni=omni)
        logger.info("vLLM-Omni duplex backend ready")
        try:
            yield
        finally:
            task = getattr(omni, "final_output_task", None)
            if task is not None:
                task.cancel()
                omni.final_output_task = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.to_thread(omni.shutdown), 10)

    async def realtime(websocket: WebSocket) -> None:
        await websocket.app.state.handler.handle_realtime_session(websocket)

    async def health(request: Request) -> JSONResponse:
        omni = getattr(request.app.state, "omni", None)
        dead = omni is None or bool(getattr(omni, "errored", False))
        return JSONResponse({"status": "dead" if dead else "ok"}, status_code=503 if dead else 200)

    return Starlette(
        routes=[
            WebSocketRoute("/v1/realtime", realtime),
            WebSocketRoute("/v1/duplex", realtime),
            Route("/health", health),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn

    uvicorn.run(
        create_app(), host=args.host, port=args.port, workers=1, log_level="info", ws_max_size=16 << 20
    )


if __name__ == "__main__":
    main()
