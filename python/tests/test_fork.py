"""A fork while the package holds and runs its threads: the child's ``threading`` stays
consistent, and it can take locks of its own even when other threads held the package's locks
at the fork; the child neither renews nor releases the parent's holds, gives back none of its
permits, and never uses the parent's session socket (a session is closed in the child, sync
and asyncio), while the parent's holds and session go on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, info, session_holds

import redis_rlock as rl
import redis_rlock.aio as ra


def _exit_code_of_child(child: Callable[[], int]) -> int:
    """Forks: the child runs ``child`` and leaves with the code it returns (99, after printing
    it, if it raised), never returning into the test; the parent waits for it and returns its
    exit code."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 99
        try:
            code = child()
        except BaseException as e:
            print(f"the child failed: {e!r}", flush=True)
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_with_the_watchdog_alive_leaves_threading_consistent_in_the_child(
    server: Server,
) -> None:
    """The package's threads carry a ``Flag`` as their ``_started`` (``_flag.py``); CPython's
    ``threading._after_fork`` calls ``_at_fork_reinit`` on it. Without that method it raised
    AttributeError in every forked child and stopped half-way, leaving the parent's watchdog
    listed as alive in the child."""
    code = textwrap.dedent(
        f"""
        import os, threading, redis, redis_rlock as rl
        r = redis.Redis(port={server.port})
        lk = rl.Lock(r, 'fork:lock')
        assert lk.acquire()
        assert any(t.name == 'redis-rlock-watchdog' for t in threading.enumerate())
        pid = os.fork()
        if pid == 0:
            names = [t.name for t in threading.enumerate()]
            os.write(1, ("CHILD " + repr(names) + "\\n").encode())
            os._exit(0)
        os.waitpid(pid, 0)
        lk.release()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "AttributeError" not in out.stderr, out.stderr
    assert "CHILD" in out.stdout, out.stdout
    assert "redis-rlock-watchdog" not in out.stdout, out.stdout


# -- a child forked while other threads hold the package's locks -------------------------------


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


# -- the parent's holds and permits are left alone in the child --------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_renews_nor_releases_the_parents_hold(r: redis.Redis) -> None:
    lock = rl.Lock(r, "fork", watchdog_timeout=0.9)
    lock.acquire()
    owner = lock.hold.owner

    def child() -> int:
        code = 0
        if lock.owned():
            code = 1
        try:
            lock.release()
            code = 2
        except rl.NotHeld:
            pass
        if rl.Lock(r, "fork").acquire(blocking=False):
            code = 3
        return code

    assert _exit_code_of_child(child) == 0
    time.sleep(1.0)  # the subject: longer than the lease; the parent's watchdog renews
    assert lock.owned() and info(r, "fork")["owner"] == owner
    lock.release()
    assert not r.exists("fork")


def test_a_permit_guard_used_after_fork_in_the_child_does_nothing(r: redis.Redis) -> None:
    sem = rl.LeasedSemaphore(r, "forksem", lease=30)
    sem.try_set_permits(1)
    hold = sem.acquire(1)
    assert hold is not None

    def child() -> int:  # must not give the parent's permit back
        try:
            hold.release()
        except rl.NotHeld:
            return 0
        return 1

    assert _exit_code_of_child(child) == 0
    assert sem.available() == 0  # the parent's permit is untouched
    hold.release()
    assert sem.available() == 1


# -- a session in a forked child ---------------------------------------------------------------


def test_a_forked_child_never_uses_its_parent_s_session_socket(r: redis.Redis) -> None:
    """A child forked with a live session shares its socket: an acquire there would be bound to
    the parent's connection (and its reply read by whichever process reads first). The child
    must see the session as closed, and leave the parent's session and holds alone."""
    s = rl.Session(r)
    parent = s.lock("a", lease=60)
    assert parent.acquire()

    def child() -> int:
        try:
            s.lock("child", lease=60).acquire(blocking=False)
            code = 1  # acquired through the parent's socket
        except rl.SessionClosed:
            code = 0 if s.closed.is_set() else 2
        s.close()
        return code

    assert _exit_code_of_child(child) == 0, "the child used the parent's session"
    assert r.exists("child") == 0, "nothing taken for the child"
    assert not s.closed.is_set() and not parent.hold.is_lost()
    assert s.lock("b", lease=60).acquire(blocking=False), "the parent's session still works"
    assert session_holds(r) == 2
    s.close()


async def test_async_a_forked_child_sees_the_session_closed(
    r: redis.Redis, ar: aredis.Redis
) -> None:
    """As the sync session: in a forked child the asyncio session is closed, without touching
    the parent's socket; the parent's session goes on."""
    s = ra.Session(ar)
    parent = s.lock("a", lease=60)
    assert await parent.acquire()

    def child() -> int:  # no event loop of its own to run, only what needs none
        return 0 if s.closed.is_set() else 1

    assert _exit_code_of_child(child) == 0, "the child saw the parent's session open"
    assert not s.closed.is_set() and not parent.hold.is_lost()
    assert await s.lock("b", lease=60).acquire(blocking=False), "the parent's session works"
    assert session_holds(r) == 2
    await s.close()
