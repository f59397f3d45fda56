"""An owner's holds of one name are one server hold: no acquire, re-entry or renewal sent for
one of them ends another's lease early; and a hold re-entered with a longer lease keeps it when
re-entered again with a shorter one (docs/clients.md: the lease is never shortened below what
any live guard of the hold was promised)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server

import redis_rlock as rl
import redis_rlock.aio as ra

#: slack for the server's PTTL against a guard's valid_until (ms rounding, two clocks)
TOL_MS = 25


def _lease_covers(r: redis.Redis, key: str, hold: rl.Hold) -> None:
    left_ms = (hold.valid_until - time.monotonic()) * 1000
    pttl = r.pttl(key)
    assert not hold.is_lost()
    assert pttl >= left_ms - TOL_MS, f"guard valid {left_ms:.0f} ms more, server lease {pttl} ms"


def test_an_owners_nested_shorter_lease_never_shortens_its_outer_hold(
    r: redis.Redis,
) -> None:
    owner = rl.Owner(r)
    outer = owner.lock("k")
    assert outer.acquire()
    inner = owner.lock("k")
    assert inner.acquire(blocking=False, lease=0.3)
    _lease_covers(r, "k", outer.hold)
    inner.release()
    _lease_covers(r, "k", outer.hold)
    time.sleep(0.5)  # past the inner lease: the outer hold is still the server's
    _lease_covers(r, "k", outer.hold)
    assert not rl.Lock(r, "k").acquire(blocking=False)
    outer.release()
    assert r.exists("k") == 0


# a write side's renewal never shortens the hash (the server keeps the later expiry); a read
# side's resets every read hold key of the owner
@pytest.mark.parametrize("kind", ["lock", "read"])
def test_an_owners_watchdog_renewal_never_shortens_a_longer_lease_of_another_handle(
    r: redis.Redis, kind: str
) -> None:
    owner = rl.Owner(r)
    if kind == "lock":
        outer: Any = owner.lock("k", lease=5.0)
        inner: Any = owner.lock("k", watchdog_timeout=0.6)  # renewed every 0.2 s for 0.6 s
    else:
        outer = getattr(owner.rw_lock("k", lease=5.0), kind)
        inner = getattr(owner.rw_lock("k", watchdog_timeout=0.6), kind)
    assert outer.acquire()
    assert inner.acquire()
    time.sleep(0.5)  # two renewals of the inner hold
    _lease_covers(r, "k", outer.hold)
    if kind == "read":  # the outer read hold's own lease key too
        keys = r.keys("{k}:*:rwlock_timeout:1")
        assert len(keys) == 1
        left_ms = (outer.hold.valid_until - time.monotonic()) * 1000
        assert r.pttl(keys[0]) >= left_ms - TOL_MS
    inner.release()
    outer.release()


def test_a_hold_reentered_with_a_longer_lease_keeps_it_when_reentered_shorter(
    r: redis.Redis,
) -> None:
    lk = rl.Lock(r, "k", watchdog_timeout=1.5)
    assert lk.acquire()
    assert lk.acquire(lease=5.0)
    assert lk.acquire(lease=0.3)
    _lease_covers(r, "k", lk.hold)
    time.sleep(0.6)  # a watchdog renewal (every 0.5 s) happened meanwhile
    _lease_covers(r, "k", lk.hold)
    for _ in range(3):
        lk.release()


async def test_an_asyncio_owners_nested_shorter_lease_never_shortens_its_outer_hold(
    server: Server, ar: aredis.Redis, r: redis.Redis
) -> None:
    owner = ra.Owner(ar)
    outer = owner.lock("k")
    assert await outer.acquire()
    inner = owner.lock("k")
    assert await inner.acquire(blocking=False, lease=0.3)
    await inner.release()
    _lease_covers(r, "k", outer.hold)
    other = ra.Lock(ar, "k")
    assert not await other.acquire(blocking=False)
    await outer.release()
    assert r.exists("k") == 0


def test_an_owners_read_release_never_leaves_another_read_guard_a_shorter_lease_key(
    r: redis.Redis,
) -> None:
    # the server drops the owner's last read lease key on a release, whichever guard released
    owner = rl.Owner(r)
    first = owner.rw_lock("k").read
    assert first.acquire(lease=0.4)
    second = owner.rw_lock("k").read
    assert second.acquire(lease=5.0)
    first.release()
    _lease_covers(r, "k", second.hold)
    keys = r.keys("{k}:*:rwlock_timeout:*")
    assert len(keys) == 1
    left_ms = (second.hold.valid_until - time.monotonic()) * 1000
    assert r.pttl(keys[0]) >= left_ms - TOL_MS
    second.release()
    assert r.exists("k") == 0


def test_an_owners_read_release_refused_by_a_stale_master_raises_the_packages_error(
    r: redis.Redis,
) -> None:
    # the renewal before the release is refused (NOREPLICAS, as an old master's after a
    # failover): the package's NoReplicas, nothing released, not redis-py's ResponseError
    owner = rl.Owner(r, response_timeout=0.3)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert first.acquire() and second.acquire()
    r.config_set("rlock.min-replicas", 1)
    try:
        with pytest.raises(rl.NoReplicas):
            first.release()
        assert first.owned() and r.hlen("k") == 2  # mode and the owner's field: still held
    finally:
        r.config_set("rlock.min-replicas", -1)
    first.release()
    second.release()
    assert r.exists("k") == 0


async def test_an_asyncio_owners_read_release_refused_by_a_stale_master_raises_the_packages_error(
    server: Server,
) -> None:
    r = aredis.Redis(port=server.port, socket_timeout=10)
    c = server.client()
    owner = ra.Owner(r, response_timeout=0.3)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert await first.acquire() and await second.acquire()
    c.config_set("rlock.min-replicas", 1)
    try:
        with pytest.raises(rl.NoReplicas):
            await first.release()
        assert first.owned() and c.hlen("k") == 2
    finally:
        c.config_set("rlock.min-replicas", -1)
    await first.release()
    await second.release()
    assert c.exists("k") == 0
    await r.aclose()


def test_an_owners_read_release_asks_a_refused_renewal_again_within_its_response_timeout(
    r: redis.Redis,
) -> None:
    # a refusal that ends within the response timeout (an old master's, then the new one's
    # answer after a failover; here the setting lowered 0.1 s later): the release goes through
    owner = rl.Owner(r, response_timeout=2.0)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert first.acquire() and second.acquire()
    r.config_set("rlock.min-replicas", 1)
    timer = threading.Timer(0.1, lambda: r.config_set("rlock.min-replicas", -1))
    timer.start()
    try:
        first.release()
    finally:
        timer.join()
        r.config_set("rlock.min-replicas", -1)
    assert not first.owned() and second.owned()
    second.release()
    assert r.exists("k") == 0


async def test_an_asyncio_owners_read_release_asks_a_refused_renewal_again(
    server: Server,
) -> None:
    r = aredis.Redis(port=server.port, socket_timeout=10)
    c = server.client()
    owner = ra.Owner(r, response_timeout=2.0)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert await first.acquire() and await second.acquire()
    c.config_set("rlock.min-replicas", 1)
    timer = threading.Timer(0.1, lambda: server.client().config_set("rlock.min-replicas", -1))
    timer.start()
    try:
        await first.release()
    finally:
        timer.join()
        c.config_set("rlock.min-replicas", -1)
    assert not first.owned() and second.owned()
    await second.release()
    assert c.exists("k") == 0
    await r.aclose()
