"""Deadlock refusals (issue 27 §2): the server's ``-DEADLOCK ...`` reply to a wait that would
close a cycle becomes :class:`redis_rlock.Deadlock` carrying the cycle. The first cycle is built
with raw commands (owners ``a`` and ``b``), so the reply is the real server's; the others go
through the package's owners (``Owner``, sync and asyncio), whose locks hold everything under
one owner id, while its plain locks (an owner id per hold) are never refused."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, apoll, blocked_clients, poll

import redis_rlock as rl
import redis_rlock.aio as ra
from redis_rlock.errors import translate


def state(r: redis.Redis, *keys: str) -> list[Any]:
    """What a refused wait must leave as it was: the data, blocked clients, the queues (each
    waiter's fields but the times, which move)."""
    out: list[Any] = [r.execute_command("DEBUG", "DIGEST"), blocked_clients(r)]
    for key in keys:
        kind = "RWLOCK" if r.hexists(key, "mode") else "RLOCK"
        for row in r.execute_command(f"{kind}.WAITERS", key):
            pairs = row.items() if isinstance(row, dict) else zip(row[::2], row[1::2])
            out.append([p for p in pairs if p[0] not in (b"waited_ms", b"left_ms")])
    return out


def test_a_deadlock_reply_becomes_deadlock_with_its_cycle(server: Server, r: redis.Redis) -> None:
    assert r.execute_command("RLOCK.ACQUIRE", "accounts", "a", 60000) is None
    assert r.execute_command("RLOCK.ACQUIRE", "ledger", "b", 60000) is None
    other = redis.Redis(port=server.port)
    waiter = threading.Thread(
        target=other.execute_command,
        args=("RLOCK.ACQUIRE", "accounts", "b", 60000, "WAIT", 3000),
    )
    waiter.start()
    try:
        poll("b to wait", 10, lambda: blocked_clients(r) == 1)
        with pytest.raises(redis.ResponseError) as refused:
            r.execute_command("RLOCK.ACQUIRE", "ledger", "a", 60000, "WAIT", 3000)
        found = translate(refused.value, "ledger")
        assert isinstance(found, rl.Deadlock) and isinstance(found, rl.LockError)
        assert found.cycle == ("a waits for ledger held by b; b waits for accounts held by a"), (
            found.cycle
        )
        assert r.execute_command("RLOCK.WAITERS", "ledger") == []
    finally:
        r.execute_command("RLOCK.RELEASE", "accounts", "a")
        waiter.join(5)
        other.close()


def test_an_owner_cycle_is_refused_at_once_changing_nothing(r: redis.Redis) -> None:
    a, b = rl.Owner(r), rl.Owner(r)
    assert a.id != b.id
    a_accounts = a.lock("accounts", lease=60)
    assert a_accounts.acquire()
    assert r.hgetall("accounts") == {a.id: b"1"}, "stored under the owner's one id"
    assert b.lock("ledger", lease=60).acquire()
    b_accounts = b.lock("accounts", lease=60)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(b_accounts.acquire(timeout=10)))
    waiter.start()
    try:
        poll("b to wait", 10, lambda: blocked_clients(r) == 1)
        before = state(r, "accounts", "ledger")
        t0 = time.monotonic()
        with pytest.raises(rl.Deadlock) as refused:
            a.lock("ledger", lease=60).acquire(timeout=5)
        assert time.monotonic() - t0 < 2, "refused at once, not after the wait"
        ida, idb = a.id.decode(), b.id.decode()
        assert refused.value.cycle == (
            f"{ida} waits for ledger held by {idb}; {idb} waits for accounts held by {ida}"
        )
        assert state(r, "accounts", "ledger") == before, "nothing changed"
    finally:
        a_accounts.release()
        waiter.join(10)
    assert got == [True], "the cycle broken, b's wait is served"
    assert r.hgetall("accounts") == {b.id: b"1"}


def test_a_cycle_through_a_read_hold_is_refused(r: redis.Redis) -> None:
    a, b = rl.Owner(r), rl.Owner(r)
    reading = a.rw_lock("config", lease=60).read
    assert reading.acquire()
    assert b.lock("jobs", lease=60).acquire()
    b_config = b.rw_lock("config", lease=60).write
    waiter = threading.Thread(target=lambda: b_config.acquire(timeout=10))
    waiter.start()
    try:
        poll("b to wait", 10, lambda: blocked_clients(r) == 1)
        with pytest.raises(rl.Deadlock) as refused:
            a.lock("jobs", lease=60).acquire(timeout=5)
        ida, idb = a.id.decode(), b.id.decode()
        assert refused.value.cycle == (
            f"{ida} waits for jobs held by {idb}; {idb} waits for config held by {ida}"
        )
    finally:
        reading.release()
        waiter.join(10)


def test_plain_locks_are_never_refused_they_wait(r: redis.Redis) -> None:
    assert rl.Lock(r, "accounts", lease=60).acquire()
    assert rl.Lock(r, "ledger", lease=60).acquire()
    other = rl.Lock(r, "accounts", lease=60)
    waiter = threading.Thread(target=lambda: other.acquire(timeout=3))
    waiter.start()
    try:
        poll("the other to wait", 10, lambda: blocked_clients(r) == 1)
        t0 = time.monotonic()
        assert not rl.Lock(r, "ledger", lease=60).acquire(timeout=0.8)
        assert time.monotonic() - t0 >= 0.4, "it waited"
    finally:
        waiter.join(10)


def test_two_locks_of_one_owner_reenter_on_the_server(r: redis.Redis) -> None:
    owner = rl.Owner(r)
    first, second = owner.lock("x", lease=60), owner.lock("x", lease=60)
    assert first.acquire()
    assert second.acquire(blocking=False), "a re-entry, at once"
    assert first.hold.owner == second.hold.owner == owner.id
    assert r.hgetall("x") == {owner.id: b"2"}
    second.release()
    assert r.hgetall("x") == {owner.id: b"1"}
    first.release()
    assert r.exists("x") == 0
    w, rd = owner.rw_lock("cfg", lease=60).write, owner.rw_lock("cfg", lease=60).read
    assert w.acquire()
    assert rd.acquire(blocking=False), "write -> read across objects"
    w.release()
    assert r.hget("cfg", "mode") == b"read", "downgraded"
    with pytest.raises(rl.UpgradeRefused):
        owner.rw_lock("cfg", lease=60).write.acquire(timeout=2)
    rd.release()
    assert r.exists("cfg") == 0


async def test_async_an_owner_cycle_is_refused(r: redis.Redis, ar: aredis.Redis) -> None:
    a, b = ra.Owner(ar), ra.Owner(ar)
    a_accounts = a.lock("accounts", lease=60)
    assert await a_accounts.acquire()
    assert await b.lock("ledger", lease=60).acquire()
    assert r.hgetall("accounts") == {a.id: b"1"}
    b_waits = asyncio.ensure_future(b.lock("accounts", lease=60).acquire(timeout=10))
    await apoll("b to wait", 10, lambda: blocked_clients(r) == 1)
    before = state(r, "accounts", "ledger")
    with pytest.raises(rl.Deadlock) as refused:
        await a.lock("ledger", lease=60).acquire(timeout=5)
    ida, idb = a.id.decode(), b.id.decode()
    assert refused.value.cycle == (
        f"{ida} waits for ledger held by {idb}; {idb} waits for accounts held by {ida}"
    )
    assert state(r, "accounts", "ledger") == before
    await a_accounts.release()
    assert await b_waits
    assert r.hgetall("accounts") == {b.id: b"1"}
