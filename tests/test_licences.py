"""What ``pip install duplex-gateway`` brings is under a stated licence and holds no GPL code.

Read from the installed distributions' own metadata (``importlib.metadata``): the core's whole
dependency closure (the requirements without an extra, followed transitively, markers evaluated
for this interpreter) must each state a licence, none of them GPL or AGPL (LGPL is allowed: it
does not reach the gateway's own code). The extras' licences are checked against what the
README's licence table says of them, so the table stays true when a dependency changes.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

README = Path(__file__).resolve().parents[1] / "README.md"
PROJECT = "duplex-gateway"

#: GPL or AGPL, in an SPDX expression, a free-text licence field or a trove classifier; not LGPL.
_COPYLEFT = re.compile(r"(?<![L])GPL|GNU General Public|Affero", re.IGNORECASE)


def licence(dist: md.Distribution) -> str:
    """What ``dist`` says its licence is (SPDX expression, then licence field, then classifiers); "" if nothing."""
    meta = dist.metadata
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return expression
    field = (meta.get("License") or "").strip()
    # Some put a whole licence text in the field: its first line names it.
    first_line = field.splitlines()[0].strip() if field else ""
    if first_line and first_line.upper() not in ("UNKNOWN", "NONE"):
        return first_line
    classifiers = [
        c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    return " / ".join(classifiers)


def is_gpl(text: str) -> bool:
    """Whether a licence statement leaves only GPL/AGPL: true unless some ``OR`` alternative avoids it."""
    alternatives = re.split(r"\s+OR\s+", text.strip("() ")) if " OR " in text else [text]
    return all(_COPYLEFT.search(alternative) for alternative in alternatives)


def closure(name: str, extras: tuple[str, ...] = ()) -> dict[str, md.Distribution]:
    """``name`` with ``extras`` and everything it needs, as installed here (by canonical name)."""
    found: dict[str, md.Distribution] = {}
    pending: list[tuple[str, frozenset[str]]] = [(name, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        current, wanted = pending.pop()
        key = (canonicalize_name(current), wanted)
        if key in seen:
            continue
        seen.add(key)
        dist = md.distribution(current)
        found.setdefault(canonicalize_name(current), dist)
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None:
                # Needed without an extra, or for one of those asked for.
                environments = [{**default_environment(), "extra": extra} for extra in ("", *wanted)]
                if not any(marker.evaluate(env) for env in environments):
                    continue
            pending.append((requirement.name, frozenset(requirement.extras)))
    return found


def problems(dists: dict[str, md.Distribution]) -> list[str]:
    """Each distribution with no stated licence or a GPL one, with what it says."""
    found = []
    for name, dist in sorted(dists.items()):
        stated = licence(dist)
        if not stated:
            found.append(f"{name} {dist.version}: no licence stated")
        elif is_gpl(stated):
            found.append(f"{name} {dist.version}: {stated}")
    return found


def test_the_core_closure_states_a_licence_and_is_not_gpl() -> None:
    core = closure(PROJECT)
    # The closure really is the core's: the speech stack and the carriers' extras are not in it.
    assert {"numpy", "onnxruntime", "starlette", "uvicorn", "websockets"} <= core.keys()
    assert not {"piper-tts", "faster-whisper", "pocketsphinx", "g722", "cryptography"} & core.keys()
    assert problems(core) == []


def test_the_checker_catches_gpl_and_a_missing_licence() -> None:
    # piper-tts (the embedded extra's TTS) is GPL-3.0-or-later: the same check on that closure fails.
    embedded = closure(PROJECT, ("embedded",))
    assert any(line.startswith("piper-tts ") for line in problems(embedded)), problems(embedded)
    assert (
        is_gpl("GPL-3.0-or-later")
        and is_gpl("AGPL-3.0-only")
        and is_gpl("GNU General Public License v3 (GPLv3)")
    )
    assert not is_gpl("LGPL-2.1-or-later") and not is_gpl(
        "GNU Lesser General Public License v2 or later (LGPLv2+)"
    )
    assert not is_gpl("MIT OR GPL-2.0-only") and is_gpl("GPL-2.0-only OR GPL-3.0-only")


def _readme_licence_rows() -> dict[str, str]:
    """The README's licence table: install (``core`` or the extra's name) to the GPL packages it names."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### What each install brings, and its licences", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and (
            match := re.fullmatch(r"`pip install (?:'?)duplex-gateway(?:\[(\w+)\])?'?`", cells[0])
        ):
            rows[match.group(1) or "core"] = cells[2]
    return rows


@pytest.mark.parametrize("extra", ["core", "embedded", "telephony"])
def test_the_readme_names_each_installs_gpl_code(extra: str) -> None:
    rows = _readme_licence_rows()
    assert extra in rows, f"README's licence table has no row for {extra}: {sorted(rows)}"
    base = closure(PROJECT)
    added = closure(PROJECT, () if extra == "core" else (extra,))
    own = {name: dist for name, dist in added.items() if extra == "core" or name not in base}
    gpl = [name for name, dist in own.items() if is_gpl(licence(dist))]
    for name in gpl:
        assert f"`{name}`" in rows[extra], (
            f"README does not say that {extra} brings {name} ({licence(own[name])})"
        )
    if not gpl:
        assert "no GPL" in rows[extra], (
            f"README's {extra} row should say it brings no GPL code: {rows[extra]!r}"
        )
