"""asyncio cancellation of the package's calls: a task cancelled inside a release or a
re-entry (the server paused under it) leaves nothing held and the re-entry count as it was; a
semaphore acquire cancelled while the server is stopped gives its permits back; a release whose
caller was cancelled and which then fails is retrieved and logged (never "exception was never
retrieved"); and, randomized, acquires of every kind cancelled at random points (cancellation,
timeouts, a server stall) leave nothing held and conserve permits. Cancellation at every await
point of a ``with`` block is swept in ``test_interrupts.py``."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from typing import Any

import pytest
import redis.asyncio as aredis
from _servers import Server, apoll, info, let_release, user_who_cannot_release

import redis_rlock.aio as ra

# -- a task cancelled inside a release or a re-entry -------------------------------------------


@pytest.mark.parametrize("kind", ["write", "read", "counted", "leased", "reenter"])
async def test_async_cancel_inside_release_and_reentry_leaves_nothing(
    server: Server, kind: str
) -> None:
    c = aredis.Redis(port=server.port)
    admin = server.client()
    if kind in ("read", "write"):
        lock: Any = getattr(ra.RWLock(c, "ac", lease=20), kind)
        assert await lock.acquire()
        op = lock.release
    elif kind == "reenter":
        lock = ra.Lock(c, "ac", lease=20)
        assert await lock.acquire()
        op = lock.acquire
    elif kind == "counted":
        sem = ra.Semaphore(c, "ac")
        await sem.try_set_permits(2)
        hold = await sem.permits(2)
        assert hold is not None
        op = hold.release
    else:
        ls = ra.LeasedSemaphore(c, "ac", lease=20)
        await ls.try_set_permits(2)
        hold = await ls.acquire(2)
        assert hold is not None
        op = hold.release
    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):  # cancels this task inside the paused command
            await op()
    admin.execute_command("CLIENT", "UNPAUSE")
    if kind == "reenter":
        assert lock.hold.count == 1
        await lock.release()
    for be in c.__dict__.get("_redis_rlock_backends", []):
        assert await be.flush(5)
    if kind in ("counted", "leased"):
        assert int(admin.execute_command("RSEM.AVAILABLE", "ac")) == 2
    else:
        assert not admin.exists("ac")
    await c.aclose()


# -- a task cancelled inside an acquire the stalled server has not answered --------------------


RT = 0.5  # the package's response timeout in these tests


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


# -- a cancelled caller's release that then fails ----------------------------------------------


async def test_a_failed_release_after_its_caller_was_cancelled_is_retrieved_and_logged(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    import gc

    admin = server.client()
    user = user_who_cannot_release(admin)
    r = aredis.Redis(port=server.port, username=user, password="x")
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
    let_release(admin, user)
    await lock.release()
    assert not admin.exists("ok:3")
    await r.aclose()


# -- randomized: acquires of every kind cancelled at random points -----------------------------


SEED = int(os.environ.get("RLOCK_PY_SEED", str(random.randrange(1 << 30))))


PERMITS = 4


async def _use(kind: str, ar: aredis.Redis, rng: random.Random) -> None:
    timeout = rng.choice([0, 0.01, 0.05, 0.2, 1.0, -1])
    blocking = timeout != 0
    t = timeout if blocking else -1
    if kind == "lock":
        lk = ra.Lock(ar, "rc:lock", response_timeout=0.3, lease=rng.choice([None, 2.0]))
        if await lk.acquire(blocking, t):
            try:
                await asyncio.sleep(rng.random() * 0.02)
            finally:
                await lk.release()
    elif kind in ("read", "write"):
        rw = ra.RWLock(ar, "rc:rw", response_timeout=0.3)
        side = rw.read if kind == "read" else rw.write
        if await side.acquire(blocking, t):
            try:
                await asyncio.sleep(rng.random() * 0.02)
            finally:
                await side.release()
    elif kind == "counted":
        sem = ra.Semaphore(ar, "rc:sem", response_timeout=0.3)
        hold = await sem.permits(rng.randint(1, 2), blocking, t)
        if hold is not None:
            async with hold:  # released however the block ends
                await asyncio.sleep(rng.random() * 0.02)
    else:
        ls = ra.LeasedSemaphore(ar, "rc:leased", response_timeout=0.3)
        hold = await ls.acquire(rng.randint(1, 2), blocking, t)
        if hold is not None:
            async with hold:  # released however the block ends
                await asyncio.sleep(rng.random() * 0.02)


async def test_random_cancellations_leave_nothing_held(server: Server) -> None:
    print(f"RLOCK_PY_SEED={SEED}")
    rng = random.Random(SEED)
    ar = aredis.Redis(port=server.port)
    r = server.client()
    await ar.execute_command("RSEM.SETPERMITS", "rc:sem", PERMITS)
    await ar.execute_command("RSEM.SETPERMITS", "rc:leased", PERMITS)
    kinds = ["lock", "read", "write", "counted", "leased"]
    tasks: list[asyncio.Task[None]] = []
    stalled_once = False
    t_end = time.monotonic() + 8
    while time.monotonic() < t_end:
        for _ in range(rng.randint(1, 6)):
            tasks.append(asyncio.create_task(_use(rng.choice(kinds), ar, rng)))
        await asyncio.sleep(rng.random() * 0.01)
        for t in rng.sample(tasks, k=min(len(tasks), rng.randint(0, 3))):
            t.cancel()
        if not stalled_once and time.monotonic() > t_end - 5:
            stalled_once = True  # a stall longer than the response timeout, mid-traffic
            server.pause()
            await asyncio.sleep(0.6)
            server.resume()
        tasks = [t for t in tasks if not t.done()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    end = time.monotonic() + 30
    while True:
        ok = (
            not info(r, "rc:lock")
            and not r.exists("rc:rw")
            and int(r.get("rc:sem") or -1) == PERMITS
            and int(r.execute_command("RSEM.AVAILABLE", "rc:leased")) == PERMITS
            and r.zcard("rc:leased:timeout") == 0
        )
        if ok:
            break
        assert time.monotonic() < end, (
            f"seed {SEED}: left held: lock={info(r, 'rc:lock')} rw={r.hgetall('rc:rw')} "
            f"sem={r.get('rc:sem')} leased={r.get('rc:leased')} "
            f"zset={r.zcard('rc:leased:timeout')}"
        )
        await asyncio.sleep(0.05)
    await ar.aclose()
