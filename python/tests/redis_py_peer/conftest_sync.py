"""Fixtures for redis-py's own ``tests/test_lock.py`` (copied by ``run.py`` into the run
directory as ``tests/conftest.py``; never into the repository's test tree): the clients it asks
for (``r``, and ``_get_client`` that its ``r_decoded`` fixture calls) on one server with the
module, and ``lock_class=RLockCompat`` wherever the tests pass redis-py's ``Lock``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.lock
import redis.lock
from _servers import Server

from redis_rlock import RLockCompat
from redis_rlock.aio import AsyncRLockCompat


@pytest.fixture(scope="session")
def peer_server() -> Iterator[Server]:
    """One redis-server with the module for the whole run (each test's client flushes it at
    teardown, as redis-py's fixtures do); its log is kept next to the results."""
    s = Server()
    yield s
    out = os.environ.get("RLOCK_PEER_OUT")
    if out:
        shutil.copyfile(s.log_path, os.path.join(out, "server.log"))
    s.close()


@pytest.fixture(autouse=True)
def _lock_class_is_rlock_compat(request: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests call ``redis.lock(..., lock_class=Lock)`` with the ``Lock`` their module
    imported from redis-py: that name is the drop-in here (sync or asyncio by module)."""
    module = request.module
    if getattr(module, "Lock", None) is redis.lock.Lock:
        monkeypatch.setattr(module, "Lock", RLockCompat)
    elif getattr(module, "Lock", None) is redis.asyncio.lock.Lock:
        monkeypatch.setattr(module, "Lock", AsyncRLockCompat)


_SERVER: list[Server] = []


@pytest.fixture(autouse=True)
def _server_of_the_run(peer_server: Server) -> None:
    _SERVER[:] = [peer_server]


def _get_client(
    cls: Any,
    request: Any,
    single_connection_client: bool = True,
    flushdb: bool = True,
    from_url: Any = None,
    **kwargs: Any,
) -> Any:
    """redis-py's helper of the same name, on the run's server: a client of ``cls`` (a
    single-connection client by default), flushed and closed when the test ends."""
    client = cls(port=_SERVER[0].port, socket_timeout=10, **kwargs)
    if single_connection_client:
        client = client.client()

    def teardown() -> None:
        if flushdb:
            client.flushdb()
        client.close()
        client.connection_pool.disconnect()

    request.addfinalizer(teardown)
    return client


@pytest.fixture
def r(request: Any) -> Iterator[redis.Redis]:
    with _get_client(redis.Redis, request) as client:
        yield client
