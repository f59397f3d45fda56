"""A hostile user's attacks on the package (issue 25's "Cancellation, interruption, fork"
standard): interrupts inside release, threads sharing a lock object, ACL users limited to key
patterns, odd numbers, RESP3, the redis-py drop-in against redis-py's own Lock expectations,
a server paused mid-release. Each test names what must hold; defects found are fixed in the
package (see the commit log) or marked ``xfail(strict=True, reason="defect: ...")``."""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, info, poll, raise_once_here
from redis.exceptions import LockError, LockNotOwnedError

import redis_rlock as rl
import redis_rlock.aio as ra
from redis_rlock import _sync

# -- interrupts inside release --------------------------------------------------------------


def test_keyboard_interrupt_in_release_still_releases(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = rl.Lock(r, "kbi")
    assert lock.acquire()
    # the next command this thread sends raises before it is sent (an interrupt landing between
    # two bytecodes of the release); the watchdog's and releaser's threads send theirs
    raise_once_here(monkeypatch, _sync.SyncBackend, "call", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    # the release goes on in the background (same request id: never twice); nothing stays
    # held by nobody until the 30 s watchdog lease ends
    poll("the interrupted release to reach the server", 5, lambda: not r.exists("kbi"))


def test_keyboard_interrupt_in_a_semaphore_guard_release_gives_back(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = rl.Semaphore(r, "kbisem")
    sem.try_set_permits(2)
    hold = sem.permits(2)
    assert hold is not None and sem.available() == 0
    # the next command this thread sends raises before it is sent (an interrupt landing between
    # two bytecodes of the release); the watchdog's and releaser's threads send theirs
    raise_once_here(monkeypatch, _sync.SyncBackend, "call", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        hold.release()
    poll("the permits to come back", 5, lambda: sem.available() == 2)


# -- an error reply to a release changes nothing: the caller still holds ----------------------


def test_a_refused_release_leaves_the_hold_with_its_owner(server: Server) -> None:
    admin = server.client()
    # may lock (request records) but not publish on the unlock channel / write the latch
    admin.execute_command(
        "ACL", "SETUSER", "half", "on", "nopass", "+@all", "~ok:*", "~rlock_request:*"
    )
    r = server.client(username="half", password="x")
    lock = rl.Lock(r, "ok:1")
    assert lock.acquire()
    with pytest.raises(rl.LockPermissionError):
        lock.release()
    assert admin.exists("ok:1")
    # the server changed nothing: this thread still holds it (renewed, releasable)
    assert lock.owned()
    admin.execute_command("ACL", "SETUSER", "half", "&*", "~*")
    lock.release()
    assert not admin.exists("ok:1")


async def test_async_refused_release_leaves_the_hold_with_its_owner(server: Server) -> None:
    admin = server.client()
    admin.execute_command(
        "ACL", "SETUSER", "half", "on", "nopass", "+@all", "~ok:*", "~rlock_request:*"
    )
    r = aredis.Redis(port=server.port, username="half", password="x")
    lock = ra.Lock(r, "ok:2")
    assert await lock.acquire()
    with pytest.raises(rl.LockPermissionError):
        await lock.release()
    assert admin.exists("ok:2") and lock.owned()
    admin.execute_command("ACL", "SETUSER", "half", "&*", "~*")
    await lock.release()
    assert not admin.exists("ok:2")
    await r.aclose()


def test_acl_user_limited_to_a_key_pattern_gets_typed_errors_and_holds_nothing(
    server: Server,
) -> None:
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "narrow", "on", "nopass", "+@all", "~mine:*")
    r = server.client(username="narrow", password="x")
    for attempt in (
        lambda: rl.Lock(r, "other").acquire(timeout=0.2),
        lambda: rl.Lock(r, "mine:x").acquire(timeout=0.2),  # its request record is not allowed
        lambda: rl.RWLock(r, "mine:rw").read.acquire(timeout=0.2),
        lambda: rl.Semaphore(r, "mine:s").acquire(1, timeout=0.2),
        lambda: rl.LeasedSemaphore(r, "mine:l").acquire(1, timeout=0.2),
    ):
        with pytest.raises(rl.LockPermissionError):
            attempt()
    assert admin.keys("*") == [] or all(not k.startswith(b"mine:") for k in admin.keys("*"))
    assert admin.dbsize() == 0


# -- threads sharing one Lock object --------------------------------------------------------


def test_another_thread_cannot_release_or_renew_a_threads_hold(r: redis.Redis) -> None:
    lock = rl.Lock(r, "shared")
    assert lock.acquire()
    out: dict[str, Any] = {}

    def other() -> None:
        try:
            lock.release()
        except BaseException as e:
            out["release"] = e
        out["owned"] = lock.owned()
        out["try"] = lock.acquire(timeout=0.1)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert isinstance(out["release"], rl.NotHeld)
    assert out["owned"] is False and out["try"] is False
    assert lock.owned() and info(r, "shared")["owner"] == lock.hold.owner
    lock.release()
    assert not r.exists("shared")


# -- fork: a guard used in the child ---------------------------------------------------------


def test_a_permit_guard_used_after_fork_in_the_child_does_nothing(r: redis.Redis) -> None:
    import os

    sem = rl.LeasedSemaphore(r, "forksem", lease=30)
    sem.try_set_permits(1)
    hold = sem.acquire(1)
    assert hold is not None
    pid = os.fork()
    if pid == 0:  # child: must not give the parent's permit back
        code = 1
        try:
            hold.release()
        except rl.NotHeld:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sem.available() == 0  # the parent's permit is untouched
    hold.release()
    assert sem.available() == 1


# -- garbage collection ----------------------------------------------------------------------


def test_a_dropped_lock_object_stops_renewing_and_its_lease_ends(r: redis.Redis) -> None:
    lock = rl.Lock(r, "dropped", watchdog_timeout=1)
    assert lock.acquire()
    del lock
    gc.collect()
    poll("the unrenewed lease to end", 5, lambda: not r.exists("dropped"))


# -- odd numbers and names -------------------------------------------------------------------


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


@pytest.mark.parametrize("name", [b"a{b}c", b"{x", b"}{", b"nul\x00in\x00it", "\u00e9{\u00e9}"])
def test_names_with_braces_and_nul_bytes(r: redis.Redis, name: Any) -> None:
    key = name if isinstance(name, bytes) else name.encode()
    lock = rl.Lock(r, name, fencing=True)
    with lock:
        assert info(r, key)["owner"] == lock.hold.owner
        assert lock.token is not None
    assert not r.exists(key)
    rw = rl.RWLock(r, name + (b":rw" if isinstance(name, bytes) else ":rw"))
    with rw.write, rw.read:
        pass
    sem = rl.LeasedSemaphore(r, key + b":s", lease=5)
    sem.try_set_permits(1)
    with sem:
        assert rl.LeasedSemaphore(r, key + b":s").acquire(1, blocking=False) is None


# -- RESP3 and decoded clients ---------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"protocol": 3}, {"protocol": 3, "decode_responses": True}])
def test_every_kind_on_resp3_and_decoded_clients(server: Server, kw: dict[str, Any]) -> None:
    c = server.client(**kw)
    lock = rl.Lock(c, "r3", fencing=True)
    with lock:
        assert lock.locked() and lock.owned() and lock.token is not None
        assert lock.acquire(timeout=1)  # re-entry
        lock.release()
    rw = rl.RWLock(c, "r3rw", fencing=True)
    with rw.write:
        assert rw.write.token is not None
    sem = rl.Semaphore(c, "r3s")
    sem.try_set_permits(2)
    with sem:
        assert sem.available() == 1
    leased = rl.LeasedSemaphore(c, "r3l", lease=5)
    leased.try_set_permits(1)
    hold = leased.acquire(1)
    assert hold is not None and len(hold.ids) == 1
    hold.release()
    compat = c.lock("r3c", timeout=5, lock_class=rl.RLockCompat)
    assert compat.acquire() and compat.owned() and compat.locked()
    compat.release()
    assert not server.client().exists("r3", "r3rw", "r3c")


async def test_async_every_kind_on_resp3(server: Server) -> None:
    c = aredis.Redis(port=server.port, protocol=3, decode_responses=True)
    lock = ra.Lock(c, "ar3", fencing=True)
    async with lock:
        assert await lock.locked() and lock.token is not None
    sem = ra.LeasedSemaphore(c, "ar3l", lease=5)
    await sem.try_set_permits(1)
    hold = await sem.acquire(1)
    assert hold is not None and len(hold.ids) == 1
    await hold.release()
    assert await sem.available() == 1
    await c.aclose()


# -- the redis-py drop-in against redis-py's own Lock expectations ---------------------------


def test_drop_in_matches_redis_py_lock_expectations(r: redis.Redis) -> None:
    lock = r.lock("c", timeout=10, lock_class=rl.RLockCompat)
    with pytest.raises(LockError):
        lock.extend(5)  # "Cannot extend an unlocked lock"
    with pytest.raises(LockError):
        lock.release()  # "Cannot release an unlocked lock"
    assert not lock.locked() and not lock.owned()
    assert lock.acquire(blocking=False, token="tok")
    assert lock.local.token == b"tok"
    assert lock.locked() and lock.owned()
    assert not lock.acquire(blocking=False)  # not reentrant, as redis-py's
    other = r.lock("c", timeout=10, lock_class=rl.RLockCompat)
    t0 = time.monotonic()
    assert not other.acquire(blocking_timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2
    assert not other.owned()
    busy = r.lock("c", blocking_timeout=0.1, lock_class=rl.RLockCompat)
    with pytest.raises(LockError, match="Unable to acquire"), busy:
        pass
    assert lock.extend(10)  # adds to the remaining ~10 s
    assert 15_000 < int(r.execute_command("RLOCK.PTTL", "c")) <= 20_000
    assert lock.extend(5, replace_ttl=True)
    assert 4_000 < int(r.execute_command("RLOCK.PTTL", "c")) <= 5_000
    assert lock.reacquire()
    assert 9_000 < int(r.execute_command("RLOCK.PTTL", "c")) <= 10_000
    lock.release()
    assert not r.exists("c")
    with pytest.raises(LockError):
        lock.release()

    noexp = r.lock("c2", lock_class=rl.RLockCompat)  # timeout None
    assert noexp.acquire()
    with pytest.raises(LockError):
        noexp.extend(5)  # "Cannot extend a lock with no timeout"
    with pytest.raises(LockError):
        noexp.reacquire()
    noexp.release()

    lost = r.lock("c3", timeout=10, lock_class=rl.RLockCompat)
    assert lost.acquire()
    r.execute_command("RLOCK.FORCERELEASE", "c3")
    with pytest.raises(LockNotOwnedError):
        lost.extend(5)
    with pytest.raises(LockNotOwnedError):
        lost.reacquire()
    assert not lost.owned()


def test_drop_in_thread_local_false_is_shared_between_threads(r: redis.Redis) -> None:
    lock = r.lock("tl", timeout=10, thread_local=False, lock_class=rl.RLockCompat)
    assert lock.acquire()
    t = threading.Thread(target=lock.release)
    t.start()
    t.join(10)
    assert not r.exists("tl")
    local = r.lock("tl2", timeout=10, lock_class=rl.RLockCompat)
    assert local.acquire()
    err: list[BaseException] = []

    def other() -> None:
        try:
            local.release()
        except BaseException as e:
            err.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert err and isinstance(err[0], LockError) and r.exists("tl2")
    local.release()


# -- a paused server and a killed connection in the middle of a release -----------------------


@pytest.mark.parametrize("kind", ["lock", "read", "write", "counted", "leased"])
def test_client_kill_mid_release_releases_exactly_once(r: redis.Redis, kind: str) -> None:
    if kind == "lock":
        lock: Any = rl.Lock(r, "k", lease=20)
        assert lock.acquire()
        release = lock.release
    elif kind in ("read", "write"):
        rw = rl.RWLock(r, "k", lease=20)
        lock = getattr(rw, kind)
        assert lock.acquire()
        release = lock.release
    elif kind == "counted":
        sem = rl.Semaphore(r, "k")
        sem.try_set_permits(3)
        hold = sem.permits(2)
        assert hold is not None
        release = hold.release
    else:
        ls = rl.LeasedSemaphore(r, "k", lease=20)
        ls.try_set_permits(3)
        hold = ls.acquire(2)
        assert hold is not None
        release = hold.release
    admin = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
    me = admin.client_id()

    def nemesis() -> None:  # kills the paused release's connection, then lets writes go
        poll(
            "the release to be paused",
            5,
            lambda: any(
                ("release" in c["cmd"] or "cancel" in c["cmd"]) and int(c["id"]) != me
                for c in admin.client_list()
            ),
        )
        for c in admin.client_list():
            if int(c["id"]) != me:
                admin.client_kill_filter(_id=int(c["id"]))
        admin.execute_command("CLIENT", "UNPAUSE")

    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    t = threading.Thread(target=nemesis)
    t.start()
    try:
        release()  # retried with its request id after the kill: exactly once, no LockLost
    finally:
        t.join(10)
        admin.execute_command("CLIENT", "UNPAUSE")
    if kind in ("counted", "leased"):
        assert int(r.execute_command("RSEM.AVAILABLE", "k")) == 3
    else:
        assert not r.exists("k")


@pytest.mark.parametrize("kind", ["lock", "write", "counted", "leased"])
def test_release_on_a_stopped_server_is_bounded(server: Server, kind: str) -> None:
    c = server.client()
    if kind == "lock":
        lock: Any = rl.Lock(c, "st", lease=3, response_timeout=0.3)
    elif kind == "write":
        lock = rl.RWLock(c, "st", lease=3, response_timeout=0.3).write
    elif kind == "counted":
        lock = rl.Semaphore(c, "st", response_timeout=0.3)
        lock.try_set_permits(1)
    else:
        lock = rl.LeasedSemaphore(c, "st", lease=3, response_timeout=0.3)
        lock.try_set_permits(1)
    holder = lock.__enter__()
    server.pause()
    try:
        t0 = time.monotonic()
        try:
            lock.__exit__(None, None, None)
        except rl.LockError:
            pass
        assert time.monotonic() - t0 < 3.0
        _ = holder
    finally:
        server.resume()
    assert rl.flush_all(5)
    if kind in ("counted", "leased"):
        poll("the permit back", 5, lambda: int(c.execute_command("RSEM.AVAILABLE", "st")) == 1)
    else:
        poll("the lock free", 5, lambda: not c.exists("st"))


# -- asyncio cancellation at the await points of release, re-entry, RWLock, semaphores --------


@pytest.mark.parametrize("kind", ["write", "read", "counted", "leased", "reenter"])
async def test_async_cancel_inside_release_and_reentry_leaves_nothing(
    server: Server, kind: str
) -> None:
    c = aredis.Redis(port=server.port)
    admin = server.client()
    if kind in ("read", "write"):
        lock: Any = getattr(ra.RWLock(c, "ac", lease=20), kind)
        assert await lock.acquire()
        op = lock.release
    elif kind == "reenter":
        lock = ra.Lock(c, "ac", lease=20)
        assert await lock.acquire()
        op = lock.acquire
    elif kind == "counted":
        sem = ra.Semaphore(c, "ac")
        await sem.try_set_permits(2)
        hold = await sem.permits(2)
        assert hold is not None
        op = hold.release
    else:
        ls = ra.LeasedSemaphore(c, "ac", lease=20)
        await ls.try_set_permits(2)
        hold = await ls.acquire(2)
        assert hold is not None
        op = hold.release
    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):  # cancels this task inside the paused command
            await op()
    admin.execute_command("CLIENT", "UNPAUSE")
    if kind == "reenter":
        assert lock.hold.count == 1
        await lock.release()
    for be in c.__dict__.get("_redis_rlock_backends", []):
        assert await be.flush(5)
    if kind in ("counted", "leased"):
        assert int(admin.execute_command("RSEM.AVAILABLE", "ac")) == 2
    else:
        assert not admin.exists("ac")
    await c.aclose()
