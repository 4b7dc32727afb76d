"""The ``duplex-gateway`` command line."""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML configuration file (see configs/default.yaml)")
    serve.add_argument("--engine", help="engine name, overriding engine.name")
    serve.add_argument("--host", help="address to listen on, overriding server.host")
    serve.add_argument("--port", type=int, help="port to listen on, overriding server.port")
    serve.add_argument(
        "--ssl-certfile",
        metavar="FILE",
        help="serve https/wss with this PEM certificate (chain), overriding server.ssl_certfile",
    )
    serve.add_argument(
        "--ssl-keyfile",
        metavar="FILE",
        help="the certificate's private key (PEM), overriding server.ssl_keyfile",
    )
    serve.add_argument(
        "--node-id",
        help="this process's name behind a load balancer (session ids carry it), overriding server.node_id",
    )
    serve.add_argument("--model", help="vLLM-Omni model name or path, overriding engine.vllm_omni.model")
    serve.add_argument(
        "--deploy-config", help="vLLM-Omni deploy YAML, overriding engine.vllm_omni.deploy_config"
    )
    serve.add_argument(
        "--omni-factory",
        metavar="MODULE:CALLABLE",
        help="callable returning the DuplexOmni / AsyncOmni to serve, overriding engine.vllm_omni.omni_factory",
    )
    serve.add_argument(
        "--backend",
        action="append",
        metavar="WS_URL",
        help="engine remote: a vLLM-Omni server ws://host:port (repeat for a pool), "
        "overriding engine.remote.backends",
    )
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text for a terminal, json for a log pipeline (one object per line), overriding server.log_format",
    )
    serve.add_argument(
        "--audiosocket-port",
        type=int,
        metavar="PORT",
        help="also take Asterisk AudioSocket calls over TCP on this port, overriding telephony.audiosocket_port",
    )
    talk = commands.add_parser("call", help="stream a WAV file to a gateway and save the spoken reply")
    talk.add_argument("wav", help="caller audio: a WAV file (any rate; mono or stereo)")
    talk.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime", help="gateway WebSocket URL")
    talk.add_argument("--out", help="write the reply audio to this WAV file")
    talk.add_argument("--api-key", help="API key, when the gateway requires one")
    talk.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    replay = commands.add_parser(
        "replay",
        help="play a recorded session against a gateway again and diff its events (exit 1: they differ)",
    )
    replay.add_argument("recording", help="a recording's folder (see the recording: section of the config)")
    replay.add_argument("--engine", help="engine to replay against (default: the recording's)")
    replay.add_argument("--config", help="YAML configuration of the replaying gateway")
    replay.add_argument(
        "--speed", type=float, default=1.0, help="play the client's side this many times faster"
    )
    replay.add_argument("--out", metavar="DIFF.json", help="also write the comparison as JSON")
    replay.add_argument(
        "--exact-deltas", action="store_true", help="count each audio/text delta (default: one per stream)"
    )
    replay.add_argument(
        "--settle",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long a slower run may take past the recording's end to catch up",
    )
    replay.add_argument("--keep", metavar="DIR", help="keep the replayed session's recording in DIR")
    bench = commands.add_parser(
        "bench", help="measure the gateway side by side with its peers (see docs/benchmarks.md)"
    )
    from duplex_gateway.bench.cli import add_arguments

    add_arguments(bench)
    return parser


def _call(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from duplex_gateway.call import OUTPUT_RATE, CallError, call, check_output_path, write_wav

    try:
        # Checked before the call, not after it: where the reply goes (the call reads the file first).
        if args.out:
            check_output_path(Path(args.out))
        result = asyncio.run(call(args.url, Path(args.wav), api_key=args.api_key, timeout_s=args.timeout))
    except CallError as exc:
        print(f"duplex-gateway call: {exc}", file=sys.stderr)
        return 1
    if args.out:
        try:
            write_wav(Path(args.out), result.reply_audio, OUTPUT_RATE)
        except (OSError, RuntimeError) as exc:  # soundfile's errors are RuntimeErrors
            print(f"duplex-gateway call: cannot write {args.out}: {exc}", file=sys.stderr)
            return 1
        print(f"reply audio written to {args.out}")
    return 0 if result.response_status == "completed" else 1


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvicorn

    from duplex_gateway.audio.vad import SileroVad
    from duplex_gateway.config import ConfigError, load_settings
    from duplex_gateway.engine.registry import UnknownEngine, build_engine
    from duplex_gateway.ops.logs import configure_logging
    from duplex_gateway.server.app import create_app
    from duplex_gateway.server.http_timeouts import head_timeout_protocol
    from duplex_gateway.server.ws_protocol import stuck_client_protocol

    try:
        settings = load_settings(
            args.config,
            **{
                "engine.name": args.engine,
                "server.host": args.host,
                "server.port": args.port,
                "server.node_id": args.node_id,
                "server.ssl_certfile": args.ssl_certfile,
                "server.ssl_keyfile": args.ssl_keyfile,
                "engine.vllm_omni.model": args.model,
                "engine.vllm_omni.deploy_config": args.deploy_config,
                "engine.vllm_omni.omni_factory": args.omni_factory,
                "engine.remote.backends": [{"url": url} for url in args.backend] if args.backend else None,
                "telephony.audiosocket_port": args.audiosocket_port,
                "server.log_format": args.log_format,
            },
        )
        engine = build_engine(settings)
    except (ConfigError, UnknownEngine) as exc:
        print(f"duplex-gateway: {exc}", file=sys.stderr)
        return 2
    server = settings.server
    if server.ssl_keyfile and not server.ssl_certfile:
        print(
            "duplex-gateway: server.ssl_keyfile needs server.ssl_certfile (--ssl-certfile)", file=sys.stderr
        )
        return 2
    for name in ("ssl_certfile", "ssl_keyfile"):
        if (path := getattr(server, name)) and not Path(path).is_file():
            print(f"duplex-gateway: server.{name}: no such file: {path}", file=sys.stderr)
            return 2
    # The port first, before any model loads: a port in use is said at once, in one line.
    listeners = _listen(server.host, server.port)
    if isinstance(listeners, str):
        print(f"duplex-gateway: {listeners}", file=sys.stderr)
        return 2
    # Every session runs the VAD: a gateway that cannot load it must not start (and say ready).
    try:
        SileroVad.shared()
    except Exception as exc:  # noqa: BLE001 - a missing or broken file, an onnxruntime that cannot load it
        for listener in listeners:
            listener.close()
        print(f"duplex-gateway: cannot load the voice activity model: {exc}", file=sys.stderr)
        return 2
    configure_logging(server.log_level, server.log_format)
    try:
        app = create_app(settings, engine)
    except ConfigError as exc:  # e.g. a carrier's key that is well formed but of the wrong kind
        for listener in listeners:
            listener.close()
        print(f"duplex-gateway: {exc}", file=sys.stderr)
        return 2

    gateway = app.state.gateway

    class GatewayServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # At once, not at the main loop's next tick: a load balancer probing /readyz
            # sees 503 and no new session starts. Flags only: this runs in a signal handler.
            gateway.stop_admitting()
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[Any] | None = None) -> None:
            # Drain while still listening, so /readyz keeps answering 503: uvicorn itself would
            # stop listening and close every WebSocket with 1012 at once. A second Ctrl-C cuts it short.
            try:
                await gateway.drain(server.drain_grace_s, abandon=lambda: self.force_exit)
            finally:
                await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        loop="uvloop",
        # uvicorn's httptools protocol, with a deadline on each request head (uvicorn sets none).
        http=head_timeout_protocol(server.request_head_timeout_s),
        # uvicorn's sans-I/O WebSocket protocol; a client that reads nothing more is dropped.
        ws=stuck_client_protocol(settings.limits.send_timeout_s),
        ws_max_size=settings.limits.hard_max_message_bytes,
        ws_ping_interval=server.ws_ping_interval_s,
        ws_ping_timeout=server.ws_ping_timeout_s,
        ws_per_message_deflate=server.ws_per_message_deflate,
        log_level=server.log_level,
        ssl_certfile=server.ssl_certfile,
        ssl_keyfile=server.ssl_keyfile,
        timeout_graceful_shutdown=5,
        # Logging is configure_logging's: uvicorn's records go through the same handler and format.
        log_config=None,
    )
    # uvicorn raises the signal that stopped it again once it is done, to the handler found at
    # start: these make a drained stop exit 0 instead of dying of that signal.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    scheme = "https" if server.ssl_certfile else "http"
    host = f"[{server.host}]" if ":" in server.host else server.host
    # uvicorn says where it listens only for sockets it binds itself.
    port = listeners[0].getsockname()[1]
    logging.getLogger("duplex_gateway").info(
        "listening on %s://%s:%d once the engine is ready", scheme, host, port
    )
    try:
        GatewayServer(config).run(sockets=listeners)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _listen(host: str, port: int) -> list[socket.socket] | str:
    """Sockets bound to ``host:port`` for uvicorn to listen on, or why there are none, in words.

    Bound as asyncio would bind them for uvicorn (every address ``host`` names, ``SO_REUSEADDR``,
    IPv6 sockets IPv6 only), but here, before the engine loads its models. Connections are refused
    until uvicorn listens on them, once the engine is ready.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot listen on {host}: {exc.strerror} (server.host / --host)"
    listeners: list[socket.socket] = []
    for family, kind, proto, _, address in dict.fromkeys(infos):
        listener = socket.socket(family, kind, proto)
        listeners.append(listener)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            listener.bind(address)
        except OSError as exc:
            for opened in listeners:
                opened.close()
            return _bind_problem(exc, host, port)
        listener.set_inheritable(True)
    return listeners


def _bind_problem(exc: OSError, host: str, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use (is a gateway already running?): "
            "stop what listens there or choose another --port"
        )
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges this user lacks: choose a port above 1023 (--port)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: no such address on this machine (server.host / --host)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _stopped(sig: int, frame: object) -> None:
    """A stop signal once uvicorn has finished (its graceful shutdown is done)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``duplex-gateway`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "call":
        return _call(args)
    if args.command == "replay":
        from duplex_gateway.ops.replay import run

        return run(
            args.recording,
            engine=args.engine,
            config=args.config,
            speed=args.speed,
            out=args.out,
            exact_deltas=args.exact_deltas,
            settle_s=args.settle,
            keep=args.keep,
        )
    if args.command == "bench":
        from duplex_gateway.bench.cli import main as bench

        return bench(args, argv[1:] if argv is not None else None)
    return 2


if __name__ == "__main__":
    sys.exit(main())
