"""What an engine declares about itself: its name, its settings and how to build it.

Each engine declares an :class:`EngineSpec` in a light module of its own (or at the end
of its module, when that is light); :data:`ENGINE_SPECS` lists where they are.
The configuration takes each engine's section (``engine.<section>``) from the specs,
and the registry builds the engine a configuration names from them, so adding an
engine is its module (with its ``SPEC``), one line here, and its tests.

A spec module must be cheap to import: the configuration imports every one of them.
Whatever an engine needs beyond the core (an extra's packages, vLLM, models) is
imported by its ``build``, only when that engine is chosen.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from duplex_gateway.config import GatewaySettings
    from duplex_gateway.engine.port import Engine

__all__ = ["ENGINE_SPECS", "EngineSpec", "SettingsSection", "engine_specs", "lazy_exports"]


class SettingsSection(BaseModel):
    """Base of an engine's settings: unknown keys are errors, values never change after the load."""

    model_config = ConfigDict(extra="forbid", frozen=True)


S = TypeVar("S", bound=SettingsSection)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpec(Generic[S]):
    """One engine as the configuration and the registry see it."""

    #: What ``engine.name`` (``--engine``) says to choose it.
    name: str
    #: Its key under ``engine:`` in the configuration; engines may share one (the two vLLM-Omni engines do).
    section: str
    #: The settings model of that section.
    settings: type[S]
    #: Builds the engine from the whole configuration; raises ``ConfigError`` for a configuration it cannot run.
    build: Callable[[GatewaySettings], Engine]
    #: One line for ``--help`` and error messages.
    summary: str = ""
    #: The engine sends its own record of each committed turn (``EngineTurnCommitted``):
    #: vLLM-Omni's duplex sessions do; for the others the gateway's commit is the record.
    records_turns: bool = False

    def settings_of(self, settings: GatewaySettings) -> S:
        """This engine's section of ``settings``, as its own model."""
        value = getattr(settings.engine, self.section)
        if not isinstance(
            value, self.settings
        ):  # pragma: no cover - the configuration is built from the specs
            raise TypeError(
                f"engine.{self.section} is a {type(value).__name__}, not {self.settings.__name__}"
            )
        return value


#: Where each engine's spec is declared (``module:NAME``), in the order ``--help`` lists them.
ENGINE_SPECS: tuple[str, ...] = (
    "duplex_gateway.engine.echo:SPEC",
    "duplex_gateway.engine.embedded.spec:SPEC",
    "duplex_gateway.engine.vllm_omni_spec:DUPLEX",
    "duplex_gateway.engine.vllm_omni_spec:STREAM",
    "duplex_gateway.engine.remote.spec:SPEC",
)


@functools.cache
def engine_specs() -> tuple[EngineSpec[SettingsSection], ...]:
    """Every declared engine's spec (imports the spec modules, never an engine's heavy parts)."""
    specs: list[EngineSpec[SettingsSection]] = []
    for where in ENGINE_SPECS:
        module_name, _, attribute = where.partition(":")
        spec = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(spec, EngineSpec):  # pragma: no cover - a wrong entry above
            raise TypeError(f"{where} is not an EngineSpec")
        specs.append(spec)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):  # pragma: no cover - two specs claiming one name
        raise ValueError(f"engine names declared twice: {sorted(n for n in names if names.count(n) > 1)}")
    return tuple(specs)


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A package's ``__getattr__`` (PEP 562) importing each name from its submodule on first use.

    For an engine package whose spec module is imported with the configuration:
    ``exports`` maps each name to the submodule (of ``package``) that defines it, so
    importing the package (to reach its spec) loads none of the engine.
    """

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
