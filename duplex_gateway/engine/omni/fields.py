"""vLLM-Omni's session fields as its engines read them (the ``vllm-omni`` and ``remote`` engines).

The gateway keeps these fields in :class:`~duplex_gateway.vocabulary.session_config.SessionConfig`
(validated where it has an opinion); here they become the keys of a vLLM-Omni
``session`` object. An update carries only what changed (:func:`changed_fields`):
vLLM-Omni refuses some fields once a session has produced audio (``voice``) or
at all after the open (``ref_audio``), so an update must never repeat them.
"""

from __future__ import annotations

from collections.abc import Mapping

from duplex_gateway.vocabulary.session_config import VLLM_OMNI_FIELDS, SessionConfig

__all__ = ["changed_fields", "omni_session_fields"]

#: The vLLM-Omni key of each configuration field whose name differs.
_WIRE_NAMES = {"noise_reduction": "input_audio_noise_reduction"}


def omni_session_fields(config: SessionConfig) -> dict[str, object]:
    """The vLLM-Omni session fields ``config`` sets (those left at the engine's default are absent)."""
    fields: dict[str, object] = {}
    for name in VLLM_OMNI_FIELDS:
        value = getattr(config, name)
        if value is None or (isinstance(value, Mapping) and not value and name == "extra_body"):
            continue
        fields[_WIRE_NAMES.get(name, name)] = dict(value) if isinstance(value, Mapping) else value
    return fields


def changed_fields(before: Mapping[str, object], after: Mapping[str, object]) -> dict[str, object]:
    """The keys of ``after`` whose values differ from ``before``; a key ``after`` dropped is sent as null."""
    changes = {key: value for key, value in after.items() if key not in before or before[key] != value}
    for key in before:
        if key not in after:
            changes[key] = None
    return changes
