"""Engines by name: what ``--engine NAME`` and ``engine.name`` select."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from duplex_gateway.config import ConfigError, GatewaySettings
from duplex_gateway.engine.port import Engine
from duplex_gateway.extras import require

if TYPE_CHECKING:
    from duplex_gateway.engine.embedded.chat_llm import ChatSettings

__all__ = ["ENGINES", "UnknownEngine", "build_engine"]


def _echo(settings: GatewaySettings) -> Engine:
    from duplex_gateway.engine.echo import EchoEngine

    echo = settings.engine.echo
    return EchoEngine(
        rate=echo.rate,
        chunk_ms=echo.chunk_ms,
        pace=echo.pace,
        max_turn_s=echo.max_turn_s,
        start_delay_ms=echo.start_delay_ms,
        max_sessions=settings.limits.max_sessions,
    )


def _embedded_chat(settings: GatewaySettings) -> ChatSettings | None:
    """The embedded engine's language model, if ``engine.embedded.llm.url`` names one."""
    from duplex_gateway.engine.embedded.chat_llm import ChatSettings

    llm = settings.engine.embedded.llm
    if llm.url is None:
        return None
    key = llm.api_key
    if key is None and llm.api_key_env is not None:
        key = os.environ.get(llm.api_key_env)
        if not key:
            raise ConfigError(
                f"engine.embedded.llm.api_key_env names {llm.api_key_env}, which is not set in the environment"
            )
    return ChatSettings(
        url=llm.url,
        # Empty: the engine asks the endpoint which models it serves and takes the first.
        model=llm.model or "",
        api_key=key,
        timeout_s=llm.timeout_s,
        max_tokens=llm.max_tokens,
        temperature=llm.temperature,
    )


def _embedded(settings: GatewaySettings) -> Engine:
    # Before its import: the engine's package imports httpx2, and its start loads the speech models.
    require("embedded", "engine embedded (the CPU speech engine; engines echo and remote need no extra)")
    from duplex_gateway.engine.embedded import EmbeddedEngine, default_voice_paths, whisper_model_path

    try:
        # Found now, loaded by the engine's start: a broken install is refused before the port opens.
        whisper_model_path()
        default_voice_paths()
    except FileNotFoundError as exc:
        raise ConfigError(f"engine embedded: {exc}") from None

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
        chat=_embedded_chat(settings),
    )


def _vllm_omni_installed() -> bool:
    return importlib.util.find_spec("vllm_omni") is not None


def _vllm_omni_source(settings: GatewaySettings) -> None:
    omni = settings.engine.vllm_omni
    name = settings.engine.name
    if not omni.model and not omni.omni_factory:
        raise ConfigError(
            f"engine {name} needs engine.vllm_omni.model (--model) "
            "or engine.vllm_omni.omni_factory (--omni-factory)"
        )
    if not _vllm_omni_installed():
        raise ConfigError(
            f"engine {name} needs vLLM-Omni, which is not installed in this environment: "
            "build its virtualenv with `make omni-venv` and run the gateway from it "
            "(.venv-omni/bin/duplex-gateway serve ...)"
        )


def _vllm_omni(settings: GatewaySettings) -> Engine:
    from duplex_gateway.engine.vllm_omni import VllmOmniEngine

    _vllm_omni_source(settings)
    omni = settings.engine.vllm_omni
    return VllmOmniEngine(
        factory=omni.omni_factory,
        model=omni.model,
        deploy_config=omni.deploy_config,
        trust_remote_code=omni.trust_remote_code,
        startup_timeout_s=omni.startup_timeout_s,
        control_timeout_s=omni.control_timeout_s,
        input_rate=omni.input_rate,
        output_rate=omni.output_rate,
        engine_vad=omni.turn_detection == "engine",
        max_sessions=settings.limits.max_sessions,
    )


def _vllm_omni_stream(settings: GatewaySettings) -> Engine:
    from duplex_gateway.engine.vllm_omni_stream import VllmOmniStreamEngine

    _vllm_omni_source(settings)
    omni = settings.engine.vllm_omni
    return VllmOmniStreamEngine(
        factory=omni.omni_factory,
        model=omni.model,
        deploy_config=omni.deploy_config,
        trust_remote_code=omni.trust_remote_code,
        startup_timeout_s=omni.startup_timeout_s,
        abort_timeout_s=omni.control_timeout_s,
        input_rate=omni.input_rate,
        output_rate=omni.output_rate,
        input_chunk_ms=omni.input_chunk_ms,
        prompt=omni.prompt,
        max_sessions=settings.limits.max_sessions,
    )


def _remote(settings: GatewaySettings) -> Engine:
    """Engine ``remote``: a pool of vLLM-Omni servers (see ``engine.remote``)."""
    from duplex_gateway.engine.remote import BackendSpec, RemoteEngine

    remote = settings.engine.remote
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


#: Builders by engine name; each imports its engine only when chosen, so heavy
#: stacks never load unless asked for.
ENGINES: dict[str, Callable[[GatewaySettings], Engine]] = {
    "echo": _echo,
    "embedded": _embedded,
    "vllm-omni": _vllm_omni,
    "vllm-omni-stream": _vllm_omni_stream,
    "remote": _remote,
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
