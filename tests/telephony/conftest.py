"""Calls run against real gateways: the e2e fixtures, reused as they are."""

from tests.e2e.conftest import (  # noqa: F401 - fixtures, registered by import
    _no_traceback_in_gateway_logs,
    gateway_factory,
    module_gateway_factory,
)
