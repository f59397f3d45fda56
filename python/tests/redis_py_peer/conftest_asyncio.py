"""Fixtures for redis-py's own ``tests/test_asyncio/test_lock.py`` (copied by ``run.py`` into
the run directory as ``tests/test_asyncio/conftest.py``): ``create_redis`` (a single-connection
client and a pooled one, as redis-py parametrizes it) and ``r``, on the run's server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Callable

import pytest_asyncio
import redis.asyncio as aredis

from tests.conftest import _SERVER


@pytest_asyncio.fixture(params=[(True,), (False,)], ids=["single", "pool"])
async def create_redis(request: Any) -> AsyncIterator[Callable[..., Awaitable[aredis.Redis]]]:
    (single_connection,) = request.param
    clients: list[tuple[aredis.Redis, bool]] = []

    async def client_factory(
        url: Any = None, cls: Any = aredis.Redis, flushdb: bool = True, **kwargs: Any
    ) -> aredis.Redis:
        single = kwargs.pop("single_connection_client", False) or single_connection
        client = cls(port=_SERVER[0].port, socket_timeout=10, **kwargs)
        if single:
            client = client.client()
            await client.initialize()
        clients.append((client, flushdb))
        return client

    yield client_factory
    for client, flushdb in clients:
        if flushdb:
            await client.flushdb()
        await client.aclose()
        await client.connection_pool.disconnect()


@pytest_asyncio.fixture
async def r(create_redis: Callable[..., Awaitable[aredis.Redis]]) -> aredis.Redis:
    return await create_redis()
