"""The in-process vLLM-Omni engines' specs and their shared settings (``engine.vllm_omni``).

``vllm-omni`` (native duplex, :mod:`.vllm_omni`) and ``vllm-omni-stream`` (turn-based,
:mod:`.vllm_omni_stream`) read one section. This module stays light: the configuration
imports it in every install, and the engines (and vLLM, when they start) are imported
only when one of them is chosen.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from duplex_gateway.config_error import ConfigError
from duplex_gateway.engine.spec import EngineSpec, SettingsSection

if TYPE_CHECKING:
    from duplex_gateway.config import GatewaySettings
    from duplex_gateway.engine.port import Engine

__all__ = ["DUPLEX", "STREAM", "VllmOmniSettings", "omni_settings", "vllm_omni_installed"]


class VllmOmniSettings(SettingsSection):
    """The in-process vLLM-Omni engines: ``vllm-omni`` (native duplex) and ``vllm-omni-stream`` (turn-based)."""

    #: Model name or local path handed to ``DuplexOmni`` / ``AsyncOmni``.
    model: str | None = None
    #: Deploy YAML (a path, or a name under vLLM-Omni's ``deploy/``); ``vllm-omni`` needs ``session_mode: duplex``.
    deploy_config: str | None = None
    #: ``module:callable`` returning a ready ``DuplexOmni`` / ``AsyncOmni`` instead of building one from ``model``.
    omni_factory: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")
    trust_remote_code: bool = False
    #: Longest wait for the engine (stage processes, weights) at start-up.
    startup_timeout_s: float = Field(600.0, gt=0)
    #: Longest wait for a session open/close or an abort acknowledgement.
    control_timeout_s: float = Field(10.0, gt=0)
    #: Rate caller audio is handed to the engine at (default 16000, what vLLM-Omni normalizes to).
    input_rate: int | None = Field(None, ge=8_000, le=48_000)
    #: Rate reply audio is handed to the gateway at (default 24000); the engine's audio is resampled to it.
    output_rate: int | None = Field(None, ge=8_000, le=48_000)
    #: ``vllm-omni``: who finds the ends of turns, the gateway's VAD or vLLM-Omni's server VAD.
    turn_detection: Literal["gateway", "engine"] = "gateway"
    #: ``vllm-omni-stream``: caller audio is sent to the engine in pieces of at least this much.
    input_chunk_ms: int = Field(100, ge=0, le=5_000)
    #: ``vllm-omni-stream``: text that ends each turn's prompt, after the conversation (sent once per turn).
    prompt: str = ""


def vllm_omni_installed() -> bool:
    """Whether vLLM-Omni can be imported here (looked up, not imported: that is the engine's start)."""
    return importlib.util.find_spec("vllm_omni") is not None


def omni_settings(settings: GatewaySettings) -> VllmOmniSettings:
    """``engine.vllm_omni``, checked for what both engines need: a model (or a factory) and vLLM-Omni."""
    omni = DUPLEX.settings_of(settings)
    name = settings.engine.name
    if not omni.model and not omni.omni_factory:
        raise ConfigError(
            f"engine {name} needs engine.vllm_omni.model (--model) "
            "or engine.vllm_omni.omni_factory (--omni-factory)"
        )
    if not vllm_omni_installed():
        raise ConfigError(
            f"engine {name} needs vLLM-Omni, which is not installed in this environment: "
            "build its virtualenv with `make omni-venv` and run the gateway from it "
            "(.venv-omni/bin/duplex-gateway serve ...)"
        )
    return omni


def _duplex(settings: GatewaySettings) -> Engine:
    omni = omni_settings(settings)
    from duplex_gateway.engine.vllm_omni import VllmOmniEngine

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


def _stream(settings: GatewaySettings) -> Engine:
    omni = omni_settings(settings)
    from duplex_gateway.engine.vllm_omni_stream import VllmOmniStreamEngine

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


DUPLEX = EngineSpec(
    name="vllm-omni",
    section="vllm_omni",
    settings=VllmOmniSettings,
    build=_duplex,
    summary="vLLM-Omni's native duplex sessions in this process (the omni virtualenv)",
    records_turns=True,
)
STREAM = EngineSpec(
    name="vllm-omni-stream",
    section="vllm_omni",
    settings=VllmOmniSettings,
    build=_stream,
    summary="vLLM-Omni's turn-based streaming input in this process (the omni virtualenv)",
)
