"""Sessions (issue 27 §1) under a Sentinel failover, asyncio (``redis_rlock.aio.Session``):
the master killed, and ``SENTINEL FAILOVER`` (the old master demoted later). The promises are
those of ``test_session_ha.py``'s sync tests."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aredis
import redis.asyncio.sentinel as asentinel
from _ha import LIMIT, PROMPT, Group, holds, is_master, replicated
from _servers import poll

import redis_rlock as rl
import redis_rlock.aio as ra


async def _async_closed_for_good(s: ra.Session, new: redis.Redis) -> None:
    assert s.closed.is_set()
    for attempt in (
        lambda: s.lock("a", lease=60).acquire(blocking=False),
        lambda: s.lock("fresh", lease=60).acquire(timeout=1),
        lambda: s.rw_lock("rw", lease=60).read.acquire(blocking=False),
        lambda: s.leased_semaphore("s", lease=60).acquire(1, blocking=False),
    ):
        with pytest.raises(rl.SessionClosed):
            await attempt()
    assert new.exists("fresh") == 0, "never reconnected"
    assert holds(new) == 0, "the bindings stayed in the old master's memory"


async def _async_takes_over(client: aredis.Redis, new: redis.Redis, key: str) -> None:
    async with ra.Session(client) as again:
        lk = again.lock(key, lease=60)
        ends = time.monotonic() + new.pttl(key) / 1000
        assert await lk.acquire(timeout=LIMIT), "granted once the old hold's lease ended"
        at = time.monotonic()
        assert at + 0.05 >= ends, f"granted {ends - at:.3f} s early"
        assert at <= ends + PROMPT, f"granted {at - ends:.3f} s after the old lease ended"
        hold = lk.hold
        assert new.hgetall(key) == {hold.owner: b"1"}
        assert holds(new) == 1, "a session hold of the new master"
    assert hold.lost.is_set()
    await asyncio.to_thread(
        poll, "the new session's hold to end", LIMIT, lambda: not new.exists(key) and not holds(new)
    )


async def test_async_session_when_the_sentinel_master_is_killed(quick_group: Group) -> None:
    g = quick_group
    master = asentinel.Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for(
        "mymaster"
    )
    await ra.LeasedSemaphore(master, "s").try_set_permits(1)
    s = await ra.Session(master).open()
    lk, rw = s.lock("a", lease=8), s.rw_lock("rw")
    assert await lk.acquire() and await rw.write.acquire()
    permit = await s.leased_semaphore("s", lease=8).acquire(1)
    assert permit is not None
    all_holds = [lk.hold, rw.write.hold, permit]
    assert holds(g.master.client()) == 3
    replicated(g.master, g.replica)
    killed = time.monotonic()
    g.master.kill()
    assert await s.closed.wait(PROMPT), "the session sees its master die (keepalive 1 s)"
    for h in all_holds:
        assert await h.lost.wait(PROMPT), h
    assert time.monotonic() - killed < PROMPT
    await asyncio.to_thread(g.wait_promoted)
    new = g.replica.client()
    assert new.hgetall("a") == {all_holds[0].owner: b"1"}, "an ordinary hold there"
    await _async_closed_for_good(s, new)
    await _async_takes_over(master, new, "a")
    await master.aclose()


async def test_async_session_across_a_manual_sentinel_failover(manual_group: Group) -> None:
    g = manual_group
    master = asentinel.Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for(
        "mymaster"
    )
    s = await ra.Session(master).open()
    lk, w = s.lock("a", lease=6), s.lock("w")
    assert await lk.acquire() and await w.acquire()
    all_holds = [lk.hold, w.hold]
    replicated(g.master, g.replica)
    await asyncio.to_thread(g.failover)
    new = g.replica.client()
    await _async_takes_over(master, new, "a")
    await asyncio.to_thread(
        poll, "the old master to be demoted", LIMIT, lambda: not is_master(g.master)
    )
    demoted = time.monotonic()
    assert await s.closed.wait(PROMPT), "closed when the Sentinel demotes its master"
    for h in all_holds:
        assert await h.lost.wait(PROMPT), h
    assert time.monotonic() - demoted < PROMPT
    await _async_closed_for_good(s, new)
    assert holds(g.master.client()) == 0, "a replica binds nothing"
    await master.aclose()


async def test_async_session_acquire_on_the_replaced_master_closes_the_session(
    manual_group: Group,
) -> None:
    """As the sync test: the old master's NOREPLICAS while the Sentinel names the new one
    closes the session at once."""
    g = manual_group
    master = asentinel.Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for(
        "mymaster"
    )
    s = await ra.Session(master).open()
    lk = s.lock("a", lease=6)
    assert await lk.acquire()
    held = lk.hold
    replicated(g.master, g.replica)
    await asyncio.to_thread(g.failover)
    assert is_master(g.master), "the old master is not demoted yet"
    started = time.monotonic()
    with pytest.raises(rl.SessionClosed):
        await s.lock("late", lease=60).acquire(timeout=LIMIT)
    assert time.monotonic() - started < PROMPT
    assert held is not None and await held.lost.wait(PROMPT)
    assert s.closed.is_set()
    assert g.master.client().exists("late") == 0
    await master.aclose()
