"""Sessions (issue 27 §1) when the server side changes under them: a Sentinel failover (the
master killed; ``SENTINEL FAILOVER``, the old master demoted later; asyncio in
``test_session_ha_aio.py``), a cluster node stopped (sync and asyncio), and a process that exits
normally with a session lock held (sync and asyncio).

The promises: a session is one connection to one master; when it goes, every hold taken
through it is lost at once, the session is closed and refuses acquires (``SessionClosed``), it
never reconnects (to the new master or anywhere else); the binding lived only in the old
master's memory, so the promoted replica holds an ordinary hold that ends with its lease; a
new session on the same client binds to the master the Sentinels name now."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aredis
import redis.asyncio.cluster as acluster
from _ha import (
    LIMIT,
    PROMPT,
    QUICK,
    Group,
    holds,
    is_master,
    key_on,
    owner,
    replica_of,
    replicated,
)
from _servers import ROOT, Server, cluster_of, poll
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import MovedError
from redis.sentinel import Sentinel

import redis_rlock as rl
import redis_rlock.aio as ra


@pytest.fixture
def cluster(request: Any) -> Iterator[list[Server]]:
    """Three masters with a replica each (node timeout 2 s)."""
    yield from cluster_of(request, 1)


def _refused_for_good(attempts: list[Callable[[], Any]]) -> None:
    for attempt in attempts:
        with pytest.raises(rl.SessionClosed):
            attempt()


def _sync_closed_for_good(s: rl.Session, new: redis.Redis) -> None:
    assert s.closed.is_set()
    _refused_for_good(
        [
            lambda: s.lock("a", lease=60).acquire(blocking=False),
            lambda: s.lock("fresh", lease=60).acquire(timeout=1),
            lambda: s.rw_lock("rw", lease=60).read.acquire(blocking=False),
            lambda: s.leased_semaphore("s", lease=60).acquire(1, blocking=False),
        ]
    )
    assert new.exists("fresh") == 0, "never reconnected"
    assert holds(new) == 0, "the bindings stayed in the old master's memory"


def _granted_at_the_lease_end(new: redis.Redis, key: str, acquire: Callable[[], bool]) -> None:
    ends = time.monotonic() + new.pttl(key) / 1000
    assert acquire(), "granted once the old hold's lease ended"
    at = time.monotonic()
    assert at + 0.05 >= ends, f"granted {ends - at:.3f} s early"
    assert at <= ends + PROMPT, f"granted {at - ends:.3f} s after the old lease ended"


def _sync_takes_over(client: redis.Redis, new: redis.Redis, key: str) -> None:
    """A new session on ``client`` binds to the new master: it takes ``key`` when the old
    (replicated, unbound) hold's lease ends there, as a session hold that ends with it."""
    with rl.Session(client) as again:
        lk = again.lock(key, lease=60)
        _granted_at_the_lease_end(new, key, lambda: lk.acquire(timeout=LIMIT))
        hold = lk.hold
        assert new.hgetall(key) == {hold.owner: b"1"}
        assert holds(new) == 1, "a session hold of the new master"
    assert hold.lost.is_set()
    poll("the new session's hold to end", LIMIT, lambda: not new.exists(key) and not holds(new))


def test_sync_session_when_the_sentinel_master_is_killed(quick_group: Group) -> None:
    g = quick_group
    master = Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for("mymaster")
    rl.LeasedSemaphore(master, "s").try_set_permits(1)
    s = rl.Session(master)
    lk, rw = s.lock("a", lease=8), s.rw_lock("rw")  # the write side watchdog-renewed
    assert lk.acquire() and rw.write.acquire()
    permit = s.leased_semaphore("s", lease=8).acquire(1)
    assert permit is not None
    all_holds = [lk.hold, rw.write.hold, permit]
    assert holds(g.master.client()) == 3
    replicated(g.master, g.replica)
    killed = time.monotonic()
    g.master.kill()
    assert s.closed.wait(PROMPT), "the session sees its master die at once"
    for h in all_holds:
        assert h.lost.wait(PROMPT), h
    assert time.monotonic() - killed < PROMPT
    g.wait_promoted()
    new = g.replica.client()
    assert new.hgetall("a") == {all_holds[0].owner: b"1"}, "an ordinary hold there"
    _sync_closed_for_good(s, new)
    _sync_takes_over(master, new, "a")


def test_sync_session_across_a_manual_sentinel_failover(manual_group: Group) -> None:
    g = manual_group
    master = Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for("mymaster")
    s = rl.Session(master)
    lk, w = s.lock("a", lease=6), s.lock("w")
    assert lk.acquire() and w.acquire()
    all_holds = [lk.hold, w.hold]
    replicated(g.master, g.replica)
    g.failover()
    # A new session binds to the new master even while the old one still runs (and calls
    # itself a master until the Sentinel demotes it).
    new = g.replica.client()
    _sync_takes_over(master, new, "a")
    poll("the old master to be demoted", LIMIT, lambda: not is_master(g.master))
    demoted = time.monotonic()
    assert s.closed.wait(PROMPT), "closed when the Sentinel demotes its master"
    for h in all_holds:
        assert h.lost.wait(PROMPT), h
    assert time.monotonic() - demoted < PROMPT
    _sync_closed_for_good(s, new)
    assert holds(g.master.client()) == 0, "a replica binds nothing"


def test_sync_session_acquire_on_the_replaced_master_closes_the_session(
    manual_group: Group,
) -> None:
    """After a failover, before the Sentinel demotes the old master, that master refuses
    grants (``NOREPLICAS``): a session bound to it never grants again, so its acquire closes
    it at once (``SessionClosed``, every hold lost) instead of waiting on it until the
    demotion."""
    g = manual_group
    master = Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for("mymaster")
    s = rl.Session(master)
    lk = s.lock("a", lease=6)
    assert lk.acquire()
    held = lk.hold
    replicated(g.master, g.replica)
    g.failover()
    assert is_master(g.master), "the old master is not demoted yet"
    started = time.monotonic()
    with pytest.raises(rl.SessionClosed):
        s.lock("late", lease=60).acquire(timeout=LIMIT)
    assert time.monotonic() - started < PROMPT
    assert held is not None and held.lost.wait(PROMPT)
    assert s.closed.is_set()
    assert g.master.client().exists("late") == 0


def test_sync_session_on_a_master_turned_replica_closes_at_once_and_cancels_nothing(
    server: Server,
) -> None:
    """A session's server made a replica (``REPLICAOF``, no Sentinel): the acquire's
    ``READONLY`` closes the session at once; nothing ran, so no cancel is sent to the replica
    (which would refuse it for two response timeouts)."""
    s = rl.Session(redis.Redis(port=server.port), response_timeout=2.0)
    lk = s.lock("a", lease=60)
    assert lk.acquire()
    held = lk.hold
    other = Server()
    try:
        server.client().execute_command("REPLICAOF", "127.0.0.1", other.port)
        started = time.monotonic()
        with pytest.raises(rl.SessionClosed):
            s.lock("b", lease=60).acquire(timeout=0.5)
        assert time.monotonic() - started < 1.0
        assert held is not None and held.lost.wait(PROMPT)
    finally:
        other.close()


def test_sync_session_acquire_with_the_sentinel_stopped_ends_by_its_deadline(
    manual_group: Group,
) -> None:
    """A master refusing grants while the Sentinel does not answer (stopped): the session asks
    it for a bounded time, so a timed acquire ends by its deadline plus the response timeout,
    and the session, whose master is still the one named last, stays open."""
    g = manual_group
    master = Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for("mymaster")
    s = rl.Session(master, response_timeout=1.0)
    g.master.client().config_set("rlock.min-replicas", "2")
    g.sentinel.pause()
    try:
        started = time.monotonic()
        with pytest.raises(rl.NoReplicas):
            s.lock("a", lease=60).acquire(timeout=1.0)
        took = time.monotonic() - started
        assert took < 1.0 + 1.0 + 0.5, took
        assert not s.closed.is_set()
    finally:
        g.sentinel.resume()
        s.close()


# -- a process that exits normally with a session lock held ---------------------------------

SYNC_CHILD = """
import sys, redis, redis_rlock
session = redis_rlock.Session(redis.Redis(port=int(sys.argv[1])))
lock = session.lock(sys.argv[2])  # watchdog-renewed
assert lock.acquire()
print("HELD", flush=True)
sys.stdin.readline()
# the interpreter exits here, the session, the lock and its hold still alive
"""

ASYNC_CHILD = """
import asyncio, sys, redis.asyncio as aredis, redis_rlock.aio as ra
async def main():
    session = ra.Session(aredis.Redis(port=int(sys.argv[1])))
    lock = session.lock(sys.argv[2])
    assert await lock.acquire()
    print("HELD", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    return session, lock  # asyncio.run ends with both alive
kept = asyncio.run(main())
"""


@pytest.mark.parametrize("child", [SYNC_CHILD, ASYNC_CHILD], ids=["sync", "asyncio"])
def test_a_process_that_exits_with_a_session_lock_held_frees_it_at_once(
    server: Server, r: redis.Redis, child: str
) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python" / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(server.port), "exit"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "HELD"
        assert holds(r) == 1
        got: list[Any] = []
        waiter = rl.Lock(r, "exit", lease=60)

        def wait() -> None:
            got.append((waiter.acquire(timeout=10), time.monotonic()))
            waiter.release()

        t = threading.Thread(target=wait)
        t.start()
        poll("the waiter to block", 5, lambda: int(r.info("clients")["blocked_clients"]) == 1)
        ended = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        t.join(10)
        ok, at = got[0]
        assert ok and at - ended < PROMPT, at - ended
        assert proc.wait(PROMPT) == 0, proc.stderr.read()
        assert time.monotonic() - ended < PROMPT, "the interpreter exited at once"
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
        assert holds(r) == 0
    finally:
        proc.kill()
        proc.wait()


async def test_sessions_in_a_cluster_are_per_node_and_a_stopped_node_loses_only_its_own(
    cluster: list[Server],
) -> None:
    nodes = cluster
    masters = [n for n in nodes if n.client().info("replication")["role"] == "master"]
    a, b = masters[0], masters[1]
    replica = replica_of(nodes, a)
    k0, ak0 = key_on(b, a.port, "k"), key_on(b, a.port, "ak")
    k1, ak1 = key_on(b, b.port, "k"), key_on(b, b.port, "ak")
    rc = RedisCluster(host="127.0.0.1", port=b.port)
    arc = acluster.RedisCluster(host="127.0.0.1", port=b.port)
    # A cluster client has no one server to bind to: refused, sync and asyncio.
    for make in (lambda: rl.Session(rc), lambda: ra.Session(arc)):
        with pytest.raises(TypeError):
            make()
    # A client of one node: sessions there, for the locks it serves.
    s0, s1 = rl.Session(redis.Redis(port=a.port)), rl.Session(redis.Redis(port=b.port))
    as0 = await ra.Session(aredis.Redis(port=a.port)).open()
    as1 = await ra.Session(aredis.Redis(port=b.port)).open()
    l0, l1 = s0.lock(k0, lease=60), s1.lock(k1, lease=60)
    al0, al1 = as0.lock(ak0, lease=60), as1.lock(ak1, lease=60)
    assert l0.acquire() and l1.acquire() and await al0.acquire() and await al1.acquire()
    on_a = [l0.hold, al0.hold]
    on_b = [l1.hold, al1.hold]
    # Per node: a lock another node serves is refused (MOVED: retried, then cancelled, within
    # the lock's response timeout, short here), nothing bound.
    with pytest.raises(MovedError):
        s0.lock(k1, lease=60, response_timeout=QUICK).acquire(blocking=False)
    with pytest.raises(MovedError):
        await as0.lock(k1, lease=60, response_timeout=QUICK).acquire(blocking=False)
    assert not s0.closed.is_set() and not as0.closed.is_set(), "a refusal closes nothing"
    assert holds(a.client()) == 2 and holds(b.client()) == 2
    replicated(a, replica)

    killed = time.monotonic()
    a.kill()
    assert s0.closed.wait(PROMPT) and await as0.closed.wait(PROMPT)
    assert on_a[0].lost.wait(PROMPT) and await on_a[1].lost.wait(PROMPT)
    assert time.monotonic() - killed < PROMPT
    for make in (lambda: rl.Session(rc), lambda: ra.Session(arc)):
        with pytest.raises(TypeError):
            make()
    assert not s1.closed.is_set() and not as1.closed.is_set(), "node b's sessions are untouched"
    assert not on_b[0].lost.is_set() and not on_b[1].lost.is_set()
    other = s1.lock(f"{{{k1}}}:other", lease=60)
    assert other.acquire(blocking=False), "node b's session still takes locks"
    other.release()
    slot = key_slot(k0.encode())
    await asyncio.to_thread(
        poll,
        "a's replica to be promoted",
        LIMIT,
        lambda: owner(b, slot) == replica.port and is_master(replica),
    )
    promoted = replica.client()
    assert promoted.hgetall(k0) == {on_a[0].owner: b"1"}, "an ordinary hold there"
    assert promoted.hgetall(ak0) == {on_a[1].owner: b"1"}
    with pytest.raises(rl.SessionClosed):
        s0.lock(k0, lease=60).acquire(blocking=False)
    with pytest.raises(rl.SessionClosed):
        await as0.lock(ak0, lease=60).acquire(blocking=False)
    with pytest.raises(redis.ConnectionError):
        rl.Session(redis.Redis(port=a.port))
    with pytest.raises(redis.ConnectionError):
        await ra.Session(aredis.Redis(port=a.port)).open()
    assert holds(promoted) == 0, "nothing bound on the promoted replica"

    # Node a back, as a replica of the promoted one: sessions open there, bind nothing.
    a.restart_same_port()
    await asyncio.to_thread(
        poll,
        "a to rejoin as a replica",
        LIMIT,
        lambda: (
            a.client().info("replication")["role"] == "slave" and owner(a, slot) == replica.port
        ),
    )
    with rl.Session(redis.Redis(port=a.port)) as back, pytest.raises(MovedError):
        back.lock(k0, lease=60, response_timeout=QUICK).acquire(blocking=False)
    async with ra.Session(aredis.Redis(port=a.port)) as aback:
        with pytest.raises(MovedError):
            await aback.lock(ak0, lease=60, response_timeout=QUICK).acquire(blocking=False)
    assert holds(a.client()) == 0 and holds(promoted) == 0, "a replica binds nothing"
    assert promoted.hgetall(k0) == {on_a[0].owner: b"1"}, "the old hold ends with its lease"
    assert holds(b.client()) == 2
    s1.close()
    await as1.close()
    assert on_b[0].lost.is_set() and on_b[1].lost.is_set()
    rc.close()
    await arc.aclose()
