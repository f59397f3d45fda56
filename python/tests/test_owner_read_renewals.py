"""An owner's renewals of one server hold in flight at once (found by
``test_client_model.py``'s asyncio run, seed 450827997): two of them can reach the server in the
opposite order of their sending, and the earlier one must not shorten what the later one
promised.

An Owner holds a read side twice (a watchdog hold and one with a fixed lease). Releasing the
fixed one first renews the owner's read lease keys (``RWLOCK.RENEW ... READ``); meanwhile the
watchdog renews the other hold for its full lease. With the server stalled, the release's
renewal, retried on a new connection after a ``CLIENT KILL``, sits in the listen backlog and
runs after the watchdog's (an already accepted connection). It asked only the longest promise
at its sending, so the lease keys ended a few hundred ms before the watchdog guard's
``valid_until`` (11 of 60 tries, sync and asyncio alike). A lease sent for a key while a
watchdog hold of the owner lives is now at least that watchdog's lease (``Peers.floor_ms``):
a watchdog renewal sent earlier or later can then never be outlasted by what it promised.
``RLOCK_PY_READ_RENEWAL_TRIES`` (default 8 here; 60 found it reliably) sets the tries."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import redis.asyncio as aredis
from _servers import Server

import redis_rlock as rl
import redis_rlock.aio as ra

TRIES = int(os.environ.get("RLOCK_PY_READ_RENEWAL_TRIES", "8"))


async def test_asyncio_owners_read_lease_keys_outlast_its_watchdog_guard_after_a_stall(
    server: Server,
) -> None:
    rng = random.Random(int(os.environ.get("RLOCK_PY_MODEL_SEED", "1")))
    r = aredis.Redis(port=server.port, socket_timeout=10)
    c = server.client()
    me = int(c.client_id())
    bad = []
    for i in range(TRIES):
        o = ra.Owner(r, response_timeout=0.5)
        watched = o.rw_lock("k", watchdog_timeout=1.5).read
        leased = o.rw_lock("k", watchdog_timeout=1.5).read
        assert await watched.acquire()
        await asyncio.sleep(rng.uniform(0, 0.5))
        assert await leased.acquire(lease=1.0)
        await asyncio.sleep(rng.uniform(0, 0.45))
        if rng.random() < 0.5:
            for cl in c.client_list():
                if int(cl["id"]) != me:
                    c.execute_command("CLIENT", "KILL", "ID", cl["id"])
        server.pause()
        asyncio.get_running_loop().call_later(rng.uniform(0.05, 0.45), server.resume)
        try:
            await leased.release()
        except Exception:
            pass  # a stalled renewal: nothing released, not what this pins
        server.resume()
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            h = watched.hold
            keys = [int(c.pttl(k)) for k in c.keys("{k}:*")]
            left_ms = (h.valid_until - time.monotonic()) * 1000  # after the replies
            if keys and not h.is_lost() and max(keys) < left_ms - 25:
                bad.append((i, round(left_ms), max(keys)))
                break
            await asyncio.sleep(0.02)
        await watched.release()
    await r.aclose()
    assert not bad, f"(try, guard's ms left, lease keys' ms left): {bad}"


def test_sync_owners_read_lease_keys_outlast_its_watchdog_guard_after_a_stall(
    server: Server,
) -> None:
    """The same with the sync API (the watchdog is a thread there)."""
    rng = random.Random(int(os.environ.get("RLOCK_PY_MODEL_SEED", "1")))
    r = server.client()
    c = server.client()
    me = int(c.client_id())
    bad = []
    for i in range(TRIES):
        o = rl.Owner(r, response_timeout=0.5)
        watched = o.rw_lock("k", watchdog_timeout=1.5).read
        leased = o.rw_lock("k", watchdog_timeout=1.5).read
        assert watched.acquire()
        time.sleep(rng.uniform(0, 0.5))
        assert leased.acquire(lease=1.0)
        time.sleep(rng.uniform(0, 0.45))
        if rng.random() < 0.5:
            for cl in c.client_list():
                if int(cl["id"]) != me:
                    c.execute_command("CLIENT", "KILL", "ID", cl["id"])
        server.pause()
        threading.Timer(rng.uniform(0.05, 0.45), server.resume).start()
        try:
            leased.release()
        except Exception:
            pass
        server.resume()
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            h = watched.hold
            assert h is not None
            keys = [int(c.pttl(k)) for k in c.keys("{k}:*")]
            left_ms = (h.valid_until - time.monotonic()) * 1000  # after the replies
            if keys and not h.is_lost() and max(keys) < left_ms - 25:
                bad.append((i, round(left_ms), max(keys)))
                break
            time.sleep(0.02)
        watched.release()
    assert not bad, f"(try, guard's ms left, lease keys' ms left): {bad}"
