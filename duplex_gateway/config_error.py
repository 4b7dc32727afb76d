"""The error of a configuration the gateway cannot run, on its own so every part that checks one can raise it.

:mod:`duplex_gateway.config` builds its sections from the engines' and carriers' spec modules,
and those modules refuse what they cannot run with this error: defined here, it needs neither
side to import the other. :mod:`duplex_gateway.config` names it too.
"""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(Exception):
    """The configuration is invalid; the message names each bad key."""
