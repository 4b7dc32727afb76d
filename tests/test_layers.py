"""The layers import downwards only: what each pure layer of the package may take from the rest of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "duplex_gateway"

#: For each layer, the parts of the gateway its modules may import (prefixes of module names).
ALLOWED: dict[str, tuple[str, ...]] = {
    # The shared types: nothing else of the gateway, so every layer can name them.
    "vocabulary": ("duplex_gateway.vocabulary",),
    # Wire protocols translate frames to the vocabulary and back, never touching a socket.
    "dialects": ("duplex_gateway.vocabulary", "duplex_gateway.dialects"),
    # Codecs, resampling and voice activity work on samples and formats only.
    "audio": ("duplex_gateway.vocabulary", "duplex_gateway.audio"),
    # The conversation state: the vocabulary, the engine port's types and the pure turn detector.
    "session": (
        "duplex_gateway.vocabulary",
        "duplex_gateway.session",
        "duplex_gateway.engine.port",
        "duplex_gateway.audio.turn_detector",
    ),
}


def _gateway_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "duplex_gateway.engine":
                names.extend(f"duplex_gateway.engine.{alias.name}" for alias in node.names)
            else:
                names.append(node.module)
    return [name for name in names if name.split(".")[0] == "duplex_gateway"]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_pure_layer_imports_only_what_is_below_it(layer: str) -> None:
    modules = sorted((PACKAGE / layer).rglob("*.py"))
    assert modules, layer
    wrong = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in modules
        for name in _gateway_imports(path)
        if not name.startswith(ALLOWED[layer])
    }
    assert not wrong
