"""The hostile list: a stalled server (SIGSTOP) past a call's deadline, CLIENT KILL mid-wait,
a restart under a watchdog, KeyboardInterrupt in a wait, fork. After each, nothing is left
held by nobody, and a stale hold never touches a later one."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, apoll, info, poll

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.5  # the package's response timeout in these tests


def _no_grant_left(r: redis.Redis, name: str, holder_owner: bytes | None) -> bool:
    i = info(r, name)
    if holder_owner is None:
        return not i
    return i.get("owner") == holder_owner and i.get("waiters") == 0


@pytest.fixture
def paused(server: Server) -> Iterator[Server]:
    yield server
    server.resume()


def test_an_acquire_read_by_a_server_resuming_after_its_deadline_holds_nothing(
    r: redis.Redis, paused: Server
) -> None:
    lock = rl.Lock(r, "stall", response_timeout=RT, lease=20)
    lock._be.call(b"stall", ["PING"])  # a connection ready before the stall
    paused.pause()
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.3) is False  # the acquire sits in the stopped server
    assert time.monotonic() - t0 < 0.3 + RT + 2 * RT + 1
    paused.resume()
    # the server runs the acquire (a grant), then the cancel: nothing stays held
    poll("the late grant given back", 10, lambda: _no_grant_left(r, "stall", None))
    assert not lock.owned()


def test_a_waiter_whose_server_stalls_past_its_deadline_holds_nothing(
    r: redis.Redis, paused: Server
) -> None:
    holder = rl.Lock(r, "stall2", lease=0.6)
    holder.acquire()
    lock = rl.Lock(r, "stall2", response_timeout=RT)
    res: list[bool] = []
    t = threading.Thread(target=lambda: res.append(lock.acquire(timeout=0.3)))
    t.start()
    poll("queued", 5, lambda: info(r, "stall2")["waiters"] == 1)
    paused.pause()  # the holder's lease ends during the stall: a hand-off on resume
    t.join(10)
    assert res == [False]
    time.sleep(0.7)  # the subject: the stall outlasting the holder's lease
    paused.resume()
    poll("nobody holds it", 10, lambda: _no_grant_left(r, "stall2", None))
    # its cancel answered (not left retrying against this test's server after it stops)
    assert lock._be.releaser.flush(10)


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


def test_restart_makes_a_watchdog_hold_lost(server: Server) -> None:
    r = server.client()
    lost = threading.Event()
    lock = rl.Lock(
        r, "restart", watchdog_timeout=0.9, response_timeout=RT, on_lost=lambda h: lost.set()
    )
    lock.acquire()
    server.restart_same_port()
    assert lost.wait(10)
    with pytest.raises(rl.LockLost):
        lock.release()
    assert not r.exists("restart")


def test_keyboard_interrupt_in_a_wait_leaves_nothing(r: redis.Redis) -> None:
    holder = rl.Lock(r, "kbd")
    holder.acquire()
    lock = rl.Lock(r, "kbd")
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    assert not lock.owned()
    poll("the waiter gone", 5, lambda: info(r, "kbd")["waiters"] == 0)
    holder.release()
    assert not r.exists("kbd")  # not handed to the interrupted waiter


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_renews_nor_releases_the_parents_hold(r: redis.Redis) -> None:
    lock = rl.Lock(r, "fork", watchdog_timeout=0.9)
    lock.acquire()
    owner = lock.hold.owner
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            if lock.owned():
                code = 1
            try:
                lock.release()
                code = 2
            except rl.NotHeld:
                pass
            if rl.Lock(r, "fork").acquire(blocking=False):
                code = 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    time.sleep(1.0)  # the subject: longer than the lease; the parent's watchdog renews
    assert lock.owned() and info(r, "fork")["owner"] == owner
    lock.release()
    assert not r.exists("fork")


async def test_async_acquire_read_by_a_resuming_server_holds_nothing(
    server: Server, paused: Server
) -> None:
    ar = aredis.Redis(port=server.port)
    r = server.client()
    lock = ra.Lock(ar, "astall", response_timeout=RT, lease=20)
    await lock._be.call(b"astall", ["PING"])
    paused.pause()
    assert await lock.acquire(timeout=0.3) is False
    paused.resume()
    # the cancel goes on in a background task of this loop: poll without blocking it
    await apoll("the late grant given back", 10, lambda: _no_grant_left(r, "astall", None))
    await ar.aclose()


async def test_async_semaphore_acquire_cancelled_in_a_stall_gives_back(
    server: Server, paused: Server
) -> None:
    ar = aredis.Redis(port=server.port)
    r = server.client()
    sem = ra.Semaphore(ar, "ssem", response_timeout=RT)
    await sem.try_set_permits(3)
    paused.pause()
    task = asyncio.create_task(sem.acquire(2, timeout=5))
    await asyncio.sleep(0.2)
    task.cancel()
    resumer = threading.Timer(0.3, paused.resume)
    resumer.start()
    with pytest.raises(asyncio.CancelledError):
        await task
    resumer.join()
    await apoll("permits back", 10, lambda: int(r.get("ssem") or 0) == 3)
    await ar.aclose()
