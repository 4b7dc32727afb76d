"""Engines by name: what ``--engine NAME`` and ``engine.name`` select.

The names and builders come from the engines' own specs (:mod:`duplex_gateway.engine.spec`);
each builder imports its engine only when chosen, so heavy stacks never load unless asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from duplex_gateway.config import GatewaySettings
from duplex_gateway.engine.port import Engine
from duplex_gateway.engine.spec import EngineSpec, SettingsSection, engine_specs

__all__ = ["ENGINES", "SPECS", "UnknownEngine", "build_engine"]

#: Every declared engine's spec, by name.
SPECS: Mapping[str, EngineSpec[SettingsSection]] = MappingProxyType(
    {spec.name: spec for spec in engine_specs()}
)

#: Builders by engine name.
ENGINES: Mapping[str, Callable[[GatewaySettings], Engine]] = MappingProxyType(
    {name: spec.build for name, spec in SPECS.items()}
)


class UnknownEngine(ValueError):
    pass


def build_engine(settings: GatewaySettings) -> Engine:
    """The engine ``settings.engine.name`` names."""
    name = settings.engine.name
    try:
        spec = SPECS[name]
    except KeyError:
        raise UnknownEngine(
            f"engine.name: unknown engine {name!r}; choose one of {', '.join(sorted(SPECS))}"
        ) from None
    return spec.build(settings)
