"""The documentation: the generated configuration reference is current, and the README's links land.

The site itself is built by ``make test`` with ``mkdocs build --strict``, which fails on a broken
link between the pages under ``docs/``; the README is outside the site, so its links are checked here.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_reference", REPO / "scripts" / "config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """The id Python-Markdown's toc extension (MkDocs' default) gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_slug(match.group(1)) for match in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)}


def test_the_configuration_reference_is_generated_from_the_settings_model() -> None:
    generator = _generator()
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert committed == generator.render(), (
        "docs/configuration.md is out of date: run python scripts/config_reference.py"
    )


def test_the_configuration_reference_names_every_key() -> None:
    from duplex_gateway.config import GatewaySettings

    page = _generator().render()
    for section, info in GatewaySettings.model_fields.items():
        assert f"## `{section}`" in page
        model = info.annotation
        assert model is not None
        for key in model.model_fields:
            assert f"| `{key}` |" in page, f"{section}.{key} is missing from the reference"


def test_every_relative_link_of_the_readme_resolves() -> None:
    text = re.sub(r"```.*?```", "", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    checked = 0
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = README.parent / path if path else README
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), (
                f"README links to {link}: {path or 'README'} has no heading #{anchor}"
            )
        checked += 1
    assert checked > 0


def test_the_readme_is_a_front_page_not_a_manual() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: the rest belongs in docs/"


def test_the_quick_start_page_shows_the_readme_example_as_the_readme_does() -> None:
    # The README's copy is the one tests/e2e/test_readme_example.py runs; the site's must not drift from it.
    section = README.read_text(encoding="utf-8").split("### Trying a client against the `echo` engine", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    page = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    assert f"```python\n{snippet}\n```" in page, "docs/quickstart.md's example differs from the README's"
