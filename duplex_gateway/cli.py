"""The ``duplex-gateway`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML configuration file (see configs/default.yaml)")
    serve.add_argument("--engine", help="engine name, overriding engine.name")
    serve.add_argument("--host", help="address to listen on, overriding server.host")
    serve.add_argument("--port", type=int, help="port to listen on, overriding server.port")
    return parser


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from duplex_gateway.app import create_app
    from duplex_gateway.config import ConfigError, load_settings
    from duplex_gateway.engine.registry import UnknownEngine, build_engine

    try:
        settings = load_settings(
            args.config,
            **{"engine.name": args.engine, "server.host": args.host, "server.port": args.port},
        )
        engine = build_engine(settings)
    except (ConfigError, UnknownEngine) as exc:
        print(f"duplex-gateway: {exc}", file=sys.stderr)
        return 2
    server = settings.server
    logging.basicConfig(level=server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings, engine),
        host=server.host,
        port=server.port,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        ws_max_size=settings.limits.hard_max_message_bytes,
        ws_ping_interval=server.ws_ping_interval_s,
        ws_ping_timeout=server.ws_ping_timeout_s,
        log_level=server.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``duplex-gateway`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
