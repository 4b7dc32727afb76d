"""The ``embedded`` engine's spec and settings (``engine.embedded``).

Importing this module loads nothing of the engine: its packages come with the
``embedded`` extra, and :func:`_build` imports them only when the engine is chosen.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from duplex_gateway.config_error import ConfigError
from duplex_gateway.engine.spec import EngineSpec, SettingsSection
from duplex_gateway.extras import require

if TYPE_CHECKING:
    from duplex_gateway.config import GatewaySettings
    from duplex_gateway.engine.embedded.chat_llm import ChatSettings
    from duplex_gateway.engine.port import Engine

__all__ = ["SPEC", "EmbeddedLlmSettings", "EmbeddedSettings", "WhisperWindow", "chat_settings"]

#: How much audio Whisper's encoder reads for a turn: ``turn``, the turn and a margin (at least
#: 15 s); ``full``, Whisper's whole 30 s window, the padding after the turn included.
WhisperWindow = Literal["turn", "full"]


class EmbeddedLlmSettings(SettingsSection):
    """An optional language model for the ``embedded`` engine: any OpenAI-compatible chat endpoint.

    Off while ``url`` is null: the offline responder and tool router answer. Keys never go in
    a config file: name an environment variable in ``api_key_env``, or set
    ``DUPLEX_GATEWAY_ENGINE__EMBEDDED__LLM__API_KEY``.
    """

    #: Base URL of the API up to its version, e.g. ``http://127.0.0.1:8080/v1``; null: no model.
    url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$")
    #: The model to ask for; null: the first one the endpoint lists at start-up.
    model: str | None = Field(None, min_length=1)
    #: Sent as ``Authorization: Bearer``; for the environment only (see ``api_key_env``).
    api_key: str | None = Field(None, repr=False)
    #: Name of the environment variable that holds the key (used when ``api_key`` is unset).
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: Longest wait for the endpoint to start answering (and for the check at start-up, at most 2 s).
    timeout_s: float = Field(10.0, gt=0, le=300)
    #: Tokens one reply may produce (a reply's own ``max_output_tokens`` wins); null: the server's default.
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)


class EmbeddedSettings(SettingsSection):
    """The ``embedded`` engine: pocketsphinx + Whisper tiny.en + Piper on the CPU."""

    #: Longest caller turn kept for transcription; a longer one keeps its most recent part.
    max_turn_s: float = Field(30.0, gt=0, le=600)
    #: Inference threads shared by all sessions; unset means one per core.
    workers: int | None = Field(None, ge=1, le=256)
    #: Threads inside one Whisper transcription; unset means one per core.
    whisper_cpu_threads: int | None = Field(None, ge=1, le=256)
    #: Whisper's encoder is most of a turn's recognition, and the reply waits for it. ``turn``
    #: (about 0.2 s a sentence on 2 cores) encodes the turn and a margin, at least 15 s; ``full``
    #: (about 0.4 s) encodes Whisper's whole 30 s window, and over the test phrases misheard
    #: 1.1 % of words at 16 kHz where ``turn`` misheard 2.8 % (7.2 % either way at 8 kHz).
    #: While other callers' turns queue for Whisper, ``turn`` is used either way.
    whisper_window: WhisperWindow = "turn"
    #: Threads inside one Piper synthesis; unset means one per core.
    tts_threads: int | None = Field(None, ge=1, le=256)
    #: Stream partial transcripts of the caller (pocketsphinx; ~90 MB and ~0.2 of a core per talking caller).
    partials: bool = True
    #: Size of the reply audio chunks.
    chunk_ms: int = Field(100, ge=10, le=1000)
    #: Speed of the reply audio relative to real time; 0 sends it as fast as it is synthesized.
    #: Paced replies stay in progress while heard, so a barge-in stops what is not yet sent.
    pace: float = Field(1.0, ge=0)
    #: How far a paced reply runs ahead of real time: what covers network jitter (the next sentence
    #: is synthesized while this one plays). A client holds about this much unplayed: when caller
    #: speech holds the reply (``semantic_vad``'s backchannel judgement), one that stops only at
    #: ``speech_started`` hears the reply stop this long after the hold, not at the verdict.
    lead_ms: int = Field(200, ge=0, le=60_000)
    #: Sessions this engine admits (each talking caller costs CPU), capped by ``limits.max_sessions``.
    max_sessions: int | None = Field(8, ge=1)
    #: A language model to answer with instead of the offline responder (off by default).
    llm: EmbeddedLlmSettings = EmbeddedLlmSettings()


def chat_settings(llm: EmbeddedLlmSettings, section: str = "engine.embedded.llm") -> ChatSettings | None:
    """The chat endpoint ``llm`` (the settings ``section``) names, if its ``url`` names one."""
    from duplex_gateway.engine.embedded.chat_llm import ChatSettings

    if llm.url is None:
        return None
    key = llm.api_key
    if key is None and llm.api_key_env is not None:
        key = os.environ.get(llm.api_key_env)
        if not key:
            raise ConfigError(
                f"{section}.api_key_env names {llm.api_key_env}, which is not set in the environment"
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


def _build(settings: GatewaySettings) -> Engine:
    # Before the engine's import: its package imports httpx2, and its start loads the speech models.
    require("embedded", "engine embedded (the CPU speech engine; engines echo and remote need no extra)")
    from duplex_gateway.engine.embedded import EmbeddedEngine, default_voice_paths, whisper_model_path

    try:
        # Found now, loaded by the engine's start: a broken install is refused before the port opens.
        whisper_model_path()
        default_voice_paths()
    except FileNotFoundError as exc:
        raise ConfigError(f"engine embedded: {exc}") from None

    embedded = SPEC.settings_of(settings)
    limit = settings.limits.max_sessions
    return EmbeddedEngine(
        max_sessions=min(limit, embedded.max_sessions) if embedded.max_sessions else limit,
        max_turn_s=embedded.max_turn_s,
        workers=embedded.workers,
        whisper_cpu_threads=embedded.whisper_cpu_threads,
        tts_threads=embedded.tts_threads,
        whisper_window=embedded.whisper_window,
        partials=embedded.partials,
        chunk_ms=embedded.chunk_ms,
        pace=embedded.pace,
        lead_ms=embedded.lead_ms,
        chat=chat_settings(embedded.llm),
    )


SPEC = EngineSpec(
    name="embedded",
    section="embedded",
    settings=EmbeddedSettings,
    build=_build,
    summary="real speech on the CPU: pocketsphinx, Whisper tiny.en and Piper (the embedded extra)",
)
