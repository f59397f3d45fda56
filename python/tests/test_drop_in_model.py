"""The redis-py drop-ins against redis-py's own ``Lock`` as the model: the same random
sequence of calls (acquire with shared, distinct or generated tokens, release, extend,
reacquire, owned, locked, a token set by hand, ``do_release(token)``, the key deleted) on lock
objects spread over two clients, once on redis-py's ``Lock`` and once on the drop-in, must give
the same answers step by step (the same value, or the same kind of exception).
``RLOCK_PY_SEED`` replays a run."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, info
from redis.asyncio.lock import Lock as AsyncRedisPyLock
from redis.exceptions import LockError, LockNotOwnedError
from redis.lock import Lock as RedisPyLock

import redis_rlock as rl
import redis_rlock.aio as ra

SEED = int(os.environ.get("RLOCK_PY_SEED", str(random.randrange(1 << 30))))
STEPS = int(os.environ.get("RLOCK_PY_DROP_IN_STEPS", "150"))
OBJECTS = 4
TOKENS: list[Any] = [None, None, "t", b"t", "u", 7]


def _step(lk: Any, op: str, arg: Any, r: redis.Redis, key: str) -> Any:
    """One call on a sync lock object: its answer (a value, or the kind of exception)."""
    try:
        if op == "acquire":
            return lk.acquire(blocking=False, token=arg)
        if op == "release":
            return lk.release()
        if op == "extend":
            return lk.extend(5)
        if op == "extend_replace":
            return lk.extend(5, replace_ttl=True)
        if op == "reacquire":
            return lk.reacquire()
        if op == "owned":
            return lk.owned()
        if op == "locked":
            return lk.locked()
        if op == "set_token":
            lk.local.token = _encoded(arg)
            return None
        if op == "do_release":
            return lk.do_release(_encoded(arg) or b"none")
        return r.delete(key)
    except LockNotOwnedError:
        return "LockNotOwnedError"
    except LockError:
        return "LockError"


async def _astep(lk: Any, op: str, arg: Any, r: aredis.Redis, key: str) -> Any:
    """One call on an asyncio lock object, as ``_step``."""
    try:
        if op == "acquire":
            return await lk.acquire(blocking=False, token=arg)
        if op == "release":
            return await lk.release()
        if op == "extend":
            return await lk.extend(5)
        if op == "extend_replace":
            return await lk.extend(5, replace_ttl=True)
        if op == "reacquire":
            return await lk.reacquire()
        if op == "owned":
            return await lk.owned()
        if op == "locked":
            return await lk.locked()
        if op == "set_token":
            lk.local.token = _encoded(arg)
            return None
        if op == "do_release":
            return await lk.do_release(_encoded(arg) or b"none")
        return await r.delete(key)
    except LockNotOwnedError:
        return "LockNotOwnedError"
    except LockError:
        return "LockError"


def _script(rng: random.Random) -> list[tuple[str, int, Any]]:
    """A random sequence of (operation, lock object, argument)."""
    ops = ["acquire"] * 4 + ["release"] * 3 + ["extend", "extend_replace", "reacquire"]
    ops += ["owned", "locked"]
    ops += ["set_token", "do_release", "delete"]
    return [(rng.choice(ops), rng.randrange(OBJECTS), rng.choice(TOKENS)) for _ in range(STEPS)]


def _compare(script: list[tuple[str, int, Any]], runs: dict[str, list[Any]]) -> None:
    """Fails at the first step where the answers differ, showing the steps before it."""
    rows = list(zip(script, runs["model"], runs["drop-in"]))
    for n, (_, want, got) in enumerate(rows):
        if want != got:
            trail = "\n".join(
                f"  {k}: {s} redis-py {w!r} drop-in {g!r}"
                for k, (s, w, g) in enumerate(rows[max(0, n - 20) : n + 1], max(0, n - 20))
            )
            raise AssertionError(f"seed {SEED}: the answers differ at step {n}:\n{trail}")


def _encoded(token: Any) -> Any:
    return None if token is None else redis.Redis().get_encoder().encode(token)


def test_drop_in_answers_as_redis_py_lock_step_by_step(server: Server) -> None:
    print(f"RLOCK_PY_SEED={SEED}")
    clients = [server.client(), server.client()]
    script = _script(random.Random(SEED))
    runs: dict[str, list[Any]] = {}
    for cls, key in ((RedisPyLock, "model"), (rl.RLockCompat, "drop-in")):
        locks = [
            clients[i % 2].lock(key, timeout=30, lock_class=cls, thread_local=bool(i % 2))
            for i in range(OBJECTS)
        ]
        answers: list[Any] = []
        for op, i, arg in script:
            answers.append(_step(locks[i], op, arg, clients[0], key))
            if cls is rl.RLockCompat:
                held = info(clients[0], key)
                assert not held or held["count"] == 1, f"seed {SEED}: {held}"
        runs[key] = answers
        clients[0].delete(key)
    _compare(script, runs)


async def test_async_drop_in_answers_as_redis_py_lock_step_by_step(server: Server) -> None:
    print(f"RLOCK_PY_SEED={SEED}")
    clients = [aredis.Redis(port=server.port), aredis.Redis(port=server.port)]
    script = _script(random.Random(SEED + 1))
    runs: dict[str, list[Any]] = {}
    for cls, key in ((AsyncRedisPyLock, "model"), (ra.AsyncRLockCompat, "drop-in")):
        locks = [
            clients[i % 2].lock(key, timeout=30, lock_class=cls, thread_local=bool(i % 2))
            for i in range(OBJECTS)
        ]
        answers: list[Any] = []
        for op, i, arg in script:
            answers.append(await _astep(locks[i], op, arg, clients[0], key))
        runs[key] = answers
        await clients[0].delete(key)
    for c in clients:
        await c.aclose()
    _compare(script, runs)


@pytest.mark.parametrize("token", ["t", b"t", 7])
def test_one_token_on_two_clients_gives_the_lock_to_one(server: Server, token: Any) -> None:
    first, second = server.client(), server.client()
    a = first.lock("k", lock_class=rl.RLockCompat, blocking_timeout=0.2)
    b = second.lock("k", lock_class=rl.RLockCompat, blocking_timeout=0.2)
    assert a.acquire(token=token)
    assert not b.acquire(token=token)  # redis-py: True, False
    assert not b.acquire(blocking=False, token=token)
    assert info(first, "k")["count"] == 1
    assert a.owned() and not b.owned()
    a.release()
    assert b.acquire(token=token) and b.owned() and not a.owned()
    b.release()
    assert not first.exists("k")


async def test_async_one_token_on_two_clients_gives_the_lock_to_one(server: Server) -> None:
    first, second = aredis.Redis(port=server.port), aredis.Redis(port=server.port)
    a = first.lock("k", lock_class=ra.AsyncRLockCompat, blocking_timeout=0.2)
    b = second.lock("k", lock_class=ra.AsyncRLockCompat, blocking_timeout=0.2)
    assert await a.acquire(token="t")
    assert not await b.acquire(token="t")
    assert info(server.client(), "k")["count"] == 1
    await a.release()
    assert await b.acquire(token="t") and await b.owned()
    await b.release()
    assert not await first.exists("k")
    await first.aclose()
    await second.aclose()


def test_a_token_handed_to_another_object_releases_and_extends_the_hold(r: redis.Redis) -> None:
    holder = r.lock("k", timeout=10, lock_class=rl.RLockCompat)
    assert holder.acquire(token="job-1")
    other = r.lock("k", timeout=10, lock_class=rl.RLockCompat)
    assert not other.owned()
    other.local.token = b"job-1"  # as redis-py users pass a token between processes
    assert other.owned() and other.extend(20)
    assert int(r.execute_command("RLOCK.PTTL", "k")) > 20_000
    other.release()
    assert not r.exists("k")
    with pytest.raises(LockNotOwnedError):
        holder.release()


def test_a_timeout_of_zero_takes_a_renewed_lease_as_none_does(r: redis.Redis) -> None:
    lock = r.lock("k", timeout=0, lock_class=rl.RLockCompat)  # redis-py: never expires
    assert lock.acquire(blocking=False)
    assert 0 < int(r.execute_command("RLOCK.PTTL", "k")) <= 30_000  # the watchdog's lease
    with pytest.raises(LockError):
        lock.extend(5)  # as with timeout=None: no lease of its own to extend
    with pytest.raises(LockError):
        lock.reacquire()
    assert lock.owned()
    lock.release()
    assert not r.exists("k")


@pytest.mark.parametrize("cls", [RedisPyLock, rl.RLockCompat])
def test_extend_by_zero_checks_ownership_as_redis_py_does(r: redis.Redis, cls: Any) -> None:
    lock = r.lock("k", timeout=10, lock_class=cls)
    assert lock.acquire(blocking=False)
    assert lock.extend(0) is True
    assert int(r.pttl("k") if cls is RedisPyLock else r.execute_command("RLOCK.PTTL", "k")) > 0
    lock.release()
    with pytest.raises(LockError):
        lock.extend(0)
    with pytest.raises(LockError):
        r.lock("k", timeout=10, lock_class=cls).extend(0)


@pytest.mark.parametrize("cls", [AsyncRedisPyLock, ra.AsyncRLockCompat])
async def test_async_extend_by_zero_checks_ownership_as_redis_py_does(
    ar: aredis.Redis, cls: Any
) -> None:
    lock = ar.lock("k", timeout=10, lock_class=cls)
    assert await lock.acquire(blocking=False)
    assert await lock.extend(0) is True
    await lock.release()
