"""Counted permits have no owner and no lease: a release given up on is a permit held by nobody
for good. ``Semaphore.release(n)`` (``RSEM.RELEASE key n REQUEST id``) is therefore sent again
while the server remembers its request id (50 s from its first send), in the background once
its caller stops waiting (three response timeouts, a cancellation, an interrupt), and a new
asyncio connection's handshake slower than the response timeout is not cut (a retry finds it
ready). Each test's server is reached through a proxy (``_proxy``) and read directly."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis
from _proxy import Proxy, SlowProxy
from _servers import Server, apoll, poll
from conftest import _print_logs

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.5
#: each way: a command's round trip 0.2 s (under RT), a new connection's handshake (the
#: proxy's connect, CLIENT SETINFO) about 0.65 s (over RT)
DELAY = 0.1


def _count(probe: redis.Redis, key: str) -> int:
    return int(probe.get(key) or 0)


async def test_an_async_release_gets_through_a_link_whose_handshake_outlasts_the_response_timeout(
    server: Server,
) -> None:
    probe = server.client()
    proxy = SlowProxy(server.port, DELAY)
    c = aredis.Redis(port=proxy.port)
    try:
        sem = ra.Semaphore(c, "cr:hs", response_timeout=RT)
        try:
            assert await sem.release(2) == 2
        except redis.exceptions.TimeoutError:
            pass  # not within 3 response timeouts: it goes on in the background
        await apoll("the release given back", 10.0, lambda: _count(probe, "cr:hs") == 2)
        # connections whose handshake outlasted a call serve the next ones
        assert await sem.release(1) == 3
        assert _count(probe, "cr:hs") == 3
    finally:
        await c.aclose()
        proxy.close()
        probe.close()


async def test_an_async_release_cancelled_in_its_handshake_still_gives_back_once(
    server: Server,
) -> None:
    probe = server.client()
    proxy = SlowProxy(server.port, DELAY)
    c = aredis.Redis(port=proxy.port)
    try:
        sem = ra.Semaphore(c, "cr:cancel", response_timeout=RT)
        task = asyncio.ensure_future(sem.release(3))
        await asyncio.sleep(0.1)  # in its first connection's handshake
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await apoll(
            "the cancelled release given back", 10.0, lambda: _count(probe, "cr:cancel") == 3
        )
        await asyncio.sleep(3 * RT)  # nothing more comes: given back once
        assert _count(probe, "cr:cancel") == 3
    finally:
        await c.aclose()
        proxy.close()
        probe.close()


def test_a_release_unanswered_in_time_goes_on_until_the_link_heals(server: Server) -> None:
    probe = server.client()
    proxy = Proxy(server.port)
    c = redis.Redis(port=proxy.port)
    try:
        sem = rl.Semaphore(c, "cr:sync", response_timeout=RT)
        assert sem.try_set_permits(1)
        proxy.cut()
        with pytest.raises(redis.exceptions.RedisError):
            sem.release(2)  # unanswered within 3 response timeouts: the caller is told so
        threading.Timer(2 * RT, proxy.heal).start()
        poll("the release given back after the heal", 10.0, lambda: _count(probe, "cr:sync") == 3)
        time.sleep(3 * RT)
        assert _count(probe, "cr:sync") == 3
    finally:
        c.close()
        proxy.close()
        probe.close()


async def test_an_async_release_unanswered_in_time_goes_on_until_the_link_heals(
    server: Server,
) -> None:
    probe = server.client()
    proxy = Proxy(server.port)
    c = aredis.Redis(port=proxy.port)
    try:
        sem = ra.Semaphore(c, "cr:async", response_timeout=RT)
        assert await sem.try_set_permits(1)
        proxy.cut()
        with pytest.raises(redis.exceptions.RedisError):
            await sem.release(2)
        asyncio.get_running_loop().call_later(2 * RT, proxy.heal)
        await apoll(
            "the release given back after the heal", 10.0, lambda: _count(probe, "cr:async") == 3
        )
        await asyncio.sleep(3 * RT)
        assert _count(probe, "cr:async") == 3
    finally:
        await c.aclose()
        proxy.close()
        probe.close()


def _refuse_grants(probe: redis.Redis, refuse: bool) -> None:
    """Makes the server's replica guard refuse grants (a replica required, none attached: as a
    master that may have been replaced), and with them give-backs of counted permits
    (``NOREPLICAS``); or lets it grant again."""
    probe.config_set("rlock.min-replicas", "1" if refuse else "0")

    def refused() -> bool:
        try:
            probe.execute_command("RLOCK.ACQUIRE", "cr:probe", "p", 60000)
        except redis.exceptions.ResponseError as e:
            assert str(e).startswith("NOREPLICAS"), e
            return True
        probe.execute_command("RLOCK.RELEASE", "cr:probe", "p")
        return False

    poll("the guard to refuse" if refuse else "grants allowed", 10.0, lambda: refused() == refuse)


def test_releases_refused_by_a_master_without_its_replicas_go_on_until_it_accepts_them(
    server: Server,
) -> None:
    probe = server.client()
    c = redis.Redis(port=server.port)
    try:
        sem = rl.Semaphore(c, "cr:norepl", response_timeout=RT)
        assert sem.try_set_permits(3)
        guard = sem.permits(2)
        assert guard is not None
        assert sem.acquire(1)
        _refuse_grants(probe, True)
        # refused (NOREPLICAS) for three response timeouts: the caller is told, the release
        # is not given up on
        with pytest.raises(redis.exceptions.TimeoutError, match="NOREPLICAS"):
            sem.release(1)
        guard.release()  # refused too: it goes on in the background
        assert _count(probe, "cr:norepl") == 0, "a refused give-back gives nothing back"
        _refuse_grants(probe, False)
        poll("the releases given back", 10.0, lambda: _count(probe, "cr:norepl") == 3)
        time.sleep(3 * RT)  # nothing more comes: given back once
        assert _count(probe, "cr:norepl") == 3
    finally:
        c.close()
        probe.close()


async def test_async_releases_refused_by_a_master_without_its_replicas_go_on_until_it_accepts_them(
    server: Server,
) -> None:
    probe = server.client()
    c = aredis.Redis(port=server.port)
    try:
        sem = ra.Semaphore(c, "cr:anorepl", response_timeout=RT)
        assert await sem.try_set_permits(3)
        guard = await sem.permits(2)
        assert guard is not None
        assert await sem.acquire(1)
        _refuse_grants(probe, True)
        with pytest.raises(redis.exceptions.TimeoutError):
            await sem.release(1)
        await guard.release()
        assert _count(probe, "cr:anorepl") == 0, "a refused give-back gives nothing back"
        _refuse_grants(probe, False)
        await apoll("the releases given back", 10.0, lambda: _count(probe, "cr:anorepl") == 3)
        await asyncio.sleep(3 * RT)
        assert _count(probe, "cr:anorepl") == 3
    finally:
        await c.aclose()
        probe.close()


class Failover:
    """A master whose replica hears it through a link (``link``) the test cuts, and the
    client's way in (``front``) to whichever server is the master."""

    def __init__(self) -> None:
        self.master = Server()
        self.link = Proxy(self.master.port)
        self.replica = Server("--replicaof", "127.0.0.1", str(self.link.port))
        self.front = Proxy(self.master.port)

    def permits(self, key: str) -> int:
        return _count(self.replica.client(), key)

    def lose_the_master(self, key: str, before: int) -> None:
        """Kills the master, promotes its replica (which must still count ``before`` permits of
        ``key``: what the master did since the cut never reached it) and sends the client
        there."""
        self.master.kill()
        self.replica.client().execute_command("REPLICAOF", "NO", "ONE")
        assert self.permits(key) == before, "the replica was not cut off in time"
        self.front.retarget(self.replica.port)

    def close(self, request: pytest.FixtureRequest) -> None:
        self.front.close()
        self.link.close()
        _print_logs(request, [self.master, self.replica])
        for s in (self.replica, self.master):
            s.close()


@pytest.fixture
def failover(request: pytest.FixtureRequest) -> Iterator[Failover]:
    f = Failover()
    yield f
    f.close(request)


def test_a_release_its_master_lost_with_its_role_is_given_back_by_the_promoted_replica(
    failover: Failover,
) -> None:
    """A master answers a counted release that never reaches its replica (their link went
    silent first), then dies; its replica, promoted, still counts the permit taken. The
    client, told nothing of it, sends the release again until a master's replicas all
    acknowledged it: the promoted replica gives the permit back (the release's request id is
    new there), once."""
    f, key = failover, "cr:durable"
    c = redis.Redis(port=f.front.port)
    try:
        sem = rl.Semaphore(c, key, response_timeout=RT)
        assert sem.try_set_permits(3)
        assert sem.acquire()
        poll("the replica in sync", 10.0, lambda: f.permits(key) == 2)
        f.link.cut()  # the master still counts its replica, which hears nothing more
        assert sem.release(1) == 3  # answered by the master: never replicated
        f.lose_the_master(key, 2)
        poll("the permit given back on the promoted replica", 15.0, lambda: f.permits(key) == 3)
        time.sleep(1.0)  # sent again, it gives back nothing more
        assert f.permits(key) == 3
    finally:
        c.close()


async def test_an_async_release_its_master_lost_with_its_role_is_given_back_by_the_promoted_replica(
    failover: Failover,
) -> None:
    """As the sync test, with the asyncio client."""
    f, key = failover, "cr:adurable"
    c = aredis.Redis(port=f.front.port)
    try:
        sem = ra.Semaphore(c, key, response_timeout=RT)
        assert await sem.try_set_permits(3)
        assert await sem.acquire()
        await apoll("the replica in sync", 10.0, lambda: f.permits(key) == 2)
        f.link.cut()
        assert await sem.release(1) == 3
        f.lose_the_master(key, 2)
        await apoll(
            "the permit given back on the promoted replica", 15.0, lambda: f.permits(key) == 3
        )
        await asyncio.sleep(1.0)
        assert f.permits(key) == 3
    finally:
        await c.aclose()


def test_a_release_refused_for_want_of_replicas_is_given_back_once_they_are_back(
    server: Server,
) -> None:
    """``NOREPLICAS`` (here Redis's own ``min-replicas-to-write``) refuses a counted release:
    nothing was given back. The release is not given up on (it raises, as one unanswered in
    time does, and goes on in the background): once the master may write again, the permit
    comes back, once."""
    probe = server.client()
    c = server.client()
    key = "cr:noreplicas"
    try:
        sem = rl.Semaphore(c, key, response_timeout=RT)
        assert sem.try_set_permits(1)
        probe.config_set("min-replicas-to-write", 1)
        with pytest.raises(redis.exceptions.RedisError):
            sem.release(1)
        assert _count(probe, key) == 1  # refused so far
        probe.config_set("min-replicas-to-write", 0)
        poll("the refused release given back", 10.0, lambda: _count(probe, key) == 2)
        time.sleep(3 * RT)  # nothing more comes: given back once
        assert _count(probe, key) == 2
    finally:
        c.close()
        probe.close()
