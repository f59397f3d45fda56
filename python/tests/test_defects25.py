"""Issue 25's last hostile round: a fork while another thread holds one of the package's locks,
NOREPLICAS retried by an acquire with a deadline, an asyncio release that fails after its
caller was cancelled. Each test failed on the code before its fix (see the commit log)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, poll

import redis_rlock as rl
import redis_rlock.aio as ra

# -- fork while another thread holds the package's locks -------------------------------------


def _hold_in_thread(lock: Any, held: threading.Event, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        with lock:
            held.set()
            stop.wait(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_threads_hold_the_packages_locks_can_lock(r: redis.Redis) -> None:
    parent_lock = rl.Lock(r, "forkparent")
    assert parent_lock.acquire()  # the watchdog thread runs
    be = parent_lock._be
    # the engine keeps no lock of its own any more (its registry, pools, watchdog and releaser
    # are lock-free): the package's pool's lock is the one left
    locks = [be._pool(b"")._lock]
    stop = threading.Event()
    threads = []
    for lk in locks:  # another thread holds each of them at the fork
        held = threading.Event()
        threads.append(_hold_in_thread(lk, held, stop))
        assert held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # child: a lock of its own, on the parent's client and on a new one
            code = 1
            try:
                for client in (r, redis.Redis(port=r.connection_pool.connection_kwargs["port"])):
                    mine = rl.Lock(client, "forkchild", lease=10)
                    if mine.acquire(timeout=2):
                        mine.release()
                        code = 0
                    else:
                        code = 3
                        break
            except BaseException:
                code = 2
            os._exit(code)
    finally:
        stop.set()
    end = time.monotonic() + 10
    status = None
    while time.monotonic() < end:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.02)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child deadlocked on a lock held by another thread at the fork")
    assert os.waitstatus_to_exitcode(status) == 0
    for t in threads:
        t.join(5)
    parent_lock.release()
    assert not r.exists("forkparent") and not r.exists("forkchild")


# -- NOREPLICAS: retried within an acquire's deadline ----------------------------------------


def _acquire_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats").get("cmdstat_rlock.acquire", {})
    return int(stats.get("calls", 0))


def test_an_acquire_with_a_deadline_retries_noreplicas_until_grants_are_allowed(
    r: redis.Redis,
) -> None:
    r.config_set("rlock.min-replicas", 1)  # no replica: this master grants nothing
    lock = rl.Lock(r, "norep", lease=10)
    t0 = time.monotonic()
    with pytest.raises(rl.NoReplicas):
        lock.acquire(blocking=False)  # one try: told at once
    assert time.monotonic() - t0 < 1.0
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_try(lock, 5)), daemon=True)
    t.start()
    poll("the acquire to be refused twice", 5, lambda: _acquire_calls(r) >= 3)
    r.config_set("rlock.min-replicas", 0)  # grants allowed again
    t.join(10)
    assert got == [True], got
    assert lock.owned() is False  # held by the thread, not this one
    assert r.exists("norep")
    r.delete("norep")


def _try(lock: rl.Lock, timeout: float) -> Any:
    try:
        return lock.acquire(timeout=timeout)
    except rl.LockError as e:
        return e


def test_noreplicas_past_the_deadline_is_raised(r: redis.Redis) -> None:
    r.config_set("rlock.min-replicas", 1)
    lock = rl.Lock(r, "norep2", lease=10)
    t0 = time.monotonic()
    with pytest.raises(rl.NoReplicas):
        lock.acquire(timeout=0.5)
    assert 0.4 < time.monotonic() - t0 < 2.0  # retried until the deadline, not beyond
    r.config_set("rlock.min-replicas", 0)
    assert not r.exists("norep2")


async def test_async_acquire_retries_noreplicas_until_grants_are_allowed(
    server: Server,
) -> None:
    r = server.client()
    r.config_set("rlock.min-replicas", 1)
    a = aredis.Redis(port=server.port)
    lock = ra.Lock(a, "anorep", lease=10)
    with pytest.raises(rl.NoReplicas):
        await lock.acquire(blocking=False)

    async def take() -> bool:  # the hold is this task's: it releases it
        got = await lock.acquire(timeout=5)
        assert r.exists("anorep")
        await lock.release()
        return got

    task = asyncio.ensure_future(take())
    while _acquire_calls(r) < 3:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    r.config_set("rlock.min-replicas", 0)
    assert await asyncio.wait_for(task, 10) is True
    assert not r.exists("anorep")
    await a.aclose()
    r.close()


# -- asyncio: a cancelled caller's release that then fails ----------------------------------


async def test_a_failed_release_after_its_caller_was_cancelled_is_retrieved_and_logged(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    import gc

    admin = server.client()
    admin.execute_command(
        "ACL", "SETUSER", "half", "on", "nopass", "+@all", "~ok:*", "~rlock_request:*"
    )
    r = aredis.Redis(port=server.port, username="half", password="x")
    lock = ra.Lock(r, "ok:3")
    assert await lock.acquire()
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    try:
        with caplog.at_level(logging.DEBUG, logger="redis_rlock"):
            caller = asyncio.ensure_future(lock.hold.release())  # the grant itself
            await asyncio.sleep(0)  # the caller awaits its shielded release task
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            assert await lock._be.flush(5)  # the release task ended (refused: NOPERM)
            del caller
            for _ in range(3):
                await asyncio.sleep(0)
                gc.collect()
        assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported
        assert any("release after a cancellation failed" in m for m in caplog.messages)
    finally:
        loop.set_exception_handler(old)
    assert admin.exists("ok:3")  # refused: the hold stays
    admin.execute_command("ACL", "SETUSER", "half", "&*", "~*")
    await lock.release()
    assert not admin.exists("ok:3")
    await r.aclose()
