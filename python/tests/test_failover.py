"""Sentinel failover (sync and asyncio): a master, its replica and a Sentinel; a manual
``SENTINEL FAILOVER`` promotes the replica while the package holds and waits. A hold taken
before is renewed and released on the new master, or reported lost truthfully; a wait in
progress follows the lock to the new master (served there) and leaves nothing held by nobody;
releases reach the new master."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
import redis.asyncio.sentinel as asentinel
from _ha import Group
from _servers import info, poll
from redis.sentinel import Sentinel

import redis_rlock as rl
import redis_rlock.aio as ra

LIMIT = 40.0


def _truthful(new: redis.Redis, key: str, hold: rl.Hold) -> bool:
    """The hold is either on the new master under its owner, or signalled lost."""
    return hold.lost.is_set() or info(new, key).get("owner") == hold.owner


def test_sync_holds_and_a_wait_across_a_failover(quick_group: Group) -> None:
    group = quick_group  # fails over a master silent for a second, or when asked
    master = Sentinel([("127.0.0.1", group.sentinel.port)], socket_timeout=5).master_for("mymaster")
    held = rl.Lock(master, "held", watchdog_timeout=6)
    leased = rl.Lock(master, "leased", lease=30)
    assert held.acquire() and leased.acquire()
    group.master.client().execute_command("WAIT", 1, 5000)  # both grants reached the replica
    waiter = rl.Lock(master, "held", watchdog_timeout=6)
    out: dict[str, Any] = {}

    def wait() -> None:
        try:
            out["got"] = waiter.acquire(timeout=LIMIT)
        except BaseException as e:  # recorded: the wait must follow the lock, not raise
            out["got"] = e
            return
        if out["got"]:
            try:
                waiter.release()
            except rl.LockLost:  # the new master, without replicas, may refuse renewals
                pass

    t = threading.Thread(target=wait)
    t.start()
    poll("the waiter to block", 5, lambda: group.master.client().info()["blocked_clients"] >= 1)
    group.failover()
    new = group.replica.client()
    hold = held.hold
    # until the release: renewed on the new master, or signalled lost (never neither)
    end = time.monotonic() + 8  # past a whole watchdog lease (6 s)
    while time.monotonic() < end:
        assert _truthful(new, "held", hold)
        time.sleep(0.05)
    for lock in (held, leased):
        h = lock.hold
        try:
            lock.release()
        except rl.LockLost:
            assert h.lost.is_set()
        # a release whose reply was lost goes on in the background: bounded, then nothing
        poll("the release on the new master", LIMIT, lambda h=h: _gone(new, h))  # type: ignore[misc]
    t.join(LIMIT)
    got = out["got"]
    assert got is True, repr(got)  # the wait followed the lock to the new master
    poll("nothing held", LIMIT, lambda: not new.exists("held") and not new.exists("leased"))
    # a fresh acquire and release after the failover reach the new master
    after = rl.Lock(master, "after", lease=10)
    poll("an acquire on the new master", LIMIT, lambda: _try(after))
    assert new.exists("after")
    after.release()
    assert not new.exists("after")


def _gone(new: redis.Redis, h: rl.Hold) -> bool:
    return bool(info(new, h.name.decode()).get("owner") != h.owner)


def _try(lock: rl.Lock) -> bool:
    try:
        return lock.acquire(timeout=1)
    except rl.NoReplicas:
        return False


async def test_async_holds_and_a_wait_across_a_failover(quick_group: Group) -> None:
    group = quick_group
    sent = asentinel.Sentinel([("127.0.0.1", group.sentinel.port)], socket_timeout=5)
    master = sent.master_for("mymaster")
    held = ra.Lock(master, "aheld", watchdog_timeout=6)
    leased = ra.Lock(master, "aleased", lease=30)
    assert await held.acquire() and await leased.acquire()
    group.master.client().execute_command("WAIT", 1, 5000)
    waiter = ra.Lock(master, "aheld", watchdog_timeout=6)

    async def wait() -> Any:
        try:
            got = await waiter.acquire(timeout=LIMIT)
        except rl.LockError as e:  # recorded: the wait must follow the lock, not raise
            return e
        if got:
            try:
                await waiter.release()
            except rl.LockLost:  # the new master, without replicas, may refuse renewals
                pass
        return got

    task = asyncio.ensure_future(wait())
    end = time.monotonic() + 5
    while group.master.client().info()["blocked_clients"] < 1:
        assert time.monotonic() < end, "the waiter did not block"
        await asyncio.sleep(0.01)
    await asyncio.to_thread(group.failover)
    new = group.replica.client()
    hold = held.hold
    end = time.monotonic() + 8
    while time.monotonic() < end:
        assert _truthful(new, "aheld", hold)
        await asyncio.sleep(0.05)
    for lock in (held, leased):
        h = lock.hold
        try:
            await lock.release()
        except rl.LockLost:
            assert h.lost.is_set()
        end = time.monotonic() + LIMIT
        while not _gone(new, h):
            assert time.monotonic() < end, "the release did not reach the new master"
            await asyncio.sleep(0.05)
    got = await asyncio.wait_for(task, LIMIT)
    assert got is True, repr(got)  # the wait followed the lock to the new master
    end = time.monotonic() + LIMIT
    while new.exists("aheld") or new.exists("aleased"):
        assert time.monotonic() < end, "something is still held"
        await asyncio.sleep(0.05)
    after = ra.Lock(master, "aafter", lease=10)
    end = time.monotonic() + LIMIT
    while True:
        try:
            if await after.acquire(timeout=1):
                break
        except rl.NoReplicas:
            pass
        assert time.monotonic() < end, "no acquire on the new master"
    assert new.exists("aafter")
    await after.release()
    assert not new.exists("aafter")
    await master.aclose()
