"""asyncio API: every path, per-task ownership, and cancellation at every await point."""

from __future__ import annotations

import asyncio
import gc
import sys
import time

import pytest
import redis.asyncio as aredis
from _servers import apoll
from redis.exceptions import LockError, LockNotOwnedError

import redis_rlock as rl
import redis_rlock.aio as ra


async def ainfo(ar: aredis.Redis, name: str) -> dict[str, object]:
    reply = await ar.execute_command("RLOCK.INFO", name)
    if reply is None:
        return {}
    items = list(reply.items()) if isinstance(reply, dict) else list(zip(reply[::2], reply[1::2]))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in items}


async def test_acquire_release_reentry_with(ar: aredis.Redis) -> None:
    lock = ra.Lock(ar, "a", fencing=True)
    assert not await lock.locked()
    async with lock:
        assert lock.owned() and lock.token == 1
        assert await lock.acquire()
        assert lock.hold.count == 2
        await lock.release()
        assert lock.owned()
    assert not lock.owned() and not await ar.exists("a")
    with pytest.raises(rl.NotHeld):
        await lock.release()


async def test_ownership_is_per_task_not_inherited(ar: aredis.Redis) -> None:
    lock = ra.Lock(ar, "task")
    await lock.acquire()

    async def child() -> tuple[bool, bool]:
        return lock.owned(), await lock.acquire(blocking=False)

    assert await asyncio.create_task(child()) == (False, False)
    assert await asyncio.gather(child(), child()) == [(False, False), (False, False)]
    await lock.release()


async def test_waiters_are_served_fifo(ar: aredis.Redis) -> None:
    holder = ra.Lock(ar, "q")
    await holder.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        lk = ra.Lock(ar, "q")
        async with lk:
            order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(waiter(i)))
        await apoll("queued", 10, lambda i=i: _waiters(ar, "q", i + 1))
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert order == [0, 1, 2, 3, 4]


async def _waiters(ar: aredis.Redis, name: str, n: int) -> bool:
    return (await ainfo(ar, name)).get("waiters") == n


async def test_lease_loss_and_watchdog(ar: aredis.Redis) -> None:
    seen: list[rl.Hold] = []
    lock = ra.Lock(ar, "lease", lease=0.2, on_lost=seen.append)
    await lock.acquire()
    assert await lock.lost.wait(5)
    assert seen and lock.lost.is_set()
    with pytest.raises(rl.LockLost):
        await lock.release()
    wd = ra.Lock(ar, "wd", watchdog_timeout=0.6)
    await wd.acquire()
    assert not await wd.lost.wait(1.2)  # renewed every 0.2 s meanwhile
    await ar.execute_command("RLOCK.FORCERELEASE", "wd")
    assert await wd.lost.wait(5)
    with pytest.raises(LockNotOwnedError):
        await wd.release()


@pytest.mark.parametrize("via", ["lock", "owner", "session_opened_meanwhile"])
async def test_a_hold_whose_task_ended_without_release_stops_being_renewed(
    ar: aredis.Redis, via: str
) -> None:
    # the task's holds live in its context; what the package starts from inside the task (the
    # hold's watchdog, a session's watcher) must not keep a copy of that context, or the hold
    # nobody can release any more is renewed for as long as that runs
    session = ra.Session(ar)
    lock = (
        ra.Owner(ar).lock("ended", watchdog_timeout=1)
        if via == "owner"
        else ra.Lock(ar, "ended", watchdog_timeout=1)
    )

    async def forget() -> None:
        assert await lock.acquire()
        if via == "session_opened_meanwhile":
            await session.open()

    await asyncio.create_task(forget())
    assert await ar.exists("ended")
    await apoll("the unrenewed lease to end", 5, lambda: _gone(ar, "ended"))
    await session.close()


async def _gone(ar: aredis.Redis, name: str) -> bool:
    gc.collect()
    return not await ar.exists(name)


@pytest.mark.parametrize("contended", [True, False])
async def test_cancel_at_every_await_point_leaves_nothing(
    ar: aredis.Redis, contended: bool
) -> None:
    holder = ra.Lock(ar, "c")
    if contended:
        await holder.acquire()
    lock = ra.Lock(ar, "c")
    outcomes = set()

    async def take() -> None:
        if await lock.acquire(timeout=5):
            await lock.release()

    for k in range(40):
        task = asyncio.create_task(take())
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
            outcomes.add("done")
        except asyncio.CancelledError:
            outcomes.add("cancelled")
        assert not lock.owned()
        if contended:
            await apoll("only the holder", 10, lambda: _only_holder(ar, holder))
        else:
            await apoll("free", 10, lambda: _free(ar))
    assert "cancelled" in outcomes


async def _only_holder(ar: aredis.Redis, holder: ra.Lock) -> bool:
    i = await ainfo(ar, "c")
    return i.get("owner") == holder.hold.owner and i.get("waiters") == 0


async def _free(ar: aredis.Redis) -> bool:
    return not await ar.exists("c")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
async def test_asyncio_timeout_around_a_wait(ar: aredis.Redis) -> None:
    holder = ra.Lock(ar, "t")
    await holder.acquire()
    lock = ra.Lock(ar, "t")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await lock.acquire()
    assert not lock.owned()
    assert (await ainfo(ar, "t"))["waiters"] == 0
    await holder.release()
    assert await lock.acquire(timeout=1)
    await lock.release()


async def test_cancelled_release_still_releases(ar: aredis.Redis) -> None:
    lock = ra.Lock(ar, "rel")

    async def hold(ev: asyncio.Event) -> None:
        await lock.acquire()
        ev.set()
        await lock.release()

    for k in range(10):
        ev = asyncio.Event()
        task = asyncio.create_task(hold(ev))
        await ev.wait()
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await apoll("released", 10, lambda: _gone(ar, "rel"))


async def _gone(ar: aredis.Redis, name: str) -> bool:
    return not await ar.exists(name)


async def test_timeout_returns_false(ar: aredis.Redis) -> None:
    holder = ra.Lock(ar, "busy")
    await holder.acquire()
    lock = ra.Lock(ar, "busy", timeout=0.2)
    t0 = time.monotonic()
    assert not await lock.acquire(timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 3
    assert not await lock.acquire(blocking=False)
    with pytest.raises(rl.LockTimeout):
        async with lock:
            pass
    await holder.release()


async def test_rwlock_and_semaphores(ar: aredis.Redis) -> None:
    rw = ra.RWLock(ar, "rw")
    other = ra.RWLock(ar, "rw")

    async def read_too() -> bool:
        got = await other.read.acquire(blocking=False)
        await other.read.release()
        return got

    async with rw.read:
        assert await asyncio.create_task(read_too())  # readers share
        with pytest.raises(rl.UpgradeRefused):
            await rw.write.acquire()
    async with rw.write, rw.read:  # write -> read at once (same owner)
        assert (await ar.hget("rw", "mode")) == b"write"
    assert not await ar.exists("rw")
    sem = ra.Semaphore(ar, "s")
    assert await sem.try_set_permits(2)
    async with sem:
        assert await sem.available() == 1
        assert await sem.acquire(1)
        assert not await sem.acquire(1, blocking=False)
        assert await sem.release(1) == 1
    assert await sem.available() == 2
    ls = ra.LeasedSemaphore(ar, "ls")
    await ls.try_set_permits(2)
    async with ls as h:
        assert len(h.ids) == 1 and await ls.available() == 1
    assert await ls.available() == 2


async def test_async_compat_drop_in(ar: aredis.Redis) -> None:
    lock = ar.lock("compat", timeout=5, lock_class=ra.AsyncRLockCompat, blocking_timeout=0.2)
    assert await lock.acquire()
    assert await lock.owned() and await lock.locked()
    other = ar.lock("compat", lock_class=ra.AsyncRLockCompat, blocking_timeout=0.2)
    assert not await other.acquire()
    await lock.extend(5)
    assert await ar.pttl("compat") > 5000
    await lock.release()
    with pytest.raises(LockError):
        await lock.release()
    assert await lock.acquire()
    await ar.delete("compat")
    with pytest.raises(LockNotOwnedError):
        await lock.release()
