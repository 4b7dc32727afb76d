"""REAL gateway processes on loopback, as the end-to-end tests start them (see :mod:`tests.e2e.helpers`)."""

from tests.e2e.conftest import (  # noqa: F401 - fixtures, registered by import
    _no_traceback_in_gateway_logs,
    gateway_factory,
    module_gateway_factory,
)
