"""What the package opens for a client ends with it: threads and connections after the
client's close and collection, the renewals of a lock object collected while it holds (its lease
then ends), the package's connections at ``close()`` / ``aclose()``; and
periods it would sleep or wait on (response timeouts, session keepalives) are refused at once
when out of range."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import random
import threading
import time
import warnings
from typing import Any, Callable

import pytest
import redis
import redis.asyncio as aredis
from _servers import Server, apoll, info, poll

import redis_rlock as rl
import redis_rlock.aio as ra


def _connections(probe: redis.Redis) -> int:
    return len(probe.client_list())


def test_clients_closed_and_collected_leave_no_thread_nor_connection(server: Server) -> None:
    probe = server.client()
    probe.execute_command("RSEM.SETPERMITS", "lc:sem", 3)
    threads0, conns0 = threading.active_count(), _connections(probe)
    for i in range(40):
        c = server.client()
        with rl.Lock(c, f"lc:lock{i}"):
            pass
        with rl.Semaphore(c, "lc:sem"):
            pass
        c.close()
        del c
    gc.collect()
    poll(
        "no thread and no connection left of 40 closed, collected clients",
        3.0,
        lambda: (
            gc.collect() >= 0
            and threading.active_count() <= threads0
            and _connections(probe) <= conns0
        ),
    )


def test_close_closes_the_packages_connections(server: Server) -> None:
    probe = server.client()
    conns0 = _connections(probe)
    c = server.client()
    with rl.Lock(c, "lc:close"):
        pass
    assert _connections(probe) > conns0
    c.close()
    poll("the package's connection closed by close()", 2.0, lambda: _connections(probe) <= conns0)
    with rl.Lock(c, "lc:close"):  # the client stays usable, as redis-py's
        pass


async def test_aclose_closes_the_packages_connections(server: Server) -> None:
    probe = server.client()
    conns0 = _connections(probe)
    c = aredis.Redis(port=server.port)
    async with ra.Lock(c, "lc:aclose"):
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await c.aclose()
        await apoll(
            "the package's connection closed by aclose()",
            2.0,
            lambda: _connections(probe) <= conns0,
        )
        del c
        gc.collect()
    ours = f"port={server.port}"  # earlier tests' garbage may be collected here too
    assert not [
        w for w in caught if issubclass(w.category, ResourceWarning) and ours in str(w.message)
    ]


def _waiter_maker(c: redis.Redis, probe: redis.Redis, kind: str, name: str) -> Callable[[], Any]:
    """A maker of the ``kind`` of sync lock under test, whose ``acquire`` waits in the server."""
    if kind == "semaphore":
        probe.execute_command("RSEM.SETPERMITS", name, 1)
        return lambda: rl.Semaphore(c, name)
    if kind == "drop-in":
        return lambda: c.lock(name, lock_class=rl.RLockCompat, blocking_timeout=5)
    return lambda: rl.Lock(c, name)


def _wait_and_release(kind: str, lock: Any, results: list[str]) -> None:
    try:
        if kind == "semaphore":
            # the permit's guard: its release carries the acquire's request id, sent again after
            # a dropped connection (``Semaphore.release(n)``: a request id of its own, below)
            guard = lock.permits(timeout=5)
            if guard is not None:
                guard.release()
            got = guard is not None
        else:
            got = lock.acquire(blocking_timeout=5) if kind == "drop-in" else lock.acquire(timeout=5)
            if got:
                lock.release()
        results.append("served" if got else "timed out")
    except Exception as e:  # what a close() under the wait raised
        results.append(f"{type(e).__name__}: {e}")


@pytest.mark.parametrize("kind", ["lock", "semaphore", "drop-in"])
def test_waits_pending_at_close_carry_on_and_are_served(server: Server, kind: str) -> None:
    """``close()`` of the client while acquires of its locks wait in the server: the waits go
    on (on new connections, as redis-py's own commands after ``close()`` and as waits after
    ``aclose()``), and each is served once the holder releases, in rounds where the release
    comes just before or after the close (a grant sent into a connection the close drops is
    replayed under the same request id); in the end nothing is held, no permit is lost, and
    nothing waits in the server."""
    probe = server.client()
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for rnd in range(6):
        c = server.client()
        name = f"lc:closewait:{kind}:{rnd}"
        make = _waiter_maker(c, probe, kind, name)
        holder = make()
        assert holder.acquire()
        results: list[str] = []
        threads = [
            threading.Thread(target=_wait_and_release, args=(kind, make(), results))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        poll(
            "3 waits blocked in the server",
            3.0,
            lambda: probe.info("clients")["blocked_clients"] >= 3,
        )
        release_first, gap = rng.random() < 0.5, rng.uniform(0.0, 0.002)
        if release_first:
            holder.release()
            time.sleep(gap)
            c.close()
        else:
            c.close()
            time.sleep(gap)
            holder.release()
        for t in threads:
            t.join(10.0)
        what = f"seed {seed} round {rnd} release_first={release_first} gap={gap:.4f}"
        assert sorted(results) == ["served"] * 3, (what, results)
        if kind == "semaphore":
            assert probe.get(name) == b"1", (what, "the permit not back")
        else:
            assert probe.exists(name) == 0, (what, "the lock still held")
        poll("no wait left in the server", 2.0, lambda: probe.info()["blocked_clients"] == 0)
        c.close()


STORM_SECS = float(os.environ.get("RLOCK_PY_CLOSE_STORM_SECS", "3"))


def _storm_worker(
    i: int, c: redis.Redis, probe: redis.Redis, stop: float, seed: int, out: dict[str, Any]
) -> None:
    """Acquires (with timeouts) the lock ``lc:storm`` or a permit of ``lc:stormsem`` in a loop;
    records every exception and every grant the server does not show as this caller's."""
    rng = random.Random(seed * 31 + i)
    while time.monotonic() < stop:
        try:
            if i % 2:
                guard = rl.Semaphore(c, "lc:stormsem").permits(1, timeout=rng.uniform(0.01, 0.3))
                if guard is None:
                    continue
                with out["mu"]:
                    out["permits"] += 1
                    if out["permits"] > 2:
                        out["bad"].append("three permits of two held at once")
                time.sleep(rng.uniform(0, 0.005))
                with out["mu"]:
                    out["permits"] -= 1
                guard.release()
            else:
                lock = rl.Lock(c, "lc:storm")
                if not lock.acquire(timeout=rng.uniform(0.01, 0.3)):
                    continue
                with out["mu"]:
                    out["locks"] += 1
                    if out["locks"] > 1:
                        out["bad"].append("two holders of one lock")
                owner = info(probe, "lc:storm").get("owner")
                if owner != lock.hold.owner:
                    out["bad"].append(f"granted, but the server's owner is {owner!r}")
                time.sleep(rng.uniform(0, 0.005))
                with out["mu"]:
                    out["locks"] -= 1
                lock.release()
        except Exception as e:  # whatever a close() under the call let through
            out["errors"].append(f"{type(e).__name__}: {e}")


def test_close_storm_under_waiting_acquires_loses_nothing_and_shifts_no_reply(
    server: Server,
) -> None:
    """Threads acquire a lock and permits with timeouts while the client's ``close()`` runs
    every few ms: no call fails (waits go on, releases are sent again, as the README's
    "Closing" promises: no ``ValueError`` of a parser cut under its reader), exclusion holds,
    every grant is the caller's own on the server (no reply read by the wrong command, as a
    handshake reply left unread by a close mid-handshake would be), no connection goes back
    to a pool with a reply pending, and in the end nothing is held and no permit is lost."""
    probe = server.client()
    c = server.client()
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    assert rl.Semaphore(c, "lc:stormsem").try_set_permits(2)
    out: dict[str, Any] = {
        "mu": threading.Lock(),
        "permits": 0,
        "locks": 0,
        "bad": [],
        "errors": [],
    }
    stop = time.monotonic() + STORM_SECS
    threads = [
        threading.Thread(target=_storm_worker, args=(i, c, probe, stop, seed, out))
        for i in range(6)
    ]
    for t in threads:
        t.start()
    closes = 0
    while time.monotonic() < stop:
        c.close()
        closes += 1
        time.sleep(rng.uniform(0, 0.01))
    for t in threads:
        t.join(20.0)
    assert not any(t.is_alive() for t in threads), f"seed {seed}: a worker hangs"
    assert rl.flush_all(10.0)
    what = f"seed {seed}, {closes} closes"
    assert out["errors"] == [], (what, sorted(set(out["errors"]))[:5])
    assert out["bad"] == [], (what, out["bad"][:5])
    for be in c.__dict__["_redis_rlock_backends"].values():
        pools = [*be._pools.values(), *(pool for pool, _ in be._waits.values())]
        for pool in pools:
            for conn in list(pool._available_connections):
                assert not (conn.is_connected and conn.can_read(0)), (what, "a reply pending")
    poll("the permits all back", 3.0, lambda: probe.get("lc:stormsem") == b"2")
    poll("the lock free", 3.0, lambda: probe.exists("lc:storm") == 0)
    poll("no wait left in the server", 3.0, lambda: probe.info()["blocked_clients"] == 0)
    c.close()


BAD_PERIODS: list[Any] = [0, 0.0, -1, -0.5, math.nan, math.inf, 1e300, True, "2", None]


def _makers(r: redis.Redis) -> list[Callable[[Any], Any]]:
    return [
        lambda rt: rl.Lock(r, "lc:bad", response_timeout=rt),
        lambda rt: rl.RWLock(r, "lc:bad", response_timeout=rt),
        lambda rt: rl.Semaphore(r, "lc:bad", response_timeout=rt),
        lambda rt: rl.LeasedSemaphore(r, "lc:bad", response_timeout=rt),
        lambda rt: rl.CountDownLatch(r, "lc:bad", response_timeout=rt),
        lambda rt: rl.Owner(r, response_timeout=rt),
        lambda rt: rl.Session(r, response_timeout=rt),
    ]


@pytest.mark.parametrize("rt", BAD_PERIODS, ids=repr)
def test_a_response_timeout_out_of_range_is_refused_at_once(r: redis.Redis, rt: Any) -> None:
    threads0 = threading.active_count()
    for make in _makers(r):
        with pytest.raises((ValueError, TypeError), match="response_timeout"):
            make(rt)
    assert threading.active_count() <= threads0


@pytest.mark.parametrize("rt", BAD_PERIODS, ids=repr)
async def test_an_async_response_timeout_out_of_range_is_refused_at_once(
    ar: aredis.Redis, rt: Any
) -> None:
    for make in (
        lambda: ra.Lock(ar, "lc:bad", response_timeout=rt),
        lambda: ra.Semaphore(ar, "lc:bad", response_timeout=rt),
        lambda: ra.Session(ar, response_timeout=rt),
    ):
        with pytest.raises((ValueError, TypeError), match="response_timeout"):
            make()


@pytest.mark.parametrize("keepalive", BAD_PERIODS, ids=repr)
def test_a_session_keepalive_out_of_range_is_refused_at_once(
    r: redis.Redis, keepalive: Any
) -> None:
    with pytest.raises((ValueError, TypeError), match="keepalive"):
        rl.Session(r, keepalive=keepalive)


def test_a_session_with_a_long_keepalive_still_sees_client_kill(r: redis.Redis) -> None:
    s = rl.Session(r, keepalive=3600.0)
    lk = s.lock("lc:sess")
    assert lk.acquire()
    hold = lk.hold
    r.execute_command("CLIENT", "KILL", "ID", s.client_id)
    poll("the session closed after CLIENT KILL", 3.0, lambda: s.closed.is_set())
    assert hold.is_lost()
    s.close()


def test_a_response_timeout_in_range_works(r: redis.Redis) -> None:
    lk = rl.Lock(r, "lc:ok", response_timeout=0.05)
    assert lk.acquire(timeout=1)
    lk.release()


# An ownerless ``Semaphore.release(n)`` in flight when the client's ``close()`` drops its
# connection: sent again (its request id makes the server give back once), as every other call
# that overlaps ``close()``; the permits are given back exactly once, never lost nor doubled.


def test_a_counted_release_racing_close_is_sent_again_and_given_back_once(
    server: Server,
) -> None:
    from _proxy import SlowProxy

    probe = server.client()
    proxy = SlowProxy(server.port, 0.08)
    c = redis.Redis(port=proxy.port)
    try:
        sem = rl.Semaphore(c, "lc:rel")
        assert sem.try_set_permits(1)
        out: list[Any] = []

        def release() -> None:
            try:
                out.append(sem.release(2))
            except Exception as e:  # what the close() under the release raised
                out.append(e)

        t = threading.Thread(target=release, daemon=True)
        t.start()
        pool = sem._be._pools[""]
        poll("the release in flight", 3.0, lambda: bool(pool._in_use_connections))
        c.close()
        t.join(10.0)
        assert len(out) == 1 and out[0] == 3, out
        assert probe.get("lc:rel") == b"3"
    finally:
        c.close()
        proxy.close()
        probe.close()


async def test_an_async_counted_release_racing_aclose_is_sent_again_and_given_back_once(
    server: Server,
) -> None:
    from _proxy import SlowProxy

    probe = server.client()
    proxy = SlowProxy(server.port, 0.08)
    c = aredis.Redis(port=proxy.port)
    try:
        sem = ra.Semaphore(c, "lc:arel")
        assert await sem.try_set_permits(1)
        task = asyncio.ensure_future(sem.release(2))
        pool = sem._be._pools[""]
        await apoll("the release in flight", 3.0, lambda: bool(pool._in_use_connections))
        await c.aclose()
        assert await asyncio.wait_for(task, 10.0) == 3
        assert probe.get("lc:arel") == b"3"
    finally:
        await c.aclose()
        proxy.close()
        probe.close()


# -- a lock object collected while it holds ----------------------------------------------------


def test_a_dropped_lock_object_stops_renewing_and_its_lease_ends(r: redis.Redis) -> None:
    lock = rl.Lock(r, "dropped", watchdog_timeout=1)
    assert lock.acquire()
    del lock
    gc.collect()
    poll("the unrenewed lease to end", 5, lambda: not r.exists("dropped"))
