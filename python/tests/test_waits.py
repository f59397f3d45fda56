"""Server-side waits and their connections (sync and asyncio): a wait whose connection died
without a word (a cut network) is noticed and served once the network heals, for every kind,
nothing lost; waits keep to the user's pool cap, in order, and at the server's ``maxclients``
the holders' releases still go through and every waiter is served."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aredis
from _proxy import Proxy, SlowProxy
from _servers import Server, blocked_clients, info, poll

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.2  # response timeout of the waiters: a lasting wait is checked every second
SERVED = 10.0  # the bound within which a wait is served once its grant is possible


@pytest.fixture
def proxy(server: Server) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.close()


def _kinds(r: redis.Redis, via: redis.Redis) -> list[tuple[str, Callable[[], Any], Any]]:
    """(name, the holder's release, the waiter's lock-like object) for every kind that waits,
    the holder already holding it."""
    out: list[tuple[str, Callable[[], Any], Any]] = []
    lock = rl.Lock(r, "lock")
    lock.acquire()
    out.append(("lock", lock.release, rl.Lock(via, "lock", response_timeout=RT)))
    rw = rl.RWLock(r, "rw")
    rw.read.acquire()
    out.append(("write", rw.read.release, rl.RWLock(via, "rw", response_timeout=RT).write))
    sem = rl.Semaphore(r, "sem")
    sem.try_set_permits(1)
    sem.acquire()
    out.append(("counted", sem.release, rl.Semaphore(via, "sem", response_timeout=RT)))
    leased = rl.LeasedSemaphore(r, "leased")
    leased.try_set_permits(1)
    held = leased.acquire()
    out.append(("leased", held.release, rl.LeasedSemaphore(via, "leased", response_timeout=RT)))
    return out


def test_an_untimed_wait_on_a_silently_dead_connection_is_served_when_the_network_heals(
    server: Server, r: redis.Redis, proxy: Proxy
) -> None:
    via = redis.Redis(port=proxy.port, socket_timeout=10)
    kinds = _kinds(r, via)
    got: dict[str, Any] = {}
    checked = threading.Event()

    def wait(name: str, obj: Any) -> None:
        got[name] = hold = obj.acquire()
        checked.wait(SERVED)
        if name == "leased":
            hold.release()
        elif hold:
            obj.release()

    threads = [threading.Thread(target=wait, args=(n, o), daemon=True) for n, _, o in kinds]
    for t in threads:
        t.start()
    poll("every waiter to block", 5, lambda: blocked_clients(r) == len(kinds))
    proxy.cut()
    for _, release, _ in kinds:
        release()  # granted to the waits, whose replies the cut network swallows
    proxy.heal()
    poll("every wait served", SERVED, lambda: len(got) == len(kinds))
    assert {n: bool(got[n]) for n, _, _ in kinds} == {n: True for n, _, _ in kinds}
    assert rl.Lock(r, "lock").locked() and rl.RWLock(r, "rw").write.locked()
    sem, leased = rl.Semaphore(r, "sem"), rl.LeasedSemaphore(r, "leased")
    assert sem.available() == 0 and leased.available() == 0
    checked.set()
    for t in threads:
        t.join(SERVED)
    assert sem.available() == 1 and leased.available() == 1  # nothing lost
    assert not rl.Lock(r, "lock").locked() and not rl.RWLock(r, "rw").write.locked()
    via.close()


async def test_an_async_untimed_wait_on_a_silently_dead_connection_is_served_when_it_heals(
    server: Server, r: redis.Redis, proxy: Proxy
) -> None:
    via = aredis.Redis(port=proxy.port, socket_timeout=10)
    holder = rl.Semaphore(r, "sem")
    holder.try_set_permits(1)
    holder.acquire()
    lock = rl.Lock(r, "lock")
    lock.acquire()
    sem = ra.Semaphore(via, "sem", response_timeout=RT)
    alock = ra.Lock(via, "lock", response_timeout=RT)
    checked = asyncio.Event()

    async def take(obj: Any) -> bool:
        got = bool(await obj.acquire())
        await checked.wait()
        await obj.release()
        return got

    tasks = [asyncio.ensure_future(take(sem)), asyncio.ensure_future(take(alock))]
    end = asyncio.get_running_loop().time() + 5
    while blocked_clients(r) < 2:
        assert asyncio.get_running_loop().time() < end, "the waiters did not block"
        await asyncio.sleep(0.01)
    proxy.cut()
    holder.release()
    lock.release()
    proxy.heal()
    end = asyncio.get_running_loop().time() + SERVED
    while not (lock.locked() and holder.available() == 0 and r.exists("sem")):
        assert asyncio.get_running_loop().time() < end, "the waits were not served"
        await asyncio.sleep(0.05)
    checked.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), SERVED) == [True, True]
    assert holder.available() == 1 and not lock.locked()  # nothing lost
    await via.aclose()


def _client_conns(r: redis.Redis) -> int:
    return int(r.info("clients")["connected_clients"])


def test_waits_keep_to_the_pool_cap_and_are_served_in_order(server: Server) -> None:
    monitor = server.client()
    before = {c["id"] for c in monitor.client_list()}
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=3)
    )
    holder = rl.Lock(capped, "k")
    holder.acquire()
    order: list[int] = []
    be = rl._sync.backend_for(capped, 2.0)

    def wait(i: int) -> None:
        lock = rl.Lock(capped, "k")
        if lock.acquire(timeout=30):
            order.append(i)
            lock.release()

    threads = []
    for i in range(12):
        threads.append(threading.Thread(target=wait, args=(i,), daemon=True))
        threads[-1].start()
        poll("the waiter in line", 5, lambda i=i: _in_line(be, monitor) == i + 1)  # type: ignore[misc]
    opened = [c for c in monitor.client_list() if c["id"] not in before]
    # 3 waits, one connection for the callers' releases, one for the background threads'
    assert len(opened) <= 3 + 2, opened
    holder.release()
    for t in threads:
        t.join(30)
    assert order == list(range(12))


def _in_line(be: Any, monitor: redis.Redis) -> int:
    """The waits sent to the server or queued for a connection."""
    gate = getattr(be, "_waits", {}).get("", (None, None))[1]
    if gate is None:
        return int(monitor.execute_command("RLOCK.INFO", "k")[7])  # waiters
    return int(gate.busy + len(gate._queue))


def test_at_maxclients_releases_go_through_and_every_waiter_is_served_in_order() -> None:
    server = Server("--maxclients", "8")
    try:
        r = redis.Redis(port=server.port)
        holder = rl.Lock(r, "k")
        holder.acquire()
        be = rl._sync.backend_for(r, 2.0)
        monitor = server.client()
        order: list[int] = []

        def wait(i: int) -> None:
            lock = rl.Lock(r, "k")
            if lock.acquire(timeout=20):
                order.append(i)
                lock.release()

        threads = []
        for i in range(20):
            threads.append(threading.Thread(target=wait, args=(i,), daemon=True))
            threads[-1].start()
            poll("the waiter in line", 5, lambda i=i: _in_line(be, monitor) == i + 1)  # type: ignore[misc]
        holder.release()
        for t in threads:
            t.join(25)
        assert order == list(range(20))
    finally:
        server.close()


def test_an_untimed_wait_follows_its_lock_through_a_cluster_failover(request: Any) -> None:
    from _ha import key_on, replica_of
    from _servers import cluster_of
    from redis.cluster import RedisCluster

    gen = cluster_of(request, 1)
    nodes = next(gen)
    try:
        master = nodes[0]
        rc = RedisCluster(host="127.0.0.1", port=master.port)
        key = key_on(master, master.port, "fo")
        holder = rl.Lock(rc, key, lease=60)
        assert holder.acquire()
        out: list[Any] = []

        def wait() -> None:
            try:
                out.append(rl.Lock(rc, key, lease=60).acquire())
            except BaseException as e:  # recorded: the test says what ended the wait
                out.append(e)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        poll("the waiter to block", 5, lambda: blocked_clients(master.client()) == 1)
        master.client().execute_command("WAIT", 1, 5000)
        replica = replica_of(nodes, master)
        replica.client().execute_command("CLUSTER", "FAILOVER")
        poll("the promotion", 30, lambda: replica.client().info("replication")["role"] == "master")
        poll("the waiter on the new master", 30, lambda: blocked_clients(replica.client()) == 1)
        assert out == []
        rc.delete(key)  # the holder's grant ends on the new master
        t.join(SERVED)
        assert out == [True]
        rc.close()
    finally:
        gen.close()


def test_a_session_wait_on_a_silently_dead_connection_closes_the_session_holding_nothing(
    server: Server, r: redis.Redis, proxy: Proxy
) -> None:
    via = redis.Redis(port=proxy.port, socket_timeout=10)
    holder = rl.Lock(r, "slock")
    holder.acquire()
    session = rl.Session(via, response_timeout=RT, keepalive=30)
    out: list[Any] = []

    def wait() -> None:
        try:
            out.append(session.lock("slock").acquire())
        except BaseException as e:  # recorded: the test says what ended the wait
            out.append(e)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    poll("the waiter to block", 5, lambda: blocked_clients(r) == 1)
    proxy.cut()
    holder.release()  # granted to the session's wait, whose reply the cut network swallows
    proxy.heal()
    t.join(SERVED)
    assert len(out) == 1 and isinstance(out[0], rl.SessionClosed), out
    assert session.closed.is_set()
    poll("nothing held", SERVED, lambda: not rl.Lock(r, "slock").locked())
    via.close()


async def test_an_async_session_wait_on_a_silently_dead_connection_closes_the_session(
    server: Server, r: redis.Redis, proxy: Proxy
) -> None:
    via = aredis.Redis(port=proxy.port, socket_timeout=10)
    holder = rl.Lock(r, "aslock")
    holder.acquire()
    session = ra.Session(via, response_timeout=RT, keepalive=30)
    task = asyncio.ensure_future(session.lock("aslock").acquire())
    end = asyncio.get_running_loop().time() + 5
    while blocked_clients(r) < 1:
        assert asyncio.get_running_loop().time() < end, "the waiter did not block"
        await asyncio.sleep(0.01)
    proxy.cut()
    holder.release()
    proxy.heal()
    with pytest.raises(rl.SessionClosed):
        await asyncio.wait_for(task, SERVED)
    assert session.closed.is_set()
    end = asyncio.get_running_loop().time() + SERVED
    while rl.Lock(r, "aslock").locked():
        assert asyncio.get_running_loop().time() < end, "the grant was not given back"
        await asyncio.sleep(0.05)
    await via.aclose()


async def test_async_waits_keep_to_the_pool_cap(server: Server) -> None:
    monitor = server.client()
    capped = aredis.Redis(
        connection_pool=aredis.BlockingConnectionPool(port=server.port, max_connections=2)
    )
    holder = ra.Lock(capped, "k")
    assert await holder.acquire()
    served: list[int] = []

    async def wait(i: int) -> None:
        lock = ra.Lock(capped, "k")
        if await lock.acquire(timeout=30):
            served.append(i)
            await lock.release()

    tasks = [asyncio.ensure_future(wait(i)) for i in range(6)]
    end = asyncio.get_running_loop().time() + 5
    while blocked_clients(monitor) < 2:
        assert asyncio.get_running_loop().time() < end, "no waiter blocked"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the subject: no more connections come
    assert blocked_clients(monitor) == 2 and _client_conns(monitor) <= 1 + 2 + 1
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert sorted(served) == list(range(6))
    await capped.aclose()


def test_an_interrupt_in_a_wait_connection_s_handshake_leaves_no_unread_reply(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _servers import raise_once_here

    sem = rl.Semaphore(r, "hs")
    sem.try_set_permits(1)
    raise_once_here(monkeypatch, redis.connection.Connection, "read_response", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        sem.acquire(timeout=5)  # its first wait opens a connection: interrupted in its handshake
    for _ in range(3):
        assert sem.acquire(timeout=5) is True
        assert sem.available() == 0
        sem.release()
    assert sem.available() == 1


@pytest.mark.parametrize("kind", ["lock", "counted"])
def test_a_wait_told_not_granted_holds_nothing_though_its_check_reached_a_free_lock(
    server: Server, r: redis.Redis, kind: str
) -> None:
    """Over a slow link (200 ms each way) a timed wait's check (its acquire again without
    ``WAIT``, same request id) can reach the server after the wait timed out there and after
    the holder let go: the check is granted while the wait's own answer, "not granted", is
    still on its way and is the one the caller gets. Whatever the check got is given back."""
    proxy = SlowProxy(server.port, 0.2)
    try:
        slow = redis.Redis(port=proxy.port, socket_timeout=10)
        for i in range(3):
            name = f"slow-{kind}-{i}"
            holder: Any
            waiter: Any
            if kind == "lock":
                holder = rl.Lock(r, name)
                assert holder.acquire(timeout=0)
                waiter = rl.Lock(slow, name, response_timeout=0.5)
            else:
                holder = rl.Semaphore(r, name)
                assert holder.try_set_permits(1)
                assert holder.acquire(timeout=0)
                waiter = rl.Semaphore(slow, name, response_timeout=0.5)
            res: dict[str, Any] = {}

            def wait(w: Any = waiter, res: dict[str, Any] = res) -> None:
                res["ok"] = w.acquire(timeout=2.7)
                if res["ok"]:
                    w.release()
                res["done"] = True

            t = threading.Thread(target=wait)
            t.start()
            # the holder lets go right after the server timed the wait out (its answer still
            # on the slow link), before the wait's check reaches the server
            cmd = "RLOCK.INFO" if kind == "lock" else "RSEM.INFO"
            seen = False
            end = time.monotonic() + 6
            while time.monotonic() < end:
                waiters = int(str(info(r, name, cmd).get("waiters", 0) or 0))
                seen = seen or waiters > 0
                if seen and waiters == 0:
                    break
                time.sleep(0.002)
            holder.release()
            t.join(15)
            assert res.get("done"), "the waiter never returned"
            if kind == "lock":
                poll(
                    f"{name} free after the waiter was told {res['ok']}",
                    5,
                    lambda n=name: r.exists(n) == 0,
                )
            else:
                poll(
                    f"{name}'s permit back after the waiter was told {res['ok']}",
                    5,
                    lambda n=name: int(r.execute_command("RSEM.AVAILABLE", n)) == 1,
                )
    finally:
        proxy.close()
