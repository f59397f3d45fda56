"""The redis-py drop-ins' waits and asyncio release, as redis-py 8.1's: ``blocking_timeout``
of +inf or beyond the server's range waits for the holder (redis-py waits), NaN or a non-number
is refused before anything is sent, and an asyncio release task cancelled before it ran leaves
the lock and the token as they were, so the release can be done again (redis-py #3847)."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import PROMPT, apoll, info, poll

import redis_rlock as rl
import redis_rlock.aio as ra

UNBOUNDED = [math.inf, 1e300, 2.0**62]


async def _free(ar: aredis.Redis) -> bool:
    return not await ar.exists("k")


@pytest.mark.parametrize("blocking_timeout", UNBOUNDED)
def test_an_unbounded_blocking_timeout_waits_for_the_holder(
    r: redis.Redis, blocking_timeout: float
) -> None:
    holder = r.lock("k", lock_class=rl.RLockCompat)
    assert holder.acquire()
    waiter = r.lock(
        "k", lock_class=rl.RLockCompat, blocking_timeout=blocking_timeout, thread_local=False
    )
    got: list[Any] = []

    def wait() -> None:
        try:
            got.append(waiter.acquire())
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=wait)
    t.start()
    poll("the waiter queued in the server", PROMPT, lambda: bool(got) or info(r, "k")["waiters"])
    assert not got, got  # still waiting (redis-py waits too), no error
    holder.release()
    t.join(PROMPT)
    assert got == [True] and waiter.owned()
    waiter.release()


@pytest.mark.parametrize("blocking_timeout", UNBOUNDED)
async def test_async_an_unbounded_blocking_timeout_waits_for_the_holder(
    ar: aredis.Redis, blocking_timeout: float
) -> None:
    holder = ar.lock("k", lock_class=ra.AsyncRLockCompat)
    assert await holder.acquire()
    waiter = ar.lock("k", lock_class=ra.AsyncRLockCompat, blocking_timeout=blocking_timeout)
    task = asyncio.ensure_future(waiter.acquire())
    plain = redis.Redis(port=ar.connection_pool.connection_kwargs["port"])
    await apoll("the waiter queued", PROMPT, lambda: task.done() or info(plain, "k")["waiters"])
    assert not task.done(), task.result()
    await holder.release()
    assert await asyncio.wait_for(task, PROMPT)
    assert await waiter.owned()
    await waiter.release()
    plain.close()


@pytest.mark.parametrize("bad", [math.nan, "1", True, b"1"])
def test_a_nan_or_non_number_blocking_timeout_is_refused_before_anything_is_sent(
    r: redis.Redis, bad: Any
) -> None:
    lock = r.lock("k", lock_class=rl.RLockCompat)
    with pytest.raises((ValueError, TypeError)):
        lock.acquire(blocking_timeout=bad)
    with pytest.raises((ValueError, TypeError)):
        r.lock("k", lock_class=rl.RLockCompat, blocking_timeout=bad).acquire()
    assert not r.exists("k") and lock.local.token is None


async def test_async_a_nan_blocking_timeout_is_refused_before_anything_is_sent(
    ar: aredis.Redis,
) -> None:
    lock = ar.lock("k", lock_class=ra.AsyncRLockCompat)
    with pytest.raises(ValueError):
        await lock.acquire(blocking_timeout=math.nan)
    assert not await ar.exists("k")


def test_a_blocking_timeout_of_zero_or_less_makes_one_try(r: redis.Redis) -> None:
    holder = r.lock("k", lock_class=rl.RLockCompat)
    assert holder.acquire()
    for bt in (0, -1, -math.inf):
        assert not r.lock("k", lock_class=rl.RLockCompat, blocking_timeout=bt).acquire()
    holder.release()
    assert r.lock("k", lock_class=rl.RLockCompat, blocking_timeout=-1).acquire()


async def test_a_release_cancelled_before_it_ran_can_be_done_again(ar: aredis.Redis) -> None:
    lock = ar.lock("k", lock_class=ra.AsyncRLockCompat)
    assert await lock.acquire(blocking=False)
    token = lock.local.token
    task = asyncio.ensure_future(lock.release())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lock.local.token == token  # nothing ran: held, and releasable
    assert await lock.owned() and await lock.locked()
    await lock.release()
    assert lock.local.token is None and not await lock.locked()


async def test_a_release_cancelled_while_running_completes_and_can_be_awaited_again(
    ar: aredis.Redis,
) -> None:
    for steps in range(1, 6):  # cancelled after 1..5 turns of the loop
        lock = ar.lock("k", lock_class=ra.AsyncRLockCompat)
        assert await lock.acquire(blocking=False)
        task = asyncio.ensure_future(lock.release())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await apoll("the release done", PROMPT, lambda: _free(ar))
        if lock.local.token is not None:  # cancelled while running: release() again ends it
            await lock.release()
        assert lock.local.token is None and not await lock.owned()
        with pytest.raises(redis.exceptions.LockError):
            await lock.release()
