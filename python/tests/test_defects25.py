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
from redis_rlock import _sync

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
    locks = [_sync._REGISTRY_LOCK, be._lock, be.watchdog._cv, be.releaser._lock]
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
