"""Every configuration file shipped in configs/ loads and validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplex_gateway.config import load_settings

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


def test_configs_are_shipped() -> None:
    names = {path.name for path in CONFIGS}
    assert {
        "default.yaml",
        "minicpmo-4.5.yaml",
        "qwen3-omni-duplex.yaml",
        "qwen3-omni-turn.yaml",
        "qwen2.5-omni-turn.yaml",
        "nemotron-voicechat.yaml",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path: Path) -> None:
    settings = load_settings(path)
    assert settings.engine.name in {"embedded", "echo", "vllm-omni", "vllm-omni-stream", "remote"}
