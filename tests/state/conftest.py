"""A real redis-server for each test, and the gateway's store on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from duplex_gateway.state.redis_store import RedisStateStore
from tests.redis_server import RedisServer, redis_server_at


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server_at(tmp_path) as server:
        yield server


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStateStore]:
    store = RedisStateStore(redis_server.url, timeout_s=0.5)
    yield store
    await store.close()
