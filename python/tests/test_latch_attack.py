"""Hostile tests of ``CountDownLatch`` (sync and asyncio): a look without waiting
(``timeout=0``) through a stalled or unreachable server, timeouts at the edges, ACL refusals,
RESP3, binary and braced names, connections left behind by many cancelled waits, and the same
answers as the Rust client for the same calls."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis
import redis.asyncio.cluster as acluster
from _servers import PROMPT, Server, apoll, blocked_clients, poll
from redis.cluster import RedisCluster
from test_cluster import cluster  # noqa: F401  (the 3-master cluster fixture)

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.5  # the package's response timeout where a stall is the subject
SLACK = 0.5  # scheduling slack on a loaded machine


@pytest.fixture
def admin(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    try:
        c.execute_command("CLIENT", "UNPAUSE")
    except redis.ConnectionError:
        pass  # the test killed the server
    c.close()


# -- timeout=0: one look, False when the server does not answer (as a timed wait) --------------


def test_a_look_through_client_pause_all_is_false_in_time(
    r: redis.Redis, admin: redis.Redis
) -> None:
    latch = rl.CountDownLatch(r, "look", response_timeout=RT)
    latch.try_set_count(1)
    assert latch.wait(0) is False
    admin.execute_command("CLIENT", "PAUSE", 20000, "ALL")
    t0 = time.monotonic()
    assert latch.wait(0) is False  # not a TimeoutError: a stall is no error for a wait
    assert time.monotonic() - t0 < RT + SLACK
    admin.execute_command("CLIENT", "UNPAUSE")


def test_a_look_at_a_stopped_or_dead_server_is_false_in_time(server: Server) -> None:
    r = server.client()
    latch = rl.CountDownLatch(r, "look", response_timeout=RT)
    latch.try_set_count(1)
    server.pause()
    try:
        t0 = time.monotonic()
        assert latch.wait(0) is False
        assert time.monotonic() - t0 < RT + SLACK
    finally:
        server.resume()
    server.kill()
    t0 = time.monotonic()
    assert latch.wait(0) is False  # connection refused: no answer, as Rust's Ok(false)
    assert latch.wait(0.2) is False
    assert time.monotonic() - t0 < 0.2 + 2 * RT + SLACK


async def test_async_a_look_through_client_pause_all_or_a_dead_server_is_false_in_time(
    server: Server, admin: redis.Redis
) -> None:
    ar = aredis.Redis(port=server.port)
    latch = ra.CountDownLatch(ar, "look", response_timeout=RT)
    await latch.try_set_count(1)
    admin.execute_command("CLIENT", "PAUSE", 20000, "ALL")
    t0 = time.monotonic()
    assert await latch.wait(0) is False
    assert time.monotonic() - t0 < RT + SLACK
    admin.execute_command("CLIENT", "UNPAUSE")
    server.kill()
    t0 = time.monotonic()
    assert await latch.wait(0) is False
    assert time.monotonic() - t0 < RT + SLACK
    await ar.aclose()


# -- timeouts at the edges -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan"), float("-inf")])
def test_bad_timeouts_are_refused_before_sending(r: redis.Redis, bad: float) -> None:
    latch = rl.CountDownLatch(r, "edge")
    with pytest.raises(ValueError):
        latch.wait(bad)


def test_tiny_and_infinite_timeouts(r: redis.Redis) -> None:
    latch = rl.CountDownLatch(r, "edge")
    latch.try_set_count(1)
    for t in (0, 0.0, 1e-9, 0.001, 5e-324):
        t0 = time.monotonic()
        assert latch.wait(t) is False
        assert time.monotonic() - t0 < 1.0
    assert blocked_clients(r) == 0
    latch.delete()
    assert latch.wait(math.inf) is True
    assert latch.wait(None) is True


# -- ACL --------------------------------------------------------------------------------------


def test_an_acl_user_without_the_key_is_refused_at_once(server: Server, r: redis.Redis) -> None:
    r.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~allowed:*", "+@all")
    r.execute_command("RLATCH.SETCOUNT", "denied", 1)
    lim = redis.Redis(port=server.port, username="limited", password="pw")
    latch = rl.CountDownLatch(lim, "denied")
    for t in (None, 10, 0):
        t0 = time.monotonic()
        with pytest.raises(rl.LockPermissionError):
            latch.wait(t)
        assert time.monotonic() - t0 < 2
    assert blocked_clients(r) == 0


# -- RESP3, names ------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("name", [b"{a}b", b"}{", b"\x00\xff{\r\n}", b"x\x00y"])
def test_resp3_and_binary_braced_names(server: Server, protocol: int, name: bytes) -> None:
    c = redis.Redis(port=server.port, protocol=protocol)
    latch = rl.CountDownLatch(c, name)
    assert latch.try_set_count(2) is True
    assert latch.get_count() == 2
    assert latch.wait(0.05) is False
    assert latch.count_down(2) == 0
    assert latch.wait(1) is True
    assert latch.delete() is False


# -- leaks --------------------------------------------------------------------------------------


async def test_async_many_cancelled_waits_leave_no_connection_behind(
    r: redis.Redis, server: Server
) -> None:
    ar = aredis.Redis(port=server.port)
    latch = ra.CountDownLatch(ar, "drops")
    await latch.try_set_count(1)
    before = int(r.info("clients")["connected_clients"])
    for i in range(200):
        task = asyncio.ensure_future(latch.wait(None if i % 2 else 30))
        await asyncio.sleep((i * 37 % 3000) / 1e6)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    await apoll(
        "the cancelled waits' connections to close",
        PROMPT,
        lambda: int(r.info("clients")["connected_clients"]) <= before + 1,
    )
    poll("no awaiter", PROMPT, lambda: blocked_clients(r) == 0)
    await ar.aclose()


# -- a slot migration (cluster) ----------------------------------------------------------------


def _node_id(node: Server) -> str:
    return str(node.client().execute_command("CLUSTER", "MYID").decode())


def test_sync_a_latch_follows_its_slot_to_another_node(cluster: list[Server]) -> None:  # noqa: F811
    """A slot moved by hand (``MIGRATING``/``IMPORTING``, ``MIGRATE``, ``SETSLOT NODE``): the
    latch's commands and a blocked wait go on where it is served now, without raising
    ``MOVED``/``ASK`` at the caller (redis-py's cluster client and the Rust client both
    follow a redirection)."""
    name = "{mig}:gate"
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    latch = rl.CountDownLatch(rc, name)
    assert latch.try_set_count(3)
    slot = int(rc.keyslot(name))
    src = cluster[[s.port for s in cluster].index(rc.get_node_from_key(name).port)]
    dst = next(s for s in cluster if s is not src)
    res: list[bool] = []
    t = threading.Thread(target=lambda: res.append(rl.CountDownLatch(rc, name).wait(30)))
    t.start()
    poll("the awaiter blocked", PROMPT, lambda: blocked_clients(src.client()) == 1)
    sc, dc = src.client(), dst.client()
    dc.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(src))
    sc.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(dst))
    sc.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", name)
    # mid-migration: the key is on the target, the slot still the source's (ASK)
    assert latch.get_count() == 3
    assert latch.count_down() == 2
    for node in cluster:
        node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(dst))
    # after it: the slot is the target's (MOVED, until the client's map is refreshed)
    assert latch.count_down() == 1
    assert latch.get_count() == 1
    assert res == []
    assert latch.count_down() == 0
    t.join(PROMPT)
    assert res == [True]
    rc.close()


async def test_async_a_latch_follows_its_slot_to_another_node(
    cluster: list[Server],  # noqa: F811
) -> None:
    name = "{amig}:gate"
    rc = acluster.RedisCluster(host="127.0.0.1", port=cluster[0].port)
    await rc.initialize()
    latch = ra.CountDownLatch(rc, name)
    assert await latch.try_set_count(3)
    slot = int(rc.keyslot(name))
    src = cluster[[s.port for s in cluster].index(rc.get_node_from_key(name).port)]
    dst = next(s for s in cluster if s is not src)
    task = asyncio.create_task(ra.CountDownLatch(rc, name).wait(30))
    await apoll("the awaiter blocked", PROMPT, lambda: blocked_clients(src.client()) == 1)
    sc, dc = src.client(), dst.client()
    dc.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(src))
    sc.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(dst))
    sc.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", name)
    assert await latch.get_count() == 3
    assert await latch.count_down() == 2
    for node in cluster:
        node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(dst))
    assert await latch.count_down() == 1
    assert await latch.get_count() == 1
    assert not task.done()
    assert await latch.count_down() == 0
    assert await asyncio.wait_for(task, PROMPT) is True
    await rc.aclose()


# -- an unlimited wait goes to the server in bounded slices ---------------------------------------


def _awaits_seen(server: Server, name: bytes, n: int) -> tuple[threading.Thread, list[int]]:
    """Watches the server (MONITOR) in a thread for ``n`` ``RLATCH.AWAIT name`` commands and
    collects their timeouts."""
    seen: list[int] = []
    mon = server.client()
    ready = threading.Event()

    def watch() -> None:
        with mon.monitor() as m:
            ready.set()
            for cmd in m.listen():
                parts = cmd["command"].split(" ")
                if parts[:2] == ["RLATCH.AWAIT", name.decode()]:
                    seen.append(int(parts[2]))
                    if len(seen) >= n:
                        return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert ready.wait(PROMPT)
    return t, seen


def test_an_unlimited_wait_is_sent_in_slices(server: Server, r: redis.Redis) -> None:
    # Without a limit, each RLATCH.AWAIT still carries at most 30 s, so a connection that died
    # silently is noticed by that wait's response timeout instead of never (seen on the wire).
    latch = rl.CountDownLatch(r, "sliced")
    latch.try_set_count(1)
    watcher, seen = _awaits_seen(server, b"sliced", 1)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(latch.wait(None)), daemon=True)
    t.start()
    watcher.join(PROMPT)
    assert seen and 1 <= seen[0] <= 30_000, seen
    poll("the wait to block", PROMPT, lambda: blocked_clients(r) == 1)
    latch.count_down()
    t.join(PROMPT)
    assert result == [True]


async def test_async_an_unlimited_wait_is_sent_in_slices(server: Server) -> None:
    r = aredis.Redis(port=server.port)
    latch = ra.CountDownLatch(r, "asliced")
    await latch.try_set_count(1)
    watcher, seen = _awaits_seen(server, b"asliced", 1)
    task = asyncio.create_task(latch.wait(None))
    await asyncio.to_thread(watcher.join, PROMPT)
    assert seen and 1 <= seen[0] <= 30_000, seen
    await latch.count_down()
    assert await asyncio.wait_for(task, PROMPT) is True
    await r.aclose()
