"""Count-down latches (``CountDownLatch``, sync and asyncio) on ``RLATCH.*``, held to the hostile
standard: many awaiters released by one count-down, timeouts that leave no awaiter blocked in the
server, a wait interrupted at any point (``KeyboardInterrupt``, a task cancelled, an
``asyncio.wait_for`` running out) that leaves no awaiter behind and no pooled connection with an
unread reply, a server paused or a connection killed mid-wait, a plain ``DEL``, a cluster with
braced names and a Sentinel failover. Also: a look without waiting (``timeout=0``) through a
stalled or unreachable server is False in time, timeouts at the edges, ACL refusals, RESP3 and
binary braced names, no connection left behind by many cancelled waits, a latch following its
slot to another cluster node, and an unlimited wait sent to the server in bounded slices."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
import redis.asyncio.cluster as acluster
import redis.connection
from _ha import Group, replicated
from _servers import PROMPT, Server, apoll, blocked_clients, poll, raise_once_here
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.5  # the package's response timeout where a stall is the subject
#: a `CLIENT PAUSE ... ALL` here: longer than any bound asserted while it lasts (its UNPAUSE is
#: paused too, so each such test lasts this long)
PAUSE_MS = 5000
N = 10  # awaiters per test


def _latch_calls(r: redis.Redis) -> int:
    """How many RLATCH.* commands the server ran (INFO commandstats)."""
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_rlatch"))


def _awaiting(r: redis.Redis) -> list[dict[str, Any]]:
    """The connections blocked in RLATCH.AWAIT now."""
    return [c for c in r.client_list() if c["cmd"] == "rlatch.await" and "b" in c["flags"]]


def _interrupt_once_blocked(
    monkeypatch: pytest.MonkeyPatch, r: redis.Redis, exc: BaseException
) -> None:
    """The test thread's next wait for a reply (``can_read`` with a timeout: the engine's, not
    the pool's check) raises ``exc`` once the server shows the awaiter blocked: an interrupt
    landing while the wait sits in the server."""
    real = redis.connection.Connection.can_read
    me = threading.get_ident()
    fired: list[bool] = []

    def swapped(self: Any, timeout: float = 0) -> bool:
        if not fired and threading.get_ident() == me and timeout:
            fired.append(True)
            poll("the awaiter blocked", PROMPT, lambda: blocked_clients(r) == 1)
            raise exc
        return bool(real(self, timeout))

    monkeypatch.setattr(redis.connection.Connection, "can_read", swapped)


def _wait_into(latch: rl.CountDownLatch, timeout: float | None, out: list[bool]) -> None:
    out.append(latch.wait(timeout))


def _pool_is_sound(r: redis.Redis, latch: rl.CountDownLatch) -> None:
    """The latch's next users get their own replies: a pooled connection holding an unread
    ``RLATCH.AWAIT`` (or one still blocked in the server) would answer the next command with
    the wait's ``1`` once the latch opens, or stall it until then."""
    other = rl.CountDownLatch(latch._be.client, latch.name + b":other", response_timeout=RT)
    assert other.try_set_count(5)
    assert latch.count_down() == 0  # opens the latch: an orphaned wait's reply would come now
    for _ in range(3):
        assert other.get_count() == 5
        assert latch.get_count() == 0
    assert latch.wait(1.0) is True
    assert other.wait(0.05) is False
    assert other.count_down(5) == 0
    assert blocked_clients(r) == 0


# -- the commands --------------------------------------------------------------------------


def test_set_count_count_down_get_count_delete(r: redis.Redis) -> None:
    latch = rl.CountDownLatch(r, "l")
    assert latch.get_count() == 0 and latch.wait(0) is True  # missing: open
    assert latch.count_down() == 0 and not r.exists("l")  # nothing written
    assert latch.try_set_count(3) is True
    assert r.get("l") == b"3"  # Redisson's layout
    assert latch.try_set_count(7) is False and latch.get_count() == 3
    assert latch.wait(0) is False and latch.wait(0.01) is False
    assert latch.count_down() == 2
    assert latch.count_down(5) == 0 and not r.exists("l")  # never below zero
    assert latch.wait() is True
    assert latch.try_set_count(2) and latch.delete() is True and latch.delete() is False
    assert latch.get_count() == 0


@pytest.mark.parametrize("bad", [0, -1, -(2**63), 2**63])
def test_a_count_or_amount_out_of_range_is_refused_before_sending(r: redis.Redis, bad: int) -> None:
    latch = rl.CountDownLatch(r, "l")
    latch.get_count()  # the engine's connection is made
    before = _latch_calls(r)
    with pytest.raises(ValueError):
        latch.try_set_count(bad)
    with pytest.raises(ValueError):
        latch.count_down(bad)
    for odd in (True, 1.0, "1"):
        with pytest.raises(TypeError):
            latch.count_down(odd)  # type: ignore[arg-type]
    for timeout in (-0.1, float("nan"), 1e300):
        with pytest.raises(ValueError):
            latch.wait(timeout)
    assert _latch_calls(r) == before and not r.exists("l")


def test_a_retyped_key_raises_wrongtype_and_a_missing_module_is_named(server: Server) -> None:
    r = server.client()
    r.hset("h", "f", "v")
    latch = rl.CountDownLatch(r, "h")
    for call in (latch.get_count, latch.wait, lambda: latch.wait(0.5), latch.count_down):
        with pytest.raises(rl.WrongType):
            call()
    assert blocked_clients(r) == 0
    plain = Server(module=False)
    try:
        with pytest.raises(rl.ModuleMissing):
            rl.CountDownLatch(plain.client(), "l").wait(1)
    finally:
        plain.close()


# -- awaiters ------------------------------------------------------------------------------


def test_threads_released_by_one_count_down_each_get_true_once(r: redis.Redis) -> None:
    latch = rl.CountDownLatch(r, "gate")
    assert latch.try_set_count(2)
    results: list[bool] = []
    lock = threading.Lock()

    def waiter(timeout: float | None) -> None:
        ok = rl.CountDownLatch(r, "gate").wait(timeout)
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=waiter, args=(None if i % 2 else 30.0,)) for i in range(N)]
    for t in threads:
        t.start()
    poll("every awaiter blocked", PROMPT, lambda: blocked_clients(r) == N)
    assert latch.count_down() == 1
    assert blocked_clients(r) == N and results == []  # not open yet
    assert latch.count_down() == 0  # one count-down opens it for all
    for t in threads:
        t.join(PROMPT)
        assert not t.is_alive()
    assert results == [True] * N
    assert blocked_clients(r) == 0


def test_a_timed_wait_returns_false_in_time_and_leaves_no_awaiter(r: redis.Redis) -> None:
    latch = rl.CountDownLatch(r, "closed")
    latch.try_set_count(1)
    for timeout in (0.001, 0.2):
        t0 = time.monotonic()
        assert latch.wait(timeout) is False
        took = time.monotonic() - t0
        assert timeout <= took < timeout + 0.5, took
        assert blocked_clients(r) == 0
    assert latch.get_count() == 1


def test_a_plain_del_or_delete_opens_the_latch_for_awaiters(r: redis.Redis) -> None:
    for how in ("DEL", "delete"):
        latch = rl.CountDownLatch(r, f"del:{how}")
        latch.try_set_count(3)
        res: list[bool] = []
        threads = [threading.Thread(target=_wait_into, args=(latch, 30.0, res)) for _ in range(3)]
        for t in threads:
            t.start()
        poll("the awaiters blocked", PROMPT, lambda: blocked_clients(r) == 3)
        if how == "DEL":
            assert r.delete(latch.name) == 1  # outside rlock: seen at the awaiters' poll
        else:
            assert latch.delete() is True
        for t in threads:
            t.join(PROMPT)
        assert res == [True] * 3 and blocked_clients(r) == 0


# -- interrupts ----------------------------------------------------------------------------


@pytest.mark.parametrize("untimed", [True, False])
def test_an_interrupt_while_blocked_leaves_no_awaiter_and_a_sound_pool(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, untimed: bool
) -> None:
    latch = rl.CountDownLatch(r, "kbi", response_timeout=RT)
    latch.try_set_count(1)
    _interrupt_once_blocked(monkeypatch, r, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        latch.wait(None if untimed else 30)
    poll("the interrupted awaiter gone", PROMPT, lambda: blocked_clients(r) == 0)
    assert latch.get_count() == 1
    _pool_is_sound(r, latch)


@pytest.mark.parametrize("where", ["send_command", "read_response"])
def test_an_interrupt_sending_or_reading_the_wait_leaves_a_sound_pool(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    latch = rl.CountDownLatch(r, "kbi2", response_timeout=RT)
    latch.try_set_count(1)
    if where == "read_response":
        # the reply is in: the latch opened (by another latch's count-down) as it was read
        threading.Timer(0.05, lambda: r.execute_command("RLATCH.COUNTDOWN", "kbi2")).start()
    raise_once_here(monkeypatch, redis.connection.Connection, where, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        latch.wait(30)
    poll("no awaiter left", PROMPT, lambda: blocked_clients(r) == 0)
    latch.try_set_count(1)
    _pool_is_sound(r, latch)


def test_a_real_sigint_during_an_untimed_wait(r: redis.Redis) -> None:
    latch = rl.CountDownLatch(r, "sigint", response_timeout=RT)
    latch.try_set_count(1)

    def nemesis() -> None:
        poll("the awaiter blocked", PROMPT, lambda: blocked_clients(r) == 1)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=nemesis)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            latch.wait()
    finally:
        t.join(PROMPT)
    poll("the interrupted awaiter gone", PROMPT, lambda: blocked_clients(r) == 0)
    _pool_is_sound(r, latch)


# -- a paused server, a killed connection ------------------------------------------------------


@pytest.fixture
def admin(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    try:
        c.execute_command("CLIENT", "UNPAUSE")
    except redis.ConnectionError:
        pass  # the test killed the server
    c.close()


def test_client_pause_all_during_a_timed_wait(r: redis.Redis, admin: redis.Redis) -> None:
    latch = rl.CountDownLatch(r, "paused", response_timeout=RT)
    latch.try_set_count(1)
    admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
    t0 = time.monotonic()
    assert latch.wait(0.3) is False  # the wait sits unread in the paused server
    took = time.monotonic() - t0
    assert 0.3 <= took < 0.3 + RT + 0.5, took
    admin.execute_command("CLIENT", "UNPAUSE")
    poll("no awaiter left after the pause", PROMPT, lambda: blocked_clients(r) == 0)
    _pool_is_sound(r, latch)


@pytest.mark.parametrize("untimed", [True, False])
def test_client_kill_of_the_awaiting_connection_keeps_the_wait_going(
    r: redis.Redis, untimed: bool
) -> None:
    latch = rl.CountDownLatch(r, "kill")
    latch.try_set_count(1)
    res: list[bool] = []
    t = threading.Thread(target=lambda: res.append(latch.wait(None if untimed else 30)))
    t.start()
    poll("the awaiter blocked", PROMPT, lambda: len(_awaiting(r)) == 1)
    first = _awaiting(r)[0]["id"]
    r.client_kill_filter(_id=first)
    poll(
        "the wait sent again on a new connection",
        PROMPT,
        lambda: [c["id"] for c in _awaiting(r)] not in ([], [first]),
    )
    assert res == []
    assert latch.count_down() == 0
    t.join(PROMPT)
    assert res == [True] and blocked_clients(r) == 0


@pytest.mark.parametrize("error", [False, True])
def test_client_unblock_of_the_awaiter_keeps_the_wait_going(r: redis.Redis, error: bool) -> None:
    """``CLIENT UNBLOCK`` answers the wait as a timeout (0) or with ``UNBLOCKED`` (``ERROR``, and
    what a master turned replica at a failover answers every blocked client): neither is the
    latch opening, so the wait is sent again while its time lasts."""
    latch = rl.CountDownLatch(r, "unblock")
    latch.try_set_count(1)
    res: list[Any] = []

    def waiter() -> None:
        try:
            res.append(latch.wait(30))
        except Exception as e:
            res.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    poll("the awaiter blocked", PROMPT, lambda: len(_awaiting(r)) == 1)
    first = _awaiting(r)[0]["id"]
    args = ["CLIENT", "UNBLOCK", first] + (["ERROR"] if error else [])
    assert r.execute_command(*args) == 1
    poll("the wait sent again", PROMPT, lambda: len(_awaiting(r)) == 1 or bool(res))
    assert res == []
    assert latch.count_down() == 0
    t.join(PROMPT)
    assert res == [True] and blocked_clients(r) == 0


def test_a_timed_wait_whose_connection_is_killed_ends_in_time(r: redis.Redis) -> None:
    """A server that kills every awaiting connection (CLIENT KILL in a loop): the wait is sent
    again each time, and still ends at its timeout."""
    latch = rl.CountDownLatch(r, "killer")
    latch.try_set_count(1)
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set():
            for c in _awaiting(r):
                r.client_kill_filter(_id=c["id"])
            time.sleep(0.01)

    k = threading.Thread(target=killer)
    k.start()
    try:
        t0 = time.monotonic()
        assert latch.wait(1.0) is False
        assert time.monotonic() - t0 < 1.0 + 0.5
    finally:
        stop.set()
        k.join(PROMPT)
    poll("no awaiter left", PROMPT, lambda: blocked_clients(r) == 0)


# -- asyncio -------------------------------------------------------------------------------


async def test_async_tasks_released_by_one_count_down_each_get_true_once(
    r: redis.Redis, ar: aredis.Redis
) -> None:
    latch = ra.CountDownLatch(ar, "agate")
    assert await latch.try_set_count(2) and not await latch.try_set_count(3)
    tasks = [
        asyncio.create_task(ra.CountDownLatch(ar, "agate").wait(None if i % 2 else 30))
        for i in range(N)
    ]
    await apoll("every awaiter blocked", PROMPT, lambda: blocked_clients(r) == N)
    assert await latch.count_down() == 1 and await latch.get_count() == 1
    assert not any(t.done() for t in tasks)
    assert await latch.count_down() == 0
    assert await asyncio.wait_for(asyncio.gather(*tasks), PROMPT) == [True] * N
    assert blocked_clients(r) == 0
    assert await latch.wait(0) is True
    assert await latch.try_set_count(1) and await latch.delete() and not await latch.delete()
    for bad in (0, -3):
        with pytest.raises(ValueError):
            await latch.count_down(bad)
        with pytest.raises(ValueError):
            await latch.try_set_count(bad)


async def test_async_a_timed_wait_returns_false_in_time_and_leaves_no_awaiter(
    r: redis.Redis, ar: aredis.Redis
) -> None:
    latch = ra.CountDownLatch(ar, "aclosed")
    await latch.try_set_count(1)
    t0 = time.monotonic()
    assert await latch.wait(0.2) is False
    assert 0.2 <= time.monotonic() - t0 < 0.7
    assert blocked_clients(r) == 0 and await latch.wait(0) is False


async def _apool_is_sound(r: redis.Redis, latch: ra.CountDownLatch) -> None:
    """As ``_pool_is_sound``, for the asyncio engine."""
    other = ra.CountDownLatch(latch._be.client, latch.name + b":other", response_timeout=RT)
    assert await other.try_set_count(5)
    assert await latch.count_down() == 0
    for _ in range(3):
        assert await other.get_count() == 5
        assert await latch.get_count() == 0
    assert await latch.wait(1.0) is True
    assert await other.wait(0.05) is False
    assert await other.count_down(5) == 0
    assert blocked_clients(r) == 0


@pytest.mark.parametrize("how", ["cancel", "wait_for", "cancel_untimed"])
async def test_async_a_cancelled_wait_leaves_no_awaiter_and_a_sound_pool(
    r: redis.Redis, ar: aredis.Redis, how: str
) -> None:
    latch = ra.CountDownLatch(ar, "acancel", response_timeout=RT)
    await latch.try_set_count(1)
    if how == "wait_for":
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(latch.wait(30), 0.3)
    else:
        task = asyncio.create_task(latch.wait(None if how == "cancel_untimed" else 30))
        await apoll("the awaiter blocked", PROMPT, lambda: blocked_clients(r) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await apoll("the cancelled awaiter gone", PROMPT, lambda: blocked_clients(r) == 0)
    assert await latch.get_count() == 1
    await _apool_is_sound(r, latch)


async def test_async_a_cancel_while_sending_the_wait_leaves_a_sound_pool(
    r: redis.Redis, ar: aredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    latch = ra.CountDownLatch(ar, "asend", response_timeout=RT)
    await latch.try_set_count(1)
    raise_once_here(monkeypatch, aredis.Connection, "send_command", asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await latch.wait(30)
    await apoll("no awaiter left", PROMPT, lambda: blocked_clients(r) == 0)
    await _apool_is_sound(r, latch)


async def test_async_client_pause_all_during_a_timed_wait(
    r: redis.Redis, ar: aredis.Redis, admin: redis.Redis
) -> None:
    latch = ra.CountDownLatch(ar, "apaused", response_timeout=RT)
    await latch.try_set_count(1)
    admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
    t0 = time.monotonic()
    assert await latch.wait(0.3) is False
    took = time.monotonic() - t0
    assert 0.3 <= took < 0.3 + RT + 0.5, took
    admin.execute_command("CLIENT", "UNPAUSE")
    await apoll("no awaiter left after the pause", PROMPT, lambda: blocked_clients(r) == 0)
    await _apool_is_sound(r, latch)


async def test_async_client_kill_and_a_plain_del(r: redis.Redis, ar: aredis.Redis) -> None:
    latch = ra.CountDownLatch(ar, "akill")
    await latch.try_set_count(1)
    task = asyncio.create_task(latch.wait())
    await apoll("the awaiter blocked", PROMPT, lambda: len(_awaiting(r)) == 1)
    first = _awaiting(r)[0]["id"]
    r.client_kill_filter(_id=first)
    await apoll(
        "the wait sent again on a new connection",
        PROMPT,
        lambda: [c["id"] for c in _awaiting(r)] not in ([], [first]),
    )
    assert not task.done()
    assert r.delete("akill") == 1  # a plain DEL opens it
    assert await asyncio.wait_for(task, PROMPT) is True
    assert blocked_clients(r) == 0


# -- cluster and Sentinel --------------------------------------------------------------------

NAMES = [f"{{latch:{i}}}:gate" for i in range(9)]


def test_sync_cluster_latches_with_braced_names(cluster: list[Server]) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    assert len({rc.get_node_from_key(n).name for n in NAMES}) == 3
    for name in NAMES:
        latch = rl.CountDownLatch(rc, name)
        assert latch.try_set_count(2)
        res: list[bool] = []
        t = threading.Thread(target=_wait_into, args=(rl.CountDownLatch(rc, name), 30.0, res))
        t.start()
        node = cluster[[s.port for s in cluster].index(rc.get_node_from_key(name).port)]
        poll("the awaiter blocked", PROMPT, lambda n=node: blocked_clients(n.client()) == 1)
        assert latch.count_down() == 1 and latch.count_down() == 0
        t.join(PROMPT)
        assert res == [True] and not rc.exists(name)
        assert latch.wait(0.01) is True
    rc.close()


async def test_async_cluster_latches_with_braced_names(cluster: list[Server]) -> None:
    rc = acluster.RedisCluster(host="127.0.0.1", port=cluster[1].port)
    for name in NAMES:
        latch = ra.CountDownLatch(rc, name)
        assert await latch.try_set_count(1)
        task = asyncio.create_task(ra.CountDownLatch(rc, name).wait(30))
        await apoll(
            "the awaiter blocked",
            PROMPT,
            lambda: sum(blocked_clients(s.client()) for s in cluster) == 1,
        )
        assert await latch.count_down() == 0
        assert await asyncio.wait_for(task, PROMPT) is True
    await rc.aclose()


def test_sync_latch_wait_follows_a_sentinel_failover(manual_group: Group) -> None:
    """The Sentinels demote the old master (killing its clients): the wait is sent again to the
    new master, where the replicated count is, and its count-down opens it."""
    g = manual_group
    master = Sentinel([("127.0.0.1", g.sentinel.port)], socket_timeout=5).master_for("mymaster")
    latch = rl.CountDownLatch(master, "ha")
    assert latch.try_set_count(1)
    res: list[bool] = []
    t = threading.Thread(target=lambda: res.append(latch.wait(60)))
    t.start()
    poll("the awaiter blocked", PROMPT, lambda: blocked_clients(g.master.client()) == 1)
    replicated(g.master, g.replica)  # the count on the replica (a lost write would open it)
    g.failover()
    poll(
        "the wait sent to the new master",
        30,
        lambda: blocked_clients(g.replica.client()) == 1,
        step=0.05,
    )
    assert res == []
    assert latch.count_down() == 0
    t.join(PROMPT)
    assert res == [True]


# -- one look (timeout=0) through a stalled or unreachable server ------------------------------


SLACK = 0.5  # scheduling slack on a loaded machine


def test_a_look_through_client_pause_all_is_false_in_time(
    r: redis.Redis, admin: redis.Redis
) -> None:
    latch = rl.CountDownLatch(r, "look", response_timeout=RT)
    latch.try_set_count(1)
    assert latch.wait(0) is False
    admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
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
    admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
    t0 = time.monotonic()
    assert await latch.wait(0) is False
    assert time.monotonic() - t0 < RT + SLACK
    admin.execute_command("CLIENT", "UNPAUSE")
    server.kill()
    t0 = time.monotonic()
    assert await latch.wait(0) is False
    assert time.monotonic() - t0 < RT + SLACK
    await ar.aclose()


# -- timeouts at the edges ---------------------------------------------------------------------


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


# -- ACL ---------------------------------------------------------------------------------------


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


# -- leaks -------------------------------------------------------------------------------------


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


def test_sync_a_latch_follows_its_slot_to_another_node(cluster: list[Server]) -> None:
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
    cluster: list[Server],
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


# -- an unlimited wait goes to the server in bounded slices ------------------------------------


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
