"""Leases too short to hold are refused at once, everywhere one is taken: a ``lease`` (and the
drop-in's ``timeout`` / ``extend`` time) below one millisecond, the server's unit (it was sent
as 1 ms: ``acquire()`` answered True for a hold already over), and a ``watchdog_timeout`` below
0.1 s (renewed every third of it: 2 ms meant ~1,200 renewals a second, 1 ns a hold over before
its first renewal). Values from the floors up are taken and held.
Likewise out of range, refused before anything is sent: timeouts that are NaN or negative
(infinity is no limit), or beyond any wait (``OverflowError``, as ``threading`` raises), leases
that are NaN, infinite, zero or huge, and permit counts that are zero, negative, huge, a bool or
not a whole number."""

from __future__ import annotations

import math
import random
import re
import time
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server

import redis_rlock as rl
import redis_rlock.aio as ra

SHORT_LEASES: list[float] = [1e-9, 1e-6, 0.0004, 0.000999]
SHORT_WATCHDOGS: list[float] = [1e-9, 0.0004, 0.002, 0.05, 0.0999]
LEASE_FLOOR = re.escape("at least 0.001 s")
WATCHDOG_FLOOR = re.escape("watchdog_timeout must be at least 0.1 s")


def _sync_lease_takers(r: redis.Redis) -> list[Callable[[float], Any]]:
    return [
        lambda s: rl.Lock(r, "arg:l", lease=s),
        lambda s: rl.RWLock(r, "arg:rw", lease=s),
        lambda s: rl.LeasedSemaphore(r, "arg:ls", lease=s),
        lambda s: rl.Owner(r).lock("arg:o", lease=s),
        lambda s: rl.Lock(r, "arg:l").acquire(blocking=False, lease=s),
        lambda s: rl.RWLock(r, "arg:rw").write.acquire(blocking=False, lease=s),
        lambda s: rl.LeasedSemaphore(r, "arg:ls").acquire(1, blocking=False, lease=s),
        lambda s: r.lock("arg:d", lock_class=rl.RLockCompat, timeout=s),
    ]


def _sync_watchdog_takers(r: redis.Redis) -> list[Callable[[float], Any]]:
    return [
        lambda s: rl.Lock(r, "arg:l", watchdog_timeout=s),
        lambda s: rl.RWLock(r, "arg:rw", watchdog_timeout=s),
        lambda s: rl.LeasedSemaphore(r, "arg:ls", watchdog_timeout=s),
        lambda s: rl.Owner(r).lock("arg:o", watchdog_timeout=s),
    ]


def _nothing_sent(r: redis.Redis) -> None:
    assert r.keys("arg:*") == [], "a refused argument still took something"


def test_leases_and_watchdog_timeouts_too_short_to_hold_are_refused_at_once(
    r: redis.Redis,
) -> None:
    for take in _sync_lease_takers(r):
        for s in SHORT_LEASES:
            with pytest.raises(ValueError, match=LEASE_FLOOR):
                take(s)
    for take in _sync_watchdog_takers(r):
        for s in SHORT_WATCHDOGS:
            with pytest.raises(ValueError, match=WATCHDOG_FLOOR):
                take(s)
    _nothing_sent(r)


def test_a_drop_in_extend_shorter_than_a_millisecond_is_refused(r: redis.Redis) -> None:
    lock = r.lock("arg:d", lock_class=rl.RLockCompat, timeout=5)
    assert lock.acquire(blocking=False)
    for s in SHORT_LEASES:
        with pytest.raises(ValueError, match=LEASE_FLOOR):
            lock.extend(s, replace_ttl=True)
        with pytest.raises(ValueError, match=LEASE_FLOOR):
            lock.extend(s)
    assert lock.extend(0)  # as redis-py: adding nothing checks the lock is still owned
    lock.release()


async def test_async_leases_and_watchdog_timeouts_too_short_to_hold_are_refused_at_once(
    ar: aredis.Redis, r: redis.Redis
) -> None:
    lease_makers: list[Callable[[float], Any]] = [
        lambda s: ra.Lock(ar, "arg:l", lease=s),
        lambda s: ra.RWLock(ar, "arg:rw", lease=s),
        lambda s: ra.LeasedSemaphore(ar, "arg:ls", lease=s),
        lambda s: ar.lock("arg:d", lock_class=ra.AsyncRLockCompat, timeout=s),
    ]
    watchdog_makers: list[Callable[[float], Any]] = [
        lambda s: ra.Lock(ar, "arg:l", watchdog_timeout=s),
        lambda s: ra.RWLock(ar, "arg:rw", watchdog_timeout=s),
        lambda s: ra.LeasedSemaphore(ar, "arg:ls", watchdog_timeout=s),
    ]
    for s in SHORT_LEASES:
        for make in lease_makers:
            with pytest.raises(ValueError, match=LEASE_FLOOR):
                make(s)
        with pytest.raises(ValueError, match=LEASE_FLOOR):
            await ra.Lock(ar, "arg:l").acquire(blocking=False, lease=s)
        with pytest.raises(ValueError, match=LEASE_FLOOR):
            await ra.LeasedSemaphore(ar, "arg:ls").acquire(1, blocking=False, lease=s)
    for s in SHORT_WATCHDOGS:
        for make in watchdog_makers:
            with pytest.raises(ValueError, match=WATCHDOG_FLOOR):
                make(s)
    _nothing_sent(r)


def _renewals(probe: redis.Redis) -> int:
    return int(probe.info("commandstats").get("cmdstat_rlock.renew", {}).get("calls", 0))


def test_watchdog_timeouts_from_the_floor_up_are_taken_and_renewed_without_a_busy_loop(
    server: Server,
) -> None:
    """At the floor (0.1 s) a watchdog lock is taken and renewed about three times a lease,
    never in a busy loop (0.002 s meant ~1,200 renewals a second); a watchdog timeout drawn
    from 0.3 s to 0.5 s holds throughout four leases (the server shows the hold all along)."""
    r = server.client()
    probe = server.client()
    seed = random.randrange(1 << 30)
    wt_held = random.Random(seed).uniform(0.3, 0.5)
    for i, wt in enumerate((0.1, wt_held)):
        name = f"arg:wd{i}"
        lock = rl.Lock(r, name, watchdog_timeout=wt)
        before = _renewals(probe)
        assert lock.acquire(timeout=1)
        deadline = time.monotonic() + 4 * wt
        while time.monotonic() < deadline:  # watched throughout four leases
            if i:
                assert probe.exists(name) == 1, (seed, wt, "the hold ended on the server")
            time.sleep(0.01)
        renewals = _renewals(probe) - before
        assert renewals <= 3 * 4 + 4, (seed, wt, renewals, "renewed in a busy loop")
        if i:
            assert lock.owned() and renewals >= 1, (seed, wt, renewals)
        if lock.owned():
            lock.release()
    r.close()
    probe.close()


# -- timeouts, leases and permit counts out of range -------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, -5, -math.inf, -0.5])
def test_bad_timeouts_are_refused_before_anything_is_sent(r: redis.Redis, bad: float) -> None:
    lock = rl.Lock(r, "odd")
    with pytest.raises(ValueError):
        lock.acquire(timeout=bad)
    assert r.dbsize() == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0, -1, 1e300])
def test_bad_leases_are_refused(r: redis.Redis, bad: float) -> None:
    with pytest.raises(ValueError):
        rl.Lock(r, "odd", lease=bad)
    with pytest.raises(ValueError):
        rl.LeasedSemaphore(r, "odd").acquire(1, lease=bad)
    assert r.dbsize() == 0


def test_a_timeout_beyond_any_wait_is_refused_at_once_as_threading_does(r: redis.Redis) -> None:
    lock = rl.Lock(r, "huge")
    for bad in (1e300, 2.0**53):
        with pytest.raises(OverflowError):
            lock.acquire(timeout=bad)
        with pytest.raises(OverflowError):
            rl.Semaphore(r, "huge-p").acquire(1, timeout=bad)
    assert r.dbsize() == 0
    assert lock.acquire(timeout=math.inf)  # infinity is no limit, as -1
    lock.release()


async def test_async_a_timeout_beyond_any_wait_is_refused_at_once(
    r: redis.Redis, ar: aredis.Redis
) -> None:
    with pytest.raises(OverflowError):
        await ra.Lock(ar, "huge").acquire(timeout=1e300)
    with pytest.raises(ValueError):
        await ra.Semaphore(ar, "huge-p").add_permits(2**63)
    assert r.dbsize() == 0


def test_permit_counts_zero_huge_and_bool_are_refused(r: redis.Redis) -> None:
    sem = rl.Semaphore(r, "p")
    for bad in (0, -1, 2**63, True, 1.5):
        with pytest.raises((ValueError, TypeError)):
            sem.acquire(bad, timeout=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sem.try_set_permits(2**64)
    assert sem.try_set_permits(1)
    assert not sem.acquire(2**62, timeout=0.1)  # never satisfiable: times out, nothing taken
    assert sem.available() == 1
    for bad in (2**70, 2**63, -(2**63) - 1):
        with pytest.raises(ValueError):
            sem.add_permits(bad)
    assert sem.available() == 1
    leased = rl.LeasedSemaphore(r, "lp")
    with pytest.raises(ValueError):
        leased.acquire(10_001)
