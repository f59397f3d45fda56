"""A release that is not simply sent and answered: refused by the server (an error reply
changes nothing: the hold stays its owner's, renewed and releasable), its connection killed while
the server is paused in the middle of it (sent again with its request id: released exactly once),
sent to a stopped server (the caller is answered within a bound, the release goes on), and a lock
release whose reply was lost: sent again in the background, but never after the server forgot its
id (10 s), where it would end a later hold of the same owner; given up on ``P.RELEASE_RESEND_S``
after its first send, the lease ends a hold whose release never arrived; leased permits' release
cut off is sent on until their lease would have ended. Counted permits' releases are in
``test_counted_release.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _proxy import Proxy
from _servers import Server, apoll, let_release, poll, user_who_cannot_release

import redis_rlock as rl
import redis_rlock.aio as ra
from redis_rlock import _proto as P

# -- a release the server refuses leaves the hold with its owner -------------------------------


def test_a_refused_release_leaves_the_hold_with_its_owner(server: Server) -> None:
    admin = server.client()
    user = user_who_cannot_release(admin)
    r = server.client(username=user, password="x")
    lock = rl.Lock(r, "ok:1")
    assert lock.acquire()
    with pytest.raises(rl.LockPermissionError):
        lock.release()
    assert admin.exists("ok:1")
    # the server changed nothing: this thread still holds it (renewed, releasable)
    assert lock.owned()
    let_release(admin, user)
    lock.release()
    assert not admin.exists("ok:1")


async def test_async_refused_release_leaves_the_hold_with_its_owner(server: Server) -> None:
    admin = server.client()
    user = user_who_cannot_release(admin)
    r = aredis.Redis(port=server.port, username=user, password="x")
    lock = ra.Lock(r, "ok:2")
    assert await lock.acquire()
    with pytest.raises(rl.LockPermissionError):
        await lock.release()
    assert admin.exists("ok:2") and lock.owned()
    let_release(admin, user)
    await lock.release()
    assert not admin.exists("ok:2")
    await r.aclose()


# -- a killed connection or a stopped server in the middle of a release ------------------------


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


# -- a release whose reply was lost: sent again, never after the server forgot its id ----------


RT = 0.5


def test_a_release_whose_reply_was_lost_is_never_sent_after_the_server_forgot_its_id(
    server: Server, r: redis.Redis
) -> None:
    """A lock release executed with its reply lost, then a network cut past the 10 s the
    server remembers the release's id: the owner takes the lock again (here through another
    connection), the network heals, and the release sent on in the background must not end
    that later hold. It is given up on ``P.RELEASE_RESEND_S`` after its first send (the lease
    ends a hold whose release never arrived)."""
    p = Proxy(server.port)
    c = redis.Redis(port=p.port)
    key = "dr:forgotten"
    try:
        lock = rl.Lock(c, key, lease=60, response_timeout=RT)
        assert lock.acquire()
        (owner,) = r.hkeys(key)
        conns = p.hold()

        def lose_the_reply() -> None:
            poll("the release sent", 5.0, lambda: any(p.held_from_client(i) for i in conns))
            (sent,) = [i for i in conns if p.held_from_client(i)]
            p.release_to_server(sent)  # executed; its reply held back, then dropped by the cut
            poll("the release executed", 5.0, lambda: not r.exists(key))
            p.cut()

        cutter = threading.Thread(target=lose_the_reply, daemon=True)
        cutter.start()
        lock.release()  # unanswered: goes on in the background
        cutter.join(10.0)
        assert not cutter.is_alive() and not r.exists(key)
        # the server forgets the release's id (its latch expires)
        poll("the release's id forgotten", 15.0, lambda: not r.keys("redisson_unlock_latch:*"))
        assert r.execute_command("RLOCK.ACQUIRE", key, owner, 60_000) is None
        p.heal()
        assert rl.flush_all(15.0), "the background release never ended"
        assert r.hget(key, owner) == b"1", "a stale release ended the owner's later hold"
    finally:
        c.close()
        p.close()


async def test_an_async_release_whose_reply_was_lost_is_never_sent_after_the_server_forgot_its_id(
    server: Server, r: redis.Redis
) -> None:
    """As the sync test above, for the asyncio engine."""
    p = Proxy(server.port)
    c = aredis.Redis(port=p.port)
    key = "dr:aforgotten"
    try:
        lock = ra.Lock(c, key, lease=60, response_timeout=RT)
        assert await lock.acquire()
        (owner,) = r.hkeys(key)
        conns = p.hold()

        def lose_the_reply() -> None:
            poll("the release sent", 5.0, lambda: any(p.held_from_client(i) for i in conns))
            (sent,) = [i for i in conns if p.held_from_client(i)]
            p.release_to_server(sent)
            poll("the release executed", 5.0, lambda: not r.exists(key))
            p.cut()

        cutter = threading.Thread(target=lose_the_reply, daemon=True)
        cutter.start()
        await lock.release()  # unanswered: goes on in the background
        await asyncio.to_thread(cutter.join, 10.0)
        assert not cutter.is_alive() and not r.exists(key)
        await apoll(
            "the release's id forgotten", 15.0, lambda: not r.keys("redisson_unlock_latch:*")
        )
        assert r.execute_command("RLOCK.ACQUIRE", key, owner, 60_000) is None
        p.heal()
        assert await lock._be.flush(15.0), "the background release never ended"
        assert r.hget(key, owner) == b"1", "a stale release ended the owner's later hold"
    finally:
        await c.aclose()
        p.close()


# -- leased permits' release cut off: sent on until their lease would have ended ---------------

#: how long the network is cut under a leased release: longer than a lock's release is sent
#: again (``P.RELEASE_RESEND_S``), far shorter than the permits' lease
CUT_S = P.RELEASE_RESEND_S + 2.0
LEASE_S = 40


def test_a_leased_release_cut_off_is_sent_on_until_the_lease_would_have_ended(
    server: Server, r: redis.Redis
) -> None:
    """Leased permits released while the network is cut (nothing reaches the server): the
    caller is answered, the release goes on in the background, and once the network heals it
    gives the permits back, long before their lease would have ended. A leased release names
    permit ids no later grant reuses: it is sent on for as long as the permits may be held
    (a lock's release only ``P.RELEASE_RESEND_S``), the same rule in both engines."""
    p = Proxy(server.port)
    c = redis.Redis(port=p.port)
    key = "dr:leased-cut"
    try:
        ls = rl.LeasedSemaphore(c, key, lease=LEASE_S, response_timeout=RT)
        assert ls.try_set_permits(1)
        hold = ls.acquire(1)
        assert hold is not None
        p.cut()
        t0 = time.monotonic()
        hold.release()  # unanswered: goes on in the background
        time.sleep(CUT_S)  # the outage lasts
        assert int(r.execute_command("RSEM.AVAILABLE", key)) == 0, "released through a cut"
        p.heal()
        poll("the permit back", 10.0, lambda: int(r.execute_command("RSEM.AVAILABLE", key)) == 1)
        assert time.monotonic() - t0 < LEASE_S, "given back by its lease, not by the release"
        assert rl.flush_all(5.0), "the background release never ended"
    finally:
        c.close()
        p.close()


async def test_an_async_leased_release_cut_off_is_sent_on_until_the_lease_would_have_ended(
    server: Server, r: redis.Redis
) -> None:
    """As the sync test above, for the asyncio engine."""
    p = Proxy(server.port)
    c = aredis.Redis(port=p.port)
    key = "dr:aleased-cut"
    try:
        ls = ra.LeasedSemaphore(c, key, lease=LEASE_S, response_timeout=RT)
        assert await ls.try_set_permits(1)
        hold = await ls.acquire(1)
        assert hold is not None
        p.cut()
        t0 = time.monotonic()
        await hold.release()  # unanswered: goes on in the background
        await asyncio.sleep(CUT_S)  # the outage lasts
        assert int(r.execute_command("RSEM.AVAILABLE", key)) == 0, "released through a cut"
        p.heal()
        await apoll(
            "the permit back", 10.0, lambda: int(r.execute_command("RSEM.AVAILABLE", key)) == 1
        )
        assert time.monotonic() - t0 < LEASE_S, "given back by its lease, not by the release"
        assert await ls._be.flush(5.0), "the background release never ended"
    finally:
        await c.aclose()
        p.close()
