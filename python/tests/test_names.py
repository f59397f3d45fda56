"""Names of every type, in every API that takes one (sync and asyncio: locks, read-write locks,
semaphores, leased semaphores, latches, an owner's and a session's locks, the redis-py
drop-ins), are the key redis-py would use for them: its ``Encoder``'s bytes (str in the
client's encoding, int and float as their ``repr``, bytes-like as they are). A bool, None or
any other type raises redis-py's ``DataError`` at once, before anything is sent.
Names with braces (unbalanced too), NUL bytes and non-ASCII text work for every kind."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, info
from redis.exceptions import DataError

import redis_rlock as rl
import redis_rlock.aio as ra

NAMES: list[Any] = [
    42,
    10**8,
    -7,
    0,
    1.5,
    1e20,
    float("inf"),
    "\u00e9t\u00e9",
    "x{y}",
    b"\x00\xff",
    bytearray(b"ba"),
    memoryview(b"mv"),
]
BAD: list[Any] = [True, False, None, object(), ["a"], 1j, {"a": 1}]
ENCODINGS = ["utf-8", "latin-1"]


def _take_sync(api: str, c: redis.Redis, name: Any) -> Callable[[], None]:
    """Takes (or creates) ``name`` through ``api``; returns what gives it back."""
    if api == "lock":
        lk = rl.Lock(c, name)
        assert lk.acquire()
        return lk.release
    if api == "rwlock":
        rw = rl.RWLock(c, name)
        assert rw.write.acquire()
        return rw.write.release
    if api == "semaphore":
        sem = rl.Semaphore(c, name)
        assert sem.try_set_permits(1)
        return lambda: None
    if api == "leased":
        leased = rl.LeasedSemaphore(c, name)
        assert leased.try_set_permits(1)
        hold = leased.acquire(1)
        assert hold is not None
        return hold.release
    if api == "latch":
        assert rl.CountDownLatch(c, name).try_set_count(1)
        return lambda: None
    if api == "owner":
        lk = rl.Owner(c).lock(name)
        assert lk.acquire()
        return lk.release
    if api == "session":
        session = rl.Session(c)
        lk = session.lock(name)
        assert lk.acquire()
        return lambda: (lk.release(), session.close())  # type: ignore[func-returns-value]
    lk = c.lock(name, lock_class=rl.RLockCompat)
    assert lk.acquire()
    return lk.release


SYNC_APIS = ["lock", "rwlock", "semaphore", "leased", "latch", "owner", "session", "drop-in"]


def _made_sync(api: str, c: redis.Redis, name: Any) -> None:
    """Only makes the object ``api`` takes ``name`` with (no command)."""
    makers: dict[str, Callable[[], Any]] = {
        "lock": lambda: rl.Lock(c, name),
        "rwlock": lambda: rl.RWLock(c, name),
        "semaphore": lambda: rl.Semaphore(c, name),
        "leased": lambda: rl.LeasedSemaphore(c, name),
        "latch": lambda: rl.CountDownLatch(c, name),
        "owner": lambda: rl.Owner(c).lock(name),
        "drop-in": lambda: c.lock(name, lock_class=rl.RLockCompat),
    }
    if api == "session":
        with rl.Session(c) as session:
            session.lock(name)
    else:
        makers[api]()


def _key(c: Any, name: Any) -> bytes:
    """The key redis-py itself sends for ``name``."""
    return bytes(c.get_encoder().encode(name))


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("api", SYNC_APIS)
def test_every_name_is_the_key_redis_py_would_use(server: Server, api: str, encoding: str) -> None:
    c = server.client(encoding=encoding)
    r = server.client()
    for name in NAMES:
        key = _key(c, name)
        give_back = _take_sync(api, c, name)
        assert r.exists(key), f"{api}: {name!r} is not the key {key!r}: {r.keys()}"
        give_back()
        r.flushall()
    c.close()


@pytest.mark.parametrize("api", SYNC_APIS)
def test_a_name_of_another_type_is_refused_at_once(server: Server, api: str) -> None:
    r = server.client()
    for name in BAD:
        with pytest.raises(DataError):
            _made_sync(api, r, name)
    assert r.dbsize() == 0


async def _take_async(api: str, c: aredis.Redis, name: Any) -> Callable[[], Awaitable[Any]]:
    if api == "lock":
        lk = ra.Lock(c, name)
        assert await lk.acquire()
        return lk.release
    if api == "rwlock":
        rw = ra.RWLock(c, name)
        assert await rw.write.acquire()
        return rw.write.release  # type: ignore[no-any-return]
    if api == "semaphore":
        sem = ra.Semaphore(c, name)
        assert await sem.try_set_permits(1)
        return sem.available
    if api == "leased":
        leased = ra.LeasedSemaphore(c, name)
        assert await leased.try_set_permits(1)
        hold = await leased.acquire(1)
        assert hold is not None
        return hold.release
    if api == "latch":
        latch = ra.CountDownLatch(c, name)
        assert await latch.try_set_count(1)
        return latch.get_count
    if api == "owner":
        lk = ra.Owner(c).lock(name)
        assert await lk.acquire()
        return lk.release
    if api == "session":
        session = ra.Session(c)
        lk = session.lock(name)
        assert await lk.acquire()

        async def end() -> None:
            await lk.release()
            await session.close()

        return end
    compat = c.lock(name, lock_class=ra.AsyncRLockCompat)
    assert await compat.acquire()
    return compat.release


@pytest.mark.parametrize("api", SYNC_APIS)
async def test_async_every_name_is_the_key_redis_py_would_use(server: Server, api: str) -> None:
    r = server.client()
    for encoding in ENCODINGS:
        c = aredis.Redis(port=server.port, encoding=encoding)
        for name in NAMES:
            key = _key(c, name)
            give_back = await _take_async(api, c, name)
            assert r.exists(key), f"{api}: {name!r} is not the key {key!r}: {r.keys()}"
            await give_back()
            r.flushall()
        await c.aclose()


@pytest.mark.parametrize("api", SYNC_APIS)
async def test_async_a_name_of_another_type_is_refused_at_once(server: Server, api: str) -> None:
    r = server.client()
    c = aredis.Redis(port=server.port)
    makers: dict[str, Callable[[Any], Any]] = {
        "lock": lambda n: ra.Lock(c, n),
        "rwlock": lambda n: ra.RWLock(c, n),
        "semaphore": lambda n: ra.Semaphore(c, n),
        "leased": lambda n: ra.LeasedSemaphore(c, n),
        "latch": lambda n: ra.CountDownLatch(c, n),
        "owner": lambda n: ra.Owner(c).lock(n),
        "session": lambda n: ra.Session(c).lock(n),
        "drop-in": lambda n: c.lock(n, lock_class=ra.AsyncRLockCompat),
    }
    for name in BAD:
        with pytest.raises(DataError):
            makers[api](name)
    assert r.dbsize() == 0
    await c.aclose()


# -- braces and NUL bytes in names -------------------------------------------------------------


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
