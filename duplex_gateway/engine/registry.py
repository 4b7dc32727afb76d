"""Engines by name: what ``--engine NAME`` and ``engine.name`` select."""

from __future__ import annotations

from collections.abc import Callable

from duplex_gateway.config import GatewaySettings
from duplex_gateway.engine.port import Engine

__all__ = ["ENGINES", "UnknownEngine", "build_engine"]


def _echo(settings: GatewaySettings) -> Engine:
    from duplex_gateway.engine.echo import EchoEngine

    echo = settings.engine.echo
    return EchoEngine(
        rate=echo.rate,
        chunk_ms=echo.chunk_ms,
        pace=echo.pace,
        max_turn_s=echo.max_turn_s,
        max_sessions=settings.limits.max_sessions,
    )


def _embedded(settings: GatewaySettings) -> Engine:
    from duplex_gateway.engine.embedded import EmbeddedEngine

    embedded = settings.engine.embedded
    limit = settings.limits.max_sessions
    return EmbeddedEngine(
        max_sessions=min(limit, embedded.max_sessions) if embedded.max_sessions else limit,
        max_turn_s=embedded.max_turn_s,
        workers=embedded.workers,
        whisper_cpu_threads=embedded.whisper_cpu_threads,
        tts_threads=embedded.tts_threads,
        partials=embedded.partials,
        chunk_ms=embedded.chunk_ms,
        pace=embedded.pace,
        lead_ms=embedded.lead_ms,
    )


#: Builders by engine name; each imports its engine only when chosen, so heavy
#: stacks never load unless asked for.
ENGINES: dict[str, Callable[[GatewaySettings], Engine]] = {
    "echo": _echo,
    "embedded": _embedded,
}


class UnknownEngine(ValueError):
    pass


def build_engine(settings: GatewaySettings) -> Engine:
    """The engine ``settings.engine.name`` names."""
    name = settings.engine.name
    try:
        builder = ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"engine.name: unknown engine {name!r}; choose one of {', '.join(sorted(ENGINES))}") from None
    return builder(settings)
