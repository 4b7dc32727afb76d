"""Loading a vLLM-Omni engine object, shared by the ``vllm-omni`` and ``vllm-omni-stream`` engines.

Each engine builds its vLLM-Omni object (``DuplexOmni`` or ``AsyncOmni``) from the
model settings, or from a ``--omni-factory`` callable a deployment names; both
open their sessions at vLLM-Omni's own rates unless the model says otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "DEFAULT_INPUT_RATE",
    "DEFAULT_OUTPUT_RATE",
    "OmniFactoryError",
    "keep_root_logging",
    "load_factory",
    "omni_builder",
]

#: vLLM-Omni normalizes caller audio to 16 kHz; sending it at that rate avoids a second resampling.
DEFAULT_INPUT_RATE = 16_000
DEFAULT_OUTPUT_RATE = 24_000


class OmniFactoryError(ValueError):
    """``--omni-factory`` does not name an importable callable."""


def omni_builder(
    factory: str | Callable[[], Any] | None,
    default: str,
    *,
    model: str | None,
    deploy_config: str | None,
    trust_remote_code: bool,
) -> Callable[[], Any]:
    """What builds the engine object: the ``--omni-factory`` callable, or the ``default``
    class (``module:Class``) constructed from the model settings."""
    if callable(factory):
        return factory
    if isinstance(factory, str):
        return load_factory(factory)
    module_name, _, class_name = default.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    kwargs: dict[str, Any] = {"model": model, "trust_remote_code": trust_remote_code}
    if deploy_config:
        kwargs["deploy_config"] = deploy_config
    return lambda: cls(**kwargs)


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by ``module:attribute`` (like uvicorn's ``module:app``).

    The working directory is importable, as it is for ``python -m``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise OmniFactoryError(f"omni factory {spec!r} must look like 'package.module:callable'")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OmniFactoryError(f"omni factory {spec!r}: cannot import {module_name}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise OmniFactoryError(f"omni factory {spec!r}: {module_name} has no attribute {attr}") from None
    if not callable(target):
        raise OmniFactoryError(f"omni factory {spec!r} is not callable")
    return target  # type: ignore[no-any-return]


@contextlib.contextmanager
def keep_root_logging() -> Iterator[None]:
    """Undo what importing vLLM's serving stack does to the root logger.

    One of its dependencies (``model_hosting_container_standards``) sets the root
    logger and its handlers to ``LOG_LEVEL`` (default ERROR) when imported, which
    would silence the gateway's own warnings and info lines.
    """
    root = logging.getLogger()
    level = root.level
    handler_levels = [(h, h.level) for h in root.handlers]
    try:
        yield
    finally:
        root.setLevel(level)
        for handler, handler_level in handler_levels:
            handler.setLevel(handler_level)
