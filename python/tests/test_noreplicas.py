"""An acquire refused for want of replicas (``NOREPLICAS``: the master's
``rlock.min-replicas`` not met) is told at once when it makes one try, and retried until its
deadline when it has one: granted once grants are allowed again, ``NoReplicas`` raised at the
deadline and not beyond (sync and asyncio)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, poll

import redis_rlock as rl
import redis_rlock.aio as ra


def _acquire_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats").get("cmdstat_rlock.acquire", {})
    return int(stats.get("calls", 0))


def _try(lock: rl.Lock, timeout: float) -> Any:
    try:
        return lock.acquire(timeout=timeout)
    except rl.LockError as e:
        return e


def test_an_acquire_with_a_deadline_retries_noreplicas_until_grants_are_allowed(
    r: redis.Redis,
) -> None:
    r.config_set("rlock.min-replicas", 1)  # no replica: this master grants nothing
    lock = rl.Lock(r, "norep", lease=10)
    t0 = time.monotonic()
    with pytest.raises(rl.NoReplicas):
        lock.acquire(blocking=False)  # one try: told at once
    assert time.monotonic() - t0 < 1.0
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_try(lock, 5)), daemon=True)
    t.start()
    poll("the acquire to be refused twice", 5, lambda: _acquire_calls(r) >= 3)
    r.config_set("rlock.min-replicas", 0)  # grants allowed again
    t.join(10)
    assert got == [True], got
    assert lock.owned() is False  # held by the thread, not this one
    assert r.exists("norep")
    r.delete("norep")


def test_noreplicas_past_the_deadline_is_raised(r: redis.Redis) -> None:
    r.config_set("rlock.min-replicas", 1)
    lock = rl.Lock(r, "norep2", lease=10)
    t0 = time.monotonic()
    with pytest.raises(rl.NoReplicas):
        lock.acquire(timeout=0.5)
    assert 0.4 < time.monotonic() - t0 < 2.0  # retried until the deadline, not beyond
    r.config_set("rlock.min-replicas", 0)
    assert not r.exists("norep2")


async def test_async_acquire_retries_noreplicas_until_grants_are_allowed(
    server: Server,
) -> None:
    r = server.client()
    r.config_set("rlock.min-replicas", 1)
    a = aredis.Redis(port=server.port)
    lock = ra.Lock(a, "anorep", lease=10)
    with pytest.raises(rl.NoReplicas):
        await lock.acquire(blocking=False)

    async def take() -> bool:  # the hold is this task's: it releases it
        got = await lock.acquire(timeout=5)
        assert r.exists("anorep")
        await lock.release()
        return got

    task = asyncio.ensure_future(take())
    while _acquire_calls(r) < 3:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    r.config_set("rlock.min-replicas", 0)
    assert await asyncio.wait_for(task, 10) is True
    assert not r.exists("anorep")
    await a.aclose()
    r.close()
