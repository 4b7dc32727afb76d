"""Configuration loading: file, environment, command line, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.engine.registry import UnknownEngine, build_engine
from duplex_gateway.server.app import session_defaults

ROOT = Path(__file__).resolve().parent.parent


def test_default_config_file_matches_builtin_defaults() -> None:
    assert load_settings(ROOT / "configs" / "default.yaml") == load_settings(None)


def test_precedence_cli_over_env_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("limits:\n  max_sessions: 3\n  idle_timeout_s: 7\nserver:\n  port: 1111\n")
    monkeypatch.setenv("DUPLEX_GATEWAY_LIMITS__IDLE_TIMEOUT_S", "9")
    monkeypatch.setenv("DUPLEX_GATEWAY_SERVER__PORT", "2222")
    settings = load_settings(path, **{"server.port": 3333, "engine.name": None})
    assert settings.limits.max_sessions == 3
    assert settings.limits.idle_timeout_s == 9
    assert settings.server.port == 3333


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("limits:\n  max_sesions: 3\n", "limits.max_sesions"),
        ("limits:\n  max_sessions: 0\n", "limits.max_sessions"),
        ("session:\n  input_format: mp3\n", "session.input_format"),
        ("session:\n  input_rate: 96000\n", "session.input_rate"),
        ("engin:\n  name: echo\n", "engin"),
        ("server:\n  node_id: gw_1\n", "server.node_id"),
    ],
)
def test_errors_name_the_bad_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert key in str(info.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("limits: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(bad)


def test_env_error_names_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUPLEX_GATEWAY_LIMITS__MAX_SESSIONS", "lots")
    with pytest.raises(ConfigError, match="limits.max_sessions"):
        load_settings(None)


def test_unknown_engine_is_named() -> None:
    with pytest.raises(UnknownEngine, match="warp"):
        build_engine(load_settings(None, **{"engine.name": "warp"}))


def test_session_defaults_follow_config() -> None:
    config = session_defaults(
        load_settings(None, **{"session.turn_detection": "none", "session.input_rate": 16000})
    )
    assert config.turn_detection is None
    assert config.input_format.rate == 16000


def test_node_id_comes_from_file_env_or_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(None).server.node_id is None
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  node_id: gw1\n")
    assert load_settings(path).server.node_id == "gw1"
    monkeypatch.setenv("DUPLEX_GATEWAY_SERVER__NODE_ID", "gw-2")
    assert load_settings(path).server.node_id == "gw-2"
    assert load_settings(path, **{"server.node_id": "gw3"}).server.node_id == "gw3"
