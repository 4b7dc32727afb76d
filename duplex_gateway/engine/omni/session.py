"""The vLLM-Omni ``session`` object a gateway session is opened and updated with.

Both engines build it here: the ``vllm-omni`` engine opens its in-process session
with it (:func:`engine_session`), the ``remote`` engine sends it in a
``session.update`` (:func:`session_object`, in vLLM-Omni ``DuplexClient``'s
shape, which a duplex-gateway backend reads too). An update sends only the keys
that differ from the object sent before (:func:`~.fields.changed_fields`).

Decided once for both engines: ``speed`` is always sent (an update back to 1.0
must say so: a key left out would go as null), and text is always asked for
(vLLM-Omni accepts a playback report only for a reply that carried text).
"""

from __future__ import annotations

from typing import Any

from duplex_gateway.engine.omni.fields import omni_session_fields
from duplex_gateway.engine.omni.tools import session_tools
from duplex_gateway.vocabulary.session_config import Modality, SessionConfig, SessionKind

__all__ = ["engine_answers", "engine_session", "output_modalities", "session_object"]


def output_modalities(config: SessionConfig) -> list[str]:
    """What vLLM-Omni is asked to make: text always, audio where the client wants it."""
    return ["text", "audio"] if Modality.AUDIO in config.output_modalities else ["text"]


def engine_answers(config: SessionConfig) -> bool:
    """vLLM-Omni's ``auto_response`` for a session: the client's, in a session that replies at all.

    With it the model's own turn-taking decides which commits get a reply (the
    gateway session then leaves the decision to the engine).
    """
    return config.auto_response and config.kind is SessionKind.REALTIME


def _common(config: SessionConfig) -> dict[str, Any]:
    session: dict[str, Any] = {
        "modalities": output_modalities(config),
        "instructions": config.instructions or None,
        "speed": config.speed,
    }
    if config.voice and config.voice != "default":
        session["voice"] = config.voice
    session.update(omni_session_fields(config))
    # The functions the model may call (vLLM-Omni keeps them as extra_body.realtime_tools).
    session.update(session_tools(config.tools, config.tool_choice))
    # The model's knobs go as the client sent them, auto_response too.
    session["extra_body"] = {**config.extra_body, "auto_response": engine_answers(config)}
    return session


def session_object(
    config: SessionConfig, *, input_rate: int, output_rate: int, initial: bool
) -> dict[str, Any]:
    """The ``session`` of a ``session.update`` to a vLLM-Omni (or duplex-gateway) server.

    PCM16 both ways at the engine's rates; ``turn_detection: null`` because the
    gateway's own VAD (or the client) decides turns and commits them.
    """
    session = _common(config)
    session["turn_detection"] = None
    if initial:
        session.update(
            {
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "sample_rate_hz": input_rate,
                "audio": {"input": {"sample_rate_hz": input_rate}, "output": {"sample_rate_hz": output_rate}},
            }
        )
    return session


def engine_session(config: SessionConfig, *, initial: bool, detects_turns: bool) -> dict[str, object]:
    """The Realtime ``session`` object an in-process vLLM-Omni session is opened / updated with.

    ``detects_turns``: the engine runs its own VAD, configured from the client's
    ``turn_detection`` (else turns are the gateway's and the engine's VAD is off).
    """
    session: dict[str, object] = {**_common(config), "output_audio_format": "pcm16"}
    if initial:
        session["type"] = "realtime"
        session["input_audio_format"] = "pcm16"
    td = config.turn_detection
    if detects_turns and td is not None:
        session["turn_detection"] = {
            "type": "server_vad",
            "threshold": td.threshold,
            "prefix_padding_ms": td.prefix_padding_ms,
            "silence_duration_ms": td.silence_duration_ms,
            "create_response": td.create_response,
            "interrupt_response": td.interrupt_response,
        }
    elif initial or not detects_turns:
        session["turn_detection"] = None
    return session
