"""Server-side waits and their connections (sync and asyncio): a wait whose connection died without
a word (a cut network) is noticed and served once the network heals, for every kind, nothing
lost; a wait whose connection is killed (``CLIENT KILL``) queues again and is served; waits keep
to the user's pool cap, in order, and at the server's ``maxclients`` the holders' releases still
go through and every waiter is served."""

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
from _servers import Server, apoll, blocked_clients, info, poll

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
    before = {c["id"] for c in monitor.client_list()}
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
    # the test's own connections only (one the server has not yet seen closed, such as the
    # set-up's ping, is not the subject): 2 waits, one for the package's other commands
    opened = [c for c in monitor.client_list() if c["id"] not in before]
    assert blocked_clients(monitor) == 2 and len(opened) <= 2 + 1, opened
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


def _check_granted_under_a_busy_answer(r: redis.Redis, proxy: Proxy, name: str) -> None:
    """Drives one interleaving, the same every run: a timed wait on ``name``
    (its holder's lock, through ``proxy``) is queued; every connection's bytes are held; the
    server times the wait out (its "not granted" held back) and the holder lets go; the wait's
    check (its acquire again without ``WAIT``, same request id) reaches the server and is
    granted, and its reply never comes (its connection closes); then the wait's own "not
    granted" arrives."""
    poll("the wait to be queued", 5, lambda: int(str(info(r, name).get("waiters", 0))) == 1)
    links = proxy.hold()
    wait_link = links.pop()  # the wait's connection: the newest
    poll("the server to time the wait out", 5, lambda: not info(r, name).get("waiters"))
    r.delete(name)  # the holder's lock ends
    checked: list[int] = []

    def sent() -> bool:
        checked[:] = [i for i in links if proxy.held_from_client(i)]
        return bool(checked)

    poll("the check to be sent", 5, sent, step=0.002)
    proxy.release_to_server(checked[0])
    poll("the check to be granted", 5, lambda: r.exists(name) == 1, step=0.002)
    proxy.release(wait_link)  # the wait's "not granted"
    for i in links:
        proxy.sever(i)  # the check's reply never comes


def test_a_wait_told_not_granted_after_its_unanswered_check_was_granted_holds_nothing(
    server: Server, r: redis.Redis, proxy: Proxy
) -> None:
    """A timed wait whose check was granted and got no reply, then answered "not granted"
    itself (see ``_check_granted_under_a_busy_answer``): the caller is told False, so the
    check's grant is given back, the lock free within a bound, not held for its lease."""
    via = redis.Redis(port=proxy.port, socket_timeout=10)
    assert rl.Lock(r, "held").acquire(timeout=0, lease=60)
    # response timeout 0.3 s: the wait's connection is polled every second, and the wait
    # (1.9 s; its call ends 2.2 s in) is checked at the poll 2 s in (its check is due 1.5 s in)
    waiter = rl.Lock(via, "held", response_timeout=0.3)
    res: dict[str, Any] = {}
    t = threading.Thread(target=lambda: res.update(ok=waiter.acquire(timeout=1.9, lease=60)))
    t.start()
    _check_granted_under_a_busy_answer(r, proxy, "held")
    t.join(10)
    assert res == {"ok": False}, "the wait was told not granted"
    poll("the check's grant to be given back", 5, lambda: r.exists("held") == 0)
    via.close()


async def test_an_async_wait_told_not_granted_after_its_unanswered_check_was_granted_holds_nothing(
    server: Server, r: redis.Redis, proxy: Proxy
) -> None:
    """As the sync test, with redis.asyncio: the wait's "not granted" is read while the check
    is in flight."""
    via = aredis.Redis(port=proxy.port, socket_timeout=10)
    assert rl.Lock(r, "held").acquire(timeout=0, lease=60)
    # response timeout 0.5 s: the wait (2.2 s; its call ends 2.7 s in) is checked 2.5 s in
    waiter = ra.Lock(via, "held", response_timeout=0.5)
    waiting = asyncio.ensure_future(waiter.acquire(timeout=2.2, lease=60))
    await asyncio.to_thread(_check_granted_under_a_busy_answer, r, proxy, "held")
    assert await asyncio.wait_for(waiting, 10) is False, "the wait was told not granted"
    await apoll("the check's grant to be given back", 5, lambda: r.exists("held") == 0)
    await via.aclose()


def _fill_the_line(
    capped: redis.Redis, monitor: redis.Redis, name: str, cap: int, queued: int = 0
) -> list[threading.Thread]:
    """``cap`` untimed waits for ``name`` blocked in the server (every connection the line
    allows) and ``queued`` more in line for a connection; they end once ``name`` is free."""

    def wait() -> None:
        lock = rl.Lock(capped, name)
        if lock.acquire():
            lock.release()

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(cap + queued)]
    for t in threads:
        t.start()
    poll("the line full of waits", 5, lambda: blocked_clients(monitor) == cap)
    be = rl._sync.backend_for(capped, 2.0)
    poll("the queued waits in line", 5, lambda: _in_line(be, monitor) == cap + queued)
    return threads


def _free_things(capped: redis.Redis, r: redis.Redis) -> list[tuple[str, Any]]:
    """(name, lock-like object) of every kind that waits, each free."""
    sem = rl.Semaphore(r, "free-sem")
    sem.try_set_permits(1)
    leased = rl.LeasedSemaphore(r, "free-leased")
    leased.try_set_permits(1)
    return [
        ("lock", rl.Lock(capped, "free-lock")),
        ("write", rl.RWLock(capped, "free-rw").write),
        ("read", rl.RWLock(capped, "free-rw2").read),
        ("counted", rl.Semaphore(capped, "free-sem")),
        ("leased", rl.LeasedSemaphore(capped, "free-leased")),
    ]


@pytest.mark.parametrize("cap", [1, 3])
def test_a_holder_takes_free_locks_at_once_while_the_line_is_full_of_waits_for_its_own(
    server: Server, r: redis.Redis, cap: int
) -> None:
    """The line of waits is full of untimed waits for a lock this thread holds: its own
    acquires of free locks and permits (which need no wait) are granted at once, as with
    redis-py's own lock on a capped pool; they are not queued behind waits only its release
    ends. A lock held briefly by another is taken soon after it is let go."""
    monitor = server.client()
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=cap)
    )
    holder = rl.Lock(capped, "held")
    assert holder.acquire(timeout=0)
    threads = _fill_the_line(capped, monitor, "held", cap, queued=2)
    try:
        for kind, obj in _free_things(capped, r):
            t0 = time.monotonic()
            got = obj.acquire(timeout=3)
            took = time.monotonic() - t0
            assert got, f"{kind}: a free one was not granted while the line was full"
            assert took < 1.5, f"{kind}: granted only after {took:.2f} s"
            (got if kind == "leased" else obj).release()
        other = rl.Lock(r, "briefly-held")
        assert other.acquire(timeout=0, lease=0.3)
        t0 = time.monotonic()
        assert rl.Lock(capped, "briefly-held").acquire(timeout=5, lease=1)
        assert time.monotonic() - t0 < 2.5  # its lease's end, then a try within a second
    finally:
        holder.release()
        for t in threads:
            t.join(10)
        capped.close()
    assert not any(t.is_alive() for t in threads), "the waits were not all served"
    assert r.exists("held") == 0


def test_an_owner_re_enters_through_a_second_handle_while_the_line_is_full(
    server: Server, r: redis.Redis
) -> None:
    """An owner holds a lock while the line is full of untimed waits for it (and more are
    queued for a connection): a second handle of the same owner re-enters at once."""
    monitor = server.client()
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=2)
    )
    owner = rl.Owner(capped)
    first = owner.lock("owned")
    assert first.acquire(timeout=0)
    threads = _fill_the_line(capped, monitor, "owned", 2, queued=2)
    try:
        second = owner.lock("owned")
        t0 = time.monotonic()
        assert second.acquire(timeout=3), "the owner's re-entry was not granted"
        assert time.monotonic() - t0 < 1.5
        second.release()
        assert r.exists("owned") == 1  # the first handle still holds it
    finally:
        first.release()
        for t in threads:
            t.join(10)
        capped.close()
    assert not any(t.is_alive() for t in threads), "the waits were not all served"


@pytest.mark.parametrize("cap", [1, 2])
def test_a_thread_takes_the_read_side_under_its_write_while_the_line_is_full_of_waits_for_it(
    server: Server, cap: int
) -> None:
    """A plain read-write lock's write held by this thread while the line is full of untimed
    writer waits for it, and a reader queued behind them for a connection: the thread's read
    under its write (a re-entry the server grants whoever waits) is granted at once, not held
    back behind the queued reader, which only the thread's own release lets go."""
    monitor = server.client()
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=cap)
    )
    rw = rl.RWLock(capped, "rw-held")
    assert rw.write.acquire(blocking=False)

    def wait(side: str) -> None:
        other = getattr(rl.RWLock(capped, "rw-held"), side)
        if other.acquire():
            other.release()

    threads = [threading.Thread(target=wait, args=("write",), daemon=True) for _ in range(cap)]
    threads.append(threading.Thread(target=wait, args=("read",), daemon=True))
    be = rl._sync.backend_for(capped, 2.0)
    try:
        for t in threads[:cap]:
            t.start()
        poll("the line full of waits", 5, lambda: blocked_clients(monitor) == cap)
        threads[cap].start()
        poll("a reader in line", 5, lambda: _in_line(be, monitor) == cap + 1)
        t0 = time.monotonic()
        got = rw.read.acquire(timeout=3)
        took = time.monotonic() - t0
        assert got, "the thread's read under its write was not granted"
        assert took < 1.5, f"granted only after {took:.2f} s"
        rw.read.release()
    finally:
        rw.write.release()
        for t in threads:
            t.join(10)
        capped.close()
        monitor.close()
    assert not any(t.is_alive() for t in threads), "the waits were not all served"


async def test_a_task_takes_the_read_side_under_its_write_while_the_line_is_full_of_waits_for_it(
    server: Server, r: redis.Redis
) -> None:
    """asyncio: as the sync test above (the task's write; one writer wait in the server, a
    reader queued for the only connection)."""
    monitor = server.client()
    capped = aredis.Redis(
        connection_pool=aredis.BlockingConnectionPool(port=server.port, max_connections=1)
    )
    rw = ra.RWLock(capped, "a-rw-held")
    assert await rw.write.acquire(blocking=False)

    async def wait(side: str) -> None:
        other = getattr(ra.RWLock(capped, "a-rw-held"), side)
        if await other.acquire():
            await other.release()

    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(wait("write"))]
    try:
        end = loop.time() + 5
        while blocked_clients(monitor) < 1:
            assert loop.time() < end, "no waiter blocked"
            await asyncio.sleep(0.01)
        tasks.append(asyncio.ensure_future(wait("read")))
        gate = ra._engine.backend_for(capped, 2.0)._waits[""][1]
        while len(gate._queue) < 1:  # the reader queued for the connection
            assert loop.time() < end, "no reader in line"
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        got = await rw.read.acquire(timeout=3)
        took = time.monotonic() - t0
        assert got, "the task's read under its write was not granted"
        assert took < 1.5, f"granted only after {took:.2f} s"
        await rw.read.release()
    finally:
        await rw.write.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        await capped.aclose()
        monitor.close()
    assert r.exists("a-rw-held") == 0


def test_compat_locks_on_a_pool_of_one_take_a_free_lock_while_the_wait_holds_the_connection(
    server: Server, r: redis.Redis
) -> None:
    """The drop-in on ``BlockingConnectionPool(max_connections=1)``: one thread waits (no
    timeout) for the lock this thread holds, so its wait holds the one connection waits may
    use; this thread's blocking acquire of a free lock is granted at once (redis-py's own
    lock does the same)."""
    from redis_rlock.compat import RLockCompat

    monitor = server.client()
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=1)
    )
    held = capped.lock("c-held", lock_class=RLockCompat)
    assert held.acquire(blocking=True, blocking_timeout=5)
    got: list[bool] = []

    def wait() -> None:
        lock = capped.lock("c-held", lock_class=RLockCompat)
        got.append(bool(lock.acquire(blocking=True, blocking_timeout=None)))
        lock.release()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    poll("the compat wait blocked", 5, lambda: blocked_clients(monitor) == 1)
    try:
        free = capped.lock("c-free", lock_class=RLockCompat)
        t0 = time.monotonic()
        assert free.acquire(blocking=True, blocking_timeout=3), "the free lock was not granted"
        assert time.monotonic() - t0 < 1.5
        free.release()
    finally:
        held.release()
        t.join(10)
        capped.close()
    assert got == [True]


async def test_async_holder_takes_a_free_lock_and_re_enters_while_the_line_is_full(
    server: Server, r: redis.Redis
) -> None:
    """asyncio: the line full of untimed waits for a lock the task holds (one more queued for
    a connection): free locks and permits, and the owner's re-entry through a second handle,
    are granted at once."""
    monitor = server.client()
    capped = aredis.Redis(
        connection_pool=aredis.BlockingConnectionPool(port=server.port, max_connections=2)
    )
    owner = ra.Owner(capped)
    holder = owner.lock("a-held")
    assert await holder.acquire(timeout=0)

    async def wait() -> None:
        lock = ra.Lock(capped, "a-held")
        if await lock.acquire():
            await lock.release()

    tasks = [asyncio.ensure_future(wait()) for _ in range(3)]
    end = asyncio.get_running_loop().time() + 5
    while blocked_clients(monitor) < 2:
        assert asyncio.get_running_loop().time() < end, "no waiter blocked"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    sem = rl.Semaphore(r, "a-free-sem")
    sem.try_set_permits(1)
    try:
        things: list[tuple[str, Any]] = [
            ("lock", ra.Lock(capped, "a-free")),
            ("write", ra.RWLock(capped, "a-free-rw").write),
            ("counted", ra.Semaphore(capped, "a-free-sem")),
            ("re-entry", owner.lock("a-held")),
        ]
        for kind, obj in things:
            t0 = time.monotonic()
            got = await obj.acquire(timeout=3)
            took = time.monotonic() - t0
            assert got, f"{kind}: not granted while the line was full"
            assert took < 1.5, f"{kind}: granted only after {took:.2f} s"
            await obj.release()
        assert r.exists("a-held") == 1
    finally:
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await capped.aclose()


def test_waits_queued_behind_a_full_line_take_their_freed_lock_in_arrival_order(
    server: Server, r: redis.Redis
) -> None:
    """A pool of one connection, held by a wait for a lock nobody lets go during the test: waits
    for another lock queue behind it for a connection. When that lock is let go they take it by
    their tries, one after another in arrival order: no later one passes an earlier one."""
    monitor = server.client()
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=1)
    )
    blocker = rl.Lock(r, "blocker")
    assert blocker.acquire(timeout=0)
    threads = _fill_the_line(capped, monitor, "blocker", 1)
    holder = rl.Lock(r, "k")
    assert holder.acquire(timeout=0)
    be = rl._sync.backend_for(capped, 2.0)
    order: list[int] = []

    def wait(i: int) -> None:
        lock = rl.Lock(capped, "k")
        if lock.acquire(timeout=8):
            order.append(i)
            time.sleep(0.05)  # held a moment: a later wait's try would find it free if it ran
            lock.release()

    waits = []
    try:
        for i in range(5):
            waits.append(threading.Thread(target=wait, args=(i,), daemon=True))
            waits[-1].start()
            poll("the wait in line", 5, lambda i=i: _in_line(be, monitor) == i + 2)  # type: ignore[misc]
        holder.release()
        for t in waits:
            t.join(12)
        assert order == list(range(5))
    finally:
        blocker.release()
        for t in threads:
            t.join(10)
        capped.close()


def test_the_servers_request_replies_are_recognised_as_redis_py_reads_them(
    server: Server,
) -> None:
    """The module's ``ERR request <id> is already waiting`` (a wait sent again before the
    server saw its old connection go: retried) and ``ERR request <id> was cancelled`` (a grant
    rolled back when its connection went before the reply was read: asked again under a new
    id) are recognised as redis-py raises them: it strips the ``ERR `` of an error reply."""
    from redis_rlock import _proto as P
    from redis_rlock._conn import is_transient

    r = server.client()
    r.execute_command("RLOCK.ACQUIRE", "w:req", "o:holder", 30000)
    waiter = server.client()
    conn = waiter.connection_pool.get_connection()
    conn.send_command("RLOCK.ACQUIRE", "w:req", "o:w", 30000, "WAIT", 5000, "REQUEST", "rq1")
    poll("the wait queued", 3.0, lambda: blocked_clients(r) >= 1)
    with pytest.raises(redis.ResponseError) as waiting:
        r.execute_command("RLOCK.ACQUIRE", "w:req", "o:w", 30000, "REQUEST", "rq1")
    assert P.is_waiting_reply(waiting.value) and is_transient(waiting.value), waiting.value
    assert not P.is_cancelled_reply(waiting.value)
    assert r.execute_command("RLOCK.CANCEL", "w:req", "rq1") is not None
    with pytest.raises(redis.ResponseError) as cancelled:
        r.execute_command("RLOCK.ACQUIRE", "w:req", "o:w", 30000, "REQUEST", "rq1")
    assert P.is_cancelled_reply(cancelled.value), cancelled.value
    assert not P.is_waiting_reply(cancelled.value) and not is_transient(cancelled.value)
    conn.disconnect()


def _recording_ids(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The request ids the package makes from now on, in order (to cancel one from outside)."""
    from redis_rlock import _proto as P

    made: list[bytes] = []
    real = P.new_id

    def recording() -> bytes:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(P, "new_id", recording)
    return made


# A wait whose connection went silent (a cut link) while the server, seeing that connection go,
# rolled its request back (its record: cancelled; here: ``RLOCK.CANCEL`` from outside, the
# same state): its check from another connection is answered ``was cancelled``. The wait is
# not waiting any more: it asks again as a new request (as when the wait itself is told so),
# instead of reading the silent connection for ever.


def test_an_untimed_wait_whose_request_was_cancelled_under_a_silent_connection_asks_again(
    server: Server, r: redis.Redis, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    via = redis.Redis(port=proxy.port, socket_timeout=10)
    holder = rl.Lock(r, "cw")
    assert holder.acquire()
    waiter = rl.Lock(via, "cw", response_timeout=RT)
    made = _recording_ids(monkeypatch)
    got: list[bool] = []
    done = threading.Event()

    def wait() -> None:
        got.append(waiter.acquire())
        done.wait(SERVED)
        waiter.release()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    poll("the waiter to block", 5, lambda: blocked_clients(r) == 1)
    proxy.cut()
    proxy.heal()  # the wait's connection stays silent; new ones (its checks) go through
    assert r.execute_command("RLOCK.CANCEL", "cw", made[0]) == 1  # it waited: dequeued
    holder.release()
    poll("the wait asked again and was served", SERVED, lambda: bool(got))
    assert got == [True] and rl.Lock(r, "cw").locked()
    done.set()
    t.join(SERVED)
    poll("released", SERVED, lambda: not rl.Lock(r, "cw").locked())
    via.close()


async def test_an_async_untimed_wait_whose_request_was_cancelled_under_a_silent_link_asks_again(
    server: Server, r: redis.Redis, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    via = aredis.Redis(port=proxy.port, socket_timeout=10)
    holder = rl.Lock(r, "acw")
    assert holder.acquire()
    waiter = ra.Lock(via, "acw", response_timeout=RT)
    made = _recording_ids(monkeypatch)
    got: list[bool] = []
    done = asyncio.Event()

    async def wait() -> None:
        got.append(await waiter.acquire())
        await done.wait()
        await waiter.release()

    task = asyncio.ensure_future(wait())
    end = asyncio.get_running_loop().time() + 5
    while blocked_clients(r) < 1:
        assert asyncio.get_running_loop().time() < end, "the waiter did not block"
        await asyncio.sleep(0.01)
    proxy.cut()
    proxy.heal()
    assert r.execute_command("RLOCK.CANCEL", "acw", made[0]) == 1
    holder.release()
    end = asyncio.get_running_loop().time() + SERVED
    while not got:
        assert asyncio.get_running_loop().time() < end, "the wait was not served"
        await asyncio.sleep(0.02)
    assert got == [True] and rl.Lock(r, "acw").locked()
    done.set()
    await asyncio.wait_for(task, SERVED)
    assert not rl.Lock(r, "acw").locked()
    await via.aclose()


def test_a_session_wait_whose_request_was_cancelled_under_a_silent_connection_closes_it(
    server: Server, r: redis.Redis, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answer to a session's wait check: its connection is gone on the server (the
    request rolled back with it), so the session closes, holding nothing."""
    via = redis.Redis(port=proxy.port, socket_timeout=10)
    holder = rl.Lock(r, "scw")
    assert holder.acquire()
    session = rl.Session(via, response_timeout=RT, keepalive=30)
    made = _recording_ids(monkeypatch)
    out: list[Any] = []

    def wait() -> None:
        try:
            out.append(session.lock("scw").acquire())
        except BaseException as e:  # recorded: the test says what ended the wait
            out.append(e)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    poll("the waiter to block", 5, lambda: blocked_clients(r) == 1)
    proxy.cut()
    proxy.heal()
    assert r.execute_command("RLOCK.CANCEL", "scw", made[0]) == 1
    t.join(SERVED)
    assert len(out) == 1 and isinstance(out[0], rl.SessionClosed), out
    assert session.closed.is_set()
    holder.release()
    assert not rl.Lock(r, "scw").locked()
    via.close()


# -- CLIENT KILL of a waiting connection -------------------------------------------------------


def test_client_kill_of_the_waiting_connection_keeps_the_wait_going(r: redis.Redis) -> None:
    holder = rl.Lock(r, "kill")
    holder.acquire()
    lock = rl.Lock(r, "kill")
    res: list[bool] = []
    t = threading.Thread(target=lambda: res.append(lock.acquire(timeout=10)))
    t.start()
    poll("queued", 5, lambda: info(r, "kill")["waiters"] == 1)
    blocked = [c for c in r.client_list() if c["cmd"] == "rlock.acquire"]
    assert len(blocked) == 1
    r.client_kill_filter(_id=blocked[0]["id"])
    poll("queued again", 5, lambda: info(r, "kill")["waiters"] == 1)
    holder.release()
    t.join(10)
    assert res == [True]
    assert info(r, "kill")["waiters"] == 0
