"""Randomized: acquires of every kind cancelled at random points (asyncio cancellation,
timeouts, a server stall), then: nothing is left held and permits are conserved."""

from __future__ import annotations

import asyncio
import os
import random
import time

import redis.asyncio as aredis
from _servers import Server, info

import redis_rlock.aio as ra

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
