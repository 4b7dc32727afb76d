"""How hard the property tests push: modest in ``make test``, as hard as asked in a long run.

``HYPOTHESIS_PROFILE=long`` multiplies every test's example count by 100 (or sets it to
``HYPOTHESIS_MAX_EXAMPLES`` when given), so the same tests serve as a long fuzz run::

    HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest tests/properties
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["LONG", "examples"]

LONG = os.environ.get("HYPOTHESIS_PROFILE", "") == "long"


def examples(count: int) -> settings:
    """Settings for a property test that runs ``count`` examples in ``make test``."""
    if LONG:
        count = int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", count * 100))
    return settings(
        max_examples=count,
        # Generated cases vary a lot in size; timing one against another says nothing here.
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
